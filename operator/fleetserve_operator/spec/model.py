"""What is served: the model, its task, and what the runtime knows of its builtins."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import Field, model_validator
from pydantic.config import JsonDict

from fleetserve_operator.spec.base import GPU_RESOURCE, Quantity, Wire, cel, cel_rules
from fleetserve_operator.spec.model_source import (
    FETCHED_SCHEMES,
    MODEL_URI_PATTERN,
    SHA256_DIGEST,
    MetadataKey,
    ModelCache,
    ModelStorage,
    fetched_scheme,
)
from fleetserve_operator.spec.scaling import (
    Backend,
)

__all__ = [
    "BUILTIN_TASKS",
    "GENERATIVE_CEL",
    "MINILM_URI",
    "ONNXRUNTIME_ON_GPU",
    "ONNX_FILE_URI",
    "SMOLLM2_CONTEXT",
    "SMOLLM2_KV_BYTES_PER_TOKEN",
    "SMOLLM2_MIN_WEIGHTS_BYTES",
    "SMOLLM2_URI",
    "ModelSpec",
    "SOURCE_RULES",
    "Task",
    "backend_contradicts",
    "builtin_context_length",
    "builtin_task",
    "gpu_requested_cel",
    "onnxruntime_bf16",
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


def builtin_task(uri: str | None) -> Task | None:
    """The task of a `builtin://` model's URI; None for any other URI."""
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
MINILM_URI = r"^builtin://minilm-l6([?].*)?$"
ONNX_FILE_URI = r"^(file|pvc)://[^?#]*[.]onnx([?#].*)?$"


def gpu_requested_cel(section: str) -> str:
    """CEL: the `resources` of `section` (`self`, `self.runtime`) ask for a GPU (`has_gpu`)."""
    resources = f"{section}.resources"
    return (
        f"has({resources}) && ((has({resources}.limits) && '{GPU_RESOURCE}' in "
        f"{resources}.limits) || (has({resources}.requests) && '{GPU_RESOURCE}' in "
        f"{resources}.requests))"
    )


def onnxruntime_bf16(track: str) -> str:
    """Why `track` cannot run bf16 on ONNX Runtime."""
    return (
        f"{track}.backend onnxruntime serves fp32 or int8, not bf16: set {track}.backend to "
        f"torch or auto, or {track}.precision to fp32 or int8"
    )


ONNXRUNTIME_ON_GPU = (
    "runtime.backend onnxruntime runs on the CPU only, but runtime.device is cuda, or auto "
    f"with {GPU_RESOURCE} in runtime.resources (auto picks CUDA when the pod has a GPU): set "
    "runtime.backend to torch or auto, or runtime.device to cpu"
)


def backend_contradicts(track: str, backend: Backend) -> str:
    """Why `backend` on `track` cannot serve the model (an .onnx file, or not one)."""
    if backend == "torch":
        return (
            f"{track}.backend torch does not apply to an .onnx model, which only ONNX Runtime "
            f"serves: set {track}.backend to auto or onnxruntime"
        )
    return (
        f"{track}.backend onnxruntime applies to builtin://minilm-l6 and .onnx models only; "
        f"torch serves this one: set {track}.backend to auto or torch"
    )


@dataclass(frozen=True, slots=True)
class SourceRule:
    """A rule between `spec.model.uri` and the fields that say how to fetch it, stated once.

    `rule` is CEL on the model section (`self`), for the API server; `holds` is the same rule
    on the parsed model, for a spec the operator reads. Both refuse with `message`.
    """

    rule: str
    message: str
    field_path: str
    holds: Callable[[ModelSpec], bool]

    def cel(self) -> JsonDict:
        """The rule's `VALIDATIONS` entry."""
        return cel(self.rule, self.message, self.field_path)


_FETCHED = " || ".join(f"self.uri.startsWith('{scheme}://')" for scheme in FETCHED_SCHEMES)
_FETCHED_NAMES = ", ".join(f"{scheme}://" for scheme in FETCHED_SCHEMES)


def _fetched_only(field: str, present: Callable[[ModelSpec], bool]) -> SourceRule:
    return SourceRule(
        f"!has(self.{field}) || (has(self.uri) && ({_FETCHED}))",
        f"model.{field} applies to fetched models ({_FETCHED_NAMES}) only",
        f".{field}",
        lambda model: not present(model) or model.fetched,
    )


def _s3_only(field: str) -> SourceRule:
    return SourceRule(
        f"!has(self.storage) || !has(self.storage.{field}) || "
        "(has(self.uri) && self.uri.startsWith('s3://'))",
        f"model.storage.{field} applies to s3:// models only",
        f".storage.{field}",
        lambda model: (
            model.storage is None
            or getattr(model.storage, field) is None
            or fetched_scheme(model.uri) == "s3"
        ),
    )


