"""Pure: what the operator observed (child Deployments, problems, measured memory) → `.status`.

`sync` gathers the observations through `kube` and `analysis`, calls `compute_status` on the
status the rollout returned, and
writes the result only when it differs from the object's current status (so a resync or an
operator restart writes nothing). `transitions` turns a status change into Events. A
condition's `lastTransitionTime` moves only when its status does, as metav1 prescribes.

A `Problem` (a spec error, a child the operator may not or cannot write, pods that fail
after the children were applied, a memory budget too small) makes `Degraded` True with its
reason and message; while the stable track has no available replica it is also `Ready`'s
reason, so whoever waits for Ready sees why it does not come.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from fleetserve_operator import contract, naming
from fleetserve_operator.errors import MESSAGE_LIMIT
from fleetserve_operator.naming import Track
from fleetserve_operator.records import EventNote, Manifest, MemoryFigures, Problem, TrackFetch
from fleetserve_operator.rollout.traffic import fallback_active, traffic_split
from fleetserve_operator.spec import (
    Condition,
    ConditionType,
    GenerationSpec,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutPhase,
    TracksStatus,
    TrackStatus,
    set_condition,
)
from fleetserve_operator.spec.model import builtin_context_length

__all__ = [
    "Observation",
    "compute_status",
    "generation_memory_problem",
    "is_rolled_out",
    "memory_problem",
    "model_fetched",
    "reconcile_events",
    "track_status",
    "transitions",
]

GIB = 2**30


@dataclass(frozen=True, slots=True)
class Observation:
    """Everything `compute_status` needs besides spec and previous status."""

    generation: int
    deployments: Mapping[Track, Manifest]
    problem: Problem | None
    now: str
    """RFC 3339 UTC timestamp of this observation."""
    routes_by_weight: bool = False
    """An HTTPRoute carries exact weights (`gateway-api`); else replica counts decide."""
    fetches: Mapping[Track, TrackFetch] = field(default_factory=dict)
    """The model fetches of the tracks whose pods fetch their model (`facts.track_fetches`)."""
    canary_only: bool = False
    """The umbrella Service selects the canary's pods alone: the bake's standby gets nothing."""
    stable_only: bool = False
    """The umbrella Service selects the stable pods alone: before and during a shadow stage."""


def memory_problem(
    spec: InferenceServiceSpec, figures: MemoryFigures, measured: GenerationSpec | None = None
) -> Problem | None:
    """A `MemoryBudgetExceeded` problem when the spec needs more than the budget allows.

    An encoder: a full batch. A generative model: weights, one step's activations and a
    KV pool that holds one full context (`generation_memory_problem`); `measured` are the
    engine knobs the figures were measured with (the stable track's).
    """
    budget = spec.memory.budget_bytes
    if budget == 0:
        return None
    knobs = spec.gpu_track.generation_knobs
    if knobs is not None:
        return generation_memory_problem(spec, knobs, figures, measured or knobs)
    batching = spec.batching
    tokens = batching.max_batch_size * batching.max_sequence_length
    needed = int(figures.weights_bytes + figures.fixed_bytes + figures.bytes_per_token * tokens)
    usable = int(budget * (1 - spec.memory.reserve_fraction))
    if needed <= usable:
        return None
    return Problem(
        reason="MemoryBudgetExceeded",
        message=(
            f"a batch of spec.batching.maxBatchSize {batching.max_batch_size} x "
            f"maxSequenceLength {batching.max_sequence_length} tokens needs {needed} bytes "
            f"({needed / GIB:.2f} GiB: weights {int(figures.weights_bytes)} + fixed "
            f"{int(figures.fixed_bytes)} + {tokens} tokens x {figures.bytes_per_token:.0f}), "
            f"above spec.memory.budget {spec.memory.budget} = {usable} usable bytes "
            f"({usable / GIB:.2f} GiB after reserveFraction {spec.memory.reserve_fraction}); "
            "the runtime will cap batches below the configured size"
        ),
    )


def generation_memory_problem(
    spec: InferenceServiceSpec,
    knobs: GenerationSpec,
    figures: MemoryFigures,
    measured: GenerationSpec,
) -> Problem | None:
    """A `MemoryBudgetExceeded` problem when `knobs` leave no KV pool for one full context.

    The runtime sizes its pool from what the budget leaves after the reserve, the weights
    and one step's activations, and refuses to load when that cannot hold one sequence of
    the whole context. From the figures the stable replicas measured under `measured`: the
    activations (`fixed_bytes` less the pool) scale with `maxStepTokens`, a block's bytes
    with `blockSize`. The context is `maxContext`, or a builtin's own; for another model
    with `maxContext` 0 only weights and activations are checked.
    """
    blocks, block_bytes = figures.kv_cache_blocks, figures.kv_cache_block_bytes
    if blocks is None or block_bytes is None:
        return None
    memory = spec.memory
    usable = int(memory.budget_bytes * (1 - memory.reserve_fraction))
    per_token = block_bytes / measured.block_size
    measured_steps = max(0.0, figures.fixed_bytes - blocks * block_bytes)
    activations = int(measured_steps * knobs.max_step_tokens / measured.max_step_tokens)
    context = knobs.max_context or builtin_context_length(spec.model) or 0
    one_context = int(-(-context // knobs.block_size) * knobs.block_size * per_token)
    weights = int(figures.weights_bytes)
    pool = (usable - weights - activations) * knobs.kv_cache_fraction
    if pool > 0 and pool >= one_context:
        return None
    needed = weights + activations + int(one_context / knobs.kv_cache_fraction)
    kv = (
        f"the KV cache of one {context}-token sequence {one_context} "
        f"/ spec.generation.kvCacheFraction {knobs.kv_cache_fraction}"
        if context
        else "a KV cache"
    )
    return Problem(
        reason="MemoryBudgetExceeded",
        message=(
            f"weights {weights} + activations of one spec.generation.maxStepTokens "
            f"{knobs.max_step_tokens}-token step {activations} + {kv} need {needed} bytes "
            f"({needed / GIB:.2f} GiB), {needed - usable} bytes more than spec.memory.budget "
            f"{memory.budget} leaves ({usable} bytes after reserveFraction "
            f"{memory.reserve_fraction}); the runtime will refuse to load: raise "
            "spec.memory.budget, or lower spec.generation.maxContext or maxStepTokens"
        ),
    )


def track_status(deployment: Manifest) -> TrackStatus:
    """The version and image of one observed Deployment's pods, and its replica counts."""
    status = deployment.get("status", {})
    containers = deployment["spec"].get("template", {}).get("spec", {}).get("containers", [])
    images = [c.get("image") for c in containers if c.get("name") == contract.CONTAINER_NAME]
    return TrackStatus(
        version=deployment["metadata"].get("labels", {}).get(naming.MODEL_VERSION_LABEL),
        image=images[0] if images else None,
        replicas=deployment["spec"].get("replicas", 0),
        ready_replicas=status.get("readyReplicas", 0),
        available_replicas=status.get("availableReplicas", 0),
        updated_replicas=status.get("updatedReplicas", 0),
    )


def _with_digest(track: TrackStatus, fetch: TrackFetch | None) -> TrackStatus:
    """`track` with the digest its pods fetched, when they agree on one."""
    if fetch is None or len(fetch.digests) != 1:
        return track
    return track.model_copy(update={"model_digest": fetch.digests[0]})


def is_rolled_out(deployment: Manifest) -> bool:
    """True when the Deployment controller has finished rolling out the current template."""
    spec, status = deployment["spec"], deployment.get("status", {})
    wanted = spec.get("replicas", 0)
    return bool(
        status.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 0)
        and status.get("updatedReplicas", 0) >= wanted
        and status.get("availableReplicas", 0) >= wanted
        and status.get("replicas", 0) <= wanted
    )


