"""The fake kubelet: runs scheduled Fleetserve pods as local processes and reports their status.

It plays the kubelet for every fake node at once.  Every ``sync_interval_s`` it lists the pods
bound to a node and, for each one:

- a pod of a Fleetserve image (the runtime or the operator) gets its container command started
  as a local process, its ports mapped to free loopback ports (``pod_launch``); a pod that
  mounts a service-account token gets, as from a kubelet, a token bound to the pod from the
  TokenRequest API, here in a kubeconfig in the work dir (``identity``), so the process acts
  only as that ServiceAccount; the readiness endpoint is probed and the pod's status written
  back; a process that exits is restarted after ``restart_delay_s`` with restartCount + 1
  (restartPolicy Always);
- any other pod is simply reported Running and Ready (KWOK-style);
- a pod marked for deletion is reported not ready, runs out its `preStop` sleep (the native
  sleep action, if the container has one) still serving, then has its process stopped
  (SIGTERM, SIGKILL after its grace period, both capped) and is removed for good, as a
  kubelet confirms a graceful deletion.

With ``backend="containers"`` a pod of a Fleetserve image, runtime or operator, runs as real
containers of its image instead (``pod_containers`` plans them, ``container_pod`` runs them
with podman): init containers first, volumes (the projected service-account token included),
securityContext and limits honoured, container ports published on 127.0.0.1 where the probe
and the pod map reach them, an exit 137 at the memory limit reported as ``OOMKilled``; the
operator finds the API server as an in-cluster client does (``pod_containers.service_env``).

A process pod's ``configMap`` volumes are projected into host directories that follow the
ConfigMap, its args pointed at them, and a Service's cluster URL in them resolved to a ready
pod of the Service (``pod_volumes``): the harness has neither mount namespaces nor cluster DNS.

With ``pod_network`` each process pod gets a loopback address of its own instead of remapped
ports on 127.0.0.1, and the runner publishes every Service's pods in EndpointSlices that a
gateway can dial (``pod_endpoints`` says why the controller's own cannot); containers pods keep
127.0.0.1.

Polling, rather than a watch, keeps this small and restart-proof; a list every few hundred
milliseconds is nothing for a local API server.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import httpx

from fleetserve_e2e.container_pod import PodContainers
from fleetserve_e2e.identity import (
    ProjectedToken,
    projected_token,
    request_token,
    write_token_kubeconfig,
)
from fleetserve_e2e.images.registry import PullOptions
from fleetserve_e2e.kubeapi import JsonObject, KubeApiError, KubeClient, namespaced
from fleetserve_e2e.pod_containers import (
    ContainersPlan,
    PodSpecError,
    containers_plan,
    node_directory,
)
from fleetserve_e2e.pod_endpoints import MANAGED_BY, MANAGED_BY_LABEL, endpoint_slices
from fleetserve_e2e.pod_launch import (
    LOOPBACK,
    LaunchPlan,
    fleetserve_container,
    launch_plan,
    prestop_sleep_s,
)
from fleetserve_e2e.pod_map import (
    FILE_SD_FILE,
    POD_MAP_FILE,
    PodAddress,
    write_file_sd,
    write_pod_map,
)
from fleetserve_e2e.pod_status import Observation, pod_status, timestamp
from fleetserve_e2e.pod_volumes import (
    ConfigMapMount,
    config_map_mounts,
    host_args,
    project,
    resolve_services,
)
from fleetserve_e2e.pod_workloads import PodProcess, ProcessWorkload, Workload
from fleetserve_e2e.ports import free_pod_ip, free_port

_MAX_GRACE_S = 10.0
_DISCOVERY = "discovery.k8s.io/v1"
_PROBE_TIMEOUT_S = 1.0
Backend = Literal["processes", "containers"]
CREATE_CONFIG_ERROR = "CreateContainerConfigError"
"""The kubelet's waiting reason for a container whose Secret or ConfigMap is missing."""


def _not_created(pod: JsonObject, reason: str, message: str) -> Observation:
    """A pod whose containers cannot be created: Pending, each container waiting for `reason`.

    Its times are the pod's creation, so that a retry that fails alike writes nothing.
    """
    since = pod["metadata"].get("creationTimestamp") or timestamp()
    return Observation(
        started_at=since,
        ready_changed_at=since,
        running=False,
        ready=False,
        initialized=False,
        waiting=(reason, message),
    )


