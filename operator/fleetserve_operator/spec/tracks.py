"""The tracks: the GPU track's pod-shaping spec, the CPU fallback, and the rules across sections.

The rules that read the model and another section (the backend a track may use, the KV
cache a budget must hold, the ports the gRPC listener may not take) are CEL on the whole
spec, each with its Python twin (`*_problem`).
"""

from __future__ import annotations

import hashlib
import re

from pydantic import Field, model_validator

from fleetserve_operator.spec.base import (
    GPU_RESOURCE,
    DnsSubdomain,
    Duration,
    LabelValue,
    QualifiedName,
    Wire,
    cel,
    cel_rules,
)
from fleetserve_operator.spec.images import DEFAULT_CPU_IMAGE, DEFAULT_IMAGE, Image
from fleetserve_operator.spec.model import (
    MINILM_URI,
    ONNX_FILE_URI,
    ONNXRUNTIME_ON_GPU,
    SMOLLM2_CONTEXT,
    SMOLLM2_KV_BYTES_PER_TOKEN,
    SMOLLM2_MIN_WEIGHTS_BYTES,
    SMOLLM2_URI,
    ModelSpec,
    backend_contradicts,
    gpu_requested_cel,
    onnxruntime_bf16,
)
from fleetserve_operator.spec.scaling import (
    Backend,
    DisruptionSpec,
    Precision,
    ScalingSpec,
    TopologySpread,
)
from fleetserve_operator.spec.serving import (
    BatchingOverrides,
    BatchingSpec,
    GenerationOverrides,
    GenerationSpec,
    GrpcSpec,
    MemorySpec,
    Replicas,
    Resources,
    RuntimeSpec,
    Toleration,
)

__all__ = [
    "BACKEND_RULES",
    "GRPC_RULES",
    "KV_FIT_RULE",
    "RUNTIME_HTTP_PORT",
    "FallbackSpec",
    "GpuTrackSpec",
    "backend_problem",
    "grpc_port_problem",
    "kv_fit_problem",
]

_NO_FALLBACK_CAPACITY = (
    "fallback.replicas.max is 0, but an enabled fallback needs at least 1 replica to take "
    "the traffic: raise fallback.replicas.max, or set fallback.enabled to false"
)


class FallbackSpec(Wire):
    """A CPU Deployment kept warm, to take traffic when the GPU track cannot."""

    model_config = cel_rules(
        cel(
            f"!({gpu_requested_cel('self')})",
            f"fallback.resources must not request {GPU_RESOURCE}: the fallback track runs on CPU",
            ".resources",
        ),
        cel(
            "!has(self.scaling) || self.replicas.min == self.replicas.max",
            "fallback.replicas and fallback.scaling both size the fallback track: "
            "remove fallback.scaling, or give fallback.replicas min = max",
            ".scaling",
        ),
        # The rule fails only at max 0 (max >= 0), so the plain message names the
        # value; a messageExpression here is priced past the API server's CEL budget.
        cel(
            "!self.enabled || has(self.scaling) || self.replicas.max >= 1",
            _NO_FALLBACK_CAPACITY,
            ".replicas.max",
        ),
    )

    enabled: bool = False
    """Run the CPU fallback track."""
    image: Image | None = None
    """Runtime container image of the fallback's pods (and of their model fetch): a CPU-only
    build; unset: the operator's default for the CPU track (the chart's `runtime.cpuImage`),
    never the GPU tracks' image. Changing it, or the operator's default of a service that
    leaves it unset, replaces the fallback's pods, without a canary."""
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
    generation: GenerationOverrides | None = None
    """Generation fields that differ on CPU (usually a smaller `maxRunningSequences`);
    generative models only."""
    max_error_rate: float | None = Field(None, ge=0, le=1)
    """Fail over when the stable track's 5xx ratio exceeds this for `errorWindow`; unset:
    fail over only when it has no available replica."""
    error_window: Duration = "1m"
    """How long the error ratio must stay above `maxErrorRate`."""
    precision: Precision = "fp32"
    """Numeric precision of the fallback's model (`--precision`); `int8` is usually the
    fastest on CPU."""
    backend: Backend = "auto"
    """What runs the fallback's model (`--backend`): `auto` lets the runtime pick (ONNX
    Runtime for `builtin://minilm-l6` in fp32, torch for it in int8); `torch` or
    `onnxruntime` pins it. ONNX Runtime serves fp32 or int8, and a backend that cannot serve
    the model is refused. Changing it replaces the fallback's pods, without a canary."""
    scaling: ScalingSpec | None = None
    """Autoscale the fallback track on an inference signal (a KEDA ScaledObject); it then
    replaces `replicas`, also while the fallback carries the traffic."""
    disruption: DisruptionSpec = DisruptionSpec()
    """The fallback track's PodDisruptionBudget."""
    topology_spread: TopologySpread = TopologySpread.SCHEDULE_ANYWAY
    """How the fallback pods spread across nodes and zones."""
    priority_class_name: DnsSubdomain | None = None
    """PriorityClass of the fallback pods; unset: the cluster's default."""

    @model_validator(mode="after")
    def _cpu_only(self) -> FallbackSpec:
        if self.resources.has_gpu:
            msg = f"fallback.resources must not request {GPU_RESOURCE}: the fallback runs on CPU"
            raise ValueError(msg)
        if self.scaling is not None and self.replicas.is_autoscaled:
            msg = (
                "fallback.replicas and fallback.scaling both size the fallback track: "
                "remove fallback.scaling, or give fallback.replicas min = max"
            )
            raise ValueError(msg)
        if self.backend == "onnxruntime" and self.precision == "bf16":
            raise ValueError(onnxruntime_bf16("fallback"))
        if self.enabled and self.scaling is None and self.replicas.max < 1:
            raise ValueError(_NO_FALLBACK_CAPACITY)
        return self

    @property
    def pod_image(self) -> str:
        """The image the fallback's pods run: `image`, else the built-in CPU-track one.

        The operator sets an unset `image` to its own default as it reads a spec.
        """
        return self.image or DEFAULT_CPU_IMAGE


