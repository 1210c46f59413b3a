"""FastAPI's native OpenTelemetry: off unless `--opentelemetry` asks for it.

Each case runs in a fresh interpreter, since OpenTelemetry's global tracer provider can be
set only once per process: the script installs a provider that records span names, builds
the runtime's app and sends it one request.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import asyncio, contextlib, sys

import httpx
from opentelemetry import trace

from fleetserve_runtime.server.app import create_app
from fleetserve_runtime.cli import parse_config

spans = []


class Tracer(trace.Tracer):
    def start_span(self, name, *args, **kwargs):
        spans.append(name)
        return trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)

    @contextlib.contextmanager
    def start_as_current_span(self, name, *args, **kwargs):
        with trace.use_span(self.start_span(name)) as span:
            yield span


class Provider(trace.TracerProvider):
    def get_tracer(self, *args, **kwargs):
        return Tracer()


trace.set_tracer_provider(Provider())


async def main():
    app = create_app(parse_config(sys.argv[1:]))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://runtime") as client:
        assert (await client.get("/v2/health/live")).status_code == 200
    print(len(spans))


asyncio.run(main())
"""


@pytest.mark.parametrize(("flags", "traced"), [((), False), (("--opentelemetry",), True)])
def test_fastapi_spans_only_with_the_flag(flags: tuple[str, ...], traced: bool) -> None:
    """With a tracer provider configured, requests make spans only under --opentelemetry."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "--model", "builtin://synthetic", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    spans = int(done.stdout.split()[-1])
    assert (spans > 0) is traced, spans
