"""A `file://` directory is served as what it holds, or refused naming what was found.

Resolving reads file names and small JSON files only, so most directories here hold empty
weight files; the GGUF and BERT directories that load hold real ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fleetserve_runtime.models.accuracy import PrecisionOptions
from fleetserve_runtime.models.generative import GenerativeHandler
from fleetserve_runtime.models.llama.model import LlamaModel
from fleetserve_runtime.models.onnx_model import OnnxEncoderHandler
from fleetserve_runtime.models.quantize import Int8Linear
from fleetserve_runtime.models.registry import Task, choose_backend, resolve_handler
from fleetserve_runtime.models.sentence_encoder import SentenceEncoderHandler
from fleetserve_runtime.models.synthetic import SyntheticHandler
from tests.runtime.models.bert_directories import (
    CLS,
    MEAN,
    NORMALIZE,
    POOLING,
    TRANSFORMER,
    relay_minilm,
    write_json,
    write_modules,
)

CPU = torch.device("cpu")
LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
PLUGIN = """
from pathlib import Path

from fleetserve_runtime.models.synthetic import SyntheticHandler

Path(__file__).with_name("ran").touch()


def create_handler(name, version, max_sequence_length):
    return SyntheticHandler(name, version, max_sequence_length=max_sequence_length)
"""
"""A plug-in that leaves a file named `ran` beside itself when its code runs."""


def resolve(directory: Path, *, task: Task = "auto", plugins: bool = True) -> Any:
    return resolve_handler(
        f"file://{directory}",
        name="m",
        version="1",
        max_sequence_length=256,
        task=task,
        plugins=plugins,
    )


def files(directory: Path, *names: str, config: dict[str, object] | None = None) -> Path:
    """`directory` holding empty files `names`, and `config` as its config.json if given."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).touch()
    if config is not None:
        write_json(directory / "config.json", config)
    return directory


def test_a_sentence_transformers_directory_is_a_bert_encoder(tmp_path: Path) -> None:
    """MiniLM laid out by hand resolves to the BERT encoder with its modules' pooling."""
    handler = resolve(relay_minilm(tmp_path / "st", max_seq_length=128))
    assert isinstance(handler, SentenceEncoderHandler)
    assert handler.metadata.outputs[0].shape == (-1, 384)
    assert handler.metadata.max_sequence_length == 128
    handler.load(CPU)
    assert (handler.encoder.pooling.mode, handler.encoder.pooling.normalize) == ("mean", True)


@pytest.mark.parametrize(
    ("pooling", "normalize", "expected"),
    [
        pytest.param(CLS, False, ("cls", False), id="cls"),
        pytest.param(MEAN, False, ("mean", False), id="no-normalize"),
        pytest.param({"pooling_mode": ["cls"]}, True, ("cls", True), id="mode-list"),
        pytest.param({}, True, ("mean", True), id="no-mode-is-mean"),
        pytest.param(None, False, ("mean", False), id="plain-checkpoint"),
    ],
)
def test_the_pooling_is_the_directorys(
    tmp_path: Path,
    pooling: dict[str, object] | None,
    normalize: bool,
    expected: tuple[str, bool],
) -> None:
    """Pooling config and a Normalize module decide; a plain checkpoint is mean, unnormalised."""
    handler = resolve(relay_minilm(tmp_path / "d", pooling=pooling, normalize=normalize))
    handler.load(CPU)
    assert (handler.encoder.pooling.mode, handler.encoder.pooling.normalize) == expected


def test_a_bert_directory_serves_int8_behind_the_accuracy_guard(tmp_path: Path) -> None:
    """Precision applies to a BERT directory as to MiniLM: quantised, guarded, the figure kept."""
    handler = resolve_handler(
        f"file://{relay_minilm(tmp_path / 'st', pooling=CLS, normalize=False)}",
        name="m",
        version="1",
        max_sequence_length=64,
        precision=PrecisionOptions("int8", 0.99, 0.0),
    )
    handler.load(CPU)
    assert handler.metadata.precision == "int8"
    assert handler.metadata.min_cosine >= 0.99
    assert isinstance(handler.encoder.blocks[0].qkv, Int8Linear)


def test_do_lower_case_lowercases_before_tokenising(tmp_path: Path) -> None:
    """`do_lower_case` lowercases texts even when the tokenizer itself keeps case."""
    directory = relay_minilm(tmp_path / "d")
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    tokenizer["normalizer"]["lowercase"] = False
    write_json(directory / "tokenizer.json", tokenizer)
    cased = resolve(directory)
    write_json(directory / "sentence_bert_config.json", {"do_lower_case": True})
    lowered = resolve(directory)
    for handler in (cased, lowered):
        handler.load(CPU)
    ids = {
        name: [bytes(handler.preprocess(text, truncate=False).data) for text in ("Paris", "paris")]
        for name, handler in (("cased", cased), ("lowered", lowered))
    }
    assert ids["cased"][0] != ids["cased"][1]
    assert ids["lowered"][0] == ids["lowered"][1]


