"""The sections of the runtime's configuration: one frozen model per concern.

`RuntimeConfig` (`core.config`) holds one of each; a section's fields become the flags
`--<flag_prefix><field>` and the env variables `FLEETSERVE_<SECTION>_<FIELD>`. Each section
checks its own fields and their combinations; checks that span sections are `RuntimeConfig`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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
    "Section",
    "SemanticCacheConfig",
    "ShadowConfig",
    "TenantsConfig",
    "at_least",
    "readable",
]

Buckets = Literal["auto", "none"] | list[Annotated[int, Field(ge=1)]]
"""Batch-size buckets: `auto` (powers of two up to the batch size), `none`, or a list."""


def at_least(name: str, value: float, floor_name: str, floor: float, *, why: str = "") -> None:
    """`ValueError` unless setting `name` is at least setting `floor_name`; `why` says why."""
    if value < floor:
        msg = f"{name} ({value}) must be >= {floor_name} ({floor})" + (f": {why}" if why else "")
        raise ValueError(msg)


def readable(path: Path | None, read: Callable[[Path], object], what: str) -> Path | None:
    """`path` once `read` accepts it; a `ValueError` saying why not (start-up refuses it)."""
    if path is not None:
        try:
            read(path)
        except OSError as exc:
            msg = f"cannot read {what} {path}: {exc.strerror}"
            raise ValueError(msg) from None
    return path


class Section(BaseModel):
    """A frozen group of settings; an unknown key is refused, never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    flag_prefix: ClassVar[str] = ""
    """Prefix of this section's CLI flags, where the field names alone would be ambiguous."""


class BatchingConfig(Section):
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


class QueueConfig(Section):
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
        at_least(
            "queue.max_timeout_ms", self.max_timeout_ms,
            "queue.default_timeout_ms", self.default_timeout_ms,
        )  # fmt: skip
        return self


class MemoryConfig(Section):
    """Per-replica memory budget; the batch token limit is derived from it at warmup."""

    flag_prefix: ClassVar[str] = "memory-"

    budget_bytes: int = Field(0, ge=0)
    """Bytes one replica may use for weights and activations; 0 means unbounded."""
    reserve_fraction: float = Field(0.1, ge=0, lt=1)
    """Fraction of the budget kept free for fragmentation and the allocator's own use."""
    pool_max_bytes: int = Field(256 * 1024 * 1024, ge=0)
    """Most bytes the input buffer pool keeps for reuse."""


class GenerationConfig(Section):
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
    dtype: Literal["auto", "float32", "bfloat16", "int8"] = "auto"
    """Weights and KV blocks: `auto` is bfloat16 on CUDA, float32 elsewhere; bfloat16 on a
    CPU with bf16 matrix units runs about twice as fast, at outputs no longer identical to
    float32's; `int8` (CPU only) is int8 weights over float32 activations and KV, refused at
    load when its logits stray too far from float32's."""
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
        at_least(
            "generation.max_timeout_ms", self.max_timeout_ms,
            "generation.default_timeout_ms", self.default_timeout_ms,
        )  # fmt: skip
        at_least(
            "generation.max_output_tokens", self.max_output_tokens,
            "generation.default_max_tokens", self.default_max_tokens,
        )  # fmt: skip
        at_least(
            "generation.max_step_tokens", self.max_step_tokens,
            "generation.max_running_sequences", self.max_running_sequences,
            why="every running sequence decodes one token per step",
        )  # fmt: skip
        return self


class CacheConfig(Section):
    """Optional result cache (off when `max_entries` is 0)."""

    flag_prefix: ClassVar[str] = "cache-"

    max_entries: int = Field(0, ge=0)
    """Most cached results; 0 disables the cache."""
    max_bytes: int = Field(64 * 1024 * 1024, ge=0)
    """Most bytes of cached results."""


class SemanticCacheConfig(Section):
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


class HealthConfig(Section):
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


class HttpConfig(Section):
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


class TenantsConfig(Section):
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
        return readable(value, read_table, "tenants file")

    @model_validator(mode="after")
    def _check_header(self) -> TenantsConfig:
        if self.file is None and (self.trust_header or self.default_max_requests is not None):
            msg = "tenants.trust_header and tenants.default_max_requests need tenants.file"
            raise ValueError(msg)
        return self


class ShadowConfig(Section):
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
