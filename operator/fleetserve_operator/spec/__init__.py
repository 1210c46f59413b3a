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

from fleetserve_operator.spec.base import (
    DEFAULT_IMAGE,
    GPU_RESOURCE,
    MAX_QUANTITY,
    Wire,
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
    BatchingOverrides,
    BatchingSpec,
    EnvVar,
    FallbackSpec,
    GpuTrackSpec,
    KeySelector,
    MemorySpec,
    ModelSpec,
    Replicas,
    Resources,
    RuntimeSpec,
    Toleration,
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


class InferenceServiceSpec(Wire):
    """The desired state of one served model (`spec` of an InferenceService)."""

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

    @property
    def gpu_track(self) -> GpuTrackSpec:
        """The sections that shape the GPU tracks' pods (what a rollout rolls out)."""
        return GpuTrackSpec(
            model=self.model, runtime=self.runtime, batching=self.batching, memory=self.memory
        )
