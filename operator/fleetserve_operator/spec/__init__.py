"""The InferenceService API (`serving.fleetserve.io/v1alpha1`): the CRD's single source of truth.

`crdgen` turns these pydantic models into `crds/serving.fleetserve.io_inferenceservices.yaml`;
the operator parses every object it receives with them. Field names are snake_case in Python
and camelCase on the wire. Each rule the API server can check is written twice on purpose: as
a CEL rule (`x-kubernetes-validations`, so `kubectl apply` rejects a bad object with a message
naming the field) and as a pydantic validator (so the operator never acts on an object an older
CRD let through). Semantic checks the schema cannot make (does the PVC exist?) are the
reconciler's.
"""

from __future__ import annotations

from pydantic import model_validator

from fleetserve_operator.spec.base import (
    GPU_RESOURCE,
    MAX_QUANTITY,
    DnsSubdomain,
    Wire,
    cel,
    cel_rules,
    parse_duration_s,
    parse_quantity,
)
from fleetserve_operator.spec.delivery import (
    AnalysisMode,
    AnalysisSpec,
    MetricCheck,
    ParentRef,
    RolloutCommand,
    RolloutEvent,
    RolloutSpec,
    SecretKeyRef,
    ShadowSpec,
    StepGate,
    StepPolicy,
    TrafficProvider,
    TrafficSpec,
    WebhookSpec,
    WebhookType,
)
from fleetserve_operator.spec.evidence import (
    AnalysisResult,
    CheckEvidence,
    CheckOutcome,
    CheckResult,
    Evidence,
    InconclusiveReason,
    PowerEvidence,
    RateEvidence,
    ShadowCounts,
    ShadowEvidence,
    TrackCounts,
    Verdict,
)
from fleetserve_operator.spec.images import (
    DEFAULT_CPU_IMAGE,
    DEFAULT_IMAGE,
    Image,
    RuntimeImages,
)
from fleetserve_operator.spec.model import GENERATIVE_CEL, ModelSpec, Task
from fleetserve_operator.spec.scaling import (
    Backend,
    DisruptionSpec,
    Precision,
    ScalingMetric,
    ScalingSpec,
    TopologySpread,
)
from fleetserve_operator.spec.serving import (
    BatchingOverrides,
    BatchingSpec,
    EnvVar,
    GenerationOverrides,
    GenerationSpec,
    GrpcSpec,
    KeySelector,
    MemorySpec,
    Replicas,
    Resources,
    RuntimeSpec,
    TenantsSpec,
    TlsSpec,
    Toleration,
)
from fleetserve_operator.spec.status import (
    Acknowledgement,
    BakeStatus,
    Condition,
    ConditionType,
    InferenceServiceStatus,
    RolloutPhase,
    RolloutStatus,
    ShadowStatus,
    StepGateStatus,
    StepWait,
    TracksStatus,
    TrackStatus,
    set_condition,
)
from fleetserve_operator.spec.tracks import (
    BACKEND_RULES,
    GRPC_RULES,
    KV_FIT_RULE,
    RUNTIME_HTTP_PORT,
    FallbackSpec,
    GpuTrackSpec,
    backend_problem,
    grpc_port_problem,
    kv_fit_problem,
)

__all__ = [
    "DEFAULT_CPU_IMAGE",
    "DEFAULT_IMAGE",
    "GPU_RESOURCE",
    "MAX_QUANTITY",
    "Acknowledgement",
    "AnalysisMode",
    "AnalysisResult",
    "AnalysisSpec",
    "Backend",
    "BakeStatus",
    "RateEvidence",
    "ShadowCounts",
    "ShadowEvidence",
    "ShadowStatus",
    "BatchingOverrides",
    "BatchingSpec",
    "CheckEvidence",
    "CheckOutcome",
    "CheckResult",
    "Condition",
    "ConditionType",
    "DisruptionSpec",
    "EnvVar",
    "Evidence",
    "FallbackSpec",
    "GenerationOverrides",
    "GenerationSpec",
    "GpuTrackSpec",
    "GrpcSpec",
    "Image",
    "InconclusiveReason",
    "InferenceServiceSpec",
    "InferenceServiceStatus",
    "PowerEvidence",
    "KeySelector",
    "MemorySpec",
    "MetricCheck",
    "ModelSpec",
    "ParentRef",
    "Precision",
    "RUNTIME_HTTP_PORT",
    "Replicas",
    "Resources",
    "RolloutCommand",
    "RolloutEvent",
    "RolloutPhase",
    "RolloutSpec",
    "RolloutStatus",
    "StepGate",
    "StepGateStatus",
    "ShadowSpec",
    "StepPolicy",
    "StepWait",
    "RuntimeImages",
    "SecretKeyRef",
    "RuntimeSpec",
    "ScalingMetric",
    "ScalingSpec",
    "Task",
    "TenantsSpec",
    "TlsSpec",
    "Toleration",
    "TopologySpread",
    "TrackCounts",
    "TrackStatus",
    "TrafficProvider",
    "TrafficSpec",
    "WebhookSpec",
    "WebhookType",
    "TracksStatus",
    "Verdict",
    "parse_duration_s",
    "parse_quantity",
    "set_condition",
]