def _progressing(
    make: Callable[[ConditionType, bool, str, str], Condition],
    previous: InferenceServiceStatus,
    phase: RolloutPhase,
    rolling: list[str],
) -> Condition:
    """True while a canary rollout runs (reason: its phase) or a Deployment rolls.

    A canary held at a step has every Deployment rolled out, yet the service is still on
    its way to the new version; whoever waits on Progressing must see that.
    """
    tracks = f"; rolling out: {', '.join(rolling)}" if rolling else ""
    if phase.is_rollout_active:
        canary = f"canary {previous.canary_version} at the {previous.canary_weight}% step"
        return make(ConditionType.PROGRESSING, True, phase.value, canary + tracks)
    if rolling:
        return make(ConditionType.PROGRESSING, True, "RollingUpdate", tracks.removeprefix("; "))
    return make(ConditionType.PROGRESSING, False, "Complete", "every track is rolled out")


def model_fetched(
    fetches: Mapping[Track, TrackFetch],
) -> tuple[Literal["True", "False", "Unknown"], str, str] | None:
    """`ModelFetched`'s (status, reason, message); None when no track fetches its model."""
    if not fetches:
        return None
    counts = "; ".join(
        f"{track.value}: {fetch.fetched}/{fetch.pods} pods fetched"
        + (f" {', '.join(fetch.digests)}" if fetch.digests else "")
        + (f" (node cache: {', '.join(fetch.cache)})" if fetch.cache else "")
        for track, fetch in fetches.items()
    )
    failed = next((fetch.failure for fetch in fetches.values() if fetch.failure), None)
    if failed is not None:
        return "False", failed.reason, failed.message
    mixed = [track.value for track, fetch in fetches.items() if len(fetch.digests) > 1]
    if mixed:
        why = f"pods of the {', '.join(mixed)} track fetched different bytes; pin model.digest"
        return "False", "DigestsDiffer", f"{why}: {counts}"
    if any(fetch.fetched < fetch.pods for fetch in fetches.values()):
        return "False", "Fetching", counts
    if not any(fetch.pods for fetch in fetches.values()):
        return "Unknown", "NoPods", counts
    return "True", "Fetched", counts


