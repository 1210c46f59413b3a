"""How versions reach users: rollout steps, metric analysis and traffic routing."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_snake

from fleetserve_operator.spec.base import (
    VALIDATIONS,
    DnsLabel,
    DnsSubdomain,
    Duration,
    Wire,
    cel,
    cel_rules,
    keyed_list,
    parse_duration_s,
)

__all__ = [
    "COMMAND_PREFIX",
    "MAX_INTER_TOKEN_BOUND_MS",
    "MAX_LATENCY_BOUND_MS",
    "AnalysisMode",
    "AnalysisSpec",
    "MetricCheck",
    "ParentRef",
    "RolloutCommand",
    "RolloutEvent",
    "RolloutSpec",
    "SecretKeyRef",
    "ShadowSpec",
    "StepGate",
    "StepPolicy",
    "TrafficProvider",
    "TrafficSpec",
    "WebhookSpec",
    "WebhookType",
]

COMMAND_PREFIX = "serving.fleetserve.io/"
MAX_LATENCY_BOUND_MS = 30_000.0
"""The last bucket bound of the runtime's request and first-token histograms
(`contract.LATENCY_BOUNDS_S`): a p99 above it cannot be measured, so no bound may lie there."""
MAX_INTER_TOKEN_BOUND_MS = 2_500.0
"""The last bucket bound of the inter-token histogram (`contract.INTER_TOKEN_BOUNDS_S`)."""
# Gateway API's own Hostname type: a DNS name, optionally with one leading wildcard label.
_HOSTNAME_RE = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
Hostname = Annotated[str, Field(pattern=_HOSTNAME_RE, max_length=253)]


class RolloutCommand(StrEnum):
    """Manual rollout control: annotations on the InferenceService (the spec is never edited).

    Each command is acted on once per value, acknowledged in `status.rollout.acknowledged`
    and an Event, and then removed by the operator:
    `kubectl annotate fsvc demo serving.fleetserve.io/promote=next`.
    """

    PROMOTE = "promote"
    """Skip to the next step (`next`, the default) or past every step (`full`)."""
    PAUSE = "pause"
    """Stop advancing; analysis still runs and can still roll back."""
    RESUME = "resume"
    """Continue a paused or holding rollout."""
    ABORT = "abort"
    """Roll the canary back now."""
    RETRY = "retry"
    """Roll out again the spec that was rolled back or failed."""
    APPROVE = "approve"
    """Open a step's manual gate: the value is the weight of the step awaiting approval
    (`approve=1`); for any other step it is acknowledged as ignored."""

    @property
    def annotation(self) -> str:
        """The annotation key, e.g. `serving.fleetserve.io/promote`."""
        return COMMAND_PREFIX + self.value


class MetricCheck(Wire):
    """An extra PromQL check; the query's value must lie within [min, max]."""

    model_config = cel_rules(
        cel("has(self.min) || has(self.max)", "a metric check needs min or max"),
        cel(
            "!has(self.min) || !has(self.max) || self.min <= self.max",
            "a metric check's min must be <= max",
        ),
    )

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", max_length=63)
    """Name shown in status and events."""
    query: str = Field(min_length=1, max_length=4096)
    """PromQL returning one number; `$namespace`, `$model`, `$version`, `$track`, `$window`
    are substituted."""
    min: float | None = None
    """Lowest passing value."""
    max: float | None = None
    """Highest passing value."""

    @model_validator(mode="after")
    def _bounded(self) -> MetricCheck:
        if self.min is None and self.max is None:
            msg = f"metric check {self.name!r} needs min or max"
            raise ValueError(msg)
        if self.min is not None and self.max is not None and self.min > self.max:
            msg = f"metric check {self.name!r}: min ({self.min}) must be <= max ({self.max})"
            raise ValueError(msg)
        return self


class AnalysisMode(StrEnum):
    """How the built-in checks judge a canary (`spec.rollout.analysis.mode`)."""

    SEQUENTIAL = "sequential"
    """Anytime-valid tests of the canary against stable, fed at every look (every rollout
    tick) with the counter increases since the last: errors and the latency histogram
    (generative models: the time-to-first-token and inter-token-latency histograms), and
    of the canary's own rates against the absolute bounds. A rejection at level `alpha`
    rolls the canary back at once; a step passes after its `interval` with `minRequests`
    canary requests and no rejection, and a step before more than half of the traffic (or
    before promotion) only once the evidence rules out a `minDetectableRatio` regression
    at `power`."""
    THRESHOLD = "threshold"
    """Once per `interval`, each metric of the window against a fixed bound;
    `failureThreshold` failed analyses in a row roll the canary back."""


