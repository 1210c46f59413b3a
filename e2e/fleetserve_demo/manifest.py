"""The demo's InferenceServices: MiniLM (`examples/minilm.yaml`) and SmolLM2, for a laptop.

The examples are what a user applies to a real cluster; the demo changes only what a local,
two-core, CPU-only run needs, and leaves the files as they are.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fleetserve_e2e.paths import REPO_DIR

EXAMPLE = REPO_DIR / "examples" / "minilm.yaml"
CHAT_EXAMPLE = REPO_DIR / "examples" / "smollm2.yaml"
CHAT_NAME = "smollm2"
# The bad version keeps the model's name (clients and dashboards do not change) but serves a
# synthetic model that fails 30% of requests: a real MiniLM cannot be made to fail on purpose.
BAD_URI = "builtin://synthetic?latency_ms=5&error_rate=0.3"
# Analysis bounds, held to what a one-replica track on two busy cores can promise.
MAX_LATENCY_RATIO_VS_STABLE = 2.0


def _one_thread_example(path: Path) -> dict[str, Any]:
    """The example at `path` with one torch thread per process and one fallback replica.

    Stable, canary and fallback share the laptop's two cores with the control plane and
    Prometheus.
    """
    service: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    spec = service["spec"]
    spec["runtime"]["threads"] = 1
    spec["fallback"]["threads"] = 1
    spec["fallback"]["replicas"] = {"min": 1, "max": 1}
    return service


def demo_service(*, prometheus_url: str, interval_s: int) -> dict[str, Any]:
    """The example with compressed steps, the local Prometheus and one replica per track.

    `interval_s` is how long each canary step is held before it is analysed.
    """
    service = _one_thread_example(EXAMPLE)
    spec = service["spec"]
    analysis = spec["rollout"]["analysis"]
    analysis.update(
        prometheusUrl=prometheus_url,
        # The live panel shows each step's window against fixed bounds, so the demo judges in
        # threshold mode; the example's default (sequential) is shown by `make e2e-rollout`.
        mode="threshold",
        maxErrorRate=0.01,
        # At the 1% step the canary sees a request every few seconds: judge it on a window of
        # three steps and a handful of requests, or the first step could never be judged.
        window=f"{3 * interval_s}s",
        minRequests=3,
        # A CPU-only MiniLM that shares its cores is slower and noisier than a GPU.
        maxP99LatencyMs=1000,
        maxLatencyRatioVsStable=MAX_LATENCY_RATIO_VS_STABLE,
        maxQueueWaitRatioVsStable=10.0,
    )
    spec["rollout"]["interval"] = f"{interval_s}s"
    spec["rollout"]["progressDeadline"] = "3m"
    return service


def good_version(service: dict[str, Any], version: str) -> dict[str, Any]:
    """The spec patch that rolls out the same model as `version`."""
    model = copy.deepcopy(service["spec"]["model"])
    model["version"] = version
    return {"spec": {"model": model}}


def bad_version(service: dict[str, Any], version: str) -> dict[str, Any]:
    """The spec patch that rolls out an erroring model under the same name as `version`."""
    model = copy.deepcopy(service["spec"]["model"])
    model.update(version=version, uri=BAD_URI)
    return {"spec": {"model": model}}


@dataclass(frozen=True)
class ChatLimits:
    """What the demo's SmolLM2 replicas may hold: sized for two busy cores, not for traffic."""

    max_running_sequences: int = 2
    max_step_tokens: int = 128
    max_context: int = 512
    # Fits the fp32 weights (542 MB), one small step's activations and a KV pool of a few
    # full 512-token contexts; the example's budget sizes a pool for real chat traffic.
    memory_budget: str = "768Mi"

    def describe(self) -> str:
        """One line for the screen."""
        return (
            f"at most {self.max_running_sequences} running sequences, context "
            f"{self.max_context} tokens, {self.max_step_tokens} tokens per step, memory "
            f"budget {self.memory_budget}"
        )


CHAT_LIMITS = ChatLimits()


def chat_service(*, prometheus_url: str, limits: ChatLimits = CHAT_LIMITS) -> dict[str, Any]:
    """`examples/smollm2.yaml` with one thread and one replica per track, and small limits.

    The example's engine (32 running sequences, 4096-token contexts, 1.5Gi) is sized for a
    GPU; here both tracks run on the laptop's CPU beside MiniLM, so the demo shrinks it and
    the CPU fallback follows the same small `generation` instead of its own overrides.
    """
    service = _one_thread_example(CHAT_EXAMPLE)
    spec = service["spec"]
    spec["fallback"].pop("generation", None)
    spec["generation"].update(
        maxRunningSequences=limits.max_running_sequences,
        maxStepTokens=limits.max_step_tokens,
        maxContext=limits.max_context,
    )
    spec["memory"]["budget"] = limits.memory_budget
    # No SmolLM2 rollout in the story, but the operator accepts only the Prometheus it trusts.
    spec["rollout"]["analysis"]["prometheusUrl"] = prometheus_url
    return service
