"""The operator's half of the runtime contract: command line, model URIs and metric names.

The runtime (`fleetserve_runtime.cli`) derives one flag per `RuntimeConfig` field; this module
renders those flags from an InferenceService spec, and names the runtime metrics the operator
queries: the only place they are spelled, since the operator may not import the runtime.
`analysis` builds every PromQL query from these names. tests/contract/ parses the rendered
flags with the runtime's own parser, and checks every metric and label the rendered queries
select against the runtime's real registry, so the two programs cannot drift apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

from fleetserve_operator.naming import Track
from fleetserve_operator.spec import (
    RUNTIME_HTTP_PORT,
    BatchingSpec,
    GpuTrackSpec,
    ModelSpec,
    ShadowSpec,
)
from fleetserve_operator.spec.base import parse_quantity
from fleetserve_operator.spec.model_source import DEFAULT_MAX_BYTES, ModelCache, fetched_scheme

__all__ = [
    "shadow_flags",
    "shadow_target",
    "AUTH_MOUNT",
    "AUTH_TOKEN_FILE",
    "AUTH_TOKEN_KEY",
    "COMMAND",
    "CONTAINER_NAME",
    "FETCH_COMMAND",
    "FETCH_CONTAINER_NAME",
    "FETCH_FAILED",
    "FetchFailure",
    "FETCHED_MODEL_DIR",
    "GENERATION_TOKENS_METRIC",
    "HTTP_PORT",
    "INTER_TOKEN_BOUNDS_S",
    "INTER_TOKEN_LATENCY_METRIC",
    "KNOWN_BUILTINS",
    "KV_CACHE_BLOCKS_METRIC",
    "KV_CACHE_BLOCK_BYTES_METRIC",
    "LATENCY_BOUNDS_S",
    "LIVE_PATH",
    "METRICS_PATH",
    "MODEL_MOUNT",
    "PREEMPTIONS_METRIC",
    "PRIORITY_MOUNT",
    "PRIORITY_TOKEN_FILE",
    "PRIVILEGED_HEADERS",
    "TENANTS_FILE",
    "TENANTS_KEY",
    "TENANTS_MOUNT",
    "TENANT_HEADER",
    "QUEUE_WAIT_METRIC",
    "READY_PATH",
    "REQUESTS_METRIC",
    "REQUEST_DURATION_METRIC",
    "SHADOW_AGREED_METRIC",
    "SHADOW_MOUNT",
    "SHADOW_TARGET_FILE",
    "SHADOW_TARGET_KEY",
    "SHADOW_COMPARED_METRIC",
    "SHADOW_ERRORS_METRIC",
    "SHADOW_MIRRORED_METRIC",
    "SHADOW_VERSION_LABEL",
    "TIME_TO_FIRST_TOKEN_METRIC",
    "TLS_CERT_FILE",
    "TLS_KEY_FILE",
    "TLS_MOUNT",
    "MemoryMetric",
    "PvcSource",
    "TrackConfig",
    "pvc_source",
    "render_args",
    "runtime_model_uri",
    "NODE_CACHE_PATH",
    "STORAGE_CA_FILE",
    "STORAGE_CA_KEY",
    "STORAGE_CA_MOUNT",
    "STORAGE_CREDENTIALS_MOUNT",
    "as_args",
    "fetch_args",
    "fetch_budget_bytes",
]

COMMAND = ("fleetserve-runtime", "serve")
CONTAINER_NAME = "runtime"
"""The container that runs `COMMAND` in every track's pods (`observe` reads its image)."""
FETCH_COMMAND = ("fleetserve-runtime", "fetch")
"""The init container that downloads a fetched model (`spec.model.uri` s3/oci/https/hf)."""
FETCH_CONTAINER_NAME = "fetch"


class FetchFailure(StrEnum):
    """Why a fetch failed, as it writes in its termination message (`{"reason", "message"}`).

    Each is also the reason a canary is rolled back with and the service's `Degraded` reason.
    """

    MODEL_NOT_FOUND = "ModelNotFound"
    ACCESS_DENIED = "AccessDenied"
    DIGEST_MISMATCH = "DigestMismatch"
    MODEL_TOO_LARGE = "ModelTooLarge"
    STORAGE_UNREACHABLE = "StorageUnreachable"
    INVALID_ARCHIVE = "InvalidArchive"
    INVALID_URI = "InvalidUri"
    INTERNAL_ERROR = "InternalError"


