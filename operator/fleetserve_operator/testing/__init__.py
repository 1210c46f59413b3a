"""Test helpers, public like `kopf.testing`: a fake cluster, fake metrics, spec factories.

- `fakes`: `FakeKube` (an in-memory API server that records every write), the metric
  sources, `FakeClock`, `serve_http` and its `QuietHandler`, the spec factories and
  `RollingOut` (a rollout driven through `Sync`); re-exported here.
- `rollout`: `World`, the rollout state machine stepped with the children rendered from
  every status it returns, as `sync` renders them.

Nothing here imports torch or the runtime: the operator's tests run without either.
"""

from __future__ import annotations

from fleetserve_operator.testing.fakes import (
    FakeClock,
    FakeKube,
    FakeMetricSource,
    QuietHandler,
    RollingOut,
    ScriptedMetricSource,
    make_service,
    make_spec,
    serve_http,
)

__all__ = [
    "FakeClock",
    "FakeKube",
    "FakeMetricSource",
    "QuietHandler",
    "RollingOut",
    "ScriptedMetricSource",
    "make_service",
    "make_spec",
    "serve_http",
]
