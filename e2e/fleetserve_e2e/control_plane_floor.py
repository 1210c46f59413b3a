"""The control plane's floor under the operator bench: the same fleet, no operator.

On a 2-core machine the control plane (API server, controller manager, etcd, scheduler,
KWOK) spends most of the CPU while 1000 services come up, so the bench's ``ready_s`` is
bounded below by what the control plane needs for the fleet, whatever the operator does.
This run measures that bound. In a fresh cluster of the bench's shape (`scale_cluster`)
the driver creates the bench's N InferenceServices one after another, as the bench does,
and as soon as each exists POSTs, from `writers` threads, the children the operator
creates on its first reconcile (`floor_children`), as the operator creates them: no
dry-run, no Event, no status write, no watch of the children. ``ready_s`` runs from the
first create until every service's Deployment reports ``REPLICAS`` ready replicas (seen by
a watch, as the bench sees its services: `ready_watch`). An operator that cost nothing
would still make these creates and then write a status, so on the same machine it could
not be Ready sooner.

``python -m fleetserve_e2e.control_plane_floor --services 1000 --json out.json``;
``bench/operator_bench.py`` runs it before the bench and prints both.

The driver can also make the operator's other kinds of request (`Extras`), to price each on
the control plane apart from the operator's own work: a dry-run of each child before its
create (`--dry-runs`), status writes and Events per service (`--status-writes N`,
`--events N`).
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fleetserve_operator import render
from fleetserve_operator.controller.kube import APPLY_CONTENT_TYPE
from fleetserve_operator.spec import InferenceServiceSpec, InferenceServiceStatus, RuntimeImages

from fleetserve_e2e.cluster import LocalCluster
from fleetserve_e2e.kubeapi import JsonObject, KubeClient, namespaced
from fleetserve_e2e.operator_process import MANAGER, child_path, fsvc_path, install_crd
from fleetserve_e2e.operator_scale import (
    NAMESPACE,
    READY_POLL_S,
    REPLICAS,
    bench_service,
    report_ready,
    scale_cluster,
    service_names,
    write_result,
)
from fleetserve_e2e.proc_stats import machine_busy_s
from fleetserve_e2e.ready_watch import ReadyWatch
from fleetserve_e2e.waiting import GiveUpError, wait_until

# The collections of the bench's children.
_PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "PodDisruptionBudget": "poddisruptionbudgets",
}


@dataclass(frozen=True)
class Extras:
    """The operator's kinds of request the driver makes besides its creates (none: the floor)."""

    dry_runs: bool = False
    """Dry-run each child's create first (a POST with `dryRun=All`), as the operator checks
    every write."""
    status_writes: int = 0
    """Server-side applies of the service's status, after its children."""
    events: int = 0
    """Events posted on the service, after its status writes."""


@dataclass(frozen=True)
class FloorResult:
    """What one floor run measured (seconds)."""

    services: int
    children: int
    """Children created, every service's together."""
    writers: int
    extras: Extras
    create_s: float
    """From the first InferenceService's create until the last one's."""
    ready_s: float
    machine_cpu_ready_s: float
    """The whole machine's busy CPU seconds (all cores) from the first create until all Ready."""
    driver_cpu_ready_s: float
    """This process's CPU seconds over the same window (its creates, renders and POSTs, and
    its watch of the Deployments)."""


def floor_children(service: JsonObject) -> list[JsonObject]:
    """The children the operator creates on `service`'s first reconcile (built-in images).

    `service` is the InferenceService as the API server returned it (its uid is the owner's).
    """
    meta = service["metadata"]
    owner = render.Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    spec = InferenceServiceSpec.model_validate(service["spec"]).with_images(RuntimeImages())
    return render.desired_children(owner, spec, InferenceServiceStatus())


_MANAGED = {"fieldManager": MANAGER}


def _create_children(kube: KubeClient, service: JsonObject, extras: Extras) -> int:
    children = floor_children(service)
    for child in children:
        group_version = "" if child["apiVersion"] == "v1" else child["apiVersion"]
        path = namespaced(_PLURALS[child["kind"]], NAMESPACE, group_version=group_version)
        if extras.dry_runs:
            kube.request("POST", path, body=child, params={**_MANAGED, "dryRun": "All"})
        kube.request("POST", path, body=child, params=_MANAGED)
    _report(kube, service, extras)
    return len(children)