_SEQUENTIAL_ONLY = ("alpha", "errorTolerance", "latencyTolerance", "minDetectableRatio", "power")
_THRESHOLD_ONLY = (
    "maxLatencyRatioVsStable",
    "maxQueueWaitRatioVsStable",
    "maxRejectionRatioVsStable",
    "maxTtftRatioVsStable",
    "maxItlRatioVsStable",
)
_MODE_FIELDS = {AnalysisMode.SEQUENTIAL: _SEQUENTIAL_ONLY, AnalysisMode.THRESHOLD: _THRESHOLD_ONLY}
"""The fields only one mode uses. Each has a default, which the API server fills in, so the
other mode refuses a field only when it differs from its default: a value the user chose."""


def _unused(field: str, mode: AnalysisMode) -> str:
    return f"analysis.{field} is used in {mode} mode only: remove it, or set mode: {mode}"


def _mode_rules(schema: dict[str, Any]) -> None:
    """Add the CEL rule of each one-mode field (its default read from the schema)."""
    rules = [
        cel(
            f"self.mode == '{mode}' || !has(self.{field})"
            f" || self.{field} == {float(schema['properties'][field]['default'])!r}",
            _unused(field, mode),
            f".{field}",
        )
        for mode, fields in _MODE_FIELDS.items()
        for field in fields
    ]
    schema[VALIDATIONS] = rules


