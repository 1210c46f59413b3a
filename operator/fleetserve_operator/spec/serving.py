"""What runs: the model, the runtime pods, batching, memory and the CPU fallback."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from fleetserve_operator.spec.base import (
    DEFAULT_IMAGE,
    GPU_RESOURCE,
    DnsSubdomain,
    Duration,
    LabelValue,
    QualifiedName,
    Quantity,
    Wire,
    cel,
    parse_quantity,
)

__all__ = [
    "BatchingOverrides",
    "BatchingSpec",
    "EnvSource",
    "EnvVar",
    "FallbackSpec",
    "GpuTrackSpec",
    "KeyRef",
    "KeySelector",
    "MemorySpec",
    "ModelSpec",
    "Replicas",
    "Resources",
    "RuntimeSpec",
    "Toleration",
]


class ModelSpec(Wire):
    """What to serve: the model's name, version and where its weights or handler come from."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.uri) != has(self.handler)",
                    "exactly one of model.uri and model.handler must be set",
                )
            ]
        }
    )

    name: str = Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$", max_length=63)
    """Name the model is served under (`/v2/models/{name}`) and its `model` metric label."""
    # The version is also a label value of the track's Deployment and pods, so it takes that
    # grammar: no `+`, and a letter or digit at both ends.
    version: str = Field(pattern=r"^[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?$", max_length=63)
    """Version label; changing it rolls the new version out."""
    uri: str | None = Field(
        None,
        pattern=r"^(builtin://[a-z0-9-]+(\?.*)?|file:///.+|pvc://[a-z0-9][a-z0-9.-]{0,252}/.+)$",
        max_length=2048,
    )
    """`builtin://minilm-l6`, `builtin://synthetic?latency_ms=5`, `file:///path` (in the image)
    or `pvc://<claim>/<path>` (the claim is mounted read-only at /models)."""
    handler: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", max_length=512)
    """Entry point `package.module:factory` building the model handler (instead of `uri`)."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.uri is None) == (self.handler is None):
            msg = "exactly one of model.uri and model.handler must be set"
            raise ValueError(msg)
        return self


class Replicas(Wire):
    """Replica bounds; when `max > min` an autoscaler owns the count (see the README)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [cel("self.min <= self.max", "replicas.min must be <= max")]
        }
    )

    min: int = Field(1, ge=0, le=1000)
    """Fewest replicas."""
    max: int = Field(1, ge=0, le=1000)
    """Most replicas; equal to `min` means the operator sets the count itself."""

    @model_validator(mode="after")
    def _ordered(self) -> Replicas:
        if self.min > self.max:
            msg = f"replicas.min ({self.min}) must be <= replicas.max ({self.max})"
            raise ValueError(msg)
        return self

    @property
    def is_autoscaled(self) -> bool:
        """True when an autoscaler, not the operator, owns the Deployment's replica count."""
        return self.max > self.min


class Resources(Wire):
    """Container resource requests and limits (Kubernetes quantities)."""

    requests: dict[QualifiedName, Quantity] = Field(default_factory=dict, max_length=16)
    """Requested resources, e.g. `cpu: "2"`, `memory: 8Gi`."""
    limits: dict[QualifiedName, Quantity] = Field(default_factory=dict, max_length=16)
    """Resource limits, e.g. `nvidia.com/gpu: 1`."""

    @property
    def has_gpu(self) -> bool:
        """True when the resources ask for an NVIDIA GPU."""
        return GPU_RESOURCE in self.requests or GPU_RESOURCE in self.limits

    @property
    def gpu_count(self) -> int:
        """GPUs one replica takes (its limit, else its request); 0 without GPUs."""
        value = self.limits.get(GPU_RESOURCE, self.requests.get(GPU_RESOURCE, 0))
        return parse_quantity(value)


class Toleration(Wire):
    """A pod toleration, as in the core API."""

    key: QualifiedName | None = None
    """Taint key; empty with `Exists` matches every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """How the value is compared."""
    value: LabelValue | None = None
    """Taint value for `Equal`."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; empty tolerates all."""
    toleration_seconds: int | None = Field(None, ge=0)
    """How long a `NoExecute` taint is tolerated, in seconds."""


class KeySelector(Wire):
    """A key of a Secret or ConfigMap in the InferenceService's namespace."""

    name: DnsSubdomain
    """Name of the Secret or ConfigMap."""
    key: str = Field(pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)
    """Key inside it."""


class KeyRef(KeySelector):
    """A key of a Secret or ConfigMap, for an environment variable."""

    optional: bool | None = None
    """Start even when it is missing."""


