"""The operator at scale: N InferenceServices on KWOK nodes, measured (``make bench-operator``).

``python -m fleetserve_e2e.operator_scale --services 1000 --json out.json`` starts a local
control plane whose only nodes are KWOK nodes (``kwok``), installs the CRD, runs the real
operator as e2e runs it (``operator_process``: a subprocess under the shipped RBAC, watching
one namespace, no Prometheus URL), creates N synthetic services with 2 replicas each, then
measures:

- ``ready_s``: from the first create until every service reports Ready with both replicas,
  as a watch of the services sees it (`ready_watch`: a list of them every few seconds would
  load the API server it measures);
- idle API traffic: every request the operator's ServiceAccount makes, from the API server's
  **audit log** (policy: Metadata level for ServiceAccounts, nothing else), over a window
  after a settle period. The audit log is the trustworthy count: it sees every write, kopf's
  own annotation and finalizer patches and Events included, whatever the operator believes
  it did. Dry-run requests (the operator's pre-write checks) are counted apart: they store
  nothing;
- change → patch latency: M services get a new ``spec.batching.maxBatchSize`` at a steady
  pace; the latency is from the PATCH until a watch on Deployments sees that service's
  Deployment at a new generation;
- the operator's peak RSS (``VmHWM`` of ``/proc/<pid>/status``) and CPU seconds
  (``/proc/<pid>/stat``), in all and until every service is Ready;
- a leader hand-over: a standby starts, the leader stops (releasing its Lease), and a few
  services are changed at once and during the new leader's replay of the fleet.

The result is written as JSON (`ScaleResult`); ``bench/operator_bench.py`` prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import Field, asdict, dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from fleetserve_operator.controller.metrics import COALESCED

from fleetserve_e2e.cluster import LocalCluster
from fleetserve_e2e.kubeapi import JsonObject, KubeApiError, KubeClient
from fleetserve_e2e.kwok import KwokNodes, kwok_cluster
from fleetserve_e2e.operator_process import (
    INSTANCE_LABEL,
    ROLE,
    OperatorIdentity,
    OperatorProcess,
    child_path,
    fsvc_path,
    install_crd,
)
from fleetserve_e2e.proc_stats import ProcessSampler, machine_busy_s
from fleetserve_e2e.ready_watch import ReadyWatch
from fleetserve_e2e.waiting import GiveUpError, wait_until

NAMESPACE = "bench"
REPLICAS = 2
READY_POLL_S = 0.1
"""How often the bench and its floor look at their watch's count: the CPU figures until all
Ready are read at the first look after the last object became ready (its time is the watch's)."""
_WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
AUDIT_POLICY: JsonObject = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


def bench_service(name: str, *, replicas: int = REPLICAS) -> JsonObject:
    """A synthetic-model InferenceService with `replicas` CPU replicas."""
    return {
        "apiVersion": "serving.fleetserve.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": name, "version": "1", "uri": "builtin://synthetic?latency_ms=1"},
            "runtime": {"replicas": {"min": replicas, "max": replicas}, "device": "cpu"},
            "batching": {"maxBatchSize": 4, "maxQueueDelayMs": 1},
            "traffic": {"provider": "replicas"},
        },
    }


def service_names(count: int) -> list[str]:
    """The names of the bench's `count` services, in the order they are created."""
    return [f"svc-{i:04d}" for i in range(count)]


@dataclass(frozen=True)
class AuditCount:
    """The operator's requests in a window of the audit log."""

    writes: int
    lease_writes: int
    """Leader-election renewals: a constant heartbeat per operator, whatever N is."""
    dry_runs: int
    reads: int
    by_kind: dict[str, int]
    """``<verb> <resource>[/<subresource>]`` → count, writes other than the Lease's."""