def _conditions(
    previous: InferenceServiceStatus,
    seen: Observation,
    phase: RolloutPhase,
    stable: TrackStatus | None,
) -> list[Condition]:
    rolling = sorted(
        track.value for track, dep in seen.deployments.items() if not is_rolled_out(dep)
    )
    ready = stable is not None and stable.available_replicas > 0
    fallback = previous.condition(ConditionType.FALLBACK_ACTIVE)
    problem = seen.problem

    def make(kind: ConditionType, value: bool, reason: str, message: str) -> Condition:
        return Condition(
            type=kind.value,
            status="True" if value else "False",
            observed_generation=seen.generation,
            last_transition_time=seen.now,
            reason=reason,
            message=message,
        )

    counts = f"{stable.available_replicas}/{stable.replicas}" if stable else "0/0"
    availability = f"stable track: {counts} replicas available"
    if ready or problem is None:
        readiness = make(ConditionType.READY, ready, phase.value, availability)
    else:
        readiness = make(ConditionType.READY, False, problem.reason, problem.message)
    wanted = [
        readiness,
        _progressing(make, previous, phase, rolling),
        make(
            ConditionType.DEGRADED,
            problem is not None,
            problem.reason if problem else "AsExpected",
            problem.message if problem else "",
        ),
        fallback or make(ConditionType.FALLBACK_ACTIVE, False, "GPUTrackServing", ""),
    ]
    fetched = model_fetched(seen.fetches)
    if fetched is not None:
        status, reason, message = fetched
        wanted.append(
            Condition(
                type=ConditionType.MODEL_FETCHED.value,
                status=status,
                observed_generation=seen.generation,
                last_transition_time=seen.now,
                reason=reason,
                message=message,
            )
        )
    # A service whose model is no longer fetched drops the condition rather than keep a stale one.
    conditions = [
        c
        for c in previous.conditions
        if fetched is not None or c.type != ConditionType.MODEL_FETCHED.value
    ]
    for condition in wanted:
        conditions = set_condition(conditions, condition, now=seen.now)
    # The rollout's conditions (FallbackActive, Promoted) were decided for this generation too.
    generation = {"observed_generation": seen.generation}
    return [condition.model_copy(update=generation) for condition in conditions]


