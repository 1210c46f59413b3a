"""Model URIs, the versioned registry, TorchScript and handler-directory models."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from asgi_lifespan import LifespanManager

from fleetserve_runtime.core.errors import InvalidInput, ModelNotFound, ModelNotReady
from fleetserve_runtime.models.registry import LoadedModel, ModelRegistry, resolve_handler
from fleetserve_runtime.models.synthetic import SyntheticHandler
from fleetserve_runtime.server.app import create_app
from fleetserve_runtime.testing import infer_request, make_config
from fleetserve_runtime.testing.asgi import serve

HANDLER_PY = """
from fleetserve_runtime.models.synthetic import SyntheticHandler, SyntheticParams


def create_handler(name, version, max_sequence_length):
    return SyntheticHandler(name, version, max_sequence_length=max_sequence_length,
                            params=SyntheticParams(dim=3, latency_ms=0))
"""


OLD_STYLE_HANDLER_PY = """
from fleetserve_runtime.models.synthetic import SyntheticHandler


class OldStyle(SyntheticHandler):
    def collate(self, items, *, layout, alloc, device):
        return super().collate(items, layout)


def create_handler(name, version, max_sequence_length):
    return OldStyle(name, version, max_sequence_length=max_sequence_length)
"""

HANDLER_DOCS = (
    Path(__file__).resolve().parents[3] / "docs" / "reference" / "runtime-configuration.md"
)


def documented_handler_py() -> str:
    """The complete `handler.py` the configuration reference shows under "Model handlers"."""
    section = HANDLER_DOCS.read_text().split("## Model handlers", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def loaded(version: str) -> LoadedModel:
    return LoadedModel(SyntheticHandler("m", version), 0.0, None, 0)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        pytest.param("builtin://gpt-9", "unknown builtin model", id="unknown-builtin"),
        pytest.param("s3://bucket/model", "unsupported model URI", id="unknown-scheme"),
        pytest.param("file:///nonexistent/model.pt", "does not exist", id="missing-file"),
        pytest.param("builtin://synthetic?latency_ms=-1", "latency_ms", id="bad-param"),
    ],
)
def test_bad_uris_are_refused(uri: str, message: str) -> None:
    """Unknown or malformed model URIs fail with a message saying what is wrong."""
    with pytest.raises(ValueError, match=message):
        resolve_handler(uri, name="m", version="1", max_sequence_length=8)


def test_module_factory_must_return_a_handler() -> None:
    """A `module:factory` that returns something else is refused."""
    with pytest.raises(TypeError, match="ModelHandler protocol"):
        resolve_handler("builtins:slice", name="m", version="1", max_sequence_length=8)


def test_handler_directory(tmp_path: Path) -> None:
    """`file:///dir` loads `create_handler` from the directory's handler.py."""
    (tmp_path / "handler.py").write_text(HANDLER_PY)
    handler = resolve_handler(f"file://{tmp_path}", name="m", version="7", max_sequence_length=8)
    assert handler.metadata.outputs[0].shape == (-1, 3)
    assert handler.metadata.version == "7"


def test_a_plugin_with_another_collate_signature_is_refused_saying_why(tmp_path: Path) -> None:
    """A `collate` that cannot take `(items, ctx)` is refused at resolve, not at its first batch."""
    (tmp_path / "handler.py").write_text(OLD_STYLE_HANDLER_PY)
    with pytest.raises(TypeError, match=r"OldStyle\.collate\(items, \*, layout, alloc, device\) "):
        resolve_handler(f"file://{tmp_path}", name="m", version="1", max_sequence_length=8)
    with pytest.raises(TypeError, match="in one CollateContext"):
        resolve_handler(f"file://{tmp_path}", name="m", version="1", max_sequence_length=8)


async def test_the_documented_handler_directory_serves(tmp_path: Path) -> None:
    """The reference's example `handler.py` loads, warms up and serves through the v2 API."""
    (tmp_path / "handler.py").write_text(documented_handler_py())
    async with serve(f"file://{tmp_path}", warmup=True) as (client, _):
        answer = await client.post(
            "/v2/models/test/infer", json=infer_request(["one two three", "four"])
        )
    assert answer.status_code == 200, answer.text
    output = answer.json()["outputs"][0]
    assert (output["name"], output["shape"], output["data"]) == ("words", [2, 1], [3.0, 1.0])


def test_registry_swaps_and_switches_back() -> None:
    """Activate keeps one previous version; switching back is instant; release frees it."""
    registry = ModelRegistry("m")
    with pytest.raises(ModelNotReady):
        _ = registry.active
    registry.activate(loaded("v1"))
    registry.activate(loaded("v2"))
    assert registry.active.version == "v2"
    assert registry.versions() == ["v1", "v2"]
    assert registry.switch_back().version == "v1"
    assert registry.active.version == "v1"
    registry.activate(loaded("v3"))
    assert sorted(registry.versions()) == ["v1", "v3"]
    assert registry.release_previous() == "v1"
    with pytest.raises(ModelNotFound):
        registry.get("v1")
    with pytest.raises(InvalidInput):
        registry.switch_back()


async def test_exported_module_served_end_to_end(tmp_path: Path) -> None:
    """A `torch.export` file serves FP32 rows through the v2 API, batched like any model."""
    layer = torch.nn.Linear(4, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(8, dtype=torch.float32).reshape(2, 4))
        layer.bias.zero_()
    path = tmp_path / "linear.pt2"
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(layer, (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))
    config = make_config(model=f"file://{path}?input_width=4")
    app = create_app(config)
    body = {
        "inputs": [
            {"name": "input", "datatype": "FP32", "shape": [2, 4], "data": [1, 0, 0, 0, 0, 0, 0, 1]}
        ]
    }
    bad = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    async with LifespanManager(app, startup_timeout=60) as manager:
        await app.state.runtime.wait_ready()
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://rt") as client:
            ok = await client.post("/v2/models/test/infer", json=body)
            refused = await client.post("/v2/models/test/infer", json=bad)
    assert ok.status_code == 200
    output = ok.json()["outputs"][0]
    assert output["shape"] == [2, 2]
    assert np.allclose(output["data"], [0.0, 4.0, 3.0, 7.0])
    assert refused.status_code == 400
    assert "takes 4" in refused.json()["error"]
