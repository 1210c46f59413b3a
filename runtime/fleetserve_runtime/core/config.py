"""Runtime configuration: one validated model, read from CLI flags, `FLEETSERVE_*` env and YAML.

Precedence is CLI flag > environment variable > YAML file > default. Environment variables
are derived from the model: top-level fields are `FLEETSERVE_<FIELD>` and section fields
`FLEETSERVE_<SECTION>_<FIELD>` (for example `FLEETSERVE_BATCHING_MAX_BATCH_SIZE`). Bad values
and bad combinations stop start-up with a message naming the field; nothing falls back.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from fleetserve_runtime.core.auth import allowlist_entry_problem, read_token
from fleetserve_runtime.core.shadow_target import (
    MinCosine,
    ShadowFraction,
    ShadowTarget,
    ShadowUrl,
    ShadowVersionLabel,
)
from fleetserve_runtime.core.tenants import read_table

__all__ = [
    "BatchingConfig",
    "CacheConfig",
    "GenerationConfig",
    "HealthConfig",
    "HttpConfig",
    "MemoryConfig",
    "QueueConfig",
    "RuntimeConfig",
    "TenantsConfig",
    "ShadowConfig",
    "SemanticCacheConfig",
    "load_config",
]

_yaml_path: contextvars.ContextVar[Path | None] = contextvars.ContextVar("_yaml_path", default=None)

Buckets = Literal["auto", "none"] | list[Annotated[int, Field(ge=1)]]
StringList = Annotated[list[str], NoDecode]
"""A list given as YAML list or comma-separated text (flags and env variables)."""
MAX_METADATA_FACTS = 16
MetadataKey = Annotated[
    str, Field(pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", max_length=63)
]
"""A `model_metadata` key: a Kubernetes label key without a prefix."""
MetadataFacts = Annotated[dict[MetadataKey, Annotated[str, Field(max_length=256)]], NoDecode]
"""`model_metadata`: a YAML mapping, or text (flags and env variables) `_parse_facts` reads."""


def _split_list(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _parse_facts(value: object) -> object:
    """`key=value,key=value` or a JSON object as text, at most `MAX_METADATA_FACTS` of them."""
    facts = _read_facts(value) if isinstance(value, str) else value
    if isinstance(facts, dict) and len(facts) > MAX_METADATA_FACTS:
        msg = f"model_metadata holds {len(facts)} facts; at most {MAX_METADATA_FACTS} are allowed"
        raise ValueError(msg)
    return facts


def _read_facts(value: str) -> object:
    if value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            msg = f"model_metadata is not a valid JSON object: {exc}"
            raise ValueError(msg) from None
    facts: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        key, equals, fact = item.partition("=")
        if not equals:
            msg = f"model_metadata entry {item!r} is not key=value"
            raise ValueError(msg)
        if key.strip() in facts:
            msg = f"model_metadata key {key.strip()!r} appears more than once"
            raise ValueError(msg)
        facts[key.strip()] = fact.strip()
    return facts


def _at_least(name: str, value: float, floor_name: str, floor: float, *, why: str = "") -> None:
    """`ValueError` unless setting `name` is at least setting `floor_name`; `why` says why."""
    if value < floor:
        msg = f"{name} ({value}) must be >= {floor_name} ({floor})" + (f": {why}" if why else "")
        raise ValueError(msg)


def _readable(path: Path | None, read: Callable[[Path], object], what: str) -> Path | None:
    """`path` once `read` accepts it; a `ValueError` saying why not (start-up refuses it)."""
    if path is not None:
        try:
            read(path)
        except OSError as exc:
            msg = f"cannot read {what} {path}: {exc.strerror}"
            raise ValueError(msg) from None
    return path


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    flag_prefix: ClassVar[str] = ""
    """Prefix of this section's CLI flags, where the field names alone would be ambiguous."""


