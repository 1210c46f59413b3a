"""What runs: the model, the runtime pods, batching, memory and the CPU fallback."""

from __future__ import annotations

import hashlib
import re
from typing import Literal
from urllib.parse import parse_qs, urlsplit

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
from fleetserve_operator.spec.scaling import (
    Backend,
    DisruptionSpec,
    Precision,
    ScalingSpec,
    TopologySpread,
)

__all__ = [
    "BACKEND_RULES",
    "BUILTIN_TASKS",
    "GENERATIVE_CEL",
    "GRPC_RULES",
    "KV_FIT_RULE",
    "SMOLLM2_CONTEXT",
    "SMOLLM2_KV_BYTES_PER_TOKEN",
    "SMOLLM2_MIN_WEIGHTS_BYTES",
    "BatchingOverrides",
    "BatchingSpec",
    "EnvSource",
    "EnvVar",
    "FallbackSpec",
    "GenerationOverrides",
    "GenerationSpec",
    "GpuTrackSpec",
    "GrpcSpec",
    "KeyRef",
    "KeySelector",
    "MemorySpec",
    "ModelSpec",
    "RUNTIME_HTTP_PORT",
    "Replicas",
    "Resources",
    "RuntimeSpec",
    "Task",
    "TlsSpec",
    "Toleration",
    "backend_problem",
    "builtin_context_length",
    "grpc_port_problem",
    "kv_fit_problem",
]

Task = Literal["embed", "generate"]
"""What a model does: `embed` answers `/v2/.../infer`, `generate` streams text."""
BUILTIN_TASKS: dict[str, Task] = {
    "minilm-l6": "embed",
    "synthetic": "embed",
    "smollm2-135m": "generate",
    "synthetic-generate": "generate",
}
"""The task of each `builtin://` model, known without loading it."""


def _builtin_pattern(task: Task) -> str:
    names = "|".join(sorted(name for name, kind in BUILTIN_TASKS.items() if kind == task))
    return f"^builtin://({names})([?].*)?$"


def _builtin_task(uri: str | None) -> Task | None:
    if uri is None:
        return None
    for task in ("embed", "generate"):
        if re.fullmatch(_builtin_pattern(task), uri):
            return task
    return None


GENERATIVE_CEL = (
    "(has(self.model.task) ? self.model.task == 'generate' : "
    f"has(self.model.uri) && self.model.uri.matches('{_builtin_pattern('generate')}'))"
)
"""CEL, on the spec: true when the service generates text (`ModelSpec.effective_task`)."""

# What the runtime serves on ONNX Runtime: MiniLM (either backend) and `.onnx` files (only
# it); everything else runs on torch. A `pvc://` model becomes a file of the same name.
_MINILM_URI = r"^builtin://minilm-l6([?].*)?$"
_ONNX_FILE_URI = r"^(file|pvc)://[^?#]*[.]onnx([?#].*)?$"


def _gpu_requested_cel(section: str) -> str:
    """CEL: the `resources` of `section` (`self`, `self.runtime`) ask for a GPU (`has_gpu`)."""
    resources = f"{section}.resources"
    return (
        f"has({resources}) && ((has({resources}.limits) && '{GPU_RESOURCE}' in "
        f"{resources}.limits) || (has({resources}.requests) && '{GPU_RESOURCE}' in "
        f"{resources}.requests))"
    )


def _onnxruntime_bf16(track: str) -> str:
    return (
        f"{track}.backend onnxruntime serves fp32 or int8, not bf16: set {track}.backend to "
        f"torch or auto, or {track}.precision to fp32 or int8"
    )


_ONNXRUNTIME_ON_GPU = (
    "runtime.backend onnxruntime runs on the CPU only, but runtime.device is cuda, or auto "
    f"with {GPU_RESOURCE} in runtime.resources (auto picks CUDA when the pod has a GPU): set "
    "runtime.backend to torch or auto, or runtime.device to cpu"
)