FETCH_FAILED = "ModelFetchFailed"
"""The reason of a fetch that failed without saying why (killed, or an older image)."""
HTTP_PORT = RUNTIME_HTTP_PORT
READY_PATH = "/v2/health/ready"
LIVE_PATH = "/v2/health/live"
METRICS_PATH = "/metrics"
MODEL_MOUNT = "/models"
FETCHED_MODEL_DIR = "model"
"""Where, under MODEL_MOUNT, the fetch installs a model once it is complete and verified (it
downloads beside it and renames, so the runtime never sees half a model)."""
NODE_CACHE_PATH = "/var/cache/fleetserve/models"
"""`spec.model.cache: node`: the node's model cache, a hostPath the fetch container mounts at
the same path (never the runtime container)."""
STORAGE_CREDENTIALS_MOUNT = "/var/run/secrets/fleetserve/storage"
"""Where `spec.model.storage.secretName` is mounted, in the fetch container only."""
STORAGE_CA_MOUNT = "/var/run/fleetserve/storage-ca"
STORAGE_CA_KEY = "ca.crt"
STORAGE_CA_FILE = f"{STORAGE_CA_MOUNT}/{STORAGE_CA_KEY}"
AUTH_MOUNT = "/var/run/secrets/fleetserve/auth"
"""Where `spec.runtime.authSecretRef`'s Secret is mounted: a directory, never a subPath,
so that the kubelet swaps in a rotated token without restarting the pod."""
AUTH_TOKEN_KEY = "token"
AUTH_TOKEN_FILE = f"{AUTH_MOUNT}/{AUTH_TOKEN_KEY}"
PRIORITY_MOUNT = "/var/run/secrets/fleetserve/priority"
"""Where `spec.runtime.priorityTokenSecretRef`'s Secret is mounted (a directory, as AUTH_MOUNT)."""
PRIORITY_TOKEN_FILE = f"{PRIORITY_MOUNT}/{AUTH_TOKEN_KEY}"
TENANTS_MOUNT = "/var/run/secrets/fleetserve/tenants"
"""Where `spec.runtime.tenants.secretRef`'s Secret is mounted (a directory, as AUTH_MOUNT)."""
TENANTS_KEY = "tenants.yaml"
TENANTS_FILE = f"{TENANTS_MOUNT}/{TENANTS_KEY}"
TENANT_HEADER = "X-Fleetserve-Tenant"
"""Names the tenant only where `spec.runtime.tenants.trustHeader` says a gateway sets it;
elsewhere the HTTPRoute removes it."""
TLS_MOUNT = "/var/run/secrets/fleetserve/tls"
"""Where `spec.runtime.tls`'s Secret is mounted: a directory, so a renewed certificate is
swapped in by the kubelet."""
TLS_CERT_FILE = f"{TLS_MOUNT}/tls.crt"
TLS_KEY_FILE = f"{TLS_MOUNT}/tls.key"
SHADOW_MOUNT = "/etc/fleetserve/shadow"
"""Where the stable pods mount the shadow stage's ConfigMap (`rollout.shadow`): a directory,
never a subPath, so the kubelet swaps in a new target and the runtime, which re-reads it
(`--shadow-file`), starts and stops copying without a restart."""
SHADOW_TARGET_KEY = "target.json"
SHADOW_TARGET_FILE = f"{SHADOW_MOUNT}/{SHADOW_TARGET_KEY}"
PRIVILEGED_HEADERS = ("X-Fleetserve-Priority", "X-Fleetserve-Timeout-Ms")
"""Request headers the runtime honours only from a caller holding the priority token; the
HTTPRoute removes them from every request it forwards."""
KNOWN_BUILTINS = frozenset({"minilm-l6", "synthetic", "smollm2-135m", "synthetic-generate"})
"""`builtin://` models the runtime image ships; anything else is an invalid spec."""
# The runtime refuses max_instances > max_queue_size (a request larger than the queue could
# never be admitted), so a small queue also caps the per-request instances (runtime default 256).
RUNTIME_MAX_INSTANCES = 256
REQUESTS_METRIC = "fleetserve_requests_total"
"""Requests answered, a counter labelled model/version/track and `code` (the HTTP status)."""
REQUEST_DURATION_METRIC = "fleetserve_request_duration_seconds"
"""Arrival to answer, a histogram in seconds labelled model/version/track."""
QUEUE_WAIT_METRIC = "fleetserve_queue_wait_seconds"
"""Arrival to batch formation, a histogram in seconds labelled model/version/track."""
LATENCY_BOUNDS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
"""The `le` bounds of the runtime's latency histograms (its `LATENCY_BUCKETS_S`), `+Inf`
aside: the sequential latency test has one event series per bound."""
TIME_TO_FIRST_TOKEN_METRIC = "fleetserve_time_to_first_token_seconds"
"""Generation request's arrival to its first token, a histogram in seconds with the
`LATENCY_BOUNDS_S` buckets, labelled model/version/track."""
INTER_TOKEN_LATENCY_METRIC = "fleetserve_inter_token_latency_seconds"
"""Gap between consecutive tokens of one stream, a histogram in seconds with the
`INTER_TOKEN_BOUNDS_S` buckets, labelled model/version/track."""
INTER_TOKEN_BOUNDS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
"""The `le` bounds of the inter-token histogram (the runtime's `INTER_TOKEN_BUCKETS_S`),
`+Inf` aside: finer than the request buckets where one decode step lands."""
GENERATION_TOKENS_METRIC = "fleetserve_generation_tokens_total"
"""Tokens generated, a counter labelled model/version/track (one series per pod)."""
PREEMPTIONS_METRIC = "fleetserve_preemptions_total"
"""Sequences preempted when KV blocks ran out, a counter labelled model/version/track."""
KV_CACHE_BLOCKS_METRIC = "fleetserve_model_kv_cache_blocks"
"""Blocks of a generative version's KV-cache pool, sized at load; a gauge labelled
model/version/track (no series for an encoder)."""
KV_CACHE_BLOCK_BYTES_METRIC = "fleetserve_model_kv_cache_block_bytes"
"""Bytes of one KV-cache block as loaded (every layer's keys and values for `blockSize`
tokens, in the device's dtype); a gauge labelled model/version/track."""