class BatchingConfig(_Section):
    """How requests are grouped into batches."""

    max_batch_size: int = Field(32, ge=1, le=4096)
    """Most requests (instances) in one batch."""
    max_queue_delay_ms: float = Field(10.0, ge=0, le=10_000)
    """Longest the oldest queued request waits for a batch to fill, in milliseconds."""
    max_sequence_length: int = Field(256, ge=1, le=1_000_000)
    """Longest input in tokens; longer inputs get 413 unless the request asks to truncate."""
    buckets: Buckets = "auto"
    """Length-bucket upper edges in tokens, `auto` (learned from observed lengths) or `none`."""
    max_batch_tokens: int = Field(0, ge=0)
    """Most padded tokens in one batch; 0 derives the limit from the memory budget."""
    min_padding_efficiency: float = Field(0.85, gt=0, le=1)
    """A batch that one bucket cannot fill takes neighbouring buckets' requests while real /
    padded tokens stay at or above this; 1.0 keeps each batch to one bucket."""
    packing: bool = True
    """Let the model lay tokens back to back so dense layers compute no padding."""

    @field_validator("buckets", mode="before")
    @classmethod
    def _parse_buckets(cls, value: object) -> object:
        if isinstance(value, str) and value not in ("auto", "none"):
            try:
                return [int(part) for part in value.split(",") if part.strip()]
            except ValueError:
                msg = f"buckets must be 'auto', 'none' or comma-separated integers, got {value!r}"
                raise ValueError(msg) from None
        return value

    @model_validator(mode="after")
    def _check_edges(self) -> BatchingConfig:
        if isinstance(self.buckets, list):
            if self.buckets != sorted(set(self.buckets)):
                msg = f"batching.buckets must be strictly increasing, got {self.buckets}"
                raise ValueError(msg)
            if self.buckets and self.buckets[-1] > self.max_sequence_length:
                msg = (
                    f"batching.buckets edge {self.buckets[-1]} exceeds "
                    f"max_sequence_length {self.max_sequence_length}"
                )
                raise ValueError(msg)
        return self


class QueueConfig(_Section):
    """Admission, priorities and deadlines."""

    max_queue_size: int = Field(1024, ge=1)
    """Most instances waiting; beyond it requests get 503 with Retry-After."""
    default_timeout_ms: int = Field(5_000, ge=1)
    """Deadline of a request that names none, in milliseconds."""
    max_timeout_ms: int = Field(30_000, ge=1)
    """Longest deadline a caller may ask for, in milliseconds."""
    priority_aging_ms: float = Field(200.0, gt=0)
    """Waiting this long raises a request one priority class, in milliseconds."""
    lower_class_share: float = Field(0.1, ge=0, le=0.5)
    """Fraction of each batch guaranteed to each lower class that has requests waiting."""
    retry_after_s: int = Field(1, ge=1, le=3600)
    """Retry-After sent with 503 when the queue is full, in seconds."""

    @model_validator(mode="after")
    def _check_timeouts(self) -> QueueConfig:
        _at_least(
            "queue.max_timeout_ms", self.max_timeout_ms,
            "queue.default_timeout_ms", self.default_timeout_ms,
        )  # fmt: skip
        return self


class MemoryConfig(_Section):
    """Per-replica memory budget; the batch token limit is derived from it at warmup."""

    flag_prefix: ClassVar[str] = "memory-"

    budget_bytes: int = Field(0, ge=0)
    """Bytes one replica may use for weights and activations; 0 means unbounded."""
    reserve_fraction: float = Field(0.1, ge=0, lt=1)
    """Fraction of the budget kept free for fragmentation and the allocator's own use."""
    pool_max_bytes: int = Field(256 * 1024 * 1024, ge=0)
    """Most bytes the input buffer pool keeps for reuse."""