def _backend_contradicts(track: str, backend: Backend) -> str:
    if backend == "torch":
        return (
            f"{track}.backend torch does not apply to an .onnx model, which only ONNX Runtime "
            f"serves: set {track}.backend to auto or onnxruntime"
        )
    return (
        f"{track}.backend onnxruntime applies to builtin://minilm-l6 and .onnx models only; "
        f"torch serves this one: set {track}.backend to auto or torch"
    )


class ModelSpec(Wire):
    """What to serve: the model's name, version and where its weights or handler come from."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.uri) != has(self.handler)",
                    "exactly one of model.uri and model.handler must be set",
                ),
                *(
                    cel(
                        f"!has(self.task) || !has(self.uri) || "
                        f"!self.uri.matches('{_builtin_pattern(task)}') || self.task == '{task}'",
                        f"model.task must be {task} for "
                        + " and ".join(
                            f"builtin://{name}"
                            for name, kind in sorted(BUILTIN_TASKS.items())
                            if kind == task
                        ),
                        ".task",
                    )
                    for task in ("embed", "generate")
                ),
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
    task: Task | None = None
    """`embed` or `generate`. Unset: `generate` for `builtin://smollm2-135m` and
    `builtin://synthetic-generate`, otherwise `embed`; set it to `generate` for a Llama
    checkpoint (`file://`, `pvc://`). It is declared rather than read from the loaded model
    so that the API server can refuse generation settings on an encoder, and the operator
    can render the routes and size the memory before any pod has run; the builtins' task is
    known, so for them a contradicting value is refused."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.uri is None) == (self.handler is None):
            msg = "exactly one of model.uri and model.handler must be set"
            raise ValueError(msg)
        known = _builtin_task(self.uri)
        if self.task is not None and known is not None and self.task != known:
            msg = f"model.task must be {known} for {self.uri}"
            raise ValueError(msg)
        return self

    @property
    def effective_task(self) -> Task:
        """`task`, or for an unset one the builtin's task, else `embed`."""
        return self.task or _builtin_task(self.uri) or "embed"

    @property
    def generates(self) -> bool:
        """True when the model generates text (the OpenAI and generate routes)."""
        return self.effective_task == "generate"


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


class TlsSpec(Wire):
    """The certificate the runtime pods serve HTTPS and gRPC over TLS with."""

    secret_name: DnsSubdomain
    """A `kubernetes.io/tls` Secret in the InferenceService's namespace (keys `tls.crt` and
    `tls.key`, as cert-manager writes them)."""


class GrpcSpec(Wire):
    """The runtime's Open Inference Protocol gRPC listener (`inference.GRPCInferenceService`)."""

    enabled: bool = False
    """Serve OIP over gRPC beside HTTP (`--grpc-port`): each track's pods get a container
    port and their Services a port named `grpc`, and with `gateway-api` a GRPCRoute splits
    gRPC traffic with the HTTPRoute's weights, on `traffic.hostnames` (required: a gRPC call
    names its model inside the message). Changing it is a rollout."""
    port: int = Field(9000, ge=1, le=65535)
    """Port of the gRPC listener in the pods and of the Services' `grpc` port; it must
    differ from the runtime's HTTP port (8080) and from `traffic.port`."""


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
    priority_token_secret_ref: KeySelector | None = None
    """Secret key holding the token that lets a caller set the `X-Fleetserve-Priority` and
    `X-Fleetserve-Timeout-Ms` headers (`--priority-token-file`, read from a read-only Secret
    volume like `authSecretRef`'s); it also authenticates inference requests. Unset: no
    caller may raise them. The HTTPRoute strips both headers from every request it forwards,
    so only a caller inside the cluster that holds the token can use them."""
    tls: TlsSpec | None = None
    """Serve HTTP and gRPC over TLS with this Secret's certificate (`--tls-cert-file`,
    `--tls-key-file`, mounted read-only; every track). The probes then use HTTPS, and
    Prometheus must scrape the pods with `scheme: https` (see docs/security.md). Unset:
    plain text. Changing it is a rollout."""
    precision: Precision = "fp32"
    """Numeric precision of the GPU tracks' model (`--precision`); changing it is a rollout."""
    backend: Backend = "auto"
    """What runs the GPU tracks' model (`--backend`): `auto` lets the runtime pick (ONNX
    Runtime for `builtin://minilm-l6` on the CPU in fp32 and torch for it otherwise; `.onnx`
    files on ONNX Runtime, every other model on torch); `torch` or `onnxruntime` pins it. ONNX
    Runtime runs on the CPU only and serves fp32 or int8, and a backend that cannot serve
    the model is refused. Changing it is a rollout."""
    grpc: GrpcSpec = GrpcSpec()
    """OIP over gRPC (off by default); the CPU fallback serves it whenever the stable track
    does, so gRPC clients keep working through a failover."""

    @model_validator(mode="after")
    def _backend_fits(self) -> RuntimeSpec:
        if self.backend != "onnxruntime":
            return self
        if self.precision == "bf16":
            raise ValueError(_onnxruntime_bf16("runtime"))
        if self.device == "cuda" or (self.device == "auto" and self.resources.has_gpu):
            raise ValueError(_ONNXRUNTIME_ON_GPU)
        return self


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


