"""The demo's story: two models in one fleet, a MiniLM rollout promoted, a bad one rolled back.

MiniLM (embeddings, the rollout's subject) and SmolLM2 (chat, streamed) are created together
and load side by side; SmolLM2's streamed answer is shown once the MiniLM traffic is on, so
the fleet serves both kinds of model at once before the rollouts begin.

Every process (control plane, Prometheus, operator, runtime pods, the load driver's thread) is
entered into one `ExitStack`, so Ctrl-C, SIGTERM, an error or `--exit` stops all of them.
Every wait has a deadline; a story that did not happen ends the program with exit status 1.
The last line is `DEMO_RESULT={json}`, which `demo_e2e/test_demo.py` reads.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from rich.console import Console
from rich.live import Live

from fleetserve_demo.display import RolloutView, traffic_line
from fleetserve_demo.manifest import (
    CHAT_LIMITS,
    CHAT_NAME,
    MAX_LATENCY_RATIO_VS_STABLE,
    bad_version,
    chat_service,
    demo_service,
    good_version,
)
from fleetserve_e2e import KubeClient, LocalCluster, LocalPrometheus
from fleetserve_e2e.chat import stream_chat
from fleetserve_e2e.loadgen import LoadDriver
from fleetserve_e2e.operator_process import (
    INSTANCE_LABEL,
    TRACK_LABEL,
    OperatorIdentity,
    OperatorProcess,
    condition,
    fsvc_path,
    fsvc_status,
    install_crd,
)
from fleetserve_e2e.paths import REPO_DIR, binary
from fleetserve_e2e.pod_map import PodAddress
from fleetserve_e2e.waiting import GiveUpError, wait_until

NAMESPACE = "demo"
NAME = "minilm"
CHART_RBAC = REPO_DIR / "charts" / "fleetserve" / "files" / "operator-rbac.yaml"
# Steps fall due by the operator's clock: tick well inside the demo's few-second intervals.
OPERATOR_SETTINGS = {"FLEETSERVE_ROLLOUT_TICK_S": "0.5"}
# Enough requests for the 1% step to be judged within a few windows, little enough for two
# cores that also run the control plane, Prometheus and three MiniLM processes.
LOAD_RPS = 30.0
# A fleet left running for a look around keeps its traffic for a day.
LOAD_FOREVER_S = 24 * 3600.0
REFRESH_S = 0.5
READY_TIMEOUT_S = 180.0
CHAT_QUESTION = "In two sentences, what is Kubernetes?"
CHAT_MAX_TOKENS = 64
ROLLOUT_TIMEOUT_S = 240.0
ROLLBACK_TIMEOUT_S = 150.0


class StoryError(GiveUpError):
    """The rollout ended otherwise than the story says (e.g. the good version rolled back)."""


@dataclass
class Outcome:
    """What happened, printed as the `DEMO_RESULT` line at the end."""

    ok: bool = False
    ready_s: dict[str, float] = field(default_factory=dict)
    chat: dict[str, Any] | None = None
    fleet: list[str] = field(default_factory=list)
    timeline: list[tuple[str, float]] = field(default_factory=list)
    promoted_version: str | None = None
    promotion_weights: list[int] = field(default_factory=list)
    promotion_analyses: list[dict[str, Any]] = field(default_factory=list)
    rollback_phase: str | None = None
    rollback_reason: str | None = None
    rollback_analyses: list[dict[str, Any]] = field(default_factory=list)
    time_to_rollback_s: float | None = None
    failure: str | None = None
    wall_s: float = 0.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """`--exit` (tear down at the end, for CI), `--fast` (3 s steps), `--interval S`."""
    parser = argparse.ArgumentParser(prog="python -m fleetserve_demo", description=__doc__)
    parser.add_argument(
        "--exit", action="store_true", help="tear everything down at the end instead of waiting"
    )
    parser.add_argument(
        "--fast", action="store_true", help="3 s rollout steps (same as --interval 3)"
    )
    parser.add_argument("--interval", type=int, default=5, help="seconds each step is held (5)")
    args = parser.parse_args(argv)
    if args.fast:
        args.interval = 3
    if args.interval < 1:
        parser.error("--interval must be at least 1 second")
    return args


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds the ExitStack, so a `kill` stops the fleet as Ctrl-C does.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run the story; 0 when both the promotion and the rollback happened."""
    args = parse_args(argv)
    console = Console(highlight=False, log_path=False)
    if not console.is_terminal:
        # CI logs: no live redraws, and wide enough for the analysis table.
        console.width = 140
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    outcome = Outcome()
    started = time.monotonic()
    try:
        with ExitStack() as stack:
            Story(console, args.interval, stack, outcome, started).run()
            outcome.ok = True
            if not args.exit:
                console.print("\n[bold]The fleet keeps running, with traffic. Ctrl-C stops it.[/]")
                while True:
                    signal.pause()
            console.rule("tearing down")
    except KeyboardInterrupt:
        console.print("stopped: every process the demo started was stopped")
        return 0 if outcome.ok else 130
    except (TimeoutError, GiveUpError, RuntimeError, FileNotFoundError) as error:
        outcome.failure = f"{type(error).__name__}: {error}"
        console.print(f"[bold red]The demo's story did not happen:[/] {outcome.failure}")
    outcome.wall_s = round(time.monotonic() - started, 1)
    # Written raw: rich would wrap a long line, and the test parses it.
    sys.stdout.write(f"DEMO_RESULT={json.dumps(outcome.__dict__)}\n")
    console.print(f"demo finished in {outcome.wall_s:.0f}s")
    return 0 if outcome.ok else 1