def _report(kube: KubeClient, service: JsonObject, extras: Extras) -> None:
    """The status writes and Events of `extras`, made as the operator makes them."""
    meta = service["metadata"]
    for _ in range(extras.status_writes):
        body = {
            "apiVersion": service["apiVersion"],
            "kind": service["kind"],
            "metadata": {"name": meta["name"], "namespace": NAMESPACE},
            "status": {"observedGeneration": meta["generation"], "phase": "Pending"},
        }
        path = fsvc_path(NAMESPACE, meta["name"]) + "/status"
        forced = {**_MANAGED, "force": "true"}
        kube.request("PATCH", path, body=body, params=forced, content_type=APPLY_CONTENT_TYPE)
    for index in range(extras.events):
        involved = {
            "apiVersion": service["apiVersion"],
            "kind": service["kind"],
            "name": meta["name"],
            "namespace": NAMESPACE,
            "uid": meta["uid"],
        }
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": NAMESPACE},
            "involvedObject": involved,
            "type": "Normal",
            "reason": "Floor",
            "message": f"event {index} of the floor's driver",
            "source": {"component": MANAGER},
        }
        kube.create(namespaced("events", NAMESPACE), event)


def is_deployment_ready(item: JsonObject) -> bool:
    """Whether a Deployment of the floor has all its replicas ready."""
    return bool((item.get("status") or {}).get("readyReplicas") == REPLICAS)


def run(
    services: int,
    *,
    writers: int,
    ready_timeout_s: float,
    work_dir: Path,
    extras: Extras = Extras(),
) -> FloorResult:
    """Run once in a fresh cluster under `work_dir` (kept for its logs)."""
    with scale_cluster(services, work_dir) as cluster:
        return _measure(cluster, services, writers, ready_timeout_s, extras)


def _measure(
    cluster: LocalCluster, services: int, writers: int, ready_timeout_s: float, extras: Extras
) -> FloorResult:
    kube = cluster.client
    install_crd(cluster)
    kube.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    # The API server's first create of a new CRD's kind takes about 2 s (its handler is
    # still being set up); in the bench the operator's start hides it, here a dry-run does.
    warm = {"dryRun": "All"}
    kube.request("POST", fsvc_path(NAMESPACE), body=bench_service("warm-up"), params=warm)
    names = service_names(services)
    deployments = child_path("Deployment", NAMESPACE)
    with (
        ThreadPoolExecutor(max_workers=writers, thread_name_prefix="floor-writer") as pool,
        ReadyWatch(kube, deployments, is_deployment_ready) as watch,
    ):
        machine_started = machine_busy_s()
        driver_started = time.process_time()
        started = time.monotonic()
        writes: list[Future[int]] = []
        for name in names:
            service = kube.create(fsvc_path(NAMESPACE), bench_service(name))
            writes.append(pool.submit(_create_children, kube, service, extras))
        created = time.monotonic()
        print(f"floor: created {len(names)} services in {created - started:.1f}s", flush=True)
        printed: list[int] = []

        def all_ready() -> float | None:
            for write in writes:
                if write.done() and (error := write.exception()) is not None:
                    raise GiveUpError(f"a child's create failed: {error}") from error
            return report_ready(watch, len(names), "floor ready", printed)

        ready_at = wait_until(
            all_ready,
            timeout_s=ready_timeout_s,
            what="every service's Deployment to be ready",
            interval_s=READY_POLL_S,
        )
        machine_ready = machine_busy_s() - machine_started
        driver_ready = time.process_time() - driver_started
        ready_s = ready_at - started
    print(f"floor: all {len(names)} Deployments ready after {ready_s:.1f}s", flush=True)
    return FloorResult(
        services=services,
        children=sum(write.result() for write in writes),
        writers=writers,
        extras=extras,
        create_s=round(created - started, 2),
        ready_s=round(ready_s, 2),
        machine_cpu_ready_s=round(machine_ready, 2),
        driver_cpu_ready_s=round(driver_ready, 2),
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fleetserve_e2e.control_plane_floor")
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--writers", type=int, default=8, help="threads POSTing children")
    parser.add_argument("--ready-timeout-s", type=float, default=1800.0)
    parser.add_argument("--dry-runs", action="store_true", help="dry-run each create first")
    parser.add_argument("--status-writes", type=int, default=0, help="per service")
    parser.add_argument("--events", type=int, default=0, help="per service")
    parser.add_argument("--work-dir", type=Path, help="keep the cluster's files and logs here")
    parser.add_argument("--json", type=Path, required=True, help="write the result here")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Parse `argv`, run once, write the JSON result."""
    args = _parser().parse_args(argv)

    def measure(work_dir: Path) -> dict[str, Any]:
        floor = run(
            args.services,
            writers=args.writers,
            ready_timeout_s=args.ready_timeout_s,
            work_dir=work_dir,
            extras=Extras(args.dry_runs, args.status_writes, args.events),
        )
        return asdict(floor)

    write_result(args.json, args.work_dir, measure)


if __name__ == "__main__":
    main()