def effective_canary_weight(
    status: InferenceServiceStatus, seen: Observation, tracks: Mapping[Track, TrackStatus]
) -> int:
    """The percentage of requests the canary really gets in `status`.

    An HTTPRoute gives it exactly its split. Without one the umbrella Service spreads
    requests over every ready GPU-pool pod, so the canary's share of ready replicas is what
    it gets: one canary pod next to three stable ones is 25%, whatever the step says; while
    the Service selects the canary's pods alone (a bake), all of it, and while it selects the
    stable pods alone (a shadow stage), none.
    """
    if seen.routes_by_weight:
        return traffic_split(status).canary
    canary, stable = tracks.get(Track.CANARY), tracks.get(Track.STABLE)
    canary_ready = canary.ready_replicas if canary else 0
    if fallback_active(status) or canary_ready == 0 or seen.stable_only:
        return 0
    if seen.canary_only:
        return 100
    # A ready canary is behind the Service even at weight 0 (Starting): it gets its share,
    # and never reads as 0% while it does.
    share = 100 * canary_ready / (canary_ready + (stable.ready_replicas if stable else 0))
    return max(1, round(share))


def compute_status(previous: InferenceServiceStatus, seen: Observation) -> InferenceServiceStatus:
    """The status to report after observing `seen`.

    `previous` is the status `rollout.next_step` returned (a refused spec's too): phase,
    stable version, weights and rollout state are carried over.
    """
    tracks = {
        track: _with_digest(track_status(dep), seen.fetches.get(track))
        for track, dep in seen.deployments.items()
    }
    stable = tracks.get(Track.STABLE)
    phase = previous.current_phase
    return previous.model_copy(
        update={
            "observed_generation": seen.generation,
            "phase": phase,
            "ready": f"{stable.ready_replicas}/{stable.replicas}" if stable else "0/0",
            "tracks": TracksStatus(
                stable=stable, canary=tracks.get(Track.CANARY), fallback=tracks.get(Track.FALLBACK)
            ),
            "effective_canary_weight": effective_canary_weight(previous, seen, tracks),
            "last_error": seen.problem.message if seen.problem else None,
            "last_transition_time": (
                previous.last_transition_time if phase == previous.phase else seen.now
            ),
            "conditions": _conditions(previous, seen, phase, stable),
        }
    )


def transitions(old: InferenceServiceStatus, new: InferenceServiceStatus) -> list[EventNote]:
    """Events for a phase change and for every condition whose status changed.

    A `Degraded` condition that stays True with a new reason (one failure followed by
    another) gets an Event too.
    """
    notes: list[EventNote] = []
    if old.phase != new.phase and new.phase is not None:
        before = old.phase.value if old.phase else "None"
        notes.append(EventNote("Normal", "PhaseChanged", f"{before} -> {new.phase.value}"))
    for condition in new.conditions:
        previous = next((c for c in old.conditions if c.type == condition.type), None)
        new_problem = (
            condition.type == ConditionType.DEGRADED
            and condition.is_true
            and previous is not None
            and previous.reason != condition.reason
        )
        if previous is not None and previous.status == condition.status and not new_problem:
            continue
        if previous is None and not condition.is_true:
            continue  # a condition first reported False is no news
        warning = condition.type == ConditionType.DEGRADED and condition.is_true
        message = f"{condition.type}={condition.status}: {condition.message}".rstrip(": ")
        notes.append(EventNote("Warning" if warning else "Normal", condition.reason, message))
    return notes


def reconcile_events(notes: list[EventNote]) -> list[EventNote]:
    """The Events one reconcile posts for its `notes`: each Warning, and one for the rest.

    The Normal notes (a phase change, conditions that changed, the children written) are
    one Event with the first one's reason, their messages joined with "; " in order, each
    after the first led by its reason unless its message already starts with it; a note
    that would take the message past `MESSAGE_LIMIT` starts another Event, so none is cut
    off. At 1000 services, one Event per note was 4.4 requests per created service, the
    largest share of the operator's writes; a person reading `kubectl describe` still
    finds every note. The rollout's own Events (`Promoted`, `RolledBack`, ...) are not
    notes: they keep theirs, for the people and tools that look for their reasons.
    """
    events = [note for note in notes if note.type == "Warning"]
    joined: list[EventNote] = []
    for note in (note for note in notes if note.type == "Normal"):
        part = note.message
        if joined and not part.startswith(note.reason):
            part = f"{note.reason}: {part}"
        last = joined[-1] if joined else None
        if last is not None and len(last.message) + 2 + len(part) <= MESSAGE_LIMIT:
            joined[-1] = EventNote("Normal", last.reason, f"{last.message}; {part}")
        else:
            joined.append(EventNote("Normal", note.reason, note.message))
    return [*events, *joined]