class GenerationSpec(Wire):
    """The generative engine's knobs (`model.task: generate` only), as `--generation-*` flags.

    See docs/generation.md for what each one trades; the defaults are the runtime's.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.maxStepTokens >= self.maxRunningSequences",
                    "generation.maxStepTokens must be >= generation.maxRunningSequences: "
                    "every running sequence decodes one token per step",
                    ".maxStepTokens",
                ),
                cel(
                    "self.maxTimeoutMs >= self.defaultTimeoutMs",
                    "generation.maxTimeoutMs must be >= generation.defaultTimeoutMs",
                    ".maxTimeoutMs",
                ),
                cel(
                    "self.maxContext == 0 || self.maxContext >= self.blockSize",
                    "generation.maxContext must be 0 (the model's) or >= generation.blockSize",
                    ".maxContext",
                ),
                cel(
                    "self.maxOutputTokens >= self.defaultMaxTokens",
                    "generation.maxOutputTokens must be >= generation.defaultMaxTokens",
                    ".maxOutputTokens",
                ),
            ]
        }
    )

    kv_cache_fraction: float = Field(1.0, gt=0, le=1)
    """Share of the memory budget left after the reserve, the weights and one step's
    activations that the KV-cache pool takes."""
    block_size: int = Field(16, ge=1, le=1024)
    """Token positions per KV-cache block, the unit of allocation and prefix sharing."""
    max_running_sequences: int = Field(32, ge=1, le=4096)
    """Most sequences generating at once per replica; the rest wait in the queue."""
    max_step_tokens: int = Field(512, ge=1, le=1_048_576)
    """Chunked-prefill budget: most tokens one engine step computes. Lower keeps the
    inter-token latency steady under long prompts; higher gets first tokens out sooner."""
    max_context: int = Field(0, ge=0, le=1_048_576)
    """Longest prompt plus output, in tokens; 0 takes the model's own context length."""
    prefix_caching: bool = True
    """Share the KV blocks of identical prompt prefixes (system prompts, earlier turns)."""
    default_timeout_ms: int = Field(120_000, ge=1)
    """Deadline of a generation that names none (queue, prompt and every token), in ms."""
    max_timeout_ms: int = Field(600_000, ge=1)
    """Longest deadline a generation may ask for, in milliseconds."""
    default_max_tokens: int = Field(512, ge=1, le=1_048_576)
    """Output tokens of a request that sets no `max_tokens` (OpenAI's own default, the rest
    of the context, lets one caller hold a sequence slot for minutes)."""
    max_output_tokens: int = Field(4096, ge=1, le=1_048_576)
    """Most output tokens one request may ask for; a larger `max_tokens` gets 400."""
    allow_ignore_eos: bool = False
    """Accept `ignore_eos` (generate exactly `max_tokens`, as benchmarks do) from callers;
    off, a request setting it gets 400, so no caller keeps a slot past its answer's end."""
    drain_seconds: int = Field(120, ge=0, le=3600)
    """How long a terminating pod (an old version after a promotion, a rolled-back canary,
    a scale-down) keeps serving the streams it has started; it takes no new request.
    Streams still running after it end with an error event. Every terminating pod waits
    this long, so it bounds how long an old replica holds its GPU."""

    @model_validator(mode="after")
    def _check(self) -> GenerationSpec:
        if self.max_step_tokens < self.max_running_sequences:
            msg = (
                f"generation.maxStepTokens ({self.max_step_tokens}) must be >= "
                f"generation.maxRunningSequences ({self.max_running_sequences}): every "
                "running sequence decodes one token per step"
            )
            raise ValueError(msg)
        if self.max_timeout_ms < self.default_timeout_ms:
            msg = (
                f"generation.maxTimeoutMs ({self.max_timeout_ms}) must be >= "
                f"generation.defaultTimeoutMs ({self.default_timeout_ms})"
            )
            raise ValueError(msg)
        if self.max_output_tokens < self.default_max_tokens:
            msg = (
                f"generation.maxOutputTokens ({self.max_output_tokens}) must be >= "
                f"generation.defaultMaxTokens ({self.default_max_tokens})"
            )
            raise ValueError(msg)
        if 0 < self.max_context < self.block_size:
            msg = (
                f"generation.maxContext ({self.max_context}) must be 0 (the model's) or >= "
                f"generation.blockSize ({self.block_size})"
            )
            raise ValueError(msg)
        return self