def test_a_llama_directory_and_a_gguf_directory_generate(
    tmp_path: Path, write_tiny_gguf: Callable[..., Any]
) -> None:
    """config.json of a Llama → the checkpoint loader; one *.gguf → the GGUF loader, loaded."""
    llama = resolve(files(tmp_path / "llama", "model.safetensors", config=LLAMA_CONFIG))
    assert isinstance(llama, GenerativeHandler)
    assert llama.source == str(tmp_path / "llama")
    tiny = write_tiny_gguf()
    gguf = resolve(tiny.path.parent)
    assert isinstance(gguf, GenerativeHandler)
    assert gguf.source == str(tiny.path)
    gguf.load(CPU)
    assert isinstance(gguf.lm, LlamaModel)


def test_an_onnx_directory_runs_on_onnxruntime(tmp_path: Path) -> None:
    """model.onnx (+ tokenizer.json) → the ONNX encoder on its graph; the backend follows."""
    directory = files(tmp_path / "onnx", "model.onnx", "tokenizer.json")
    handler = resolve(directory)
    assert isinstance(handler, OnnxEncoderHandler)
    assert handler.metadata.platform == "onnxruntime"
    uri = f"file://{directory}"
    assert choose_backend(uri, "auto", device="cpu", precision="fp32") == "onnxruntime"
    with pytest.raises(ValueError, match="which runs on onnxruntime"):
        choose_backend(uri, "torch", device="cpu", precision="fp32")
    bert = f"file://{relay_minilm(tmp_path / 'bert')}"
    with pytest.raises(ValueError, match="which runs on torch"):
        choose_backend(bert, "onnxruntime", device="cpu", precision="fp32")


def test_a_plugin_directory_runs_its_handler(tmp_path: Path) -> None:
    """handler.py (with weights of its own beside it) is a plug-in, run when allowed."""
    directory = files(tmp_path / "plugin", "weights.safetensors")
    (directory / "handler.py").write_text(PLUGIN)
    assert isinstance(resolve(directory), SyntheticHandler)
    assert (directory / "ran").exists()


def test_a_plugin_is_refused_before_its_code_runs_when_plugins_are_off(tmp_path: Path) -> None:
    """With plugins off the directory's handler.py is refused, naming what would admit it."""
    directory = files(tmp_path / "plugin", "model.safetensors")
    (directory / "handler.py").write_text(PLUGIN)
    with pytest.raises(ValueError, match=r"handler\.py, code that came with the model.*"):
        resolve(directory, plugins=False)
    assert not (directory / "ran").exists()


def bert(tmp_path: Path, **kwargs: Any) -> Path:
    return relay_minilm(tmp_path / "bert", **kwargs)


DENSE = "sentence_transformers.models.Dense"


def without(name: str) -> Callable[[Path], Path]:
    def build(tmp_path: Path) -> Path:
        directory = bert(tmp_path)
        (directory / name).unlink()
        return directory

    return build


def pickled(tmp_path: Path) -> Path:
    directory = without("model.safetensors")(tmp_path)
    (directory / "pytorch_model.bin").touch()
    return directory


def modules(*listed: tuple[str, str]) -> Callable[[Path], Path]:
    def build(tmp_path: Path) -> Path:
        directory = bert(tmp_path)
        write_modules(directory, list(listed))
        return directory

    return build


def pooling(config: dict[str, object]) -> Callable[[Path], Path]:
    return lambda tmp_path: bert(tmp_path, pooling=config)


def two_ggufs(tmp_path: Path) -> Path:
    return files(tmp_path / "gguf", "a.gguf", "b.gguf")


def model_type(config: dict[str, object]) -> Callable[[Path], Path]:
    return lambda tmp_path: files(tmp_path / "other", "model.safetensors", config=config)


def plugin_beside(*names: str, config: dict[str, object] | None = None) -> Callable[[Path], Path]:
    return lambda tmp_path: files(tmp_path / "mixed", "handler.py", *names, config=config)