def count_requests(lines: Iterable[str], *, username: str, start: float, end: float) -> AuditCount:
    """Count `username`'s requests received in ``[start, end)`` (Unix seconds) in audit lines.

    A watch is long-running and is counted once, when it starts.
    """
    counts: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    for line in lines:
        event = json.loads(line)
        kind = _request_kind(event, username)
        if kind is None or not start <= _unix(event["requestReceivedTimestamp"]) < end:
            continue
        counts[kind] += 1
        if kind == "write":
            ref = event.get("objectRef", {})
            sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
            by_kind[f"{event['verb']} {ref.get('resource', '?')}{sub}"] += 1
    return AuditCount(
        writes=counts["write"],
        lease_writes=counts["lease"],
        dry_runs=counts["dry-run"],
        reads=counts["read"],
        by_kind=dict(by_kind),
    )


def _request_kind(event: JsonObject, username: str) -> str | None:
    """``write``, ``lease``, ``dry-run`` or ``read`` for `username`'s requests, else None."""
    if event.get("user", {}).get("username") != username:
        return None
    if event["verb"] not in _WRITE_VERBS:
        return "read"
    if "dryRun=" in event.get("requestURI", ""):
        return "dry-run"
    if event.get("objectRef", {}).get("resource") == "leases":
        return "lease"
    return "write"


class AuditTail:
    """The lines an audit log gained since the last `read` (the log grows by 100s of MB)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[str]:
        """Complete lines appended since the last call."""
        with self._path.open("rb") as log:
            log.seek(self._offset)
            data = self._partial + log.read()
            self._offset = log.tell()
        *lines, self._partial = data.split(b"\n")
        return [line.decode("utf-8") for line in lines if line]


def wait_quiet(tail: AuditTail, username: str, *, quiet_s: float, timeout_s: float) -> float:
    """Wait until `username` made no write for `quiet_s`; returns the seconds waited.

    After "all Ready" the operator may still drain a backlog (kopf's own create handlers,
    queued child events); idle starts when that is done, not at a fixed time.
    """
    started = last_write = time.time()
    while True:
        for line in tail.read():
            event = json.loads(line)
            if _request_kind(event, username) == "write":
                last_write = max(last_write, _unix(event["requestReceivedTimestamp"]))
        now = time.time()
        if now - last_write >= quiet_s:
            return now - started
        if now - started > timeout_s:
            raise TimeoutError(f"the operator still wrote after {timeout_s:.0f}s")
        time.sleep(1.0)


def _unix(stamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp with microseconds (audit events)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of `values` (`fraction` in (0, 1]); NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * fraction // 1))
    return ordered[int(rank) - 1]


@dataclass(frozen=True)
class ScaleResult:
    """Everything one run measured (seconds, MB, requests)."""

    services: int
    pods: int
    create_s: float
    ready_s: float
    settle_s: float
    """From all Ready until the operator had made no write for the quiet period."""
    idle_window_s: float
    idle_writes: int
    idle_writes_per_min: float
    idle_lease_writes_per_min: float
    idle_dry_runs_per_min: float
    idle_reads_per_min: float
    idle_writes_by_kind: dict[str, int]
    changes: int
    changes_seen: int
    change_to_patch_p50_s: float
    change_to_patch_p99_s: float
    change_to_patch_max_s: float
    rss_peak_mb: float
    rss_idle_mb: float
    cpu_s: float
    cpu_idle_s: float
    cpu_ready_s: float
    """The operator's CPU seconds from its start until every service was Ready."""
    machine_cpu_ready_s: float
    """The whole machine's busy CPU seconds (all cores) from the first create until every
    service was Ready."""
    ready_writes_by_kind: dict[str, int]
    """The operator's writes from the first create until every service was Ready, by
    ``<verb> <resource>[/<subresource>]`` (its Lease renewals apart)."""
    ready_dry_runs: int
    ready_reads: int
    reconciles_by_trigger: dict[str, float]
    """The operator's own count (``fleetserve_operator_reconciles``) over the whole run, of
    the reconciles that ran."""
    coalesced_events: float
    """Child events over the whole run that merged into a reconcile already queued."""
    handover_changes: int
    handover_changes_seen: int
    handover_first_change_s: float
    """Change → patch of a change made as soon as the old leader exited (releasing the
    Lease): the standby's take-over, its start and its first reconcile together."""
    handover_change_p99_s: float
    """Change → patch of the changes made while the new leader replays the whole fleet."""