def _pod_key(pod: JsonObject) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


@dataclass
class RunnerConfig:
    """Settings of the fake kubelet.

    `base_env` is the environment pod processes start from; cluster credentials, proxies and
    ``FLEETSERVE_*`` settings are dropped from it.  `server` and `ca_cert` go into the token
    kubeconfigs of pods that mount a service-account token.
    """

    work_dir: Path
    commands: Mapping[str, Sequence[str]]
    base_env: Mapping[str, str]
    server: str
    ca_cert: Path
    sync_interval_s: float = 0.3
    restart_delay_s: float = 1.0
    backend: Backend = "processes"
    """``containers``: Fleetserve pods (runtime and operator) run as containers of their image."""
    images: Mapping[str, str] = field(default_factory=dict)
    """Image reference in a pod spec → the local tag to run instead (containers backend)."""
    pull: PullOptions = field(default_factory=PullOptions)
    """How an image missing locally is pulled (containers backend)."""
    marker: str = ""
    """Labels the containers as this cluster's, for the cleanup of leftovers."""
    host_names: tuple[str, ...] = ()
    """Names every container resolves to the host's loopback (containers backend)."""
    pod_network: bool = False
    """Give each process pod a loopback address of its own as its podIP, listening there on
    its container ports (`ports.free_pod_ip`), and publish each Service's pods in EndpointSlices
    of their own (`pod_endpoints`); off: every pod is 127.0.0.1 at remapped ports, which only
    the pod map tells apart."""


def _port_of(url: str) -> int:
    """The port of an ``https://host:port`` URL (the API server's, which always names one)."""
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"{url!r} names no port")
    return port