def _uri_is_http(model: ModelSpec) -> bool:
    return model.uri is not None and model.uri.startswith("http://")


def _endpoint_is_http(model: ModelSpec) -> bool:
    endpoint = None if model.storage is None else model.storage.endpoint
    return endpoint is not None and endpoint.startswith("http://")


SOURCE_RULES: tuple[SourceRule, ...] = (
    _fetched_only("digest", lambda model: model.digest is not None),
    _fetched_only("maxBytes", lambda model: model.max_bytes is not None),
    _fetched_only("storage", lambda model: model.storage is not None),
    _fetched_only("cache", lambda model: model.cache is not None),
    SourceRule(
        "!has(self.cache) || has(self.digest) || (has(self.uri) && self.uri.startsWith('oci://'))",
        "model.cache: node needs a pinned digest to key the cache by: set model.digest "
        "(an oci:// URI carries its own)",
        ".cache",
        lambda model: (
            model.cache is None or model.digest is not None or fetched_scheme(model.uri) == "oci"
        ),
    ),
    *(_s3_only(field) for field in ("region", "addressing")),
    SourceRule(
        "!has(self.storage) || !has(self.storage.endpoint) || "
        "(has(self.uri) && (self.uri.startsWith('s3://') || self.uri.startsWith('hf://')))",
        "model.storage.endpoint applies to s3:// and hf:// models only",
        ".storage.endpoint",
        lambda model: (
            model.storage is None
            or model.storage.endpoint is None
            or fetched_scheme(model.uri) in ("s3", "hf")
        ),
    ),
    SourceRule(
        "!has(self.uri) || !self.uri.matches('^https?://') || has(self.digest)",
        "model.digest is required for an https:// model: the sha256 of the file it names "
        "(sha256:<64 hex>), so that one version always serves the same bytes",
        ".digest",
        lambda model: fetched_scheme(model.uri) not in ("https", "http") or bool(model.digest),
    ),
    SourceRule(
        "!has(self.digest) || !has(self.uri) || !self.uri.startsWith('oci://') || "
        "self.uri.endsWith('@' + self.digest)",
        "model.digest must equal the manifest digest in an oci:// model.uri (or be unset)",
        ".digest",
        lambda model: (
            model.digest is None
            or fetched_scheme(model.uri) != "oci"
            or str(model.uri).endswith(f"@{model.digest}")
        ),
    ),
    SourceRule(
        "!has(self.uri) || !self.uri.startsWith('oci://') || self.uri.contains('@sha256:')",
        "an oci:// model.uri must end in @sha256:<64 hex>, the manifest digest, so that one "
        "version always serves the same artifact",
        ".uri",
        lambda model: fetched_scheme(model.uri) != "oci" or "@sha256:" in str(model.uri),
    ),
    SourceRule(
        "!has(self.uri) || !self.uri.startsWith('hf://') || self.uri.matches('@[0-9a-f]{40}$')",
        "an hf:// model.uri must end in @<40-hex commit>: a branch or tag can move",
        ".uri",
        lambda model: (
            fetched_scheme(model.uri) != "hf"
            or re.search("@[0-9a-f]{40}$", str(model.uri)) is not None
        ),
    ),
    SourceRule(
        "!has(self.storage) || !has(self.storage.endpoint) || "
        "self.storage.endpoint.startsWith('https://') || self.storage.allowHttp",
        "model.storage.endpoint must be https:// (set model.storage.allowHttp to fetch over "
        "plain HTTP)",
        ".storage.endpoint",
        lambda model: (
            not _endpoint_is_http(model) or bool(model.storage and model.storage.allow_http)
        ),
    ),
    SourceRule(
        "!has(self.uri) || !self.uri.startsWith('http://') || "
        "(has(self.storage) && self.storage.allowHttp)",
        "an http:// model.uri needs model.storage.allowHttp: true (a model fetched in the "
        "clear can be swapped on the way; prefer https://)",
        ".uri",
        lambda model: (
            not _uri_is_http(model) or (model.storage is not None and model.storage.allow_http)
        ),
    ),
    SourceRule(
        "!has(self.storage) || !self.storage.allowHttp || "
        "(has(self.uri) && self.uri.startsWith('http://')) || "
        "(has(self.storage.endpoint) && self.storage.endpoint.startsWith('http://'))",
        "model.storage.allowHttp applies only to an http:// model.uri or model.storage.endpoint",
        ".storage.allowHttp",
        lambda model: (
            model.storage is None
            or not model.storage.allow_http
            or _uri_is_http(model)
            or _endpoint_is_http(model)
        ),
    ),
)
"""Every rule between a fetched model's URI and its `digest`, `maxBytes` and `storage`."""