class GenerationConfig(_Section):
    """The generative engine: KV blocks, continuous batching, chunked prefill."""

    flag_prefix: ClassVar[str] = "generation-"

    block_size: int = Field(16, ge=1, le=1024)
    """Token positions per KV-cache block, the unit of allocation and prefix sharing."""
    kv_cache_fraction: float = Field(1.0, gt=0, le=1)
    """Share of the budget left after the reserve, the weights and one step's measured
    activations that the KV pool takes."""
    unbounded_kv_bytes: int = Field(1024**3, ge=1)
    """With memory.budget_bytes 0 (unbounded): the KV pool holds max_running_sequences full
    contexts, but at most this many bytes."""
    max_running_sequences: int = Field(32, ge=1, le=4096)
    """Most sequences in the running batch; the rest wait in the queue."""
    max_step_tokens: int = Field(512, ge=1, le=1_048_576)
    """Most tokens one step computes (decode tokens plus prefill chunks): lower keeps
    inter-token latency steady under long prompts, higher gets first tokens out sooner."""
    max_context: int = Field(0, ge=0, le=1_048_576)
    """Longest prompt plus output in tokens; 0 takes the model's own context length."""
    prefix_caching: bool = True
    """Share the KV blocks of identical prompt prefixes between requests."""
    policy: Literal["continuous", "static"] = "continuous"
    """`continuous` admits sequences at every step; `static` runs a batch to completion
    before admitting more (the baseline continuous batching is measured against)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Weights and KV blocks: `auto` is bfloat16 on CUDA, float32 elsewhere; bfloat16 on a
    CPU with bf16 matrix units runs about twice as fast, at outputs no longer identical to
    float32's."""
    default_timeout_ms: int = Field(120_000, ge=1)
    """Deadline of a generation that names none (queue, prompt and every output token), in
    milliseconds; a whole answer takes far longer than one encoder request."""
    max_timeout_ms: int = Field(600_000, ge=1)
    """Longest deadline a generation may ask for, in milliseconds."""
    default_max_tokens: int = Field(512, ge=1, le=1_048_576)
    """Output tokens of a request that sets no `max_tokens` (OpenAI's own default is the
    rest of the context, which lets one caller hold a sequence slot for minutes)."""
    max_output_tokens: int = Field(4096, ge=1, le=1_048_576)
    """Most output tokens one request may ask for; a larger `max_tokens` gets 400."""
    allow_ignore_eos: bool = False
    """Accept `ignore_eos` (generate exactly `max_tokens`, as benchmarks do) from callers;
    off, a request setting it gets 400."""
    max_streams: int = Field(256, ge=1, le=65_536)
    """Most streamed generations (`stream: true`, `generate_stream`) open at once on this
    server; beyond it a new stream gets 503 with `Retry-After: 1`."""
    stream_send_timeout_s: float = Field(30.0, gt=0, le=3600)
    """Longest one write of a stream may wait for its client to take bytes (the connection's
    write buffer stays full); then the stream is cut and the connection reset."""
    stream_buffer_bytes: int = Field(262_144, ge=4096, le=64 * 1024**2)
    """Most bytes of a stream's events held for a client that reads slower than the model
    generates; beyond it the generation is cancelled (its KV blocks freed) and the
    connection reset."""

    @model_validator(mode="after")
    def _check_bounds(self) -> GenerationConfig:
        _at_least(
            "generation.max_timeout_ms", self.max_timeout_ms,
            "generation.default_timeout_ms", self.default_timeout_ms,
        )  # fmt: skip
        _at_least(
            "generation.max_output_tokens", self.max_output_tokens,
            "generation.default_max_tokens", self.default_max_tokens,
        )  # fmt: skip
        _at_least(
            "generation.max_step_tokens", self.max_step_tokens,
            "generation.max_running_sequences", self.max_running_sequences,
            why="every running sequence decodes one token per step",
        )  # fmt: skip
        return self


class CacheConfig(_Section):
    """Optional result cache (off when `max_entries` is 0)."""

    flag_prefix: ClassVar[str] = "cache-"

    max_entries: int = Field(0, ge=0)
    """Most cached results; 0 disables the cache."""
    max_bytes: int = Field(64 * 1024 * 1024, ge=0)
    """Most bytes of cached results."""


