"""Runtime configuration: one validated model, read from CLI flags, `FLEETSERVE_*` env and YAML.

Precedence is CLI flag > environment variable > YAML file > default. Environment variables
are derived from the model: top-level fields are `FLEETSERVE_<FIELD>` and section fields
`FLEETSERVE_<SECTION>_<FIELD>` (for example `FLEETSERVE_BATCHING_MAX_BATCH_SIZE`). Bad values
and bad combinations stop start-up with a message naming the field; nothing falls back.
"""

from __future__ import annotations

import contextvars
import json
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from fleetserve_runtime.core.auth import allowlist_entry_problem, read_token
from fleetserve_runtime.core.config_sections import (
    BatchingConfig,
    CacheConfig,
    GenerationConfig,
    HealthConfig,
    HttpConfig,
    MemoryConfig,
    QueueConfig,
    SemanticCacheConfig,
    ShadowConfig,
    TenantsConfig,
    at_least,
    readable,
)

__all__ = ["RuntimeConfig", "load_config"]

_yaml_path: contextvars.ContextVar[Path | None] = contextvars.ContextVar("_yaml_path", default=None)

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


_ENCODER_BUILTINS = frozenset({"minilm-l6", "synthetic"})
"""Built-in models that embed text: a semantic cache of generations cannot serve them."""


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
        return readable(value, read_token, "token file")

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
        at_least(
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