class AnalysisSpec(Wire):
    """How a canary step is judged from Prometheus (canary vs stable by the `track` label)."""

    model_config = ConfigDict(json_schema_extra=_mode_rules)

    mode: AnalysisMode = AnalysisMode.SEQUENTIAL
    """`sequential` (anytime-valid tests, see docs/explanation/canary-analysis.md) or
    `threshold` (fixed bounds per interval). The absolute bounds (`maxErrorRate`,
    `maxP99LatencyMs`, a generative model's bounds) and the PromQL `checks` apply in both
    modes; a field only the other mode uses is refused unless left at its default."""
    alpha: float = Field(0.01, gt=0, le=0.5)
    """Sequential mode: the most probability of ever rolling back a canary that is no worse
    than stable (by the tolerances) and within the absolute bounds, split evenly between
    the built-in tests, the absolute bounds' tests and the baseline of the 100% step."""
    error_tolerance: float = Field(0.0, ge=0, le=100)
    """Sequential mode: the canary's odds of a 5xx answer may be this much above stable's
    (0: not at all; 0.1: by 10%) before the error test counts it as worse."""
    latency_tolerance: float = Field(0.5, ge=0, le=100)
    """Sequential mode: at every latency bucket bound, the canary's odds of a slower answer
    (generative models: a slower first token, a slower gap between tokens) may be this much
    above stable's before a latency test counts it as slower."""
    min_detectable_ratio: float = Field(2.0, gt=1, le=100)
    """Sequential mode: the regression the evidence must rule out before the canary gets
    more than half of the traffic, or is promoted: this many times stable's odds of a 5xx
    answer, and of a slow answer (slower than the bucket bound at stable's p99), where
    stable's rate counts as at least 1%. Until the evidence does, the step holds, at most
    `progressDeadline` after its interval."""
    power: float = Field(0.9, ge=0.5, le=0.999)
    """Sequential mode: the least probability that a canary `minDetectableRatio` times
    worse is held (never promoted); 1 - power is the evidence's level."""
    prometheus_url: str = Field(pattern=r"^https?://.+", max_length=512)
    """Prometheus base URL, e.g. `http://prometheus.monitoring:9090`; it must be one the
    operator's configuration allows (`allowed_prometheus_urls` or its own `prometheus_url`),
    else the spec is invalid."""
    window: Duration | None = None
    """Range of each query; unset means the rollout interval."""
    max_error_rate: float = Field(0.01, ge=0, le=1)
    """Both modes: highest passing ratio of 5xx answers to all answers (threshold mode: in
    the window; sequential mode: an anytime-valid test of the canary's rate, so 0 rolls
    back at the first 5xx)."""
    max_p99_latency_ms: float | None = Field(None, gt=0, le=MAX_LATENCY_BOUND_MS)
    """Both modes: highest passing canary p99 request latency, in milliseconds (sequential
    mode: judged at the first bucket bound at or above it); at most the histogram's last
    bound. Unset: no absolute bound."""
    max_latency_ratio_vs_stable: float = Field(1.5, ge=1)
    """Threshold mode: highest passing canary p99 / stable p99."""
    max_queue_wait_ratio_vs_stable: float = Field(2.0, ge=1)
    """Threshold mode: highest passing canary queue-wait p99 / stable queue-wait p99."""
    max_rejection_ratio_vs_stable: float = Field(2.0, ge=1)
    """Threshold mode: highest passing canary 503/504 ratio / stable's (sequential mode
    counts 503/504 as errors)."""
    min_requests: int = Field(20, ge=0)
    """Fewest canary requests for a verdict (in the window; sequential mode: in the step);
    fewer is inconclusive."""
    min_tokens: int = Field(500, ge=0)
    """Generative models: fewest tokens the canary generated for a verdict (in the window;
    sequential mode: in the step), on top of `minRequests`; fewer is inconclusive. A few
    dozen chat answers; latency per token from fewer is noise."""
    max_ttft_p99_ms: float | None = Field(2000.0, gt=0, le=MAX_LATENCY_BOUND_MS)
    """Generative models, both modes: highest passing canary p99 time to first token
    (arrival to first token: queueing and prefill), in milliseconds; 2 s is where a chat
    user starts to wait. Unset: no absolute bound."""
    max_ttft_ratio_vs_stable: float = Field(1.5, ge=1)
    """Generative models, threshold mode: highest passing canary TTFT p99 / stable's."""
    max_itl_p99_ms: float | None = Field(200.0, gt=0, le=MAX_INTER_TOKEN_BOUND_MS)
    """Generative models, both modes: highest passing canary p99 gap between two tokens of
    a stream (inter-token latency), in milliseconds; 200 ms (5 tokens/s) is about reading
    speed. Unset: no absolute bound."""
    max_itl_ratio_vs_stable: float = Field(1.5, ge=1)
    """Generative models, threshold mode: highest passing canary ITL p99 / stable's."""
    max_preemption_rate: float | None = Field(0.1, ge=0)
    """Generative models, both modes: highest passing canary preemptions per request (a
    preempted sequence lost its KV blocks and is recomputed). Unset: no bound."""
    min_tokens_per_second_per_replica: float | None = Field(None, ge=0)
    """Generative models, both modes: lowest passing canary generated tokens per second per
    replica. Throughput follows the offered load, so there is no default; set it to what a
    replica must sustain at the steps' traffic. Unset: no bound."""
    failure_threshold: int = Field(2, ge=1, le=100)
    """Consecutive failed analyses that roll the canary back (a sequential test's rejection
    rolls it back at once)."""
    inconclusive_threshold: int = Field(3, ge=1, le=100)
    """Consecutive inconclusive analyses after which the rollout holds and says so."""
    history_limit: int = Field(10, ge=1, le=100)
    """Analysis results kept in status."""
    checks: list[MetricCheck] = keyed_list("name", max_length=16)
    """Extra PromQL checks with bounds."""

    @model_validator(mode="after")
    def _one_mode_fields(self) -> AnalysisSpec:
        for mode, fields in _MODE_FIELDS.items():
            for field in fields:
                name = to_snake(field)
                value, default = getattr(self, name), type(self).model_fields[name].default
                if self.mode is not mode and value != default:
                    msg = f"{_unused(field, mode)} (it is {value}, its default {default})"
                    raise ValueError(msg)
        return self


class StepGate(StrEnum):
    """What a step waits for after its analysis passed and its hold elapsed."""

    MANUAL = "manual"
    """A person's approval: the `serving.fleetserve.io/approve=<weight>` annotation."""


_POLICY_NEEDS = "a step policy needs hold or gate"
_POLICY_WEIGHTS = "rollout.stepPolicies[].weight must be one of rollout.steps"


