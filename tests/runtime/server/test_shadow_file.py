"""The shadow target from a file the serving pod re-reads: how a stage starts and stops."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx2
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from fleetserve_runtime.core.config_sections import ShadowConfig
from fleetserve_runtime.core.metrics import ShadowMetrics
from fleetserve_runtime.core.shadow_target import ShadowTarget, read_target
from fleetserve_runtime.server.shadow import Copy, Kind, Shadow

TARGET = {"url": "http://m-canary.ns.svc:8080", "fraction": 1.0, "version_label": "2"}


def _following(path: Path, seen: list[str]) -> Shadow:
    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(str(request.url))
        return httpx2.Response(200)

    config = ShadowConfig(file=path, poll_s=0.1)
    shadow = Shadow(config, draw=lambda: 0.0, transport=httpx2.MockTransport(handler))
    shadow.start(ShadowMetrics(CollectorRegistry(), model="m", track="stable"), lambda: "1")
    return shadow


def test_file_and_target_settings_are_refused_together(tmp_path: Path) -> None:
    path = tmp_path / "target.json"
    for given in ({"url": TARGET["url"]}, {"fraction": 0.5}, {"version_label": "2"}):
        with pytest.raises(ValidationError, match=f"shadow.{next(iter(given))} cannot be set"):
            ShadowConfig(file=path, **given)
    with pytest.raises(ValidationError, match="shadow.poll_s only applies with shadow.file"):
        ShadowConfig(url=TARGET["url"], poll_s=1)
    assert ShadowConfig(file=path).enabled
    assert ShadowConfig(file=path).fixed_target() is None
    assert not ShadowConfig().enabled


def test_an_absent_or_blank_file_is_no_target_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "target.json"
    assert read_target(path) is None
    path.write_text(" \n")
    assert read_target(path) is None
    path.write_text(json.dumps(TARGET))
    assert read_target(path) == ShadowTarget(**TARGET)  # type: ignore[arg-type]
    for bad in ('{"url": "ftp://x"}', '{"url": "http://a", "weight": 1}', "not json"):
        path.write_text(bad)
        with pytest.raises(ValueError, match=str(path)):
            read_target(path)


def test_the_mirror_follows_the_file_without_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Written: copies start to the file's URL; emptied: they stop; bad: off, logged once."""
    path = tmp_path / "target.json"

    async def run() -> None:
        seen: list[str] = []
        shadow = _following(path, seen)
        assert shadow.sampled("POST", "/v1/embeddings") is None  # no file yet: off
        path.write_text(json.dumps(TARGET))
        await asyncio.sleep(0.35)
        drawn = shadow.sampled("POST", "/v1/embeddings")
        assert drawn is not None
        assert drawn[0] is Kind.EMBEDDINGS
        assert drawn[1].url == TARGET["url"]
        assert drawn[1].version_label == "2"
        path.write_text("")
        await asyncio.sleep(0.35)
        assert shadow.sampled("POST", "/v1/embeddings") is None
        path.write_text('{"url": "nowhere"}')
        with caplog.at_level(logging.ERROR):
            await asyncio.sleep(0.45)
        assert shadow.sampled("POST", "/v1/embeddings") is None
        refusals = [r for r in caplog.records if "shadow off" in r.getMessage()]
        assert len(refusals) == 1, refusals
        await shadow.close()

    asyncio.run(run())


def test_a_copy_goes_where_it_was_drawn_even_if_the_target_moved(tmp_path: Path) -> None:
    path = tmp_path / "target.json"
    path.write_text(json.dumps(TARGET))

    async def run() -> None:
        seen: list[str] = []
        shadow = _following(path, seen)
        drawn = shadow.sampled("POST", "/v1/embeddings")
        assert drawn is not None
        path.write_text(json.dumps(TARGET | {"url": "http://other.ns.svc:8080"}))
        shadow.reload()
        copy = Copy(kind=drawn[0], target=drawn[1], path="/v1/embeddings", headers={}, status=200)
        shadow.offer(copy)
        while shadow.in_flight:
            await asyncio.sleep(0.01)
        assert seen == [f"{TARGET['url']}/v1/embeddings"]
        await shadow.close()

    asyncio.run(run())