class GenerationOverrides(Wire):
    """Generation fields the CPU fallback sets differently; unset fields follow `generation`."""

    kv_cache_fraction: float | None = Field(None, gt=0, le=1)
    """Share of the memory budget the KV-cache pool takes."""
    block_size: int | None = Field(None, ge=1, le=1024)
    """Token positions per KV-cache block."""
    max_running_sequences: int | None = Field(None, ge=1, le=4096)
    """Most sequences generating at once (usually fewer on CPU)."""
    max_step_tokens: int | None = Field(None, ge=1, le=1_048_576)
    """Most tokens one engine step computes."""
    max_context: int | None = Field(None, ge=0, le=1_048_576)
    """Longest prompt plus output, in tokens (0: the model's)."""
    prefix_caching: bool | None = None
    """Share the KV blocks of identical prompt prefixes."""
    default_timeout_ms: int | None = Field(None, ge=1)
    """Default generation deadline, in milliseconds (CPU is slower per token)."""
    max_timeout_ms: int | None = Field(None, ge=1)
    """Longest generation deadline, in milliseconds."""
    default_max_tokens: int | None = Field(None, ge=1, le=1_048_576)
    """Output tokens of a request that sets no `max_tokens`."""
    max_output_tokens: int | None = Field(None, ge=1, le=1_048_576)
    """Most output tokens one request may ask for."""
    allow_ignore_eos: bool | None = None
    """Accept `ignore_eos` from callers."""
    drain_seconds: int | None = Field(None, ge=0, le=3600)
    """How long a terminating fallback pod keeps serving its streams."""

    def merged_over(self, base: GenerationSpec) -> GenerationSpec:
        """`base` with the fields set here replaced; `ValueError` if the result is invalid."""
        values = base.model_dump() | self.model_dump(exclude_none=True)
        return GenerationSpec.model_validate(values)


_NO_FALLBACK_CAPACITY = (
    "fallback.replicas.max is {max}, but an enabled fallback needs at least 1 replica to take "
    "the traffic: raise fallback.replicas.max, or set fallback.enabled to false"
)


