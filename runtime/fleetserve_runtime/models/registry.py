"""Model URIs to handlers, and the versioned registry that swaps versions without a gap.

Encoder URIs: `builtin://minilm-l6`, `builtin://synthetic?<params>`, `file:///path/model.pt2`
(`torch.export`) or `.pt` (TorchScript), both with `?input_width=N`, `file:///path/model.onnx`
(an ONNX text encoder with `tokenizer.json` beside it, `models.onnx_model`), `file:///path/pkg` (a
directory with `handler.py` defining `create_handler(name, version, max_sequence_length)`),
and `module:factory` (an importable factory with the same signature).

Generative URIs (a `models.generative.GenerativeHandler`): `builtin://smollm2-135m`,
`builtin://synthetic-generate?<params>`, `file:///path/model.gguf`, and `file:///path/dir`
for a directory with `config.json` (a Llama checkpoint with `*.safetensors` and
`tokenizer.json`; a directory with `handler.py` stays a plug-in).

`ModelRegistry` keeps the active version and the previous one. A new version is loaded and
warmed off the event loop (`serving.versions.VersionLoader`), then made active in one assignment;
batches already formed hold their own handler reference, so they finish on the version they
were preprocessed for.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal
from urllib.parse import parse_qsl, urlparse

from typing_extensions import TypeVar

from fleetserve_runtime.core.errors import InvalidInput, ModelNotFound, ModelNotReady
from fleetserve_runtime.core.memory import MemoryProfile
from fleetserve_runtime.models.accuracy import Precision, PrecisionOptions
from fleetserve_runtime.models.base import ModelHandler, ModelMetadata
from fleetserve_runtime.models.generative import (
    GenerativeHandler,
    GenerativeOptions,
    llama_handler,
    smollm2_handler,
    synthetic_generative_handler,
)

__all__ = [
    "Backend",
    "KVFigures",
    "LoadedModel",
    "ModelRegistry",
    "ServedHandler",
    "choose_backend",
    "resolve_handler",
]

ServedHandler = ModelHandler | GenerativeHandler
"""An encoder (the `ModelHandler` protocol) or a generative model."""

GENERATE_ENDPOINTS = "/v1/chat/completions, /v1/completions or /v2/models/{name}/generate"

Backend = Literal["auto", "torch", "onnxruntime"]

Engine = TypeVar("Engine", default=Any)
"""What serves a generative version once it is warm (the serving layer's generation engine).

Models sit below both engines, so they leave its type open: the serving layer names it
(`ModelRegistry[GenerationEngine]`); code that never touches it (the encoder) need not."""
"""The `backend` setting: what runs the model, or `auto` to let the runtime pick."""


def choose_backend(
    uri: str, backend: Backend, *, device: str, precision: Precision
) -> Literal["torch", "onnxruntime"]:
    """What runs `uri` on `device` (the resolved device type, `cpu` or `cuda`).

    MiniLM runs on either: `auto` picks ONNX Runtime on the CPU in fp32, where its fused
    kernels cost 1.46x less CPU per request than our torch encoder, and torch otherwise (our
    int8 beats ONNX Runtime's, bf16 is torch's, and the ONNX Runtime wheel is CPU-only). Any
    other model runs on what its URI implies (`.onnx` files on ONNX Runtime, the rest on torch).

    Raises:
        ValueError: the choice contradicts the URI, or ONNX Runtime cannot serve MiniLM on
            `device` or in `precision`.
    """
    parsed = urlparse(uri)
    if parsed.scheme == "builtin" and parsed.netloc == "minilm-l6":
        if backend == "auto":
            cpu_fp32 = device == "cpu" and precision == "fp32"
            return "onnxruntime" if cpu_fp32 else "torch"
        if backend == "onnxruntime" and device != "cpu":
            msg = (
                f"backend onnxruntime runs on the CPU only, but the device is {device}; "
                "set backend to torch or auto, or device to cpu"
            )
            raise ValueError(msg)
        if backend == "onnxruntime" and precision == "bf16":
            msg = "backend onnxruntime serves fp32 or int8, not bf16; set backend to torch or auto"
            raise ValueError(msg)
        return backend
    implied: Literal["torch", "onnxruntime"] = (
        "onnxruntime" if parsed.scheme == "file" and parsed.path.endswith(".onnx") else "torch"
    )
    if backend not in ("auto", implied):
        msg = (
            f"backend {backend} does not apply to {uri!r}, which runs on {implied}; "
            f"set backend to auto or {implied}"
        )
        raise ValueError(msg)
    return implied


def resolve_handler(
    uri: str,
    *,
    name: str,
    version: str,
    max_sequence_length: int,
    generative: GenerativeOptions = GenerativeOptions(),  # noqa: B008 (frozen, shared safely)
    precision: PrecisionOptions = PrecisionOptions(),  # noqa: B008 (frozen, shared safely)
    backend: Backend = "auto",
    device: str = "cpu",
) -> ServedHandler:
    """Build (not load) the handler a model URI names; `ValueError` for an unknown URI.

    `generative` shapes a generative model (context cap, dtype); encoders ignore it.
    `precision` applies to MiniLM and ONNX models; the synthetic model has no weights and
    ignores it; any other model refuses a precision other than fp32. `backend` and the
    resolved `device` type pick what runs MiniLM (`choose_backend`).
    """
    parsed = urlparse(uri)
    params = dict(parse_qsl(parsed.query, strict_parsing=False))
    chosen = choose_backend(uri, backend, device=device, precision=precision.precision)
    if parsed.scheme == "builtin" and parsed.netloc == "minilm-l6":
        if chosen == "onnxruntime":
            from fleetserve_runtime.models.minilm_onnx import MiniLMOnnxHandler

            return MiniLMOnnxHandler(
                name, version, max_sequence_length=max_sequence_length, precision=precision
            )
        from fleetserve_runtime.models.minilm import MiniLMHandler

        return MiniLMHandler(
            name, version, max_sequence_length=max_sequence_length, precision=precision
        )
    if parsed.scheme == "file" and parsed.path.endswith(".onnx"):
        from fleetserve_runtime.models.onnx_model import OnnxEncoderHandler

        return OnnxEncoderHandler(
            name,
            version,
            path=Path(parsed.path),
            max_sequence_length=max_sequence_length,
            precision=precision,
        )
    synthetic = parsed.scheme == "builtin" and parsed.netloc == "synthetic"
    if precision.precision != "fp32" and not synthetic:
        msg = (
            f"precision {precision.precision} applies to builtin://minilm-l6 and "
            f"file:///.../model.onnx only, not to {uri!r}; serve it with precision fp32"
        )
        raise ValueError(msg)
    build = _Build(name, version, max_sequence_length, generative, params)
    if "://" not in uri and ":" in uri:
        module_name, _, attr = uri.partition(":")
        return build.plugin(getattr(importlib.import_module(module_name), attr))
    if parsed.scheme == "builtin":
        return _builtin(parsed.netloc, build)
    if parsed.scheme == "file":
        return _from_file(Path(parsed.path), build)
    msg = f"unsupported model URI {uri!r}: use builtin://, file:// or module:factory"
    raise ValueError(msg)


BUILTINS = ("minilm-l6", "smollm2-135m", "synthetic", "synthetic-generate")


@dataclass(frozen=True, slots=True)
class _Build:
    """What every URI form builds its handler from, besides the URI's own target."""

    name: str
    version: str
    max_len: int
    generative: GenerativeOptions
    params: dict[str, str]
    """The URI's query."""

    def plugin(self, factory: Callable[[str, str, int], object]) -> ServedHandler:
        """The handler a user's factory (`module:factory`, `create_handler`) returns, checked."""
        return _checked(factory(self.name, self.version, self.max_len))


def _builtin(kind: str, build: _Build) -> ServedHandler:
    if kind == "smollm2-135m":
        return smollm2_handler(build.name, build.version, options=build.generative)
    if kind == "synthetic-generate":
        from fleetserve_runtime.models.synthetic_lm import SyntheticGenerativeParams

        return synthetic_generative_handler(
            build.name,
            build.version,
            params=SyntheticGenerativeParams.model_validate(build.params),
            options=build.generative,
        )
    if kind == "synthetic":
        from fleetserve_runtime.models.synthetic import SyntheticHandler, SyntheticParams

        return SyntheticHandler(
            build.name,
            build.version,
            max_sequence_length=build.max_len,
            params=SyntheticParams.model_validate(build.params),
        )
    msg = f"unknown builtin model {kind!r}: known are {', '.join(BUILTINS)}"
    raise ValueError(msg)


def _from_file(path: Path, build: _Build) -> ServedHandler:
    if not path.exists():
        msg = f"model path {path} does not exist"
        raise ValueError(msg)
    if path.suffix == ".gguf" or (path.is_dir() and (path / "config.json").is_file()):
        if (path / "handler.py").is_file():
            msg = f"{path} has both handler.py and config.json: keep one, a plug-in or a checkpoint"
            raise ValueError(msg)
        return llama_handler(build.name, build.version, path=path, options=build.generative)
    if path.is_file():
        from fleetserve_runtime.models.serialized import SerializedModuleHandler

        if "input_width" not in build.params:
            msg = "a serialized-module model URI needs ?input_width=<N>"
            raise ValueError(msg)
        width = int(build.params["input_width"])
        return SerializedModuleHandler(build.name, build.version, path=path, input_width=width)
    spec = importlib.util.spec_from_file_location(
        f"fleetserve_user_{build.name}", path / "handler.py"
    )
    if spec is None or spec.loader is None:
        msg = f"{path} has no handler.py"
        raise ValueError(msg)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return build.plugin(module.create_handler)


def _checked(handler: object) -> ServedHandler:
    if not isinstance(handler, ModelHandler | GenerativeHandler):
        msg = f"{type(handler).__name__} does not implement the ModelHandler protocol"
        raise TypeError(msg)
    if isinstance(handler, ModelHandler):
        _check_collate(handler)
    return handler


def _check_collate(handler: ModelHandler) -> None:
    """Refuse a `collate` the executor cannot call as `collate(items, ctx)`.

    The protocol checks only that the method exists; a plug-in written for another signature
    (e.g. the batch's layout, allocator and device as separate arguments) would otherwise
    load and then fail every batch.
    """
    try:
        signature = inspect.signature(handler.collate)
    except (TypeError, ValueError):  # no signature to read (e.g. a builtin): trust it
        return
    try:
        signature.bind([], None)
    except TypeError:
        msg = (
            f"{type(handler).__name__}.collate{signature} cannot be called as "
            "collate(items, ctx): the ModelHandler protocol passes the batch's layout, "
            "allocator and device in one CollateContext (ctx.layout, ctx.alloc, ctx.device)"
        )
        raise TypeError(msg) from None


@dataclass(frozen=True, slots=True)
class KVFigures:
    """How a generative version's KV pool was sized, for metadata and metrics."""

    num_blocks: int
    block_size: int
    block_bytes: int
    activation_bytes: int
    """Measured peak of one step of `generation.max_step_tokens` tokens."""

    @property
    def pool_bytes(self) -> int:
        """Bytes of the whole pool."""
        return self.num_blocks * self.block_bytes

    @property
    def token_capacity(self) -> int:
        """Token positions the pool holds."""
        return self.num_blocks * self.block_size


@dataclass(frozen=True, slots=True)
class LoadedModel(Generic[Engine]):
    """A loaded, warmed handler and what was measured while loading it."""

    served: ServedHandler
    """The encoder or generative handler; `handler` and `generative` narrow it."""
    load_seconds: float
    memory: MemoryProfile | None
    max_batch_tokens: int
    """Padded-token limit derived from the memory budget (0: unbounded)."""
    uri: str = ""
    """The model URI this version was loaded from."""
    generation: int = 0
    """Distinguishes two loads of the same version label (e.g. unloaded, then reloaded from
    another URI), so cached results of one are never served for the other."""
    kv: KVFigures | None = None
    """The KV pool of a generative version; None for an encoder."""
    engine: Engine | None = None
    """The engine serving a generative version (started once it is warm); None otherwise."""

    @property
    def version(self) -> str:
        """The handler's version label."""
        return self.served.metadata.version

    @property
    def metadata(self) -> ModelMetadata:
        """Name, version, shapes and limits of either kind."""
        return self.served.metadata

    @property
    def handler(self) -> ModelHandler:
        """The encoder handler; `InvalidInput` naming the generate endpoints otherwise.

        The encoder request path asks for it first thing, so an infer request to a
        generative model is refused before it costs anything.
        """
        served = self.served
        if isinstance(served, GenerativeHandler):
            endpoints = GENERATE_ENDPOINTS.format(name=served.metadata.name)
            msg = (
                f"model {served.metadata.name!r} generates text and has no infer endpoint: "
                f"use {endpoints}"
            )
            raise InvalidInput(msg)
        return served

    @property
    def generative(self) -> GenerativeHandler | None:
        """The generative handler; None for an encoder."""
        return self.served if isinstance(self.served, GenerativeHandler) else None


class ModelRegistry(Generic[Engine]):
    """Active and previous versions of one model name; safe to read from any thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._versions: dict[str, LoadedModel[Engine]] = {}
        self._active: LoadedModel[Engine] | None = None
        self._previous: LoadedModel[Engine] | None = None

    @property
    def active(self) -> LoadedModel[Engine]:
        """The version new requests go to; `ModelNotReady` before the first load."""
        active = self._active
        if active is None:
            msg = f"model {self.name!r} is loading"
            raise ModelNotReady(msg)
        return active

    @property
    def is_ready(self) -> bool:
        """True once a version is loaded and warmed."""
        return self._active is not None

    def versions(self) -> list[str]:
        """Loaded version labels."""
        with self._lock:
            return list(self._versions)

    def get(self, version: str | None) -> LoadedModel[Engine]:
        """The active model, or a specific loaded version."""
        if version is None:
            return self.active
        with self._lock:
            loaded = self._versions.get(version)
        if loaded is None:
            msg = f"model {self.name!r} has no loaded version {version!r}"
            raise ModelNotFound(msg)
        return loaded

    def activate(self, loaded: LoadedModel[Engine]) -> None:
        """Make `loaded` active; the old active version stays loaded as the previous one."""
        with self._lock:
            if self._previous is not None and self._previous.version not in (
                loaded.version,
                self._active.version if self._active else None,
            ):
                del self._versions[self._previous.version]
            self._versions[loaded.version] = loaded
            if self._active is not None and self._active.version != loaded.version:
                self._previous = self._active
            self._active = loaded

    def switch_back(self) -> LoadedModel[Engine]:
        """Re-activate the previous version instantly; `InvalidInput` when there is none."""
        with self._lock:
            previous = self._previous
            if previous is None or self._active is None:
                msg = f"model {self.name!r} has no previous version to switch back to"
                raise InvalidInput(msg)
            self._previous, self._active = self._active, previous
            return previous

    def release_previous(self) -> str | None:
        """Unload the previous version; returns its label (None if there was none)."""
        with self._lock:
            previous = self._previous
            if previous is None:
                return None
            self._previous = None
            del self._versions[previous.version]
            return previous.version