class StepPolicy(Wire):
    """What one step waits for besides its analysis (`rollout.stepPolicies[]`)."""

    model_config = cel_rules(cel("has(self.hold) || has(self.gate)", _POLICY_NEEDS))

    weight: int = Field(ge=1, le=100)
    """The step it applies to: one of `rollout.steps`."""
    hold: Duration | None = None
    """Least time at this weight: the step does not advance before it has elapsed, however
    often its analysis passed (analysis keeps running and can still roll the canary back)."""
    gate: StepGate | None = None
    """`manual`: once its analysis passed and its hold elapsed, the step waits for the
    `approve` annotation naming its weight."""

    @model_validator(mode="after")
    def _needs_something(self) -> StepPolicy:
        if self.hold is None and self.gate is None:
            msg = f"{_POLICY_NEEDS} (weight {self.weight})"
            raise ValueError(msg)
        return self


_SHADOW_LONGER = "rollout.shadow.maxDuration must be at least rollout.interval (one look)"


class ShadowSpec(Wire):
    """The shadow stage before the first step (`rollout.shadow`, `shadow.md`).

    The canary's pods run at weight 0 while the stable pods copy a sample of their live
    requests to it and compare its answers with theirs; the operator judges the agreement
    and the copies' error rate sequentially at every `rollout.interval`.
    """

    fraction: float = Field(0.1, gt=0, le=1)
    """Share of the stable pods' mirrorable requests copied to the canary. The copies' work
    lands on the stable pods: keep it small on busy services."""
    min_compared: int = Field(100, ge=1, le=1_000_000)
    """Fewest answers compared before the stage can pass (it passes on evidence, never on
    silence)."""
    min_agreement: float = Field(0.95, gt=0, lt=1)
    """Share of compared answers that must agree (greedy texts equal, vectors within
    `minCosine`), shown at power `power`; shown below it, the canary is rolled back."""
    max_error_rate: float = Field(0.01, gt=0, lt=1)
    """Most share of copies the canary may fail (5xx, 4xx, timeout, no connection)."""
    min_cosine: float = Field(0.99, ge=0, le=1)
    """Cosine similarity at or above which two embedding vectors agree."""
    alpha: float = Field(0.01, gt=0, lt=1)
    """Most probability that a canary within both bounds is rolled back."""
    power: float = Field(0.9, gt=0, lt=1)
    """1 - the most probability that a canary at or past either bound passes."""
    max_duration: Duration = "30m"
    """How long the stage may last without a verdict; then the canary is rolled back
    (`ShadowInconclusive`), as a step that waited too long for its evidence is. At least
    `rollout.interval`."""


class RolloutEvent(StrEnum):
    """What a `notify` webhook can be told of: the Event reasons of the rollout it posts."""

    ROLLOUT_STARTED = "RolloutStarted"
    STEP_ADVANCED = "StepAdvanced"
    """The canary got a step's weight (the first step's too)."""
    STEP_HELD = "StepHeld"
    AWAITING_APPROVAL = "AwaitingApproval"
    STEP_APPROVED = "StepApproved"
    STEP_VETOED = "StepVetoed"
    """A `confirm` webhook refused (or did not answer) a step that was ready to advance."""
    PAUSED = "Paused"
    RESUMED = "Resumed"
    PROMOTING = "Promoting"
    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"


class WebhookType(StrEnum):
    """What the operator asks a webhook (`rollout.webhooks[].type`)."""

    NOTIFY = "notify"
    """Told of the `events` it lists, after the status is written; never blocks a rollout."""
    CONFIRM = "confirm"
    """Asked before a step advances (or the canary is promoted): only a 2xx answer lets it;
    any other answer, or none, vetoes, and the next passing analysis asks again."""


class SecretKeyRef(Wire):
    """A key of a Secret in the InferenceService's namespace."""

    name: DnsSubdomain
    """The Secret."""
    key: str = Field(pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)
    """The key whose value signs the payloads (HMAC-SHA256)."""


MAX_WEBHOOK_TIMEOUT = "10s"
_EVENTS_NEEDED = "a notify webhook needs events, a confirm webhook takes none"