_BUDGET_CEL = (
    "(type(self.memory.budget) == int ? double(self.memory.budget) : "
    "quantity(string(self.memory.budget)).asApproximateFloat())"
)


def _knob_cel(field: str, default: object) -> str:
    return f"(has(self.generation) ? self.generation.{field} : {default})"


def _kv_fit_cel() -> str:
    defaults = GenerationSpec()
    asked = _knob_cel("maxContext", defaults.max_context)
    block = _knob_cel("blockSize", defaults.block_size)
    context = f"({asked} == 0 || {asked} > {SMOLLM2_CONTEXT} ? {SMOLLM2_CONTEXT} : {asked})"
    tokens = f"({context} + {block} - 1) / {block} * {block}"
    need = f"double({tokens}) * {SMOLLM2_KV_BYTES_PER_TOKEN}.0"
    fraction = _knob_cel("kvCacheFraction", float(defaults.kv_cache_fraction))
    pool = (
        f"({_BUDGET_CEL} * (1.0 - self.memory.reserveFraction) - "
        f"{SMOLLM2_MIN_WEIGHTS_BYTES}.0) * {fraction}"
    )
    return (
        f"!has(self.model.uri) || !self.model.uri.matches('{SMOLLM2_URI}') || "
        f"!has(self.memory.budget) || {pool} >= {need}"
    )


KV_FIT_RULE = cel(
    _kv_fit_cel(),
    "memory.budget cannot hold one generation.maxContext sequence of builtin://smollm2-135m: "
    "even in bf16 it takes 23040 bytes of KV cache per token beside 256Mi of weights, within "
    "memory.budget x (1 - memory.reserveFraction) x generation.kvCacheFraction; raise "
    "memory.budget or generation.kvCacheFraction, or lower generation.maxContext",
    ".memory.budget",
)
"""CEL, on the spec: the KV pool of a budgeted SmolLM2 holds one full context, at best."""