class SemanticCacheConfig(_Section):
    """Optional cache of greedy generations, by exact prompt then by embedding similarity.

    Off when `max_entries` is 0; see docs/how-to/semantic-cache.md.
    """

    flag_prefix: ClassVar[str] = "semantic-cache-"

    encoder: str | None = Field(None, min_length=1, max_length=2048)
    """Encoder model URI that embeds prompts for the similarity search (e.g.
    `builtin://minilm-l6`), run on the CPU beside the served model; required when on."""
    min_similarity: float = Field(0.95, gt=0, le=1)
    """Least cosine similarity of two prompts' embeddings for one to take the other's
    cached answer; 1 answers only prompts of identical embeddings."""
    max_entries: int = Field(0, ge=0)
    """Most cached answers; 0 disables the semantic cache."""
    max_bytes: int = Field(64 * 1024 * 1024, ge=0)
    """Most bytes of cached answers, their embeddings and keys."""

    @property
    def enabled(self) -> bool:
        """Whether the cache has room for any entry."""
        return self.max_entries > 0 and self.max_bytes > 0

    @model_validator(mode="after")
    def _check_encoder(self) -> SemanticCacheConfig:
        if self.enabled and self.encoder is None:
            msg = (
                "semantic_cache.encoder is required when semantic_cache.max_entries > 0: name "
                "the encoder model that embeds prompts (e.g. builtin://minilm-l6)"
            )
            raise ValueError(msg)
        return self


_ENCODER_BUILTINS = frozenset({"minilm-l6", "synthetic"})
"""Built-in models that embed text: a semantic cache of generations cannot serve them."""


class HealthConfig(_Section):
    """When `/v2/health/live` fails, so that the kubelet restarts a wedged replica."""

    flag_prefix: ClassVar[str] = "health-"

    stuck_batch_floor_s: float = Field(60.0, gt=0, le=86_400)
    """A batch (or a generation step) running longer than this, and longer than
    `stuck_batch_factor` times its expected time, fails liveness, in seconds."""
    stuck_batch_factor: float = Field(10.0, ge=1, le=1_000)
    """Multiple of a batch's expected compute time (the measured pace per token times its
    tokens) after which it counts as stuck, once past `stuck_batch_floor_s`."""
    loop_stall_s: float = Field(10.0, gt=0, le=3_600)
    """Longest the event loop may go without running a callback, in seconds; a longer stall
    fails liveness while it lasts and for as long again after it ends."""


class HttpConfig(_Section):
    """Connection limits and HTTP surface of both listeners (inference and admin)."""

    header_timeout_s: float = Field(10.0, gt=0, le=300)
    """Longest a client may take to send a request's headers (from connecting, or from the
    request's first byte on a kept-alive connection), then 408 and the connection is closed;
    also the longest a kept-alive connection may wait for its next request (blank lines do
    not count)."""
    body_timeout_s: float = Field(30.0, gt=0, le=3600)
    """Longest a client may take to send a request's body once its headers arrived; then 408."""
    max_header_bytes: int = Field(16_384, ge=1024, le=1_048_576)
    """Most bytes of request line and headers; larger requests get 431."""
    api_docs: bool = False
    """Serve `/docs` and `/openapi.json` (off: they describe the API to anyone who asks)."""
    opentelemetry: bool = False
    """FastAPI's native OpenTelemetry spans and metrics for every HTTP request, to the
    providers the process configures (e.g. under `opentelemetry-instrument`). Off by default:
    the runtime's own Prometheus series and request logs cover the same, and FastAPI asks
    the global providers on every request whether any is configured, which costs a zero-cost
    request about a tenth of its CPU."""