class WebhookSpec(Wire):
    """An HTTP(S) endpoint the operator POSTs signed JSON to (`rollout.webhooks[]`)."""

    model_config = cel_rules(
        cel(
            f"self.type == '{WebhookType.CONFIRM}'"
            " ? (!has(self.events) || size(self.events) == 0)"
            " : (has(self.events) && size(self.events) > 0)",
            _EVENTS_NEEDED,
            ".events",
        ),
        cel(
            f"duration(self.timeout) <= duration('{MAX_WEBHOOK_TIMEOUT}')",
            f"a webhook's timeout must be at most {MAX_WEBHOOK_TIMEOUT}",
            ".timeout",
        ),
    )

    name: DnsLabel
    """Shown in Events and status."""
    type: WebhookType = WebhookType.NOTIFY
    """`notify` (told of `events`) or `confirm` (asked before each step advances)."""
    url: str = Field(pattern=r"^https?://[^\s]+$", max_length=2048)
    """Where to POST: an `http://` or `https://` URL; redirects are not followed."""
    events: list[RolloutEvent] = Field(default_factory=list, max_length=16)
    """`notify`: the events to POST."""
    secret_ref: SecretKeyRef | None = None
    """The HMAC-SHA256 key: the payload's signature goes in `X-Fleetserve-Signature`
    (`sha256=<hex>`); unset: unsigned. The operator reads no Secret it is not granted: give
    its ServiceAccount `get` on this one (a Role with `resourceNames`)."""
    timeout: Duration = "2s"
    """How long one attempt may take, at most 10s."""
    retries: int = Field(2, ge=0, le=5)
    """Attempts after a failed one (no answer, or not 2xx), 0.5 s apart and more."""

    @model_validator(mode="after")
    def _checked(self) -> WebhookSpec:
        if (self.type is WebhookType.CONFIRM) == bool(self.events):
            msg = f"webhook {self.name!r}: {_EVENTS_NEEDED}"
            raise ValueError(msg)
        if parse_duration_s(self.timeout) > parse_duration_s(MAX_WEBHOOK_TIMEOUT):
            msg = f"webhook {self.name!r}: timeout {self.timeout} is above {MAX_WEBHOOK_TIMEOUT}"
            raise ValueError(msg)
        return self


