"""The real server processes the HTTP hardening tests attack, one of each per test module.

`plain` serves defaults with short HTTP timeouts and JSON debug logs to a file; `secured`
adds bearer auth and model control (`fleetserve_runtime.testing.process`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetserve_runtime.testing.process import Secured, Server, plain_server, secured_server


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """The `plain_server`, and the file its log goes to."""
    log = tmp_path_factory.mktemp("plain") / "stderr.log"
    with plain_server(log) as running:
        yield running, log


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """The `secured_server`."""
    with secured_server(tmp_path_factory.mktemp("secured")) as running:
        yield running