_HOSTNAMES_NEEDED = (
    "a generative model with traffic.provider gateway-api needs traffic.hostnames: its "
    "OpenAI routes (/v1/chat/completions, /v1/completions, /v1/models) carry no model name, "
    "so the hostname tells two generative services on one Gateway apart"
)


_GRPC_HOSTNAMES_NEEDED = (
    "runtime.grpc with traffic.provider gateway-api needs traffic.hostnames: a gRPC call "
    "names its model inside the message, not in a path a route can match, so the hostname "
    "tells two services on one Gateway apart"
)


_REPLICAS_AND_SCALING = (
    "runtime.replicas (min < max: an autoscaler of your own) and scaling (KEDA) both size "
    "the stable track: remove scaling, or give runtime.replicas min = max"
)


def _kv_usage_needs_generation(field: str) -> str:
    return (
        f"{field} kvCacheUsage applies to generative models only (an encoder has no KV "
        "cache): set model.task to generate, or scale on inflightRequests or queueWaitP90"
    )


class InferenceServiceSpec(Wire):
    """The desired state of one served model (`spec` of an InferenceService)."""

    model_config = cel_rules(
        cel(
            f"!has(self.generation) || {GENERATIVE_CEL}",
            "generation applies to generative models only: set model.task to "
            "generate, or remove generation",
            ".generation",
        ),
        cel(
            f"!has(self.fallback) || !has(self.fallback.generation) || {GENERATIVE_CEL}",
            "fallback.generation applies to generative models only: set model.task "
            "to generate, or remove fallback.generation",
            ".fallback.generation",
        ),
        cel(
            f"!{GENERATIVE_CEL} || !has(self.traffic) || "
            f"self.traffic.provider != '{TrafficProvider.GATEWAY_API}' || "
            "(has(self.traffic.hostnames) && size(self.traffic.hostnames) > 0)",
            _HOSTNAMES_NEEDED,
            ".traffic.hostnames",
        ),
        KV_FIT_RULE,
        *BACKEND_RULES,
        *GRPC_RULES,
        cel(
            "!self.runtime.grpc.enabled || "
            f"self.traffic.provider != '{TrafficProvider.GATEWAY_API}' || "
            "(has(self.traffic.hostnames) && size(self.traffic.hostnames) > 0)",
            _GRPC_HOSTNAMES_NEEDED,
            ".traffic.hostnames",
        ),
        *(
            cel(
                f"!has(self{path}.scaling) || "
                f"self{path}.scaling.metric != '{ScalingMetric.KV_CACHE_USAGE}' || "
                f"{GENERATIVE_CEL}",
                _kv_usage_needs_generation(f"{prefix}scaling.metric"),
                f"{path}.scaling.metric",
            )
            for path, prefix in (("", ""), (".fallback", "fallback."))
        ),
        cel(
            "!has(self.scaling) || self.runtime.replicas.min == self.runtime.replicas.max",
            _REPLICAS_AND_SCALING,
            ".scaling",
        ),
    )

    model: ModelSpec
    """What to serve."""
    runtime: RuntimeSpec = RuntimeSpec()
    """How the GPU tracks run."""
    batching: BatchingSpec = BatchingSpec()
    """Dynamic batching and admission limits."""
    memory: MemorySpec = MemorySpec()
    """Per-replica memory budget."""
    rollout: RolloutSpec = RolloutSpec()
    """How new versions are rolled out."""
    fallback: FallbackSpec = FallbackSpec()
    """The CPU fallback track."""
    traffic: TrafficSpec = TrafficSpec()
    """How traffic reaches the tracks."""
    generation: GenerationSpec | None = None
    """The generative engine's knobs (KV cache, batch, chunked prefill, context); generative
    models only, defaults when unset."""
    scaling: ScalingSpec | None = None
    """Autoscale the stable track on an inference signal (a KEDA ScaledObject); it then
    replaces `runtime.replicas`. The canary follows weight x the stable track's current size.
    Unset: the stable track runs `runtime.replicas.min` replicas."""
    disruption: DisruptionSpec = DisruptionSpec()
    """The PodDisruptionBudget of each GPU track (stable, canary)."""
    topology_spread: TopologySpread = TopologySpread.SCHEDULE_ANYWAY
    """How the GPU tracks' pods spread across nodes (`kubernetes.io/hostname`) and zones
    (`topology.kubernetes.io/zone`), each track on its own."""
    priority_class_name: DnsSubdomain | None = None
    """PriorityClass of the GPU tracks' pods; unset: the cluster's default."""

    @model_validator(mode="after")
    def _check_generation(self) -> InferenceServiceSpec:
        for field, value in (
            ("generation", self.generation),
            ("fallback.generation", self.fallback.generation),
        ):
            if value is not None and not self.model.generates:
                msg = (
                    f"{field} applies to generative models only: set model.task to generate, "
                    f"or remove {field}"
                )
                raise ValueError(msg)
        traffic = self.traffic
        if (
            self.model.generates
            and traffic.provider is TrafficProvider.GATEWAY_API
            and not traffic.hostnames
        ):
            raise ValueError(_HOSTNAMES_NEEDED)
        for field, scaling in (
            ("scaling", self.scaling),
            ("fallback.scaling", self.fallback.scaling),
        ):
            if (
                scaling is not None
                and scaling.metric is ScalingMetric.KV_CACHE_USAGE
                and not self.model.generates
            ):
                raise ValueError(_kv_usage_needs_generation(f"{field}.metric"))
        if self.scaling is not None and self.runtime.replicas.is_autoscaled:
            raise ValueError(_REPLICAS_AND_SCALING)
        knobs = self.gpu_track.generation_knobs
        if knobs is not None:
            problem = kv_fit_problem(self.model, self.memory, knobs)
            if problem is not None:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _check_backends(self) -> InferenceServiceSpec:
        for track, backend in (
            ("runtime", self.runtime.backend),
            ("fallback", self.fallback.backend),
        ):
            problem = backend_problem(self.model, backend, track)
            if problem is not None:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _check_grpc_port(self) -> InferenceServiceSpec:
        problem = grpc_port_problem(self.runtime.grpc, self.traffic.port)
        if problem is not None:
            raise ValueError(problem)
        traffic = self.traffic
        if (
            self.runtime.grpc.enabled
            and traffic.provider is TrafficProvider.GATEWAY_API
            and not traffic.hostnames
        ):
            raise ValueError(_GRPC_HOSTNAMES_NEEDED)
        return self

    @property
    def stable_autoscaled(self) -> bool:
        """True when an autoscaler (KEDA's or the user's own) owns the stable track's count."""
        return self.scaling is not None or self.runtime.replicas.is_autoscaled

    def with_images(self, images: RuntimeImages) -> InferenceServiceSpec:
        """This spec with an unset `runtime.image` and `fallback.image` set from `images`.

        The operator reads every spec through it, before the rollout or the render sees it,
        as the API server would fill in a default: the GPU tracks' digest and
        `status.rollout.stableSpec` then hold the image the pods run, so a new default
        image rolls out like a new `runtime.image` (through the canary), and the fallback's
        pods are replaced like on any `fallback` change.
        """
        runtime = self.runtime.model_copy(update={"image": self.runtime.image or images.gpu})
        fallback = self.fallback.model_copy(update={"image": self.fallback.image or images.cpu})
        return self.model_copy(update={"runtime": runtime, "fallback": fallback})

    @property
    def gpu_track(self) -> GpuTrackSpec:
        """The sections that shape the GPU tracks' pods (what a rollout rolls out)."""
        return GpuTrackSpec(
            model=self.model,
            runtime=self.runtime,
            batching=self.batching,
            memory=self.memory,
            generation=self.generation,
        )