class TenantsConfig(_Section):
    """Tenants: fair share, quotas and allowed priorities per caller (`tenants.md`)."""

    flag_prefix: ClassVar[str] = "tenants-"

    file: Path | None = None
    """The tenants table (YAML or JSON, a mounted Secret, re-read when it changes): each
    tenant's name, tokens, weight, `max_requests` and priorities. Unset: no tenants."""
    trust_header: bool = False
    """Take the tenant from `X-Fleetserve-Tenant` (a trusted gateway authenticated the
    caller); off, a request carrying that header gets 400."""
    default_weight: float = Field(1.0, gt=0, le=1000)
    """Fair-share weight of requests bearing no tenant's token (the default tenant)."""
    default_max_requests: int | None = Field(None, ge=1, le=1_000_000)
    """Quota of the default tenant: most requests in flight at once; unset: none."""

    @field_validator("file")
    @classmethod
    def _check_file(cls, value: Path | None) -> Path | None:
        return _readable(value, read_table, "tenants file")

    @model_validator(mode="after")
    def _check_header(self) -> TenantsConfig:
        if self.file is None and (self.trust_header or self.default_max_requests is not None):
            msg = "tenants.trust_header and tenants.default_max_requests need tenants.file"
            raise ValueError(msg)
        return self


class ShadowConfig(_Section):
    """Mirroring a sample of requests to the next version, to compare answers (`shadow.md`).

    The target (`core.shadow_target`) is given by `url` and its companions, fixed for the
    pod's life, or by `file`, re-read every `poll_s` (how the operator starts and stops a
    shadow stage); never both. Off while neither is set (or the file is absent or empty).
    The copies are sent once the primary answered (2xx only) and never delay or fail it;
    their answers are compared, counted and discarded.
    """

    flag_prefix: ClassVar[str] = "shadow-"

    url: ShadowUrl | None = None
    """Base URL of the shadow version (its Service), `http://` or `https://`; unset: off
    (unless `file` is set)."""
    fraction: ShadowFraction = 0.1
    """Share of the mirrorable requests (embeddings, infer, predict, OpenAI completions and
    chat) copied to the shadow."""
    version_label: ShadowVersionLabel = "shadow"
    """The shadow's version, the `shadow_version` label of the shadow metrics."""
    min_cosine: MinCosine = 0.99
    """Cosine similarity at or above which two embedding vectors agree."""
    file: Path | None = None
    """JSON file holding the target (`url`, `fraction`, `version_label`, `min_cosine`),
    re-read every `poll_s`: absent or empty is off, so the target can come and go without a
    restart (a mounted ConfigMap). Refused together with any of those four settings."""
    poll_s: float = Field(2.0, ge=0.1, le=300)
    """How often `file` is re-read, in seconds."""
    max_concurrency: int = Field(8, ge=1, le=1024)
    """Most copies in flight at once; a copy beyond it is dropped (and counted)."""
    timeout_s: float = Field(10.0, gt=0, le=600)
    """Longest a copy may take; then it counts as a shadow error."""
    ca_file: Path | None = None
    """PEM bundle an `https://` shadow's certificate is verified against (e.g. the pods' own
    TLS secret's `ca.crt`); unset: the system's trust store."""

    @field_validator("ca_file")
    @classmethod
    def _check_ca_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            msg = f"shadow.ca_file {value} is not a readable file"
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ShadowConfig:
        if self.file is None:
            if self.model_fields_set & {"poll_s"}:
                msg = "shadow.poll_s only applies with shadow.file"
                raise ValueError(msg)
            return self
        given = sorted(self.model_fields_set & set(ShadowTarget.model_fields))
        if given:
            named = ", ".join(f"shadow.{name}" for name in given)
            msg = f"shadow.file holds the target: {named} cannot be set beside it"
            raise ValueError(msg)
        return self

    @property
    def enabled(self) -> bool:
        """Whether the pod mirrors at all: a fixed `url`, or a `file` to follow."""
        return self.url is not None or self.file is not None

    def fixed_target(self) -> ShadowTarget | None:
        """The target the settings give (None with `file`, or without `url`)."""
        if self.url is None:
            return None
        return ShadowTarget(
            url=self.url,
            fraction=self.fraction,
            version_label=self.version_label,
            min_cosine=self.min_cosine,
        )