REFUSALS = {
    "no-weights": (without("model.safetensors"), r"'bert'\) but no model\.safetensors"),
    "no-tokenizer": (without("tokenizer.json"), r"but no tokenizer\.json"),
    "pickle": (pickled, r"holds pytorch_model\.bin and no \*\.safetensors: pickled weights run"),
    "roberta": (
        model_type({"model_type": "roberta", "architectures": ["RobertaModel"]}),
        r"model_type 'roberta' \(architectures \['RobertaModel'\]\) is not served",
    ),
    "mistral": (
        model_type({"model_type": "mistral"}),
        r"model_type 'mistral' \(architectures None\) is not served",
    ),
    "max-pooling": (
        pooling({"pooling_mode": "max"}),
        r"pooling mode 'max' is not served \(mean or cls\)",
    ),
    "sqrt-len-pooling": (
        pooling({"pooling_mode_mean_sqrt_len_tokens": True}),
        r"pooling mode 'mean_sqrt_len_tokens' is not served",
    ),
    "two-modes": (
        pooling({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}),
        r"concatenates the pooling modes cls \+ mean",
    ),
    "width": (
        pooling({"embedding_dimension": 768}),
        r"pools 768-wide embeddings; the model's are 384",
    ),
    "dense": (
        modules((TRANSFORMER, ""), (POOLING, "1_Pooling"), (DENSE, "2_Dense")),
        r"lists sentence_transformers\.models\.Dense: only Transformer, Pooling and Normalize",
    ),
    "order": (
        modules((TRANSFORMER, ""), (NORMALIZE, "2"), (POOLING, "1_Pooling")),
        r"lists the modules Transformer → Normalize → Pooling",
    ),
    "nested-transformer": (
        modules((TRANSFORMER, "0_Transformer"), (POOLING, "1_Pooling")),
        r"puts the Transformer in '0_Transformer'",
    ),
    "no-pooling-config": (
        modules((TRANSFORMER, ""), (POOLING, "3_Pooling")),
        r"a Pooling module without .*3_Pooling",
    ),
    "two-ggufs": (
        two_ggufs,
        r"holds 2 GGUF files \(a\.gguf, b\.gguf\); a GGUF model directory holds exactly one",
    ),
    "gguf-and-config": (
        lambda tmp_path: files(tmp_path / "g", "a.gguf", config=LLAMA_CONFIG),
        r"holds a GGUF file \(a\.gguf\) and config\.json: keep one",
    ),
    "onnx-and-safetensors": (
        lambda tmp_path: files(tmp_path / "o", "model.onnx", "model.safetensors"),
        r"holds both model\.onnx and model\.safetensors",
    ),
    "plugin-and-config": (
        plugin_beside(config=LLAMA_CONFIG),
        r"holds handler\.py \(a plug-in\) and config\.json \(a checkpoint\): keep one",
    ),
    "plugin-and-gguf": (
        plugin_beside("model.gguf"),
        r"holds handler\.py \(a plug-in\) and model\.gguf",
    ),
    "empty": (
        lambda tmp_path: files(tmp_path / "e"),
        r"holds no model the runtime serves \(it is empty\)",
    ),
    "unknown": (
        lambda tmp_path: files(tmp_path / "w", "weights.npz", "README.md"),
        r"holds no model the runtime serves \(found: README\.md, weights\.npz\)",
    ),
}


@pytest.mark.parametrize(("build", "message"), REFUSALS.values(), ids=REFUSALS.keys())
def test_a_directory_that_fits_no_layout_is_refused_naming_what_it_holds(
    tmp_path: Path, build: Callable[[Path], Path], message: str
) -> None:
    """Each refusal names the file and what was found in it."""
    with pytest.raises(ValueError, match=message):
        resolve(build(tmp_path))


MISMATCHES = {
    "bert-as-generate": (
        bert,
        "generate",
        r"holds a BERT encoder \(config\.json model_type 'bert'\), which embeds text, but the "
        "task is generate",
    ),
    "llama-as-embed": (
        lambda tmp_path: files(tmp_path / "l", "model.safetensors", config=LLAMA_CONFIG),
        "embed",
        r"holds a Llama checkpoint \(config\.json model_type 'llama'\), which generates text, "
        "but the task is embed",
    ),
    "gguf-as-embed": (
        lambda tmp_path: files(tmp_path / "g", "tiny.gguf"),
        "embed",
        r"holds a GGUF checkpoint \(tiny\.gguf\), which generates text, but the task is embed",
    ),
    "onnx-as-generate": (
        lambda tmp_path: files(tmp_path / "o", "model.onnx", "tokenizer.json"),
        "generate",
        r"holds an ONNX encoder \(model\.onnx\), which embeds text, but the task is generate",
    ),
    "plugin-as-generate": (
        plugin_beside(),
        "generate",
        r"is an encoder \(synthetic\), which embeds text, but the task is generate",
    ),
}


@pytest.mark.parametrize(("build", "task", "message"), MISMATCHES.values(), ids=MISMATCHES.keys())
def test_a_model_of_the_other_task_is_refused(
    tmp_path: Path, build: Callable[[Path], Path], task: Task, message: str
) -> None:
    """The service's task must be the model's; `auto` takes either."""
    directory = build(tmp_path)
    if (directory / "handler.py").exists():
        (directory / "handler.py").write_text(PLUGIN)
    with pytest.raises(ValueError, match=message):
        resolve(directory, task=task)
    resolve(directory, task="auto")


@pytest.mark.parametrize(
    ("uri", "task", "message"),
    [
        ("builtin://synthetic", "generate", r"'builtin://synthetic' is an encoder"),
        ("builtin://synthetic-generate", "embed", r"is a generative model .*but the task is embed"),
    ],
)
def test_any_uri_is_held_to_the_task(uri: str, task: Task, message: str) -> None:
    """Builtins and factories are held to the task too, once built."""
    with pytest.raises(ValueError, match=message):
        resolve_handler(uri, name="m", version="1", max_sequence_length=8, task=task)