class FallbackSpec(Wire):
    """A CPU Deployment kept warm, to take traffic when the GPU track cannot."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"!({_gpu_requested_cel('self')})",
                    f"fallback.resources must not request {GPU_RESOURCE}: "
                    "the fallback track runs on CPU",
                    ".resources",
                ),
                cel(
                    "!has(self.scaling) || self.replicas.min == self.replicas.max",
                    "fallback.replicas and fallback.scaling both size the fallback track: "
                    "remove fallback.scaling, or give fallback.replicas min = max",
                    ".scaling",
                ),
                {
                    **cel(
                        "!self.enabled || has(self.scaling) || self.replicas.max >= 1",
                        _NO_FALLBACK_CAPACITY.format(max="0"),
                        ".replicas.max",
                    ),
                    "messageExpression": "'"
                    + _NO_FALLBACK_CAPACITY.replace("{max}", "' + string(self.replicas.max) + '")
                    + "'",
                },
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
            raise ValueError(_onnxruntime_bf16("fallback"))
        if self.enabled and self.scaling is None and self.replicas.max < 1:
            raise ValueError(_NO_FALLBACK_CAPACITY.format(max=self.replicas.max))
        return self


# SmolLM2-135M's floor, in its smallest serving dtype (bf16 on a GPU; CPU doubles both): 30
# layers x 3 KV heads x 64 dims x keys and values x 2 bytes per token, and 134.5M parameters.
# tests/contract/ checks them against the loaded model.
_SMOLLM2_URI = r"^builtin://smollm2-135m([?].*)?$"
SMOLLM2_CONTEXT = 8192
"""SmolLM2-135M's own context, in tokens."""
SMOLLM2_KV_BYTES_PER_TOKEN = 23_040
"""KV-cache bytes of one SmolLM2 token in bf16."""
SMOLLM2_MIN_WEIGHTS_BYTES = 256 * 2**20
"""Less than SmolLM2's weights take in bf16."""
_BUDGET_CEL = (
    "(type(self.memory.budget) == int ? double(self.memory.budget) : "
    "quantity(string(self.memory.budget)).asApproximateFloat())"
)


_SYNTHETIC_CONTEXT = 4096
"""`builtin://synthetic-generate`'s context without a `context_length` parameter."""


def builtin_context_length(model: ModelSpec) -> int | None:
    """The context, in tokens, of a generative builtin; None for any other model."""
    if model.uri is None:
        return None
    if re.fullmatch(_SMOLLM2_URI, model.uri):
        return SMOLLM2_CONTEXT
    if _builtin_task(model.uri) != "generate":
        return None
    query = parse_qs(urlsplit(model.uri).query)
    given = query.get("context_length", [])
    return int(given[-1]) if given and given[-1].isdigit() else _SYNTHETIC_CONTEXT


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
        f"!has(self.model.uri) || !self.model.uri.matches('{_SMOLLM2_URI}') || "
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
    if model.uri is None or not re.fullmatch(_SMOLLM2_URI, model.uri) or memory.budget is None:
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
    onnx_file = f"(has(self.model.uri) && self.model.uri.matches('{_ONNX_FILE_URI}'))"
    if backend == "torch":
        return f"self.{track}.backend != 'torch' || !{onnx_file}"
    minilm = f"(has(self.model.uri) && self.model.uri.matches('{_MINILM_URI}'))"
    return f"self.{track}.backend != 'onnxruntime' || {onnx_file} || {minilm}"


# On the spec, not on its sections: the rules that read the model must be there, and a
# section with rules of its own would carry its whole default in the CRD (see `crdgen`).
BACKEND_RULES = [
    *(
        cel(
            f"self.{track}.backend != 'onnxruntime' || self.{track}.precision != 'bf16'",
            _onnxruntime_bf16(track),
            f".{track}.backend",
        )
        for track in ("runtime", "fallback")
    ),
    cel(
        "self.runtime.backend != 'onnxruntime' || self.runtime.device == 'cpu' || "
        f"(self.runtime.device == 'auto' && !({_gpu_requested_cel('self.runtime')}))",
        _ONNXRUNTIME_ON_GPU,
        ".runtime.backend",
    ),
    *(
        cel(
            _backend_fits_cel(track, backend),
            _backend_contradicts(track, backend),
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
    onnx_file = re.fullmatch(_ONNX_FILE_URI, uri) is not None
    if backend == "torch" and onnx_file:
        return _backend_contradicts(track, backend)
    if backend == "onnxruntime" and not (onnx_file or re.fullmatch(_MINILM_URI, uri)):
        return _backend_contradicts(track, backend)
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