@dataclass
class Story:
    """The demo's steps; each says what it does before it does it."""

    console: Console
    interval_s: int
    stack: ExitStack
    outcome: Outcome
    started: float
    _chapter: int = 0

    def run(self) -> None:
        """Fleet up, traffic on, good version promoted, bad version rolled back, where to look."""
        cluster, prometheus, operator = self._start_fleet()
        kube = cluster.client
        service = demo_service(prometheus_url=prometheus.url, interval_s=self.interval_s)
        chat = chat_service(prometheus_url=prometheus.url)
        chat_created = self._serve(kube, service, chat)
        self._say("Live traffic: the load driver plays the gateway, by the HTTPRoute's weights")
        load = self.stack.enter_context(
            LoadDriver(
                cluster,
                NAMESPACE,
                NAME,
                service["spec"]["model"]["name"],
                rate_rps=LOAD_RPS,
                duration_s=LOAD_FOREVER_S,
            )
        )
        wait_until(
            lambda: any(r.status == 200 for r in load.by_track("stable")),
            timeout_s=30.0,
            what="the first answer from the stable track",
        )
        self._chat(cluster, chat_created)
        self._show_fleet(cluster, "The fleet: kubectl get fsvc")
        self._promote(kube, service, load)
        self._roll_back(kube, service, load)
        self._show_fleet(cluster, "The fleet after both rollouts: kubectl get fsvc")
        self._where_to_look(cluster, prometheus, operator)

    def _say(self, text: str) -> None:
        self._chapter += 1
        self._mark(f"{self._chapter}. {text}")
        self.console.rule(f"[bold]{self._chapter}. {text}", align="left")

    def _mark(self, event: str) -> None:
        self.outcome.timeline.append((event, round(time.monotonic() - self.started, 1)))

    def _start_fleet(self) -> tuple[LocalCluster, LocalPrometheus, OperatorProcess]:
        self._say("Local control plane (etcd, kube-apiserver, controller-manager, scheduler)")
        cluster = self.stack.enter_context(LocalCluster())
        prometheus = self.stack.enter_context(
            LocalPrometheus(cluster.file_sd_path, scrape_interval_s=1.0)
        )
        self.console.print(f"Prometheus ready at {prometheus.url}")
        self._say("InferenceService CRD and the operator, under the chart's least-privilege RBAC")
        install_crd(cluster)
        cluster.client.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        identity = OperatorIdentity.create(
            cluster,
            rbac_file=CHART_RBAC,
            suffix=NAMESPACE,
            kubeconfig=cluster.work_dir / "operator-kubeconfig",
        )
        identity.grant_leader_lease(cluster.client, NAMESPACE)
        operator = OperatorProcess.start(
            kubeconfig=identity.kubeconfig,
            namespace=NAMESPACE,
            log_path=cluster.work_dir / "logs" / "operator.log",
            marker=cluster.marker,
            settings={
                **OPERATOR_SETTINGS,
                "FLEETSERVE_ALLOWED_PROMETHEUS_URLS": json.dumps([prometheus.url]),
            },
        )
        self.stack.callback(operator.stop)
        self.console.print(
            f"fleetserve-operator (pid {operator.process.pid}) runs as "
            f"system:serviceaccount:{identity.namespace}:fleetserve-operator"
        )
        return cluster, prometheus, operator

    def _serve(self, kube: KubeClient, service: dict[str, Any], chat: dict[str, Any]) -> float:
        """Create both services; wait for MiniLM. Returns when SmolLM2 was created."""
        version = service["spec"]["model"]["version"]
        self._say(
            f"Two InferenceServices: {NAME} (examples/minilm.yaml, embeddings) and {CHAT_NAME} "
            "(examples/smollm2.yaml, chat)"
        )
        self.console.print(
            f"{NAME}: MiniLM v{version} · stable: 1 replica on a GPU node · fallback: 1 CPU "
            f"replica · steps {service['spec']['rollout']['steps']} every {self.interval_s}s"
        )
        self.console.print(
            f"{CHAT_NAME}: SmolLM2-135M-Instruct v{chat['spec']['model']['version']} "
            f"(task {chat['spec']['model']['task']}) · stable: 1 replica on a GPU node · "
            f"fallback: 1 CPU replica · {CHAT_LIMITS.describe()}"
        )
        self.console.print(
            "[dim]Here every pod runs on this machine's CPU with one torch thread: the "
            "examples' GPU-sized engine and budgets are shrunk to fit two cores and five "
            "model processes.[/]"
        )
        kube.create(fsvc_path(NAMESPACE), service)
        kube.create(fsvc_path(NAMESPACE), chat)
        created = time.monotonic()
        with self.console.status("loading MiniLM and SmolLM2 (stable and fallback pods)…"):
            self._wait_ready(kube, NAME, created, meanwhile=CHAT_NAME)
        return created

    def _wait_ready(
        self, kube: KubeClient, name: str, created: float, *, meanwhile: str | None = None
    ) -> None:
        """Wait for `name` to be Ready, noting when `meanwhile` is; a timeout says why not."""

        def ready() -> bool:
            if meanwhile is not None:
                self._check_ready(kube, meanwhile, created)
            return self._check_ready(kube, name, created)

        try:
            wait_until(ready, timeout_s=READY_TIMEOUT_S, what=f"{name} to be Ready", interval_s=0.5)
        except TimeoutError as error:
            why = _status(kube, name).get("lastError") or "its status names no error"
            raise TimeoutError(f"{error}: {why}") from error

    def _check_ready(self, kube: KubeClient, name: str, created: float) -> bool:
        """Whether `name` is Ready; the first time it is, say after how long."""
        if name not in self.outcome.ready_s and _ready(kube, name) is not None:
            ready_s = round(time.monotonic() - created, 1)
            self.outcome.ready_s[name] = ready_s
            self._mark(f"{name} Ready")
            self.console.print(f"{name} is Ready, {ready_s:.0f}s after it was created")
        return name in self.outcome.ready_s

    def _chat(self, cluster: LocalCluster, created: float) -> None:
        self._say(f"A streamed chat answer from {CHAT_NAME}, while MiniLM serves its traffic")
        with self.console.status("SmolLM2 is still loading…"):
            self._wait_ready(cluster.client, CHAT_NAME, created)
        pod = wait_until(
            lambda: _stable_pod(cluster, CHAT_NAME),
            timeout_s=30.0,
            what=f"the ready {CHAT_NAME} pod in the pod map",
        )
        self.console.print(
            f"[dim]POST {pod.url}/v1/chat/completions (stream: true) with the openai client, "
            "at the pod's address: the harness has no gateway[/]"
        )
        self.console.print(f"[bold]user:[/] {CHAT_QUESTION}")
        self.console.print(f"[bold]{CHAT_NAME}:[/] ", end="")
        answer = stream_chat(
            pod.url,
            CHAT_NAME,
            CHAT_QUESTION,
            max_tokens=CHAT_MAX_TOKENS,
            on_delta=lambda text: self.console.print(
                text, end="", markup=False, highlight=False, soft_wrap=True
            ),
        )
        self.console.print()
        self.console.print(
            f"[dim]{answer.prompt_tokens} prompt tokens, {answer.completion_tokens} generated in "
            f"{answer.chunks} streamed chunks; first token after [bold]{answer.ttft_s * 1000:.0f}"
            f" ms[/bold], then {answer.decode_tokens_per_s:.1f} tokens/s (one thread, shared "
            "cores)[/]"
        )
        self.outcome.chat = {
            "text": answer.text,
            "chunks": answer.chunks,
            "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens,
            "ttft_ms": round(answer.ttft_s * 1000, 1),
            "decode_tokens_per_s": round(answer.decode_tokens_per_s, 1),
        }

    def _show_fleet(self, cluster: LocalCluster, title: str) -> None:
        self._say(title)
        listed = cluster.kubectl("get", "fsvc", "-n", NAMESPACE)
        if listed.returncode != 0:
            raise RuntimeError(f"kubectl get fsvc failed: {listed.stderr}")
        self.console.print(listed.stdout.rstrip(), markup=False, highlight=False, soft_wrap=True)
        # The first column of every row after the header is a service's name.
        self.outcome.fleet = [line.split()[0] for line in listed.stdout.splitlines()[1:] if line]

    def _follow(
        self,
        kube: KubeClient,
        load: LoadDriver,
        view: RolloutView,
        done: Callable[[dict[str, Any]], bool],
        timeout_s: float,
        what: str,
    ) -> dict[str, Any]:
        """Redraw the rollout until `done(status)`; a rollout that ended otherwise gives up."""

        def step() -> dict[str, Any] | None:
            status = _status(kube)
            new, moved = view.update(status)
            if moved is not None:
                self.console.log(f"canary weight → [bold]{moved}%[/]")
            for row in new:
                self.console.log(row.describe())
            live.update(view.render(load))
            if done(status):
                return status
            if status.get("phase") in ("RolledBack", "Failed"):
                raise StoryError(f"phase {status['phase']}: {status['rollout'].get('message')}")
            return None

        try:
            with Live(view.render(load), console=self.console, refresh_per_second=4) as live:
                return wait_until(step, timeout_s=timeout_s, what=what, interval_s=REFRESH_S)
        finally:
            if not self.console.is_terminal:
                # Off a terminal Live prints its last frame without a line break.
                self.console.line()

    def _promote(self, kube: KubeClient, service: dict[str, Any], load: LoadDriver) -> None:
        self._say("Roll out MiniLM v2: canary steps, each judged by Prometheus")
        steps = service["spec"]["rollout"]["steps"]
        view = RolloutView("rollout v1 → v2", steps, MAX_LATENCY_RATIO_VS_STABLE)
        kube.merge_patch(fsvc_path(NAMESPACE, NAME), good_version(service, "2"))
        status = self._follow(
            kube,
            load,
            view,
            lambda s: s.get("stableVersion") == "2" and s.get("phase") == "Succeeded",
            ROLLOUT_TIMEOUT_S,
            "v2 to be promoted",
        )
        self.outcome.promoted_version = status["stableVersion"]
        self.outcome.promotion_weights = view.weights_seen
        self.outcome.promotion_analyses = [row.as_dict() for row in view.rows]
        note = condition(status, "Promoted")["message"]
        self.console.print(
            f"[bold green]Promoted:[/] stable is v{status['stableVersion']}; canary weights seen "
            f"{view.weights_seen}" + (f"; {note}" if note else "")
        )
        self.console.print(traffic_line(load))

    def _roll_back(self, kube: KubeClient, service: dict[str, Any], load: LoadDriver) -> None:
        self._say("Roll out a bad v3 (same model name, fails 30% of requests): automatic rollback")
        steps = service["spec"]["rollout"]["steps"]
        view = RolloutView("rollout v2 → v3 (bad)", steps, MAX_LATENCY_RATIO_VS_STABLE)
        view.skip_earlier(_status(kube))
        patched_at = time.monotonic()
        kube.merge_patch(fsvc_path(NAMESPACE, NAME), bad_version(service, "3"))
        status = self._follow(
            kube,
            load,
            view,
            lambda s: s.get("phase") == "RolledBack",
            ROLLBACK_TIMEOUT_S,
            "v3 to be rolled back",
        )
        if status.get("stableVersion") != "2":
            raise StoryError(f"after the rollback stable is v{status.get('stableVersion')}")
        reason = condition(status, "Promoted")["message"] or status["rollout"].get("message", "")
        self.outcome.rollback_phase = status["phase"]
        self.outcome.rollback_reason = reason
        self.outcome.rollback_analyses = [row.as_dict() for row in view.rows]
        self.outcome.time_to_rollback_s = _time_to_rollback(load, patched_at)
        self.console.print(f"[bold red]Rolled back:[/] {reason}")
        self.console.print(
            f"stable stays v{status['stableVersion']}; from the first failed canary request to "
            f"canary weight 0: [bold]{self.outcome.time_to_rollback_s:.1f}s[/]"
        )
        self.console.print(traffic_line(load))

    def _where_to_look(
        self, cluster: LocalCluster, prometheus: LocalPrometheus, operator: OperatorProcess
    ) -> None:
        self._say("Where to look")
        kubectl = binary("kubectl")
        stable = next(
            (
                pod
                for pod in cluster.pod_addresses()
                if pod.namespace == NAMESPACE and pod.labels.get(TRACK_LABEL) == "stable"
            ),
            None,
        )
        chat = _stable_pod(cluster, CHAT_NAME)
        selector = f'namespace="{NAMESPACE}",model="{NAME}"'
        chat_selector = f'namespace="{NAMESPACE}",model="{CHAT_NAME}"'
        lines = [
            f"export KUBECONFIG={cluster.kubeconfig}",
            f"{kubectl} get fsvc -n {NAMESPACE}",
            f"{kubectl} get fsvc {NAME} -n {NAMESPACE} -o yaml   # status.rollout.analyses",
            f"{kubectl} get deploy,pods,httproute -n {NAMESPACE}",
            f"{kubectl} get events -n {NAMESPACE} --field-selector involvedObject.name={NAME}",
            "",
            f"Prometheus: {prometheus.url}/graph",
            f"  sum by (track, version, code) (rate(fleetserve_requests_total{{{selector}}}[1m]))",
            "  histogram_quantile(0.99, sum by (le, track) "
            f"(rate(fleetserve_request_duration_seconds_bucket{{{selector}}}[1m])))",
            f"  avg by (track) (fleetserve_batch_size_sum{{{selector}}} "
            f"/ fleetserve_batch_size_count{{{selector}}})",
            "  histogram_quantile(0.99, sum by (le) "
            f"(rate(fleetserve_time_to_first_token_seconds_bucket{{{chat_selector}}}[5m])))",
            "  histogram_quantile(0.99, sum by (le) "
            f"(rate(fleetserve_inter_token_latency_seconds_bucket{{{chat_selector}}}[5m])))",
            "",
            f"chat with {CHAT_NAME} at its pod's address (more in docs/reference/generation.md):",
            f"  curl -sN {chat.url if chat else '-'}/v1/chat/completions -H "
            f'\'content-type: application/json\' -d \'{{"model": "{CHAT_NAME}", '
            '"stream": true, "messages": [{"role": "user", "content": "Hello!"}]}\'',
            "",
            f"runtime metrics (stable pod): {stable.url + '/metrics' if stable else '-'}",
            f"operator metrics: {operator.metrics_url}",
            f"operator log: {operator.process.log_path}",
        ]
        for line in lines:
            self.console.print(line, soft_wrap=True)