# Shadow mirroring (the runtime's `server.shadow`): counters of the serving (stable) pods,
# labelled model/version/track of those pods plus `SHADOW_VERSION_LABEL`, the next version's.
SHADOW_VERSION_LABEL = "shadow_version"
"""The label naming the version the copies went to (the runtime's `shadow.version_label`)."""
SHADOW_MIRRORED_METRIC = "fleetserve_shadow_mirrored_total"
"""Copies the shadow answered or failed (counted when done, before their errors and units)."""
SHADOW_ERRORS_METRIC = "fleetserve_shadow_errors_total"
"""Copies the shadow did not answer with 2xx in time, by `reason` (5xx, 4xx, timeout,
transport)."""
SHADOW_COMPARED_METRIC = "fleetserve_shadow_compared_total"
"""Answer units compared: embedding vectors, greedy generated answers."""
SHADOW_AGREED_METRIC = "fleetserve_shadow_agreed_total"
"""Compared units that agreed (counted after `SHADOW_COMPARED_METRIC`)."""


class MemoryMetric(StrEnum):
    """Gauges in which the runtime reports what its model measured at load time (bytes)."""

    WEIGHTS = "fleetserve_model_weights_bytes"
    FIXED = "fleetserve_model_fixed_bytes"
    PER_TOKEN = "fleetserve_model_bytes_per_token"


@dataclass(frozen=True, slots=True)
class PvcSource:
    """A model on a PersistentVolumeClaim: the claim and the path inside it."""

    claim: str
    path: str


@dataclass(frozen=True, slots=True)
class TrackConfig:
    """Everything that differs between the runtime flags of two tracks."""

    track: Track
    version: str
    batching: BatchingSpec
    device: str
    threads: int


def pvc_source(model: ModelSpec) -> PvcSource | None:
    """The claim and path of a `pvc://<claim>/<path>` model URI; None for other URIs."""
    if model.uri is None or not model.uri.startswith("pvc://"):
        return None
    claim, _, path = model.uri.removeprefix("pvc://").partition("/")
    return PvcSource(claim=claim, path=path)


def runtime_model_uri(model: ModelSpec) -> str:
    """The `--model` the runtime gets: a PVC or fetched model becomes a path under MODEL_MOUNT."""
    source = pvc_source(model)
    if source is not None:
        return f"file://{MODEL_MOUNT}/{source.path}"
    if model.fetched:
        return f"file://{MODEL_MOUNT}/{FETCHED_MODEL_DIR}"
    uri = model.handler if model.uri is None else model.uri
    assert uri is not None  # ModelSpec guarantees exactly one of uri and handler
    return uri