class PodRunner:
    """Fake kubelet for all fake nodes; start it once the API server is ready."""

    def __init__(self, client: KubeClient, config: RunnerConfig) -> None:
        """Prepare an idle runner; :meth:`start` launches its sync thread."""
        self._client = client
        self._config = config
        self._probe = httpx.Client(timeout=_PROBE_TIMEOUT_S, trust_env=False)
        self._processes: dict[str, PodProcess] = {}
        self._reported: dict[str, JsonObject] = {}
        self._terminating: dict[str, float] = {}
        """uid → monotonic time its deletion was first seen, while its preStop sleep runs."""
        self._published: list[PodAddress] | None = None
        self._slices: dict[tuple[str, str], JsonObject] | None = None
        """The pod network's EndpointSlices as last written, by (namespace, name)."""
        self._mounts: dict[str, list[ConfigMapMount]] = {}
        """uid → the ConfigMap volumes a process pod mounts, projected at every sync."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-kubelet", daemon=True)
        # "namespace/pod" (or "" for the pod list itself) → the last error syncing it.
        self.errors: dict[str, str] = {}

    def start(self) -> None:
        """Start syncing in the background."""
        self._write_addresses([])
        self._thread.start()

    def stop(self) -> None:
        """Stop syncing, then stop every pod process."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=_MAX_GRACE_S * 3)
        for running in self._processes.values():
            running.process.stop()
        self._processes.clear()
        self._probe.close()

    def pids(self) -> list[int]:
        """Return the pids of the pod processes currently running."""
        return [p.process.pid for p in list(self._processes.values()) if p.process.is_running()]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except (KubeApiError, httpx.HTTPError) as error:
                # The API server may be restarting or shutting down; the next round retries.
                self._record_error("", error)
            self._stop.wait(self._config.sync_interval_s)

    def _record_error(self, key: str, error: Exception) -> None:
        """Remember the error and print it when it is new, so the harness log explains a pod."""
        message = f"{type(error).__name__}: {error}"
        if self.errors.get(key) != message:
            print(f"fake-kubelet: {key or 'pods'}: {message}", file=sys.stderr, flush=True)
        self.errors[key] = message

    def sync_once(self) -> None:
        """Bring every bound pod one step closer to what the API says, then publish addresses."""
        pods = self._client.get("/api/v1/pods", {"fieldSelector": "spec.nodeName!="})["items"]
        live_uids = {pod["metadata"]["uid"] for pod in pods}
        for uid in [uid for uid in self._processes if uid not in live_uids]:
            self._processes.pop(uid).process.stop()
            self._mounts.pop(uid, None)
        for uid in [uid for uid in self._reported if uid not in live_uids]:
            del self._reported[uid]
        supervised: list[tuple[JsonObject, PodProcess]] = []
        for pod in pods:
            try:
                running = self._sync_pod(pod)
            except Exception as error:  # one bad pod must not stall the others
                self._record_error(_pod_key(pod), error)
            else:
                if running is not None:
                    supervised.append((pod, running))
        self._publish({pod["metadata"]["uid"]: pod for pod in pods})
        if self._config.pod_network:
            self._publish_endpoints(pods)
        # Statuses go out only once the addresses are published: a pod the API calls Ready
        # (and the operator weights) is already one the load driver can route to.
        for pod, running in supervised:
            try:
                self._report(pod, running.seen, pod_ip=running.ip)
            except Exception as error:
                self._record_error(_pod_key(pod), error)

    def _sync_pod(self, pod: JsonObject) -> PodProcess | None:
        """Advance one pod; its running workload, whose status `sync_once` then reports."""
        if pod["metadata"].get("deletionTimestamp"):
            self._finish_deletion(pod)
            return None
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            return None
        container = fleetserve_container(pod)
        if container is None:
            # KWOK-style: nothing runs, so report Running and Ready once and never change it.
            if pod["metadata"]["uid"] not in self._reported:
                now = timestamp()
                seen = Observation(started_at=now, ready_changed_at=now, running=True, ready=True)
                self._report(pod, seen)
            return None
        running = self._processes.get(pod["metadata"]["uid"])
        if running is None:
            if self._config.backend == "containers":
                try:
                    running = self._launch_containers(pod, container)
                except PodSpecError as error:
                    # As a kubelet does: the pod waits, says why, and is tried again.
                    self._report(pod, _not_created(pod, CREATE_CONFIG_ERROR, str(error)))
                    raise
            else:
                running = self._launch(pod, container)
        self._project(pod)
        self._supervise(running)
        return running

    def _launch(self, pod: JsonObject, container: JsonObject) -> PodProcess:
        stem = self._pod_path(pod)
        token = projected_token(pod)
        kubeconfig = None if token is None else Path(f"{stem}.kubeconfig")
        plan = launch_plan(
            pod,
            container,
            commands=self._config.commands,
            base_env=self._config.base_env,
            allocate_port=free_port,
            kubeconfig=kubeconfig,
            allocate_pod_ip=self._allocate_pod_ip if self._config.pod_network else None,
        )
        mounts = config_map_mounts(pod, container, Path(f"{stem}.volumes"))
        plan = replace(plan, argv=tuple(host_args(plan.argv, mounts)))
        self._mounts[pod["metadata"]["uid"]] = mounts
        self._project(pod)  # before the process starts, as a kubelet mounts first
        # Only once the plan holds: a pod spec the harness cannot run is retried every sync,
        # and must not request a token each time.
        if token is not None and kubeconfig is not None:
            self._write_token_kubeconfig(pod, token, kubeconfig)
        workload = ProcessWorkload(plan, Path(f"{stem}.log"), self._config.work_dir)
        return self._track(pod, plan, workload)

    def _project(self, pod: JsonObject) -> None:
        """Bring a process pod's ConfigMap volumes up to date with the API (`pod_volumes`)."""
        namespace = pod["metadata"]["namespace"]
        for mount in self._mounts.get(pod["metadata"]["uid"], []):
            try:
                found = self._client.get(namespaced("configmaps", namespace, mount.config_map))
            except KubeApiError as error:
                if error.status_code != 404:
                    raise
                found = None
            data = {
                key: resolve_services(value, self._service_endpoint)
                for key, value in ((found or {}).get("data") or {}).items()
            }
            project(mount, data if found is not None else None)

    def _service_endpoint(self, namespace: str, service: str) -> str | None:
        """``<ip>:<port>`` of a ready published pod the Service selects; None without one."""
        try:
            found = self._client.get(namespaced("services", namespace, service))
        except KubeApiError as error:
            if error.status_code == 404:
                return None
            raise
        selector: dict[str, str] = found["spec"].get("selector") or {}
        ready = [
            pod.address
            for pod in self._published or []
            if pod.namespace == namespace
            and pod.ready
            and selector
            and all(pod.labels.get(key) == value for key, value in selector.items())
        ]
        return min(ready) if ready else None

    def _allocate_pod_ip(self, ports: Collection[int]) -> str:
        """A free loopback address for a new pod; a live pod's stays its own across restarts."""
        taken = {running.ip for running in self._processes.values()}
        return free_pod_ip(ports, taken=taken)

    def _pod_path(self, pod: JsonObject) -> Path:
        """Where a pod's files go: ``<path>.log`` and the like, or the directory ``<path>``."""
        meta = pod["metadata"]
        return self._config.work_dir / "pods" / f"{meta['namespace']}_{meta['name']}"

    def _track(
        self, pod: JsonObject, plan: LaunchPlan | ContainersPlan, workload: Workload
    ) -> PodProcess:
        now = timestamp()
        running = PodProcess(
            plan=plan,
            process=workload,
            seen=Observation(started_at=now, ready_changed_at=now, running=True, ready=False),
        )
        self._processes[pod["metadata"]["uid"]] = running
        return running

    def _launch_containers(self, pod: JsonObject, container: JsonObject) -> PodProcess:
        pod_dir = self._pod_path(pod)
        namespace = pod["metadata"]["namespace"]

        def lookup(kind: str, name: str) -> JsonObject | None:
            try:
                return self._client.get(namespaced(kind, namespace, name))
            except KubeApiError as error:
                if error.status_code == 404:
                    return None
                raise

        plan = containers_plan(
            pod,
            container,
            lookup=lookup,
            images=self._config.images,
            pod_dir=pod_dir,
            allocate_port=free_port,
            cluster=self._config.marker,
            apiserver_port=_port_of(self._config.server),
            host_names=self._config.host_names,
            node_dir=node_directory(self._config.work_dir, pod["spec"].get("nodeName", "")),
        )
        wanted = projected_token(pod)
        token = None if wanted is None else self._bound_token(pod, wanted)
        workload = PodContainers(
            plan,
            pod_dir,
            restart_delay_s=self._config.restart_delay_s,
            pull=self._config.pull,
            token=token,
        )
        return self._track(pod, plan, workload)

    def _write_token_kubeconfig(self, pod: JsonObject, wanted: ProjectedToken, path: Path) -> None:
        """Write a kubeconfig at `path` with a token bound to the pod, as it mounts it."""
        token = self._bound_token(pod, wanted)
        write_token_kubeconfig(
            path, server=self._config.server, ca_cert=self._config.ca_cert, token=token
        )

    def _bound_token(self, pod: JsonObject, wanted: ProjectedToken) -> str:
        """A token of the pod's ServiceAccount bound to the pod, as its volume asks for it."""
        return request_token(
            self._client,
            namespace=pod["metadata"]["namespace"],
            account=wanted.account,
            expiration_s=wanted.expiration_s,
            audiences=wanted.audiences,
            bound_pod=pod,
        )

    def _supervise(self, running: PodProcess) -> None:
        """Restart an exited process after the delay, and probe a live one for readiness."""
        running.process.refresh()
        seen = running.seen
        if not running.process.initialized():
            running.seen = replace(
                seen,
                initialized=False,
                running=False,
                init_statuses=running.process.init_statuses(),
            )
            return
        if not seen.initialized:
            now = timestamp()
            seen = replace(
                seen,
                initialized=True,
                running=True,
                started_at=now,
                init_statuses=running.process.init_statuses(),
            )
        code = running.process.exit_code()
        if code is not None and running.exited_at is None:
            running.exited_at = time.monotonic()
            seen = replace(
                seen,
                running=False,
                ready=False,
                last_exit_code=code,
                last_reason=running.process.exit_reason(),
                last_finished_at=timestamp(),
                ready_changed_at=timestamp() if seen.ready else seen.ready_changed_at,
            )
        elif running.exited_at is not None:
            if time.monotonic() - running.exited_at >= self._config.restart_delay_s:
                running.process.restart()
                running.exited_at = None
                seen = replace(
                    seen, running=True, started_at=timestamp(), restart_count=seen.restart_count + 1
                )
        else:
            ready = self._is_ready(running)
            if ready != seen.ready:
                seen = replace(seen, ready=ready, ready_changed_at=timestamp())
        running.seen = seen

    def _is_ready(self, running: PodProcess) -> bool:
        readiness = running.plan.readiness
        if readiness is None:
            return True
        url = f"http://{running.ip}:{readiness.port}{readiness.path}"
        try:
            response = self._probe.get(url)
        except httpx.HTTPError:
            return False
        return response.status_code == httpx.codes.OK

    def _report(self, pod: JsonObject, seen: Observation, *, pod_ip: str = LOOPBACK) -> None:
        """Write the pod's status (`pod_ip`: where it listens) if it changed since last written."""
        uid = pod["metadata"]["uid"]
        previous = self._reported.get(uid)
        status = pod_status(pod, seen, pod_ip=pod_ip)
        if previous == status:
            return
        path = namespaced("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
        self._client.merge_patch(f"{path}/status", {"status": status})
        self._reported[uid] = status

    def _finish_deletion(self, pod: JsonObject) -> None:
        meta = pod["metadata"]
        running = self._processes.get(meta["uid"])
        if running is not None and not self._drained(pod, running):
            return
        self._processes.pop(meta["uid"], None)
        if running is not None:
            grace = float(meta.get("deletionGracePeriodSeconds") or 0)
            running.process.stop(grace_s=min(max(grace, 0.5), _MAX_GRACE_S))
        path = namespaced("pods", meta["namespace"], meta["name"])
        try:
            self._client.delete(
                path, {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
            )
        except KubeApiError as error:
            if error.status_code not in (404, 409):
                raise

    def _drained(self, pod: JsonObject, running: PodProcess) -> bool:
        """Whether a terminating pod's preStop sleep is over (as a kubelet runs it).

        Until then the process keeps serving but the pod is reported not ready, as the
        endpoints of a terminating pod are withdrawn while its preStop hook runs.
        """
        seconds = prestop_sleep_s(pod)
        if seconds <= 0:
            return True
        if running.seen.ready:
            running.seen = replace(running.seen, ready=False, ready_changed_at=timestamp())
            self._report(pod, running.seen, pod_ip=running.ip)
        started = self._terminating.setdefault(pod["metadata"]["uid"], time.monotonic())
        if time.monotonic() - started < min(seconds, _MAX_GRACE_S):
            return False
        del self._terminating[pod["metadata"]["uid"]]
        return True

    def _publish(self, pods_by_uid: Mapping[str, JsonObject]) -> None:
        """Publish the runtime pods: the pod map and file_sd list inference endpoints only."""
        addresses = [
            PodAddress(
                namespace=pods_by_uid[uid]["metadata"]["namespace"],
                pod=pods_by_uid[uid]["metadata"]["name"],
                address=address,
                ready=running.seen.ready,
                pid=running.process.pid,
                labels=dict(pods_by_uid[uid]["metadata"].get("labels", {})),
                grpc_address=running.grpc_address,
            )
            for uid, running in sorted(self._processes.items())
            if uid in pods_by_uid
            and running.process.is_running()
            and (address := running.address) is not None
        ]
        if addresses != self._published:
            self._write_addresses(addresses)

    def _publish_endpoints(self, pods: list[JsonObject]) -> None:
        """Write the pod network's EndpointSlices (`pod_endpoints`) when they changed."""
        services = self._client.get("/api/v1/services")["items"]
        wanted = {
            (found["metadata"]["namespace"], found["metadata"]["name"]): found
            for found in endpoint_slices(services, pods)
        }
        if wanted == self._slices:
            return
        selector = {"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY}"}
        existing = {
            (item["metadata"]["namespace"], item["metadata"]["name"])
            for item in self._client.get(f"/apis/{_DISCOVERY}/endpointslices", selector)["items"]
        }
        for (namespace, name), found in wanted.items():
            if (namespace, name) in existing:
                body = {"ports": found["ports"], "endpoints": found["endpoints"]}
                path = namespaced("endpointslices", namespace, name, group_version=_DISCOVERY)
                self._client.merge_patch(path, body)
            else:
                collection = namespaced("endpointslices", namespace, group_version=_DISCOVERY)
                self._client.create(collection, found)
        for namespace, name in existing - wanted.keys():
            path = namespaced("endpointslices", namespace, name, group_version=_DISCOVERY)
            try:
                self._client.delete(path)
            except KubeApiError as error:
                if error.status_code != 404:
                    raise
        self._slices = wanted

    def _write_addresses(self, addresses: list[PodAddress]) -> None:
        write_pod_map(self._config.work_dir / POD_MAP_FILE, addresses)
        write_file_sd(self._config.work_dir / FILE_SD_FILE, addresses)
        self._published = addresses