def _status(kube: KubeClient, name: str = NAME) -> dict[str, Any]:
    return fsvc_status(kube, NAMESPACE, name)


def _ready(kube: KubeClient, name: str) -> dict[str, Any] | None:
    """`name`'s status once its rollout is settled and stable and fallback have a replica."""
    status = _status(kube, name)
    counts = status.get("tracks", {})
    if status.get("phase") == "Succeeded" and all(
        counts.get(track, {}).get("readyReplicas", 0) == 1 for track in ("stable", "fallback")
    ):
        return status
    return None


def _stable_pod(cluster: LocalCluster, name: str) -> PodAddress | None:
    """The ready stable pod of the InferenceService `name`, from the harness's pod map."""
    return next(
        (
            pod
            for pod in cluster.pod_addresses()
            if pod.namespace == NAMESPACE
            and pod.ready
            and pod.labels.get(INSTANCE_LABEL) == name
            and pod.labels.get(TRACK_LABEL) == "stable"
        ),
        None,
    )


def _time_to_rollback(load: LoadDriver, since: float) -> float:
    """Seconds from the canary's first failed request to the route's canary weight 0."""
    bad = [r.time for r in load.by_track("canary") if r.time >= since and r.is_server_error]
    if not bad:
        raise StoryError("rolled back, but the load driver saw no failed canary request")
    first_bad = min(bad)

    # The driver reads the route every 0.2 s: it sees the weight drop within moments.
    withdrawn = wait_until(
        lambda: load.canary_gone_after(first_bad),
        timeout_s=10.0,
        what="the route without the canary",
    )
    return round(withdrawn - first_bad, 2)
