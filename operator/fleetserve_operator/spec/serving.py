"""How the GPU tracks serve: the runtime pods, batching, memory and the generative engine."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fleetserve_operator.spec.base import (
    GPU_RESOURCE,
    AtLeast,
    DnsSubdomain,
    LabelValue,
    QualifiedName,
    Quantity,
    Wire,
    cel,
    cel_rules,
    parse_quantity,
)
from fleetserve_operator.spec.images import Image
from fleetserve_operator.spec.model import (
    ONNXRUNTIME_ON_GPU,
    onnxruntime_bf16,
)
from fleetserve_operator.spec.scaling import (
    Backend,
    Precision,
)

__all__ = [
    "BatchingOverrides",
    "BatchingSpec",
    "EnvSource",
    "EnvVar",
    "GenerationOverrides",
    "GenerationSpec",
    "GrpcSpec",
    "KeyRef",
    "KeySelector",
    "MemorySpec",
    "Replicas",
    "Resources",
    "RuntimeSpec",
    "TlsSpec",
    "Toleration",
]


class Replicas(Wire):
    """Replica bounds; when `max > min` an autoscaler owns the count.

    See docs/reference/inferenceservice.md.
    """

    model_config = cel_rules(
        cel("self.min <= self.max", "replicas.min must be <= max"),
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


class TenantsSpec(Wire):
    """Who the callers are: the tenants table the runtime reads (see docs/how-to/tenants.md)."""

    secret_ref: KeySelector
    """Secret key holding the tenants table (YAML or JSON: each tenant's name, tokens,
    weight, `max_requests` and allowed priorities), mounted read-only (`--tenants-file`)
    and re-read when the Secret changes. A tenant's token also authenticates its requests."""
    trust_header: bool = False
    """Take the tenant from the `X-Fleetserve-Tenant` header when a request bears no tenant
    token (`--tenants-trust-header`): only for a gateway that authenticates callers and sets
    the header itself. False: the HTTPRoute removes the header from every request and the
    runtime refuses a request that carries it."""


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

    image: Image | None = None
    """Runtime container image of the GPU tracks (and of their model fetch); unset: the
    operator's default for them (the chart's `runtime.image`). Changing it, or the operator's
    default of a service that leaves it unset, is a rollout."""
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
    tenants: TenantsSpec | None = None
    """Tenants: fair share of batches and KV cache between callers, a quota each (429 past
    it), the priorities each may ask for, and a prefix cache never shared between them.
    Unset: one anonymous tenant. Every track runs with the stable track's setting except
    the canary, which runs the spec's: changing it is a rollout."""
    tls: TlsSpec | None = None
    """Serve HTTP and gRPC over TLS with this Secret's certificate (`--tls-cert-file`,
    `--tls-key-file`, mounted read-only; every track). The probes then use HTTPS, and
    Prometheus must scrape the pods with `scheme: https` (see docs/how-to/security.md).
    Unset: plain text. Changing it is a rollout."""
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
            raise ValueError(onnxruntime_bf16("runtime"))
        if self.device == "cuda" or (self.device == "auto" and self.resources.has_gpu):
            raise ValueError(ONNXRUNTIME_ON_GPU)
        return self


_BATCHING_TIMEOUTS = AtLeast("batching", "maxTimeoutMs", "defaultTimeoutMs")


class BatchingSpec(Wire):
    """Dynamic batching and admission limits, passed to the runtime as flags."""

    model_config = cel_rules(
        _BATCHING_TIMEOUTS.cel(),
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
        _BATCHING_TIMEOUTS.check(self)
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


_STEP_TOKENS = AtLeast(
    "generation",
    "maxStepTokens",
    "maxRunningSequences",
    why="every running sequence decodes one token per step",
)
_GENERATION_TIMEOUTS = AtLeast("generation", "maxTimeoutMs", "defaultTimeoutMs")
_OUTPUT_TOKENS = AtLeast("generation", "maxOutputTokens", "defaultMaxTokens")


class GenerationSpec(Wire):
    """The generative engine's knobs (`model.task: generate` only), as `--generation-*` flags.

    See docs/reference/generation.md for what each one trades; the defaults are the runtime's.
    """

    model_config = cel_rules(
        _STEP_TOKENS.cel(),
        _GENERATION_TIMEOUTS.cel(),
        cel(
            "self.maxContext == 0 || self.maxContext >= self.blockSize",
            "generation.maxContext must be 0 (the model's) or >= generation.blockSize",
            ".maxContext",
        ),
        _OUTPUT_TOKENS.cel(),
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
        for rule in (_STEP_TOKENS, _GENERATION_TIMEOUTS, _OUTPUT_TOKENS):
            rule.check(self)
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