class EnvSource(Wire):
    """Where an environment variable's value comes from."""

    secret_key_ref: KeyRef | None = None
    """A key of a Secret."""
    config_map_key_ref: KeyRef | None = None
    """A key of a ConfigMap."""


class EnvVar(Wire):
    """An extra environment variable for the runtime container."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=253)
    """Variable name; `FLEETSERVE_*` names set runtime options the operator does not render."""
    value: str | None = Field(None, max_length=4096)
    """Literal value; a longer one belongs in a ConfigMap or Secret (`valueFrom`)."""
    value_from: EnvSource | None = None
    """Value from a Secret or ConfigMap key."""


class RuntimeSpec(Wire):
    """How the GPU tracks (stable and canary) run the Fleetserve runtime."""

    image: str = Field(DEFAULT_IMAGE, min_length=1, max_length=512)
    """Runtime container image."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """When the kubelet pulls the image."""
    replicas: Replicas = Replicas()
    """Replicas of the stable track."""
    resources: Resources = Resources()
    """Container resources, including `nvidia.com/gpu`."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs; `auto` picks CUDA when the pod has a GPU."""
    threads: int = Field(0, ge=0, le=1024)
    """Torch intra-op threads; 0 keeps torch's default."""
    node_selector: dict[QualifiedName, LabelValue] = Field(default_factory=dict, max_length=32)
    """Node labels the pods require."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Taints the pods tolerate (GPU nodes are usually tainted)."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """Extra environment variables (all tracks)."""
    service_account_name: DnsSubdomain | None = None
    """Service account of the runtime pods; none means the namespace default."""
    auth_secret_ref: KeySelector | None = None
    """Secret key holding the token clients must present; the runtime reads it from a
    read-only Secret volume (`--auth-token-file`), so a rotated Secret takes effect without
    a restart. Unset: no authentication. Every track runs with the stable track's setting
    except the canary, which runs the spec's: changing it is a rollout."""