class DeploymentWatch:
    """Watches the namespace's Deployments; records when a service's Deployments change.

    A change is a Deployment of the service that is new (a spec change starts a canary) or
    at a higher generation than before the PATCH (the stable track's template changed).
    """

    def __init__(self, client: KubeClient, resource_version: str) -> None:
        self._client = client
        self._version = resource_version
        self._lock = threading.Lock()
        self._wanted: dict[str, tuple[dict[str, int], float]] = {}
        self.latencies: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deployment-watch", daemon=True)

    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current watch ends (at most its timeout)."""
        self._stop.set()

    def expect(self, owner: str, generations: dict[str, int], since: float) -> None:
        """Record the latency from `since` when `owner`'s Deployments leave `generations`.

        `generations` maps the name of each Deployment `owner` had before to its generation.
        """
        with self._lock:
            self._wanted[owner] = (generations, since)

    def _run(self) -> None:
        path = child_path("Deployment", NAMESPACE)
        while not self._stop.is_set():
            try:
                for event in self._client.watch(path, self._version, timeout_s=5):
                    self._seen(event.object, time.monotonic())
                    if self._stop.is_set():
                        return
            except (KubeApiError, httpx.HTTPError):
                time.sleep(0.2)  # a watch cut short is restarted from the last version

    def _seen(self, obj: JsonObject, now: float) -> None:
        meta = obj["metadata"]
        self._version = meta.get("resourceVersion", self._version)
        owner = (meta.get("labels") or {}).get(INSTANCE_LABEL)
        with self._lock:
            wanted = self._wanted.get(owner or "")
            if owner and wanted and meta.get("generation", 0) > wanted[0].get(meta["name"], 0):
                self.latencies[owner] = now - wanted[1]
                del self._wanted[owner]


def reconcile_counts(
    counters: Mapping[tuple[tuple[str, str], ...], float],
) -> tuple[dict[str, float], float]:
    """The reconciles that ran by trigger, and the child events merged into a queued one.

    `counters` is `fleetserve_operator_reconciles` by its labels (trigger and result).
    """
    ran: dict[str, float] = {}
    merged = 0.0
    for labels, value in counters.items():
        label = dict(labels)
        if label["result"] == COALESCED:
            merged += value
        else:
            ran[label["trigger"]] = ran.get(label["trigger"], 0.0) + value
    return ran, merged


def is_service_ready(item: JsonObject) -> bool:
    """Whether an InferenceService of the bench reports Ready with all its replicas ready."""
    status = item.get("status") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    replicas = (status.get("tracks") or {}).get("stable", {}).get("readyReplicas", 0)
    return bool(conditions.get("Ready") == "True" and replicas == REPLICAS)


def report_ready(watch: ReadyWatch, expected: int, what: str, printed: list[int]) -> float | None:
    """When `expected` objects were all ready, or None; prints the count when it changed.

    Raises:
        GiveUpError: the watch stopped for good.
    """
    if watch.failure is not None:
        raise GiveUpError(f"the watch of {what} stopped: {watch.failure!r}")
    ready = watch.ready_count
    if printed[-1:] != [ready]:
        print(f"{what}: {ready}/{expected}", flush=True)
        printed.append(ready)
    return watch.all_ready_at(expected)


@dataclass(frozen=True)
class ScaleConfig:
    """What to run: counts, paces and windows (seconds)."""

    services: int = 1000
    changes: int = 50
    change_interval_s: float = 0.2
    handover_changes: int = 10
    """Changes made as the leader hands over to a standby (0: no hand-over)."""
    settle_s: float = 15.0
    idle_window_s: float = 120.0
    ready_timeout_s: float = 1800.0
    operator_settings: Mapping[str, str] = field(default_factory=dict)
    operator_command: Sequence[str] | None = None
    """Replaces `fleetserve-operator run`, e.g. with a profiler around it."""


def _knobs() -> list[Field[Any]]:
    """`ScaleConfig`'s counts, paces and windows: each is the flag of its name (`knob_flag`)."""
    return [knob for knob in fields(ScaleConfig) if isinstance(knob.default, int | float)]