class ModelSpec(Wire):
    """What to serve: the model's name, version and where its weights or handler come from."""

    model_config = cel_rules(
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
        *(rule.cel() for rule in SOURCE_RULES),
    )

    name: str = Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$", max_length=63)
    """Name the model is served under (`/v2/models/{name}`) and its `model` metric label."""
    # The version is also a label value of the track's Deployment and pods, so it takes that
    # grammar: no `+`, and a letter or digit at both ends.
    version: str = Field(pattern=r"^[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?$", max_length=63)
    """Version label; changing it rolls the new version out."""
    uri: str | None = Field(None, pattern=MODEL_URI_PATTERN, max_length=2048)
    """`builtin://minilm-l6`, `builtin://synthetic?latency_ms=5`, `file:///path` (in the image),
    `pvc://<claim>/<path>` (the claim is mounted read-only at /models), or a model the pod's
    init container fetches: `s3://<bucket>/<prefix>`, `oci://<registry>/<repo>[:<tag>]@sha256:<digest>`
    (an artifact pushed with ORAS), `https://<host>/<path>` (a file or a .tar, .tar.gz, .zip
    archive; needs `digest`) or `hf://<org>/<name>@<40-hex commit>` (a Hugging Face layout)."""
    digest: str | None = Field(None, pattern=SHA256_DIGEST, max_length=71)
    """`sha256:<64 hex>` pinning what a fetched model serves: the file of an `https://` model
    (required there), the manifest of an `oci://` one (as in its URI), and for `s3://` and
    `hf://` the digest of the file listing (each file's path, size and sha256; the fetch
    reports it). A fetch whose bytes do not match fails with `DigestMismatch`."""
    max_bytes: Quantity | None = None
    """Fetched models only: the most bytes the model's files may take (declared sizes are
    checked before the download, actual bytes while it runs). Unset: 64Gi."""
    storage: ModelStorage | None = None
    """Fetched models only: credentials, CA and endpoint of the store."""
    cache: ModelCache | None = None
    """Fetched models with a pinned digest only. `node`: the fetch keeps the model in the
    node's cache (a hostPath, `/var/cache/fleetserve/models`) keyed by its digest, and a later
    pod on the node copies it from there, checked byte for byte, instead of downloading it.
    The directory must be writable by UID 65532 (else the fetch downloads and says so in
    `ModelFetched`), and the namespace's Pod Security level must admit hostPath volumes."""
    metadata: dict[MetadataKey, Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict, max_length=16
    )
    """Up to 16 facts about this version (training data version, code commit,
    hyper-parameters); carried to the runtime's model metadata and the rollout history."""
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
        known = builtin_task(self.uri)
        if self.task is not None and known is not None and self.task != known:
            msg = f"model.task must be {known} for {self.uri}"
            raise ValueError(msg)
        for rule in SOURCE_RULES:
            if not rule.holds(self):
                raise ValueError(rule.message)
        return self

    @property
    def fetched(self) -> bool:
        """True when the pod's init container fetches the model (`FETCHED_SCHEMES`)."""
        return fetched_scheme(self.uri) is not None

    @property
    def effective_task(self) -> Task:
        """`task`, or for an unset one the builtin's task, else `embed`."""
        return self.task or builtin_task(self.uri) or "embed"

    @property
    def generates(self) -> bool:
        """True when the model generates text (the OpenAI and generate routes)."""
        return self.effective_task == "generate"


# SmolLM2-135M's floor, in its smallest serving dtype (bf16 on a GPU; CPU doubles both): 30
# layers x 3 KV heads x 64 dims x keys and values x 2 bytes per token, and 134.5M parameters.
# tests/contract/ checks them against the loaded model.
SMOLLM2_URI = r"^builtin://smollm2-135m([?].*)?$"
SMOLLM2_CONTEXT = 8192
"""SmolLM2-135M's own context, in tokens."""
SMOLLM2_KV_BYTES_PER_TOKEN = 23_040
"""KV-cache bytes of one SmolLM2 token in bf16."""
SMOLLM2_MIN_WEIGHTS_BYTES = 256 * 2**20
"""Less than SmolLM2's weights take in bf16."""


_SYNTHETIC_CONTEXT = 4096
"""`builtin://synthetic-generate`'s context without a `context_length` parameter."""


def builtin_context_length(model: ModelSpec) -> int | None:
    """The context, in tokens, of a generative builtin; None for any other model."""
    if model.uri is None:
        return None
    if re.fullmatch(SMOLLM2_URI, model.uri):
        return SMOLLM2_CONTEXT
    if builtin_task(model.uri) != "generate":
        return None
    query = parse_qs(urlsplit(model.uri).query)
    given = query.get("context_length", [])
    return int(given[-1]) if given and given[-1].isdigit() else _SYNTHETIC_CONTEXT
