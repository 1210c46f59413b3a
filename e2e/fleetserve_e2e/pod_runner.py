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

Polling, rather than a watch, keeps this small and restart-proof; a list every few hundred
milliseconds is nothing for a local API server.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from fleetserve_e2e.identity import (
    ProjectedToken,
    projected_token,
    request_token,
    write_token_kubeconfig,
)
from fleetserve_e2e.kubeapi import JsonObject, KubeApiError, KubeClient, namespaced
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
from fleetserve_e2e.ports import free_port
from fleetserve_e2e.processes import ManagedProcess, start_process

_MAX_GRACE_S = 10.0
_PROBE_TIMEOUT_S = 1.0


@dataclass
class PodProcess:
    """A Fleetserve pod's local process and what the harness observed about it."""

    plan: LaunchPlan
    log_path: Path
    process: ManagedProcess
    seen: Observation
    exited_at: float | None = None

    @property
    def address(self) -> str | None:
        """``127.0.0.1:<port>`` of a runtime's inference API; None for the operator."""
        port = self.plan.serving_port
        return None if port is None else f"{LOOPBACK}:{port}"

    @property
    def grpc_address(self) -> str | None:
        """``127.0.0.1:<port>`` of a runtime's gRPC listener; None when it has none."""
        port = self.plan.grpc_port
        return None if port is None else f"{LOOPBACK}:{port}"


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
        for uid in [uid for uid in self._reported if uid not in live_uids]:
            del self._reported[uid]
        for pod in pods:
            try:
                self._sync_pod(pod)
            except Exception as error:  # one bad pod must not stall the others
                self._record_error(
                    f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", error
                )
        self._publish({pod["metadata"]["uid"]: pod for pod in pods})

    def _sync_pod(self, pod: JsonObject) -> None:
        if pod["metadata"].get("deletionTimestamp"):
            self._finish_deletion(pod)
            return
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            return
        container = fleetserve_container(pod)
        if container is None:
            # KWOK-style: nothing runs, so report Running and Ready once and never change it.
            if pod["metadata"]["uid"] not in self._reported:
                now = timestamp()
                seen = Observation(started_at=now, ready_changed_at=now, running=True, ready=True)
                self._report(pod, seen)
            return
        running = self._processes.get(pod["metadata"]["uid"]) or self._launch(pod, container)
        self._supervise(running)
        self._report(pod, running.seen)

    def _launch(self, pod: JsonObject, container: JsonObject) -> PodProcess:
        meta = pod["metadata"]
        stem = self._config.work_dir / "pods" / f"{meta['namespace']}_{meta['name']}"
        token = projected_token(pod)
        kubeconfig = None if token is None else Path(f"{stem}.kubeconfig")
        plan = launch_plan(
            pod,
            container,
            commands=self._config.commands,
            base_env=self._config.base_env,
            allocate_port=free_port,
            kubeconfig=kubeconfig,
        )
        # Only once the plan holds: a pod spec the harness cannot run is retried every sync,
        # and must not request a token each time.
        if token is not None and kubeconfig is not None:
            self._write_token_kubeconfig(pod, token, kubeconfig)
        log_path = Path(f"{stem}.log")
        now = timestamp()
        running = PodProcess(
            plan=plan,
            log_path=log_path,
            process=self._start(plan, log_path),
            seen=Observation(started_at=now, ready_changed_at=now, running=True, ready=False),
        )
        self._processes[meta["uid"]] = running
        return running

    def _write_token_kubeconfig(self, pod: JsonObject, wanted: ProjectedToken, path: Path) -> None:
        """Write a kubeconfig at `path` with a token bound to the pod, as it mounts it."""
        token = request_token(
            self._client,
            namespace=pod["metadata"]["namespace"],
            account=wanted.account,
            expiration_s=wanted.expiration_s,
            audiences=wanted.audiences,
            bound_pod=pod,
        )
        write_token_kubeconfig(
            path, server=self._config.server, ca_cert=self._config.ca_cert, token=token
        )

    def _start(self, plan: LaunchPlan, log_path: Path) -> ManagedProcess:
        return start_process(
            log_path.stem, plan.argv, log_path=log_path, env=plan.env, cwd=self._config.work_dir
        )

    def _supervise(self, running: PodProcess) -> None:
        """Restart an exited process after the delay, and probe a live one for readiness."""
        seen = running.seen
        code = running.process.exit_code()
        if code is not None and running.exited_at is None:
            running.exited_at = time.monotonic()
            seen = replace(
                seen,
                running=False,
                ready=False,
                last_exit_code=code,
                last_finished_at=timestamp(),
                ready_changed_at=timestamp() if seen.ready else seen.ready_changed_at,
            )
        elif running.exited_at is not None:
            if time.monotonic() - running.exited_at >= self._config.restart_delay_s:
                running.process = self._start(running.plan, running.log_path)
                running.exited_at = None
                seen = replace(
                    seen, running=True, started_at=timestamp(), restart_count=seen.restart_count + 1
                )
        else:
            ready = self._is_ready(running.plan)
            if ready != seen.ready:
                seen = replace(seen, ready=ready, ready_changed_at=timestamp())
        running.seen = seen

    def _is_ready(self, plan: LaunchPlan) -> bool:
        if plan.readiness is None:
            return True
        url = f"http://{LOOPBACK}:{plan.readiness.port}{plan.readiness.path}"
        try:
            response = self._probe.get(url)
        except httpx.HTTPError:
            return False
        return response.status_code == httpx.codes.OK

    def _report(self, pod: JsonObject, seen: Observation) -> None:
        """Write the pod's status if it changed since the last write."""
        uid = pod["metadata"]["uid"]
        previous = self._reported.get(uid)
        status = pod_status(pod, seen)
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
            self._report(pod, running.seen)
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

    def _write_addresses(self, addresses: list[PodAddress]) -> None:
        write_pod_map(self._config.work_dir / POD_MAP_FILE, addresses)
        write_file_sd(self._config.work_dir / FILE_SD_FILE, addresses)
        self._published = addresses
