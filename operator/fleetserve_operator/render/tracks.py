"""Pure: the tracks to run now, each as a `TrackPlan`, and what the schema cannot check.

Everything that changes during a rollout follows from `status`, which `rollout.next_step`
wrote: the stable track runs `status.rollout.stableSpec`, the canary exists only while a
rollout is active, and replica counts follow `rollout.plan_capacity`. The fallback runs the
stable track's pods on CPU, in its own image (`spec.fallback.image`, a CPU-only build), with
`spec.fallback.batching` and `spec.fallback.generation` laid over stable's.
"""

from __future__ import annotations

import re
from dataclasses import replace

from fleetserve_operator import contract, naming
from fleetserve_operator.errors import InvalidSpec
from fleetserve_operator.naming import Track
from fleetserve_operator.render.owner import Owner
from fleetserve_operator.render.pods import TrackPlan
from fleetserve_operator.rollout import fallback_active, plan_capacity
from fleetserve_operator.spec import (
    BatchingSpec,
    GenerationSpec,
    GpuTrackSpec,
    InferenceServiceSpec,
    InferenceServiceStatus,
)

__all__ = [
    "check_semantics",
    "fallback_batching",
    "fallback_generation",
    "plan_tracks",
    "stable_pods",
]

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def check_semantics(owner: Owner, spec: InferenceServiceSpec) -> None:
    """Reject what the schema lets through but no cluster can run.

    Raises:
        InvalidSpec: naming the field at fault.
    """
    longest = naming.MAX_NAME_LENGTH
    if len(owner.name) > longest or _DNS_1035.match(owner.name) is None:
        msg = f"must be a DNS-1035 label of at most {longest} characters, got {owner.name!r}"
        raise InvalidSpec("metadata.name", msg)
    uri = spec.model.uri or ""
    if uri.startswith("builtin://"):
        kind = uri.removeprefix("builtin://").split("?", 1)[0]
        if kind not in contract.KNOWN_BUILTINS:
            known = ", ".join(sorted(contract.KNOWN_BUILTINS))
            raise InvalidSpec("spec.model.uri", f"unknown builtin model {kind!r}; known: {known}")
    fallback_batching(spec, spec.batching)
    fallback_generation(spec, spec.gpu_track.generation_knobs)


def fallback_generation(
    spec: InferenceServiceSpec, base: GenerationSpec | None
) -> GenerationSpec | None:
    """The fallback's engine knobs: `base` with `spec.fallback.generation` laid over it."""
    overrides = spec.fallback.generation
    if base is None or overrides is None:
        return base
    try:
        return overrides.merged_over(base)
    except ValueError as exc:
        raise InvalidSpec("spec.fallback.generation", str(exc)) from None


def fallback_batching(spec: InferenceServiceSpec, base: BatchingSpec) -> BatchingSpec:
    """The fallback's batching: `base` with `spec.fallback.batching` laid over it."""
    try:
        return spec.fallback.batching.merged_over(base)
    except ValueError as exc:
        raise InvalidSpec("spec.fallback.batching", str(exc)) from None


def stable_pods(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> GpuTrackSpec:
    """What the stable track runs: `status.rollout.stableSpec`, else (first deploy) the spec.

    The stable track moves to a new spec only when the rollout promotes it, never because
    the spec changed; replica bounds always come from the current spec.
    """
    pods = status.rollout.stable_spec or spec.gpu_track
    return pods.model_copy(
        update={"runtime": pods.runtime.model_copy(update={"replicas": spec.runtime.replicas})}
    )


def _gpu_plan(
    spec: InferenceServiceSpec, pods: GpuTrackSpec, track: Track, replicas: int | None
) -> TrackPlan:
    runtime = pods.runtime
    return TrackPlan(
        config=contract.TrackConfig(
            track, pods.model.version, pods.batching, runtime.device, runtime.threads
        ),
        image=pods.pod_image,
        replicas=replicas,
        resources=runtime.resources,
        node_selector=runtime.node_selector,
        tolerations=runtime.tolerations,
        pods=pods,
        spec_hash=pods.digest,
        generation=pods.generation_knobs,
        precision=runtime.precision,
        backend=runtime.backend,
        spread=spec.topology_spread,
        priority_class_name=spec.priority_class_name,
    )


def plan_tracks(
    spec: InferenceServiceSpec,
    status: InferenceServiceStatus,
    *,
    observed_stable_replicas: int = 0,
) -> list[TrackPlan]:
    """The tracks to run now, sized by `rollout.plan_capacity`.

    Stable always (on its own spec); the canary while a rollout is active (on the current
    spec); the fallback when enabled (on stable's spec, grown to max while it is active).
    `observed_stable_replicas` is the stable Deployment's count, which an autoscaler owns.
    """
    capacity = plan_capacity(spec, status, stable_replicas=observed_stable_replicas)
    stable = stable_pods(spec, status)
    stable_plan = _gpu_plan(spec, stable, Track.STABLE, capacity.stable)
    plans = [replace(stable_plan, follows_shadow=spec.rollout.shadow is not None)]
    phase = status.current_phase
    if phase.is_rollout_active:
        plans.append(_gpu_plan(spec, spec.gpu_track, Track.CANARY, capacity.canary))
    if not spec.fallback.enabled:
        return plans
    fallback = spec.fallback
    active = fallback_active(status)
    fixed = fallback.replicas.max if active else fallback.replicas.min
    plans.append(
        TrackPlan(
            config=contract.TrackConfig(
                Track.FALLBACK,
                stable.model.version,
                fallback_batching(spec, stable.batching),
                "cpu",
                fallback.threads,
            ),
            image=fallback.pod_image,
            replicas=None if fallback.scaling else fixed,
            resources=fallback.resources,
            node_selector=fallback.node_selector,
            tolerations=fallback.tolerations,
            pods=stable,
            generation=fallback_generation(spec, stable.generation_knobs),
            precision=fallback.precision,
            backend=fallback.backend,
            spread=fallback.topology_spread,
            priority_class_name=fallback.priority_class_name,
        )
    )
    return plans