class RuntimeConfig(BaseSettings):
    """Everything `fleetserve-runtime serve` needs; see the module docstring for sources."""

    model_config = SettingsConfigDict(
        env_prefix="FLEETSERVE_",
        env_nested_delimiter="_",
        env_nested_max_split=1,
        extra="forbid",
        frozen=True,
        protected_namespaces=(),
        use_attribute_docstrings=True,
    )

    model: str = "builtin://synthetic"
    """Model URI: `builtin://minilm-l6`, `builtin://smollm2-135m`, `builtin://synthetic?...`,
    `builtin://synthetic-generate?...`, `file:///...` (a file, or a directory served as what
    it holds), `module:fn`."""
    task: Literal["auto", "embed", "generate"] = "auto"
    """What the model must do: `embed` or `generate`, refusing a model of the other kind
    (e.g. an encoder in a directory meant to hold a generative model); `auto` serves
    whatever the model is."""
    model_source: str | None = Field(None, min_length=1, max_length=2048)
    """Where the model's files came from (e.g. the `s3://`, `oci://`, `hf://` URI an init
    container fetched `model` from); shown in the model metadata. Set, it also marks the
    files as brought from elsewhere: a directory's `handler.py` then runs only when
    `allowed_model_uris` holds `model` exactly."""
    model_digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$")
    """The digest the fetched files were verified against, `sha256:<64 hex>`; shown in the
    model metadata."""
    model_metadata: MetadataFacts = {}
    """Up to 16 facts about this version (training data, code commit), shown in the model
    metadata: `key=value` pairs, comma-separated, or a JSON object (for values with commas);
    keys label-like, at most 63 characters, values at most 256."""
    name: str = Field("model", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
    """Model name served under `/v2/models/{name}`."""
    version: str = Field("1", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.+-]{0,62}$")
    """Model version label (metrics, metadata, cache keys)."""
    track: str = Field("stable", pattern=r"^[a-z0-9-]{1,32}$")
    """Rollout track of this replica (stable, canary, fallback); a metric label."""
    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(8080, ge=0, le=65535)
    """TCP port to listen on."""
    grpc_port: int | None = Field(None, ge=0, le=65535)
    """TCP port of the OIP gRPC listener on `host` (9000 is the documented choice); unset: off."""
    grpc_max_send_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    """Largest answer the gRPC listener sends, in bytes; a larger one fails with
    RESOURCE_EXHAUSTED (the largest request is `max_body_bytes`)."""
    grpc_max_concurrent_streams: int = Field(100, ge=1, le=100_000)
    """Most RPCs one gRPC connection may have in flight at once; further calls wait."""
    grpc_idle_timeout_s: float = Field(300.0, gt=0, le=86_400)
    """A gRPC connection without an RPC in flight for this long is closed (GOAWAY); clients
    connect again on their next call."""
    grpc_min_ping_interval_s: float = Field(60.0, gt=0, le=86_400)
    """Shortest interval between the keepalive pings a gRPC client may send while no data
    flows; a third ping that comes sooner, or a ping while no RPC is in flight, closes the
    connection (GOAWAY `too_many_pings`)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs; `auto` picks CUDA when available."""
    threads: int = Field(0, ge=0, le=1024)
    """Torch intra-op threads; 0 keeps torch's default."""
    precision: Literal["fp32", "bf16", "int8"] = "fp32"
    """Numeric precision of MiniLM, BERT directories and ONNX models: `int8` (CPU) quantises
    the encoder's Linear layers, `bf16` halves the weights; either must pass the accuracy
    guard at load."""
    precision_min_cosine: float = Field(0.99, ge=0.9, le=1.0)
    """Accuracy guard floor: smallest cosine to fp32 a reduced precision may reach on a
    guard text, else the load fails."""
    precision_min_speedup: float = Field(1.0, ge=0.0, le=100.0)
    """Speed guard floor for MiniLM and BERT directories on torch: a reduced precision must run
    the guard texts at least this many times as fast as fp32, else the load fails (CPUs
    without int8 or bf16 instructions run them many times slower); 0 turns the guard off."""
    backend: Literal["auto", "torch", "onnxruntime"] = "auto"
    """What runs `builtin://minilm-l6`: `auto` picks ONNX Runtime on the CPU in fp32 (its fused
    kernels cost less CPU per request) and torch otherwise; `onnxruntime` refuses CUDA and bf16.
    Other models run on what their URI (a directory: its content) implies; a contradicting
    choice is refused."""
    warmup: bool = True
    """Run batches across the length buckets before reporting ready."""
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    """Largest request body accepted, in bytes."""
    max_instances: int = Field(256, ge=1)
    """Most instances in one request."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level."""
    log_format: Literal["json", "text"] = "json"
    """Structured JSON logs, or plain text for a terminal."""
    log_batch_sample: int = Field(100, ge=1)
    """Log per-batch detail for one batch in this many."""
    max_tensor_rank: int = Field(8, ge=1, le=64)
    """Most dimensions of an input tensor's shape (and nesting levels of request data)."""
    max_tensor_elements: int = Field(1_048_576, ge=1)
    """Most values in one request's input (the product of its shape); more get 413."""
    auth_token_file: Path | None = None
    """File holding the bearer token inference requests must send; unset means no token."""
    auth_exempt_paths: StringList = ["/v2/health/live", "/v2/health/ready", "/metrics"]
    """Paths served without a token (exact matches, comma-separated): probes and metrics."""
    model_control: Literal["none", "explicit"] = "none"
    """`explicit` serves the repository load/unload API on the admin listener; `none` has none."""
    allowed_model_uris: StringList = []
    """URIs model control may load, comma-separated: `scheme://host/path?query` entries whose
    path admits the paths below it and whose query, if any, must equal the URI's (`*` globs
    in each part), or `*` alone; `module:` and `file://` handler directories only by an entry
    equal to the URI. With `model_source` set (and no model control), an entry equal to
    `model` lets the fetched directory's `handler.py` run."""
    admin_host: str = "127.0.0.1"
    """Address of the admin listener (model control)."""
    admin_port: int = Field(8081, ge=0, le=65535)
    """TCP port of the admin listener (model control)."""
    admin_token_file: Path | None = None
    """File holding the bearer token every model-control request must send."""
    priority_token_file: Path | None = None
    """File holding the bearer token that grants the `X-Fleetserve-Priority` and
    `X-Fleetserve-Timeout-Ms` headers (and the body's priority and timeout beyond the
    defaults); it also authenticates inference requests. Unset: no caller may raise them."""
    tls_cert_file: Path | None = None
    """PEM certificate chain the HTTP and gRPC listeners serve TLS with; unset means plain."""
    tls_key_file: Path | None = None
    """PEM private key of `tls_cert_file`."""

    batching: BatchingConfig = BatchingConfig()
    queue: QueueConfig = QueueConfig()
    memory: MemoryConfig = MemoryConfig()
    cache: CacheConfig = CacheConfig()
    semantic_cache: SemanticCacheConfig = SemanticCacheConfig()
    health: HealthConfig = HealthConfig()
    http: HttpConfig = HttpConfig()
    generation: GenerationConfig = GenerationConfig()
    tenants: TenantsConfig = TenantsConfig()
    shadow: ShadowConfig = ShadowConfig()

    @field_validator("auth_exempt_paths", "allowed_model_uris", mode="before")
    @classmethod
    def _parse_list(cls, value: object) -> object:
        return _split_list(value)

    @field_validator("model_metadata", mode="before")
    @classmethod
    def _parse_metadata(cls, value: object) -> object:
        return _parse_facts(value)

    @field_validator("auth_exempt_paths")
    @classmethod
    def _check_paths(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/"):
                msg = f"auth_exempt_paths entries must start with '/', got {path!r}"
                raise ValueError(msg)
        return value

    @field_validator("allowed_model_uris")
    @classmethod
    def _check_allowlist(cls, value: list[str]) -> list[str]:
        for entry in value:
            problem = allowlist_entry_problem(entry)
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("auth_token_file", "admin_token_file", "priority_token_file")
    @classmethod
    def _check_token_file(cls, value: Path | None) -> Path | None:
        return _readable(value, read_token, "token file")

    @model_validator(mode="after")
    def _check_tls(self) -> RuntimeConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            msg = "tls_cert_file and tls_key_file go together: set both or neither"
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _check_grpc_port(self) -> RuntimeConfig:
        taken = {self.port: "port"}
        if self.model_control == "explicit":
            taken[self.admin_port] = "admin_port"
        if self.grpc_port in taken and self.grpc_port != 0:
            msg = f"grpc_port ({self.grpc_port}) must differ from {taken[self.grpc_port]}"
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _check_model_control(self) -> RuntimeConfig:
        if self.model_control == "none":
            if self.admin_token_file is not None:
                msg = "admin_token_file only applies with model_control 'explicit'"
                raise ValueError(msg)
            if self.allowed_model_uris and self.model_source is None:
                msg = (
                    "allowed_model_uris only applies with model_control 'explicit', or with "
                    "model_source (it lets a fetched directory's handler.py run)"
                )
                raise ValueError(msg)
            return self
        if self.admin_token_file is None:
            msg = (
                "model_control 'explicit' needs admin_token_file, the file holding the bearer "
                "token every model-control call must carry"
            )
            raise ValueError(msg)
        if not self.allowed_model_uris:
            msg = (
                "model_control 'explicit' needs allowed_model_uris: list the model URIs "
                "(prefixes or * globs) that may be loaded"
            )
            raise ValueError(msg)
        if self.admin_port == self.port and self.port != 0:
            msg = f"admin_port ({self.admin_port}) must differ from port ({self.port})"
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _check_instances(self) -> RuntimeConfig:
        if self.max_instances > self.queue.max_queue_size:
            msg = (
                f"max_instances ({self.max_instances}) must be <= queue.max_queue_size "
                f"({self.queue.max_queue_size}), or no request that large could ever be queued"
            )
            raise ValueError(msg)
        _at_least(
            "max_tensor_elements", self.max_tensor_elements,
            "max_instances", self.max_instances,
            why="every instance has at least one value",
        )  # fmt: skip
        return self

    @model_validator(mode="after")
    def _check_semantic_cache(self) -> RuntimeConfig:
        """Refuse the semantic cache where nothing generates: it caches generations only."""
        if not self.semantic_cache.enabled:
            return self
        parsed = urlparse(self.model)
        encoder = parsed.scheme == "builtin" and parsed.netloc in _ENCODER_BUILTINS
        if self.task == "embed" or encoder:
            msg = (
                f"semantic_cache.max_entries ({self.semantic_cache.max_entries}) applies to "
                f"generative models only, and {self.model!r} (task {self.task}) embeds text: "
                "set semantic_cache.max_entries to 0 (the result cache, cache.max_entries, "
                "serves encoders)"
            )
            raise ValueError(msg)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """CLI (init) beats env, env beats the YAML file named by `load_config`."""
        yaml_path = _yaml_path.get()
        if yaml_path is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls, yaml_path))


def load_config(overrides: dict[str, Any], *, yaml_path: Path | None = None) -> RuntimeConfig:
    """Build the config from CLI `overrides` (nested dict), the environment and `yaml_path`.

    Raises `FileNotFoundError` for a missing YAML file and pydantic's `ValidationError` for
    bad values.
    """
    if yaml_path is not None and not yaml_path.is_file():
        msg = f"config file {yaml_path} does not exist"
        raise FileNotFoundError(msg)
    token = _yaml_path.set(yaml_path)
    try:
        return RuntimeConfig(**overrides)
    finally:
        _yaml_path.reset(token)
