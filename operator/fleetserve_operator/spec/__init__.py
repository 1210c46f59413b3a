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

from pydantic import ConfigDict, model_validator

from fleetserve_operator.spec.base import (
    DEFAULT_IMAGE,
    GPU_RESOURCE,
    MAX_QUANTITY,
    Wire,
    cel,
    parse_duration_s,
    parse_quantity,
)
from fleetserve_operator.spec.delivery import (
    AnalysisMode,
    AnalysisSpec,
    MetricCheck,
    ParentRef,
    RolloutCommand,
    RolloutSpec,
    TrafficProvider,
    TrafficSpec,
)
from fleetserve_operator.spec.serving import (
    GENERATIVE_CEL,
    KV_FIT_RULE,
    BatchingOverrides,
    BatchingSpec,
    EnvVar,
    FallbackSpec,
    GenerationOverrides,
    GenerationSpec,
    GpuTrackSpec,
    KeySelector,
    MemorySpec,
    ModelSpec,
    Replicas,
    Resources,
    RuntimeSpec,
    Task,
    Toleration,
    kv_fit_problem,
)
from fleetserve_operator.spec.status import (
    Acknowledgement,
    AnalysisResult,
    CheckEvidence,
    CheckOutcome,
    CheckResult,
    Condition,
    ConditionType,
    Evidence,
    InconclusiveReason,
    InferenceServiceStatus,
    RolloutPhase,
    RolloutStatus,
    TrackCounts,
    TracksStatus,
    TrackStatus,
    Verdict,
    set_condition,
)

__all__ = [
    "DEFAULT_IMAGE",
    "GPU_RESOURCE",
    "MAX_QUANTITY",
    "Acknowledgement",
    "AnalysisMode",
    "AnalysisResult",
    "AnalysisSpec",
    "BatchingOverrides",
    "BatchingSpec",
    "CheckEvidence",
    "CheckOutcome",
    "CheckResult",
    "Condition",
    "ConditionType",
    "EnvVar",
    "Evidence",
    "FallbackSpec",
    "GenerationOverrides",
    "GenerationSpec",
    "GpuTrackSpec",
    "InconclusiveReason",
    "InferenceServiceSpec",
    "InferenceServiceStatus",
    "KeySelector",
    "MemorySpec",
    "MetricCheck",
    "ModelSpec",
    "ParentRef",
    "Replicas",
    "Resources",
    "RolloutCommand",
    "RolloutPhase",
    "RolloutSpec",
    "RolloutStatus",
    "RuntimeSpec",
    "Task",
    "Toleration",
    "TrackCounts",
    "TrackStatus",
    "TrafficProvider",
    "TrafficSpec",
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


class InferenceServiceSpec(Wire):
    """The desired state of one served model (`spec` of an InferenceService)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
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
            ]
        }
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
        knobs = self.gpu_track.generation_knobs
        if knobs is not None:
            problem = kv_fit_problem(self.model, self.memory, knobs)
            if problem is not None:
                raise ValueError(problem)
        return self

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
