"""What the rollout state machine exchanges with its caller: facts in, actions out.

All frozen dataclasses (STYLE rule 5); `Facts()` is the empty observation. The caller
(`sync`) fills `Facts` from the child Deployments, their pods, the annotations and the due
analysis, renders the children from the `Transition`'s status, writes it, then applies each
of its `Action`s (Events, counters, command annotations) in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from fleetserve_operator.records import EventNote
from fleetserve_operator.spec import (
    AnalysisResult,
    Evidence,
    InferenceServiceStatus,
    RolloutCommand,
    RolloutEvent,
    ShadowEvidence,
    WebhookSpec,
)


class Trigger(StrEnum):
    """What moves a rollout, in priority order (the first detected one with a row wins)."""

    SPEC_INVALID = "SpecInvalid"  # the spec was refused (InvalidSpec): nothing else is read
    ADOPT = "Adopt"  # no stable spec recorded yet (first deploy): the spec becomes stable
    NEW_SPEC = "NewSpec"  # the GPU-track spec differs from stable's and from the one tried
    SPEC_REVERTED = "SpecReverted"  # the spec is stable's again
    ABORT = "Abort"
    CANARY_CRASHED = "CanaryCrashed"  # a canary pod was OOM-killed or restarted
    RETRY = "Retry"
    PROMOTE = "Promote"
    PAUSE = "Pause"
    RESUME = "Resume"
    APPROVE = "Approve"
    CANARY_READY = "CanaryReady"
    READY_DEADLINE_PASSED = "ReadyDeadlinePassed"
    ANALYSIS_PASSED = "AnalysisPassed"
    ANALYSIS_FAILED = "AnalysisFailed"
    ANALYSIS_INCONCLUSIVE = "AnalysisInconclusive"
    STABLE_PROMOTED = "StablePromoted"  # stable runs the new spec, rolled out and available
    STABLE_AVAILABLE = "StableAvailable"
    STABLE_UNAVAILABLE = "StableUnavailable"

    @property
    def command(self) -> RolloutCommand | None:
        """The annotation command this trigger stands for, if any."""
        return _COMMANDS.get(self)


_COMMANDS = {Trigger(command.value.capitalize()): command for command in RolloutCommand}


@dataclass(frozen=True, slots=True)
class TrackFacts:
    """What the caller observed of one GPU track's Deployment and its current pods."""

    spec_hash: str | None
    """The `GpuTrackSpec.digest` the Deployment's template was rendered from (its label)."""
    available: int = 0
    replicas: int = 0
    """Desired replicas (an autoscaler's choice when the stable track is autoscaled)."""
    rolled_out: bool = False
    """The Deployment controller finished rolling out the current template."""
    restarts: int = 0
    """Container restarts of the pods of the current template."""
    oom_killed: bool = False
    """A container of the current template was OOMKilled."""
    fetch_failure: tuple[str, str] | None = None
    """(reason, message) of a current pod whose model fetch failed (`contract.FetchFailure`)."""

    def serves(self, spec_hash: str | None) -> bool:
        """True when the track runs `spec_hash`, rolled out, with an available replica."""
        return self.spec_hash == spec_hash and self.rolled_out and self.available > 0


@dataclass(frozen=True, slots=True)
class Confirmation:
    """What the `confirm` webhooks answered about a step that was ready to advance."""

    allowed: bool
    detail: str
    """Who refused and how (a status code, a timeout), or who confirmed."""


@dataclass(frozen=True, slots=True)
class Facts:
    """Everything `next_step` needs besides spec, status and clock; `Facts()` is empty."""

    stable: TrackFacts | None = None
    canary: TrackFacts | None = None
    stable_error_ratio: float | None = None
    """Stable's 5xx ratio over `fallback.errorWindow`; None: no data."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    analysis: AnalysisResult | None = None
    """Set when `is_analysis_due` said so; in sequential mode also as soon as a test
    rejected (a Failed result before the interval is over)."""
    evidence: Evidence | None = None
    """Sequential mode: the tests' evidence after this look (`is_watching`), to be kept in
    `status.rollout.evidence`; None leaves it as it is."""
    shadow_evidence: ShadowEvidence | None = None
    """While shadowing: the stage's evidence after this look (`analysis.agreement.watch`),
    to be kept in `status.rollout.shadow`; its verdict, when due or Failed, is `analysis`."""
    confirmation: Confirmation | None = None
    """The `confirm` webhooks' answer, asked when a step was otherwise ready to advance
    (`asks_confirmation`); None: not asked, nothing vetoes."""


class OperatorCounter(StrEnum):
    """Counters of the operator the rollout increments (label `reason`)."""

    ROLLBACKS = "fleetserve_operator_rollbacks_total"
    PROMOTIONS = "fleetserve_operator_promotions_total"


@dataclass(frozen=True, slots=True)
class TrafficSplit:
    """The percentages of requests the tracks get (HTTPRoute weights, or replica ratio)."""

    stable: int
    canary: int
    fallback: int


@dataclass(frozen=True, slots=True)
class IncrementCounter:
    """Increment an operator counter."""

    counter: OperatorCounter
    reason: str


@dataclass(frozen=True, slots=True)
class ClearAnnotation:
    """Remove a command annotation that has been acted on (and acknowledged in status)."""

    annotation: str


@dataclass(frozen=True, slots=True)
class Notify:
    """POST a rollout event to a `notify` webhook that listed it (after the status write)."""

    webhook: WebhookSpec
    event: RolloutEvent
    message: str
    status: InferenceServiceStatus
    """The status written with it: the payload's phase, versions and weight."""


Action = EventNote | IncrementCounter | ClearAnnotation | Notify
"""A side effect of a transition, applied after its status is written. What the children
look like (canary, stable spec, weights, replicas) is not one: it follows from the status."""


@dataclass(frozen=True, slots=True)
class Transition:
    """The outcome of `next_step`: the status to write, then the actions to apply."""

    status: InferenceServiceStatus
    actions: tuple[Action, ...]
    trigger: Trigger | None
    """What was acted on; None when nothing was due."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """Replicas per GPU track; `stable` None leaves the count to an autoscaler."""

    stable: int | None
    canary: int
