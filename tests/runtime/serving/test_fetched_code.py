"""A model directory never runs the code it carries unless the allowlist names it exactly.

The directory holds `handler.py` beside weights, as a fetched model could. Through model
control the allowlist (`core.auth.uri_refusal`) refuses it even where an entry admits the
paths around it; at start-up, a model brought from elsewhere (`model_source` set) is held to
the same rule. The plug-in leaves a file named `ran` when its code runs, so each test sees
whether it did.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve_runtime.serving.runtime import Runtime
from fleetserve_runtime.testing import infer_request
from fleetserve_runtime.testing.asgi import serve

ServeWithAdmin = Callable[
    ..., AbstractAsyncContextManager[tuple[httpx.AsyncClient, httpx.AsyncClient, Runtime]]
]
PLUGIN = """
from pathlib import Path

from fleetserve_runtime.models.synthetic import SyntheticHandler, SyntheticParams

Path(__file__).with_name("ran").touch()


def create_handler(name, version, max_sequence_length):
    params = SyntheticParams(latency_ms=0, per_item_ms=0)
    return SyntheticHandler(name, version, max_sequence_length=max_sequence_length, params=params)
"""
SOURCE = "s3://models/encoder/v2"


def plugin_with_weights(root: Path) -> Path:
    """A directory holding handler.py and a weights file, as a user could store them."""
    directory = root / "model"
    directory.mkdir()
    (directory / "handler.py").write_text(PLUGIN)
    (directory / "model.safetensors").write_bytes(b"\0" * 64)
    return directory


async def test_model_control_refuses_the_directory_without_an_exact_entry(
    tmp_path: Path, serve_with_admin: ServeWithAdmin
) -> None:
    """An entry admitting the directory's parent does not admit its code: 403, nothing ran."""
    directory = plugin_with_weights(tmp_path)
    uri = f"file://{directory}"
    async with serve_with_admin(allowed=f"file://{tmp_path}") as (_, ctl, runtime):
        refused = await ctl.post(
            "/v2/repository/models/test/load", json={"parameters": {"version": "v2", "uri": uri}}
        )
        versions = runtime.registry.versions()
    assert refused.status_code == 403
    assert "runs code" in refused.json()["error"]
    assert versions == ["v1"]
    assert not (directory / "ran").exists()


async def test_a_fetched_directory_does_not_run_its_handler_at_start(tmp_path: Path) -> None:
    """With `model_source` set and no allowlist entry, the first load fails before any code."""
    directory = plugin_with_weights(tmp_path)
    with pytest.raises(ValueError, match=r"handler\.py, code that came with the model"):
        async with serve(f"file://{directory}", model_source=SOURCE):
            pass
    assert not (directory / "ran").exists()


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"model_source": SOURCE, "allowed_model_uris": "{uri}"}, id="allowlisted"),
        pytest.param({}, id="not-fetched"),
    ],
)
async def test_the_handler_runs_when_allowlisted_or_not_fetched(
    tmp_path: Path, settings: dict[str, Any]
) -> None:
    """An entry equal to the URI lets a fetched directory's code run; a local one always runs."""
    directory = plugin_with_weights(tmp_path)
    uri = f"file://{directory}"
    config = {key: value.format(uri=uri) for key, value in settings.items()}
    async with serve(uri, **config) as (client, _):
        answer = await client.post("/v2/models/test/infer", json=infer_request(["x"]))
    assert answer.status_code == 200, answer.text
    assert (directory / "ran").exists()