class RolloutSpec(Wire):
    """How a new version is rolled out: weight steps, each held for `interval` and analysed."""

    model_config = cel_rules(
        cel(
            "!has(self.stepPolicies) || self.stepPolicies.all(p, p.weight in self.steps)",
            _POLICY_WEIGHTS,
            ".stepPolicies",
        ),
        cel(
            "!has(self.shadow) || duration(self.shadow.maxDuration) >= duration(self.interval)",
            _SHADOW_LONGER,
            ".shadow.maxDuration",
        ),
    )

    steps: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default=[1, 5, 20, 50, 100],
        min_length=1,
        max_length=20,
        json_schema_extra={
            VALIDATIONS: [
                cel(
                    "self.all(i, x, i == 0 || self[i - 1] < x)",
                    "rollout.steps must be strictly increasing",
                ),
                cel("self[size(self) - 1] == 100", "rollout.steps must end at 100"),
            ],
        },
    )
    """Canary traffic percentages, strictly increasing, ending at 100."""
    interval: Duration = "1m"
    """How long each step is held before it is analysed: a minimum, as a step before more than
    half of the traffic waits for the sequential analysis's evidence."""
    progress_deadline: Duration = "10m"
    """How long the canary may take to become ready before the rollout fails, and how long
    a step may hold for evidence after its interval (sequential analysis) before the canary
    is rolled back."""
    max_surge_gpus: int | None = Field(None, ge=0, alias="maxSurgeGPUs")
    """Most extra GPUs a rollout may use above the stable track's; unset: no bound."""
    analysis: AnalysisSpec | None = None
    """Metric analysis; unset promotes on readiness and time alone."""
    bake: Duration | None = None
    """How long the new version serves all traffic after the last step passes, judged as at
    that step (against stable's baseline), while the previous version's pods keep running
    at weight 0: a failure, or a crashed canary, sends the traffic back to them at once (a
    weight change, not a redeploy); after the bake the stable track takes the new spec.
    Unset: promote as soon as the last step passes."""
    bake_standby_replicas: int | None = Field(None, ge=1)
    """Replicas the previous version keeps during `bake` (the hot standby). Unset: the
    stable track's full size (with `maxSurgeGPUs`, what that bound leaves it at 100%, at
    least one), so a flip back has all its capacity at once; fewer saves GPUs, and a flip
    back then waits for the standby to grow. An autoscaled stable track keeps its size."""
    step_policies: list[StepPolicy] = keyed_list("weight", max_length=20)
    """Holds and manual gates of single steps, by weight, e.g.
    `[{weight: 1, hold: 24h, gate: manual}]`; a step without one advances as soon as its
    analysis passes."""
    shadow: ShadowSpec | None = None
    """A shadow stage before the first step: the canary gets a copy of a sample of live
    requests at weight 0, its answers compared with stable's and never returned; it goes on
    to the first step when its agreement is shown, and is rolled back when its disagreement
    or errors are, or after `maxDuration` without a verdict. Unset: no shadow stage."""
    webhooks: list[WebhookSpec] = keyed_list("name", max_length=8)
    """Endpoints told of the rollout's events (`notify`), or asked before each step
    advances (`confirm`); payloads are signed with the Secret key `secretRef` names."""

    def webhooks_of(self, kind: WebhookType) -> list[WebhookSpec]:
        """The webhooks of one type."""
        return [hook for hook in self.webhooks if hook.type is kind]

    @model_validator(mode="after")
    def _steps(self) -> RolloutSpec:
        if any(b <= a for a, b in zip(self.steps, self.steps[1:], strict=False)):
            msg = f"rollout.steps must be strictly increasing, got {self.steps}"
            raise ValueError(msg)
        if self.steps[-1] != 100 or self.steps[0] < 1:
            msg = f"rollout.steps must lie in 1..100 and end at 100, got {self.steps}"
            raise ValueError(msg)
        strays = [p.weight for p in self.step_policies if p.weight not in self.steps]
        if strays:
            msg = f"{_POLICY_WEIGHTS} {self.steps}, got {strays}"
            raise ValueError(msg)
        weights = [p.weight for p in self.step_policies]
        if len(set(weights)) != len(weights):
            msg = f"rollout.stepPolicies names a weight twice: {weights}"
            raise ValueError(msg)
        shadow = self.shadow
        if shadow is not None and (
            parse_duration_s(shadow.max_duration) < parse_duration_s(self.interval)
        ):
            msg = f"{_SHADOW_LONGER}: {shadow.max_duration} < {self.interval}"
            raise ValueError(msg)
        return self

    def policy_for(self, weight: int) -> StepPolicy | None:
        """The step policy of the step at `weight`, if it has one."""
        return next((p for p in self.step_policies if p.weight == weight), None)


class ParentRef(Wire):
    """A Gateway the HTTPRoute attaches to (Gateway API ParentReference)."""

    name: DnsSubdomain
    """Gateway name."""
    namespace: DnsLabel | None = None
    """Gateway namespace; unset: the InferenceService's."""
    section_name: DnsSubdomain | None = None
    """Listener name on the Gateway."""
    port: int | None = Field(None, ge=1, le=65535)
    """Listener port."""


_PARENTS_NEEDED = "traffic.parentRefs must name a Gateway when provider is gateway-api"


class TrafficProvider(StrEnum):
    """What splits traffic between the tracks (`spec.traffic.provider`)."""

    GATEWAY_API = "gateway-api"
    REPLICAS = "replicas"


class TrafficSpec(Wire):
    """How traffic is split between tracks."""

    model_config = cel_rules(
        cel(
            f"self.provider != '{TrafficProvider.GATEWAY_API}' || size(self.parentRefs) > 0",
            _PARENTS_NEEDED,
            ".parentRefs",
        )
    )

    provider: TrafficProvider = TrafficProvider.REPLICAS
    """`gateway-api`: an HTTPRoute with exact weights; `replicas`: the umbrella Service
    spreads requests over pods, so weights follow replica counts."""
    parent_refs: list[ParentRef] = Field(default_factory=list, max_length=32)
    """Gateways the HTTPRoute attaches to (gateway-api)."""
    hostnames: list[Hostname] = Field(default_factory=list, max_length=16)
    """Hostnames the HTTPRoute matches (gateway-api)."""
    port: int = Field(80, ge=1, le=65535)
    """Port of the Services."""

    @model_validator(mode="after")
    def _parents(self) -> TrafficSpec:
        if self.provider is TrafficProvider.GATEWAY_API and not self.parent_refs:
            raise ValueError(_PARENTS_NEEDED)
        return self