def kv_fit_problem(model: ModelSpec, memory: MemorySpec, generation: GenerationSpec) -> str | None:
    """`KV_FIT_RULE` in Python: why the budget cannot hold one context, or None."""
    if model.uri is None or not re.fullmatch(SMOLLM2_URI, model.uri) or memory.budget is None:
        return None
    asked = generation.max_context
    context = SMOLLM2_CONTEXT if asked == 0 or asked > SMOLLM2_CONTEXT else asked
    block = generation.block_size
    need = -(-context // block) * block * SMOLLM2_KV_BYTES_PER_TOKEN
    usable = memory.budget_bytes * (1 - memory.reserve_fraction) - SMOLLM2_MIN_WEIGHTS_BYTES
    pool = usable * generation.kv_cache_fraction
    if pool >= need:
        return None
    return (
        f"memory.budget ({memory.budget}) cannot hold one generation.maxContext sequence of "
        f"{context} tokens of {model.uri}: its KV cache takes at least {need} bytes (bf16), "
        f"and the budget leaves at most {max(int(pool), 0)} bytes for it after the reserve, "
        "256Mi of weights and generation.kvCacheFraction; raise memory.budget or "
        "generation.kvCacheFraction, or lower generation.maxContext"
    )


def _backend_fits_cel(track: str, backend: Backend) -> str:
    onnx_file = f"(has(self.model.uri) && self.model.uri.matches('{ONNX_FILE_URI}'))"
    if backend == "torch":
        return f"self.{track}.backend != 'torch' || !{onnx_file}"
    minilm = f"(has(self.model.uri) && self.model.uri.matches('{MINILM_URI}'))"
    return f"self.{track}.backend != 'onnxruntime' || {onnx_file} || {minilm}"


# On the spec, not on its sections: the rules that read the model must be there, and a
# section with rules of its own would carry its whole default in the CRD (see `crdgen`).
BACKEND_RULES = [
    *(
        cel(
            f"self.{track}.backend != 'onnxruntime' || self.{track}.precision != 'bf16'",
            onnxruntime_bf16(track),
            f".{track}.backend",
        )
        for track in ("runtime", "fallback")
    ),
    cel(
        "self.runtime.backend != 'onnxruntime' || self.runtime.device == 'cpu' || "
        f"(self.runtime.device == 'auto' && !({gpu_requested_cel('self.runtime')}))",
        ONNXRUNTIME_ON_GPU,
        ".runtime.backend",
    ),
    *(
        cel(
            _backend_fits_cel(track, backend),
            backend_contradicts(track, backend),
            f".{track}.backend",
        )
        for track in ("runtime", "fallback")
        for backend in ("torch", "onnxruntime")
    ),
]
"""CEL, on the spec: each track's `backend` can serve the model on its device and precision
(`RuntimeSpec`, `FallbackSpec` and `backend_problem` in Python)."""


RUNTIME_HTTP_PORT = 8080
"""The port the runtime's HTTP listener takes in every pod (`--port`)."""
GRPC_RULES = [
    cel(
        f"!self.runtime.grpc.enabled || self.runtime.grpc.port != {RUNTIME_HTTP_PORT}",
        f"runtime.grpc.port must differ from {RUNTIME_HTTP_PORT}, the runtime's HTTP port",
        ".runtime.grpc.port",
    ),
    cel(
        "!self.runtime.grpc.enabled || self.runtime.grpc.port != self.traffic.port",
        "runtime.grpc.port must differ from traffic.port: the Services expose both",
        ".runtime.grpc.port",
    ),
]
"""CEL, on the spec: the gRPC port collides with neither HTTP port (`grpc_port_problem`)."""


def grpc_port_problem(grpc: GrpcSpec, service_port: int) -> str | None:
    """`GRPC_RULES` in Python: why `grpc` cannot take its port, or None."""
    if not grpc.enabled:
        return None
    if grpc.port == RUNTIME_HTTP_PORT:
        return (
            f"runtime.grpc.port ({grpc.port}) must differ from {RUNTIME_HTTP_PORT}, the "
            "runtime's HTTP port"
        )
    if grpc.port == service_port:
        return (
            f"runtime.grpc.port ({grpc.port}) must differ from traffic.port ({service_port}): "
            "the Services expose both"
        )
    return None


def backend_problem(model: ModelSpec, backend: Backend, track: str) -> str | None:
    """`BACKEND_RULES` in Python: why `backend` cannot serve `model` on `track`, or None."""
    uri = model.uri or ""
    onnx_file = re.fullmatch(ONNX_FILE_URI, uri) is not None
    if backend == "torch" and onnx_file:
        return backend_contradicts(track, backend)
    if backend == "onnxruntime" and not (onnx_file or re.fullmatch(MINILM_URI, uri)):
        return backend_contradicts(track, backend)
    return None


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
    generation: GenerationSpec | None = None
    """The generative engine's knobs as the spec sets them (generative models only)."""

    @property
    def generation_knobs(self) -> GenerationSpec | None:
        """The engine's knobs of a generative model (the defaults when unset); None otherwise."""
        if not self.model.generates:
            return None
        return self.generation or GenerationSpec()

    @property
    def pod_image(self) -> str:
        """The image the GPU tracks' pods run: `runtime.image`, else the built-in GPU one.

        The operator sets an unset `runtime.image` to its own default as it reads a spec.
        """
        return self.runtime.image or DEFAULT_IMAGE

    @property
    def digest(self) -> str:
        """A short hash of the pod-shaping fields, with the image the pods run.

        Replica counts are left out (scaling is not a rollout), and so are fields at their
        defaults, so that a field added to the API later does not start a rollout of every
        existing service after an operator upgrade. The built-in image counts as a default:
        it was `runtime.image`'s before the operator's own default could differ, so the
        services that run it keep their digest; any other image, the operator's default
        included, is hashed.
        """
        image = None if self.pod_image == DEFAULT_IMAGE else self.pod_image
        runtime = self.runtime.model_copy(update={"replicas": Replicas(), "image": image})
        unscaled = self.model_copy(update={"runtime": runtime})
        shaping = unscaled.model_dump_json(by_alias=True, exclude_defaults=True)
        return hashlib.sha256(shaping.encode()).hexdigest()[:16]