def knob_flag(name: str) -> str:
    """The command-line flag of the `ScaleConfig` field `name` (`settle_s`: `--settle-s`)."""
    return "--" + name.replace("_", "-")


def run(config: ScaleConfig, work_dir: Path) -> ScaleResult:
    """Run one measurement in a fresh cluster under `work_dir` (kept for its logs)."""
    with scale_cluster(config.services, work_dir) as cluster:
        return _measure(cluster, config, audit_log_path(work_dir), work_dir)


def audit_log_path(work_dir: Path) -> Path:
    """Where the API server of `scale_cluster(…, work_dir)` writes its audit log."""
    return work_dir / "logs" / "audit.log"


@contextlib.contextmanager
def scale_cluster(services: int, work_dir: Path) -> Iterator[LocalCluster]:
    """A KWOK cluster for `services` services of `REPLICAS` pods, auditing ServiceAccounts.

    The bench and its floor (`control_plane_floor`) run on clusters of this one shape, so
    that the API server does the same work for a request in both.
    """
    policy = work_dir / "audit-policy.yaml"
    work_dir.mkdir(parents=True, exist_ok=True)
    policy.write_text(yaml.safe_dump(AUDIT_POLICY), encoding="utf-8")
    audit_flags = [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={audit_log_path(work_dir)}",
        "--audit-log-format=json",
        "--audit-log-maxsize=0",
    ]
    pods = services * REPLICAS
    nodes = KwokNodes(count=max(1, -(-pods // 1000)) + 1)
    with kwok_cluster(
        nodes=nodes, work_dir=work_dir, extra_args={"kube-apiserver": audit_flags}
    ) as cluster:
        yield cluster


def _start_operator(
    cluster: LocalCluster, identity: OperatorIdentity, config: ScaleConfig, log_path: Path
) -> OperatorProcess:
    """An operator of the bench (the leader, or its standby): same identity and settings."""
    return OperatorProcess.start(
        kubeconfig=identity.kubeconfig,
        namespace=NAMESPACE,
        log_path=log_path,
        marker=cluster.marker,
        settings=config.operator_settings,
        command=config.operator_command,
    )


def _measure(
    cluster: LocalCluster, config: ScaleConfig, audit_log: Path, work_dir: Path
) -> ScaleResult:
    kube = cluster.client
    install_crd(cluster)
    identity = OperatorIdentity.create(
        cluster, rbac_file=ROLE, suffix="bench", kubeconfig=work_dir / "operator.kubeconfig"
    )
    account = next(yaml.safe_load_all(ROLE.read_text(encoding="utf-8")))["metadata"]["name"]
    username = f"system:serviceaccount:{identity.namespace}:{account}"
    kube.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    identity.grant_leader_lease(kube, NAMESPACE)
    operator = _start_operator(cluster, identity, config, work_dir / "logs" / "operator.log")
    sampler = ProcessSampler(operator.process.pid)
    sampler.start()
    tail = AuditTail(audit_log)
    try:
        names = service_names(config.services)
        machine_started = machine_busy_s()
        started = time.monotonic()
        wall_started = time.time()
        with ReadyWatch(kube, fsvc_path(NAMESPACE), is_service_ready) as watch:
            for name in names:
                kube.create(fsvc_path(NAMESPACE), bench_service(name))
            created = time.monotonic()
            print(f"created {len(names)} services in {created - started:.1f}s", flush=True)
            printed: list[int] = []

            def all_ready() -> float | None:
                operator.process.ensure_running()  # a crashed operator makes no one Ready
                return report_ready(watch, len(names), "ready", printed)

            ready_at = wait_until(
                all_ready,
                timeout_s=config.ready_timeout_s,
                what="every service to be Ready",
                interval_s=READY_POLL_S,
            )
            cpu_ready = sampler.cpu_s()
            machine_ready = machine_busy_s() - machine_started
            ready_s = ready_at - started
        print(f"all {len(names)} services Ready after {ready_s:.1f}s", flush=True)
        until_ready = count_requests(
            tail.read(), username=username, start=wall_started, end=wall_started + ready_s
        )
        settled_s = wait_quiet(
            tail, username, quiet_s=config.settle_s, timeout_s=config.ready_timeout_s
        )
        print(f"no operator write for {config.settle_s:.0f}s after {settled_s:.1f}s", flush=True)
        idle_rss = sampler.status_mb("VmRSS")
        cpu_before = sampler.cpu_s()
        window_start = time.time()
        time.sleep(config.idle_window_s)
        window_end = time.time()
        cpu_idle = sampler.cpu_s() - cpu_before
        idle = count_requests(tail.read(), username=username, start=window_start, end=window_end)
        print(f"idle: {idle}", flush=True)
        latencies = _change_latencies(cluster, names, config.changes, config.change_interval_s)
        cpu_s = sampler.cpu_s()
        peak = sampler.status_mb("VmHWM")
        counters = operator.counters("fleetserve_operator_reconciles")
        reconciles, coalesced = reconcile_counts(counters)
        sampler.stop()
        handover = _handover(cluster, identity, operator, names, config, work_dir)
    finally:
        sampler.stop()
        operator.stop()
    per_min = 60.0 / config.idle_window_s
    values = list(latencies.values())
    return ScaleResult(
        services=config.services,
        pods=config.services * REPLICAS,
        create_s=round(created - started, 2),
        ready_s=round(ready_s, 2),
        settle_s=round(settled_s, 2),
        idle_window_s=config.idle_window_s,
        idle_writes=idle.writes,
        idle_writes_per_min=round(idle.writes * per_min, 2),
        idle_lease_writes_per_min=round(idle.lease_writes * per_min, 2),
        idle_dry_runs_per_min=round(idle.dry_runs * per_min, 2),
        idle_reads_per_min=round(idle.reads * per_min, 2),
        idle_writes_by_kind=idle.by_kind,
        changes=min(config.changes, config.services),
        changes_seen=len(values),
        change_to_patch_p50_s=round(percentile(values, 0.50), 3),
        change_to_patch_p99_s=round(percentile(values, 0.99), 3),
        change_to_patch_max_s=round(max(values, default=float("nan")), 3),
        rss_peak_mb=round(peak, 1),
        rss_idle_mb=round(idle_rss, 1),
        cpu_s=round(cpu_s, 2),
        cpu_idle_s=round(cpu_idle, 2),
        cpu_ready_s=round(cpu_ready, 2),
        machine_cpu_ready_s=round(machine_ready, 2),
        ready_writes_by_kind=until_ready.by_kind,
        ready_dry_runs=until_ready.dry_runs,
        ready_reads=until_ready.reads,
        reconciles_by_trigger=dict(reconciles),
        coalesced_events=coalesced,
        handover_changes=min(config.handover_changes, config.services),
        handover_changes_seen=len(handover.latencies),
        handover_first_change_s=round(handover.first_change_s, 3),
        handover_change_p99_s=round(percentile(list(handover.latencies.values()), 0.99), 3),
    )


@dataclass(frozen=True)
class Handover:
    """What a leader hand-over measured (seconds)."""

    first_change_s: float
    """The latency of the first change, made as soon as the old leader has exited."""
    latencies: dict[str, float]


def _handover(
    cluster: LocalCluster,
    identity: OperatorIdentity,
    leader: OperatorProcess,
    names: list[str],
    config: ScaleConfig,
    work_dir: Path,
) -> Handover:
    """Start a standby, stop the leader, and time changes made while the standby takes over.

    The first change is made as the leader exits: it waits for the standby to take the
    Lease, start, and serve it ahead of its replay of the fleet (every service resumed,
    every child listed). The rest follow at `change_interval_s`, during that replay.
    """
    if config.handover_changes == 0 or len(names) < 2:
        return Handover(first_change_s=float("nan"), latencies={})
    standby = _start_operator(cluster, identity, config, work_dir / "logs" / "operator-standby.log")
    try:
        leader.stop()
        latencies = _change_latencies(
            cluster,
            names[1:],  # not the services the steady-state changes patched first
            config.handover_changes,
            config.change_interval_s,
            batch_size=16,
        )
    finally:
        standby.stop()
    return Handover(first_change_s=latencies.get(names[1], float("nan")), latencies=latencies)


def _change_latencies(
    cluster: LocalCluster,
    names: list[str],
    changes: int,
    interval_s: float,
    *,
    batch_size: int = 8,
) -> dict[str, float]:
    """Patch `changes` services evenly spread over `names`; the latency of each, by name.

    Each gets `maxBatchSize` `batch_size`, one every `interval_s`.
    """
    kube = cluster.client
    listed = kube.get(child_path("Deployment", NAMESPACE))
    generations: dict[str, dict[str, int]] = {}
    for item in listed["items"]:
        meta = item["metadata"]
        owner = (meta.get("labels") or {}).get(INSTANCE_LABEL, "")
        generations.setdefault(owner, {})[meta["name"]] = meta["generation"]
    watch = DeploymentWatch(
        KubeClient(cluster.server, cluster.pki), listed["metadata"]["resourceVersion"]
    )
    watch.start()
    count = min(changes, len(names))
    step = len(names) / count
    chosen = [names[int(i * step)] for i in range(count)]
    try:
        for name in chosen:
            since = time.monotonic()
            watch.expect(name, generations.get(name, {}), since)
            patch = {"spec": {"batching": {"maxBatchSize": batch_size}}}
            kube.merge_patch(fsvc_path(NAMESPACE, name), patch)
            time.sleep(max(0.0, interval_s - (time.monotonic() - since)))
        deadline = time.monotonic() + 60.0
        while len(watch.latencies) < count and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        watch.stop()
    return dict(watch.latencies)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fleetserve_e2e.operator_scale")
    for knob in _knobs():
        parser.add_argument(knob_flag(knob.name), type=type(knob.default), default=knob.default)
    parser.add_argument(
        "--operator-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an extra FLEETSERVE_* variable for the operator (repeatable)",
    )
    parser.add_argument(
        "--operator-command", help="run this instead of `fleetserve-operator run` (shell words)"
    )
    parser.add_argument("--work-dir", type=Path, help="keep the cluster's files and logs here")
    parser.add_argument("--json", type=Path, required=True, help="write the result here")
    return parser


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def write_result(
    json_path: Path, work_dir: Path | None, measure: Callable[[Path], Mapping[str, Any]]
) -> None:
    """Run `measure` in `work_dir` and write what it returns to `json_path` as JSON.

    Without a `work_dir`, a temporary one is used and removed after. SIGTERM (a `timeout`,
    a CI cancel) unwinds instead of killing, so the cluster is still torn down.
    """
    signal.signal(signal.SIGTERM, _exit_on_signal)
    scratch = work_dir or Path(tempfile.mkdtemp(prefix="fleetserve-scale-"))
    try:
        result = measure(scratch)
    finally:
        if work_dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    json_path.write_text(json.dumps(result, indent=2), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """Parse `argv`, run once, write the JSON result."""
    args = _parser().parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.operator_setting)
    config = ScaleConfig(
        **{knob.name: getattr(args, knob.name) for knob in _knobs()},
        operator_settings=settings,
        operator_command=shlex.split(args.operator_command) if args.operator_command else None,
    )
    write_result(args.json, args.work_dir, lambda work_dir: asdict(run(config, work_dir)))


if __name__ == "__main__":
    main()
