"""Model control in process: load, hot swap, unload, and the cache across versions.

Exercised on the admin app over ASGI, as `serve_with_admin` (conftest.py) starts it; its
access control over real sockets is in test_http_security.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import httpx
import pytest

from fleetserve_runtime.serving.runtime import Runtime
from fleetserve_runtime.testing import SYNTHETIC_MODEL as SYNTH
from fleetserve_runtime.testing import infer_request, metric_total
from fleetserve_runtime.testing.asgi import serve

# The `serve_with_admin` fixture (conftest.py).
ServeWithAdmin = Callable[
    ..., AbstractAsyncContextManager[tuple[httpx.AsyncClient, httpx.AsyncClient, Runtime]]
]


async def test_hot_swap_and_instant_switch_back(serve_with_admin: ServeWithAdmin) -> None:
    """A new version loads and takes traffic; the old one stays callable and switches back."""
    async with serve_with_admin() as (client, ctl, runtime):
        load = await ctl.post(
            "/v2/repository/models/test/load",
            json={"parameters": {"version": "v2", "uri": SYNTH + "&dim=4"}},
        )
        new = await client.post("/v2/models/test/infer", json=infer_request(["x"]))
        old = await client.post("/v2/models/test/versions/v1/infer", json=infer_request(["x"]))
        back = await ctl.post(
            "/v2/repository/models/test/load", json={"parameters": {"version": "v1"}}
        )
        after = await client.post("/v2/models/test/infer", json=infer_request(["x"]))
        released = await ctl.post("/v2/repository/models/test/unload")
    assert load.json()["active_version"] == "v2"
    assert new.json()["model_version"] == "v2"
    assert new.json()["outputs"][0]["shape"] == [1, 4]
    assert old.json()["model_version"] == "v1"
    assert back.json()["active_version"] == "v1"
    assert after.json()["model_version"] == "v1"
    assert released.json()["released_version"] == "v2"
    assert runtime.registry.versions() == ["v1"]


@pytest.mark.parametrize(
    ("allowed", "version", "uri", "status", "message"),
    [
        pytest.param(
            "builtin://synthetic", "v1", SYNTH + "&dim=4", 400, "already loaded",
            id="loaded-label-for-another-uri",
        ),
        pytest.param(
            "no_such_module_here:factory", "v2", "no_such_module_here:factory", 400,
            "cannot load", id="unimportable-factory",
        ),
        pytest.param(
            "builtin://", "v2", "builtin://nope", 400, "unknown builtin model",
            id="unknown-builtin",
        ),
        pytest.param(
            "builtin://synthetic", "v2", "builtin://[oops", 403,
            "not a valid URI (Invalid IPv6 URL)", id="malformed-uri",
        ),
    ],
)  # fmt: skip
async def test_a_refused_load_names_its_reason_and_v1_keeps_serving(
    serve_with_admin: ServeWithAdmin,
    allowed: str,
    version: str,
    uri: str,
    status: int,
    message: str,
) -> None:
    """A load that cannot or may not be done is the caller's error, never a 500.

    A loaded label cannot silently point at a different URI; a module:factory that cannot be
    imported, an unknown model and a URI that does not parse are refused naming the problem.
    """
    async with serve_with_admin(allowed=allowed) as (client, ctl, runtime):
        response = await ctl.post(
            "/v2/repository/models/test/load",
            json={"parameters": {"version": version, "uri": uri}},
        )
        still = await client.post("/v2/models/test/infer", json=infer_request(["x"]))
    assert response.status_code == status
    assert message in response.json()["error"]
    assert still.json()["model_version"] == "v1"
    assert runtime.registry.versions() == ["v1"]


COUNTING_HANDLER = """
from pathlib import Path
from fleetserve_runtime.models.synthetic import SyntheticHandler

def create_handler(name, version, max_sequence_length):
    with (Path(__file__).parent / "created").open("a") as created:
        created.write(version + "\\n")
    return SyntheticHandler(name, version, max_sequence_length=max_sequence_length)
"""


async def test_concurrent_loads_of_one_version_load_it_once(
    tmp_path: Path, serve_with_admin: ServeWithAdmin
) -> None:
    """Two loads of one label at once: the second waits and finds it loaded; one handler."""
    (tmp_path / "handler.py").write_text(COUNTING_HANDLER)
    uri = f"file://{tmp_path}"
    async with serve_with_admin(allowed=uri) as (client, ctl, runtime):
        load = {"parameters": {"version": "v2", "uri": uri}}
        answers = await asyncio.gather(
            *(ctl.post("/v2/repository/models/test/load", json=load) for _ in range(2))
        )
        served = await client.post("/v2/models/test/infer", json=infer_request(["x"]))
        generation = runtime.registry.get("v2").generation
    assert [answer.json() for answer in answers] == [{"name": "test", "active_version": "v2"}] * 2
    assert (tmp_path / "created").read_text().split() == ["v2"]
    assert (served.json()["model_version"], generation) == ("v2", 2)


async def test_cache_hits_and_never_crosses_versions(serve_with_admin: ServeWithAdmin) -> None:
    """A repeated input is served from the cache; after a version switch it is recomputed."""
    async with serve_with_admin(cache={"max_entries": 100}) as (client, ctl, _):
        await client.post("/v2/models/test/infer", json=infer_request(["same"]))
        await client.post("/v2/models/test/infer", json=infer_request(["same"]))
        await ctl.post(
            "/v2/repository/models/test/load",
            json={"parameters": {"version": "v2", "uri": SYNTH + "&dim=4"}},
        )
        swapped = await client.post("/v2/models/test/infer", json=infer_request(["same"]))
        metrics = (await client.get("/metrics")).text
    assert metric_total(metrics, "fleetserve_cache_hits_total", version="v1") == 1
    assert metric_total(metrics, "fleetserve_cache_hits_total", version="v2") == 0
    assert swapped.json()["outputs"][0]["shape"] == [1, 4]


async def test_repository_api_follows_model_control(serve_with_admin: ServeWithAdmin) -> None:
    """`/v2` lists model_repository only with model control, which lives on the admin app."""
    async with serve() as (client, _):
        plain = (await client.get("/v2")).json()["extensions"]
    async with serve_with_admin() as (client, ctl, _):
        explicit = (await client.get("/v2")).json()["extensions"]
        on_inference = await client.post("/v2/repository/models/test/unload")
        on_admin = await ctl.post("/v2/repository/models/test/unload")
    assert (plain, explicit) == ([], ["model_repository"])
    assert on_inference.status_code == 404
    assert on_admin.json() == {"name": "test", "released_version": None}


async def test_each_version_names_its_own_source(serve_with_admin: ServeWithAdmin) -> None:
    """The configured model carries model_source, digest and facts; a loaded one its own URI."""
    digest = "sha256:" + "c0" * 32
    flags = {"model_source": "oci://registry/models/enc:v1", "model_digest": digest}
    async with serve_with_admin(**flags, model_metadata="commit=3f2a9c1") as (client, ctl, _):
        other = SYNTH + "&dim=4"
        await ctl.post(
            "/v2/repository/models/test/load", json={"parameters": {"version": "v2", "uri": other}}
        )
        first = (await client.get("/v2/models/test/versions/v1")).json()
        second = (await client.get("/v2/models/test")).json()
    assert first["parameters"]["source"] == {
        "uri": "oci://registry/models/enc:v1",
        "digest": digest,
        "metadata": {"commit": "3f2a9c1"},
    }
    assert second["parameters"]["source"] == {"uri": other, "digest": None, "metadata": {}}