class BatchingSpec(Wire):
    """Dynamic batching and admission limits, passed to the runtime as flags."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.maxTimeoutMs >= self.defaultTimeoutMs",
                    "batching.maxTimeoutMs must be >= batching.defaultTimeoutMs",
                    ".maxTimeoutMs",
                )
            ]
        }
    )

    max_batch_size: int = Field(32, ge=1, le=4096)
    """Most requests (instances) in one batch."""
    max_queue_delay_ms: float = Field(10.0, ge=0, le=10_000)
    """Longest the oldest queued request waits for a batch to fill, in milliseconds."""
    max_sequence_length: int = Field(256, ge=1, le=1_000_000)
    """Longest input in tokens; longer inputs get 413 unless the request asks to truncate."""
    buckets: str = Field(
        "auto", pattern=r"^(auto|none|[1-9][0-9]*(,[1-9][0-9]*)*)$", max_length=1024
    )
    """Length-bucket edges in tokens: `auto` (learned), `none`, or increasing `16,32,64`."""
    max_batch_tokens: int = Field(0, ge=0)
    """Most padded tokens in one batch; 0 derives the limit from the memory budget."""
    max_queue_size: int = Field(1024, ge=1)
    """Most instances waiting per replica; beyond it requests get 503."""
    default_timeout_ms: int = Field(5_000, ge=1)
    """Deadline of a request that names none, in milliseconds."""
    max_timeout_ms: int = Field(30_000, ge=1)
    """Longest deadline a caller may ask for, in milliseconds."""

    @model_validator(mode="after")
    def _check(self) -> BatchingSpec:
        if self.max_timeout_ms < self.default_timeout_ms:
            msg = (
                f"batching.maxTimeoutMs ({self.max_timeout_ms}) must be >= "
                f"batching.defaultTimeoutMs ({self.default_timeout_ms})"
            )
            raise ValueError(msg)
        edges = self.bucket_edges
        if edges != sorted(set(edges)):
            msg = f"batching.buckets must be strictly increasing, got {self.buckets}"
            raise ValueError(msg)
        if edges and edges[-1] > self.max_sequence_length:
            msg = (
                f"batching.buckets edge {edges[-1]} exceeds "
                f"batching.maxSequenceLength {self.max_sequence_length}"
            )
            raise ValueError(msg)
        return self

    @property
    def bucket_edges(self) -> list[int]:
        """Explicit bucket edges; empty for `auto` and `none`."""
        if self.buckets in ("auto", "none"):
            return []
        return [int(part) for part in self.buckets.split(",")]


class BatchingOverrides(Wire):
    """Batching fields the CPU fallback sets differently; unset fields follow `batching`."""

    max_batch_size: int | None = Field(None, ge=1, le=4096)
    """Most requests in one batch."""
    max_queue_delay_ms: float | None = Field(None, ge=0, le=10_000)
    """Longest wait for a batch to fill, in milliseconds."""
    max_sequence_length: int | None = Field(None, ge=1, le=1_000_000)
    """Longest input in tokens."""
    buckets: str | None = Field(
        None, pattern=r"^(auto|none|[1-9][0-9]*(,[1-9][0-9]*)*)$", max_length=1024
    )
    """Length-bucket edges (`auto`, `none` or `16,32,64`)."""
    max_batch_tokens: int | None = Field(None, ge=0)
    """Most padded tokens in one batch."""
    max_queue_size: int | None = Field(None, ge=1)
    """Most instances waiting per replica."""
    default_timeout_ms: int | None = Field(None, ge=1)
    """Default request deadline, in milliseconds."""
    max_timeout_ms: int | None = Field(None, ge=1)
    """Longest request deadline, in milliseconds."""

    def merged_over(self, base: BatchingSpec) -> BatchingSpec:
        """`base` with the fields set here replaced; `ValueError` if the result is invalid."""
        values = base.model_dump() | self.model_dump(exclude_none=True)
        return BatchingSpec.model_validate(values)


class MemorySpec(Wire):
    """Per-replica memory budget; the runtime sizes its batches to fit it."""

    budget: Quantity | None = None
    """Bytes one replica may use for weights and activations (e.g. `12Gi`); unset: unbounded."""
    reserve_fraction: float = Field(0.1, ge=0, lt=1)
    """Fraction of the budget kept free for fragmentation and the allocator."""

    @property
    def budget_bytes(self) -> int:
        """The budget in bytes; 0 when unbounded."""
        return 0 if self.budget is None else parse_quantity(self.budget)


class FallbackSpec(Wire):
    """A CPU Deployment kept warm, to take traffic when the GPU track cannot."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"!has(self.resources) || ((!has(self.resources.limits) || "
                    f"!('{GPU_RESOURCE}' in self.resources.limits)) && "
                    f"(!has(self.resources.requests) || "
                    f"!('{GPU_RESOURCE}' in self.resources.requests)))",
                    f"fallback.resources must not request {GPU_RESOURCE}: "
                    "the fallback track runs on CPU",
                    ".resources",
                )
            ]
        }
    )

    enabled: bool = False
    """Run the CPU fallback track."""
    replicas: Replicas = Replicas()
    """`min` replicas stay warm; the track grows to `max` while it carries the traffic."""
    resources: Resources = Resources()
    """CPU and memory of a fallback replica; no GPUs."""
    threads: int = Field(0, ge=0, le=1024)
    """Torch intra-op threads; 0 keeps torch's default."""
    node_selector: dict[QualifiedName, LabelValue] = Field(default_factory=dict, max_length=32)
    """Node labels the fallback pods require."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Taints the fallback pods tolerate."""
    batching: BatchingOverrides = BatchingOverrides()
    """Batching fields that differ on CPU (usually smaller batches)."""
    max_error_rate: float | None = Field(None, ge=0, le=1)
    """Fail over when the stable track's 5xx ratio exceeds this for `errorWindow`; unset:
    fail over only when it has no available replica."""
    error_window: Duration = "1m"
    """How long the error ratio must stay above `maxErrorRate`."""

    @model_validator(mode="after")
    def _cpu_only(self) -> FallbackSpec:
        if self.resources.has_gpu:
            msg = f"fallback.resources must not request {GPU_RESOURCE}: the fallback runs on CPU"
            raise ValueError(msg)
        return self


class GpuTrackSpec(Wire):
    """The spec sections that shape a GPU track's pods; a change to them is a rollout.

    `status.rollout.stableSpec` keeps the one the stable track runs, so that the stable
    track keeps serving it while a canary runs the new one, and after a rollback.
    """

    model: ModelSpec
    """What to serve."""
    runtime: RuntimeSpec = RuntimeSpec()
    """How the GPU tracks run (`replicas` is not part of the digest)."""
    batching: BatchingSpec = BatchingSpec()
    """Dynamic batching and admission limits."""
    memory: MemorySpec = MemorySpec()
    """Per-replica memory budget."""

    @property
    def digest(self) -> str:
        """A short hash of the pod-shaping fields.

        Replica counts are left out (scaling is not a rollout), and so are fields at their
        defaults, so that a field added to the API later does not start a rollout of every
        existing service after an operator upgrade.
        """
        unscaled = self.model_copy(
            update={"runtime": self.runtime.model_copy(update={"replicas": Replicas()})}
        )
        shaping = unscaled.model_dump_json(by_alias=True, exclude_defaults=True)
        return hashlib.sha256(shaping.encode()).hexdigest()[:16]