def render_args(*, pods: GpuTrackSpec, config: TrackConfig) -> list[str]:
    """`fleetserve-runtime serve` flags for one track (after COMMAND), from what its pods run."""
    batching, model, memory = config.batching, pods.model, pods.memory
    flags: dict[str, object] = {
        "model": runtime_model_uri(model),
        "name": model.name,
        "version": config.version,
        "track": config.track.value,
        "host": "0.0.0.0",  # a pod must listen on its own IP
        "port": HTTP_PORT,
        "device": config.device,
        "threads": config.threads,
        "log-format": "json",
        "max-batch-size": batching.max_batch_size,
        "max-queue-delay-ms": batching.max_queue_delay_ms,
        "max-sequence-length": batching.max_sequence_length,
        "buckets": batching.buckets,
        "max-batch-tokens": batching.max_batch_tokens,
        "max-queue-size": batching.max_queue_size,
        "max-instances": min(RUNTIME_MAX_INSTANCES, batching.max_queue_size),
        "default-timeout-ms": batching.default_timeout_ms,
        "max-timeout-ms": batching.max_timeout_ms,
        "memory-budget-bytes": memory.budget_bytes,
        "memory-reserve-fraction": memory.reserve_fraction,
    }
    flags |= _source_flags(model)
    if pods.runtime.auth_secret_ref is not None:
        flags["auth-token-file"] = AUTH_TOKEN_FILE
    if pods.runtime.priority_token_secret_ref is not None:
        flags["priority-token-file"] = PRIORITY_TOKEN_FILE
    tenants = pods.runtime.tenants
    if tenants is not None:
        flags["tenants-file"] = TENANTS_FILE
    if pods.runtime.tls is not None:
        flags["tls-cert-file"] = TLS_CERT_FILE
        flags["tls-key-file"] = TLS_KEY_FILE
    # Only when enabled: the pods of services that never asked for gRPC keep their args, so
    # an operator upgrade starts no rollout.
    if pods.runtime.grpc.enabled:
        flags["grpc-port"] = pods.runtime.grpc.port
    # The runtime's switches take no value (`--tenants-trust-header`), unlike every flag above.
    switches = ["--tenants-trust-header"] if tenants is not None and tenants.trust_header else []
    return as_args(flags) + switches


def shadow_flags(*, tls: bool) -> dict[str, object]:
    """The flags of a stable pod that follows the shadow stage's target file.

    With TLS the target is `https://`, verified against the pods' own certificate.
    """
    flags: dict[str, object] = {"shadow-file": SHADOW_TARGET_FILE}
    if tls:
        flags["shadow-ca-file"] = TLS_CERT_FILE
    return flags


def shadow_target(url: str, shadow: ShadowSpec, version: str) -> str:
    """The target file's text (the runtime's `ShadowTarget`): copy to `url`, labelled `version`."""
    target = {
        "url": url,
        "fraction": shadow.fraction,
        "version_label": version,
        "min_cosine": shadow.min_cosine,
    }
    return json.dumps(target, sort_keys=True)


def as_args(flags: dict[str, object]) -> list[str]:
    """`--flag value` pairs, in `flags`' order."""
    return [part for flag, value in flags.items() for part in (f"--{flag}", str(value))]


def _source_flags(model: ModelSpec) -> dict[str, object]:
    """Where the model came from, for its metadata; only what the spec sets.

    A fetched model also gets its declared task, so that a directory holding the other kind
    of model is refused before its weights are read. The flags of models in the image stay
    as they were, so an operator upgrade rolls nothing out.
    """
    flags: dict[str, object] = {}
    if model.fetched:
        flags |= {"task": model.effective_task, "model-source": model.uri}
        if model.digest is not None:
            flags["model-digest"] = model.digest
    if model.metadata:
        # JSON, not key=value pairs: a value may hold commas.
        flags["model-metadata"] = json.dumps(model.metadata, sort_keys=True)
    return flags


def fetch_budget_bytes(model: ModelSpec) -> int:
    """The most bytes a fetched model may take: `maxBytes`, or DEFAULT_MAX_BYTES."""
    return DEFAULT_MAX_BYTES if model.max_bytes is None else parse_quantity(model.max_bytes)


def fetch_args(model: ModelSpec) -> list[str]:
    """`fleetserve-runtime fetch` flags (after FETCH_COMMAND) for a fetched model.

    Raises:
        ValueError: `model` is not fetched (its URI is builtin, file, PVC or a handler).
    """
    if not model.fetched:
        msg = f"model.uri {model.uri!r} is not fetched"
        raise ValueError(msg)
    flags: dict[str, object] = {
        "uri": model.uri,
        "dest": MODEL_MOUNT,
        "max-bytes": fetch_budget_bytes(model),
    }
    if model.digest is not None:
        flags["digest"] = model.digest
    if model.cache is ModelCache.NODE:
        flags["cache-dir"] = NODE_CACHE_PATH
    storage = model.storage
    if storage is not None:
        if storage.secret_name is not None:
            flags["credentials-dir"] = STORAGE_CREDENTIALS_MOUNT
        if storage.ca_config_map is not None:
            flags["ca-file"] = STORAGE_CA_FILE
        endpoint = "hf-endpoint" if fetched_scheme(model.uri) == "hf" else "s3-endpoint"
        store = {endpoint: storage.endpoint, "s3-region": storage.region}
        flags |= {flag: value for flag, value in store.items() if value is not None}
        if storage.addressing is not None:
            flags["s3-addressing"] = storage.addressing
    args = as_args(flags)
    if storage is not None and storage.allow_http:
        args.append("--allow-http")
    return args
