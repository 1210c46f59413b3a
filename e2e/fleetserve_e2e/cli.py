"""Command line behind the make targets: ``python -m fleetserve_e2e <command>``.

``tools`` builds the binaries, ``keda-tools`` KEDA's, ``storage-tools`` the storage servers',
``gateway-tools`` Traefik and ``images`` the container images; ``cluster-up``/``cluster-down`` and
``prometheus-up``/``prometheus-down`` start and stop background instances whose state lives
under ``~/.cache/fleetserve/``; ``run-cluster`` and ``run-prometheus`` are the daemons' bodies.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from pathlib import Path

from fleetserve_e2e import daemon
from fleetserve_e2e.cluster import (
    LocalCluster,
    local_runtime_images,
    standin_commands,
    venv_commands,
)
from fleetserve_e2e.gateway import build_gateway_tools
from fleetserve_e2e.images.build import build_images, report
from fleetserve_e2e.images.catalog import NAMES, ImagePlanError
from fleetserve_e2e.images.podman import PodmanError
from fleetserve_e2e.keda import build_keda
from fleetserve_e2e.paths import binary, state_dir
from fleetserve_e2e.prometheus import LocalPrometheus
from fleetserve_e2e.storage_tools import build_storage_tools
from fleetserve_e2e.toolchain import build_tools

CLUSTER = "cluster"
PROMETHEUS = "prometheus"
_UP_TIMEOUT_S = 180.0
_DOWN_TIMEOUT_S = 60.0


def _tools(_args: argparse.Namespace) -> None:
    build_tools()


def _keda_tools(_args: argparse.Namespace) -> None:
    build_keda()


def _storage_tools(_args: argparse.Namespace) -> None:
    build_storage_tools()


def _gateway_tools(_args: argparse.Namespace) -> None:
    build_gateway_tools()


def _images(args: argparse.Namespace) -> None:
    names = tuple(args.only or NAMES)
    try:
        built = build_images(names, torch_cpu_sha256=args.torch_cpu_sha256)
    except (ImagePlanError, PodmanError) as exc:
        raise SystemExit(f"images: {exc}") from None
    print(report(built))
    too_big = [item.spec.name for item in built if not item.within_bound]
    if too_big:
        raise SystemExit(f"images: over their size bound: {', '.join(too_big)}")


def _cluster_up(args: argparse.Namespace) -> None:
    state = state_dir(CLUSTER)
    info = daemon.running_info(state)
    if info is None:
        shutil.rmtree(state, ignore_errors=True)  # a fresh cluster; the last one's logs go
        run_args = ["run-cluster", f"--runtime={args.runtime}", *(["--keda"] if args.keda else [])]
        info = daemon.spawn(run_args, state, timeout_s=_UP_TIMEOUT_S)
    else:
        print("cluster already running", flush=True)
    print(f"KUBECONFIG={info['KUBECONFIG']}")
    print(f"# try: {binary('kubectl')} --kubeconfig={info['KUBECONFIG']} get nodes")
    print(f"# pod addresses: {info['POD_MAP']}; logs: {state}/logs")


def _cluster_down(_args: argparse.Namespace) -> None:
    _prometheus_down(_args)
    stopped = daemon.stop_daemon(state_dir(CLUSTER), timeout_s=_DOWN_TIMEOUT_S)
    print("cluster stopped" if stopped else "no cluster was running")


def _run_cluster(args: argparse.Namespace) -> None:
    commands = standin_commands() if args.runtime == "standin" else venv_commands()
    state = state_dir(CLUSTER)
    in_containers = args.runtime == "image"
    with LocalCluster(
        work_dir=state,
        commands=commands,
        keda=args.keda,
        pod_backend="containers" if in_containers else "processes",
        pod_images=local_runtime_images() if in_containers else None,
    ) as cluster:
        info = {
            "KUBECONFIG": str(cluster.kubeconfig),
            "POD_MAP": str(cluster.pod_map_path),
            "FILE_SD": str(cluster.file_sd_path),
        }
        daemon.serve(state, info)


def _prometheus_up(args: argparse.Namespace) -> None:
    cluster = daemon.running_info(state_dir(CLUSTER))
    if cluster is None:
        raise SystemExit("no cluster is running; run `make cluster-up` first")
    state = state_dir(PROMETHEUS)
    info = daemon.running_info(state)
    if info is None:
        shutil.rmtree(state, ignore_errors=True)
        run_args = [
            "run-prometheus",
            f"--file-sd={cluster['FILE_SD']}",
            f"--scrape-interval-s={args.scrape_interval_s}",
        ]
        info = daemon.spawn(run_args, state, timeout_s=_UP_TIMEOUT_S)
    print(f"PROMETHEUS_URL={info['PROMETHEUS_URL']}")


def _prometheus_down(_args: argparse.Namespace) -> None:
    if daemon.stop_daemon(state_dir(PROMETHEUS), timeout_s=_DOWN_TIMEOUT_S):
        print("prometheus stopped")


def _run_prometheus(args: argparse.Namespace) -> None:
    state = state_dir(PROMETHEUS)
    with LocalPrometheus(
        Path(args.file_sd), scrape_interval_s=args.scrape_interval_s, work_dir=state
    ) as prometheus:
        daemon.serve(state, {"PROMETHEUS_URL": prometheus.url})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fleetserve_e2e", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    handlers: dict[str, Callable[[argparse.Namespace], None]] = {
        "tools": _tools,
        "keda-tools": _keda_tools,
        "storage-tools": _storage_tools,
        "gateway-tools": _gateway_tools,
        "images": _images,
        "cluster-up": _cluster_up,
        "cluster-down": _cluster_down,
        "run-cluster": _run_cluster,
        "prometheus-up": _prometheus_up,
        "prometheus-down": _prometheus_down,
        "run-prometheus": _run_prometheus,
    }
    for name, handler in handlers.items():
        sub = commands.add_parser(name, help=handler.__name__.strip("_").replace("_", " "))
        sub.set_defaults(handler=handler)
        if name in ("cluster-up", "run-cluster"):
            sub.add_argument(
                "--runtime",
                choices=["venv", "standin", "image"],
                default="venv",
                help="run runtime pods with the repo venv's fleetserve-runtime, the stand-in, or "
                "as podman containers of the built runtime image (make images)",
            )
            sub.add_argument(
                "--keda",
                action="store_true",
                help="also run KEDA's operator and metrics API server (make keda-tools)",
            )
        if name == "images":
            sub.add_argument("--only", action="append", choices=NAMES, help="build only these")
            sub.add_argument(
                "--torch-cpu-sha256",
                default="",
                help="sha256 of torch's CPU wheel (runtime-cpu; not on PyPI, so not locked)",
            )
        if name in ("prometheus-up", "run-prometheus"):
            sub.add_argument("--scrape-interval-s", type=float, default=1.0)
        if name == "run-prometheus":
            sub.add_argument("--file-sd", required=True)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` and run the chosen command."""
    args = _parser().parse_args(argv)
    args.handler(args)
