"""Public test helpers (like `kopf.testing`): fakes, factories, a reading of `/metrics`.

A fake clock; config, infer-request and queue-item factories; `metric_total`, the message of
an error answer (`error_message`), and a wait for a state to be reached (`until`).

Tests import these instead of sharing conftest fixtures, so they work under pytest's
importlib import mode and in other projects' tests of custom handlers. `asgi` serves a
runtime in process and `process` runs it as one; both need the test dependencies, so this
module imports neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fleetserve_runtime.core.config import RuntimeConfig
from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.encoder.request_queue import PendingItem

__all__ = [
    "SYNTHETIC_MODEL",
    "FakeClock",
    "error_message",
    "exploding_handler",
    "infer_request",
    "make_config",
    "make_items",
    "metric_total",
    "until",
]

SYNTHETIC_MODEL = "builtin://synthetic?latency_ms=0&per_item_ms=0"
"""The synthetic encoder at zero cost: `make_config`'s model unless told otherwise."""


class FakeClock:
    """A monotonic clock that moves only when told to; call it like `time.monotonic`."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        """The current fake time, in seconds."""
        return self.now

    def advance(self, seconds: float) -> float:
        """Move forward by `seconds`; returns the new time."""
        self.now += seconds
        return self.now


def make_config(**sections: Any) -> RuntimeConfig:
    """A `RuntimeConfig` for tests: synthetic model, CPU, no warmup, plus `sections` overrides.

    Section overrides are dicts, e.g. `make_config(batching={"max_batch_size": 4})`.
    """
    base: dict[str, Any] = {
        "model": SYNTHETIC_MODEL,
        "name": "test",
        "version": "v1",
        "device": "cpu",
        "warmup": False,
        "log_format": "text",
    }
    base.update(sections)
    return RuntimeConfig(**base)


def infer_request(texts: Sequence[object], **parameters: Any) -> dict[str, Any]:
    """An OIP v2 infer body: `texts` as the one BYTES input, `parameters` if any."""
    body: dict[str, Any] = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]
    }
    if parameters:
        body["parameters"] = parameters
    return body


def metric_total(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples in `text` (a `/metrics` page) whose labels include `labels`."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def error_message(body: Any) -> str:
    """The message of an error answer's JSON `body`: the runtime's shape or OpenAI's.

    The runtime answers `{"error": message}`; the OpenAI routes `{"error": {"message": ...}}`.
    """
    error = body["error"]
    return str(error if isinstance(error, str) else error["message"])


async def until(condition: Callable[[], bool]) -> None:
    """Wait (up to 10 s) until `condition` holds; a state to reach, not a speed to meet."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    msg = "the expected state was not reached within 10 s"
    raise AssertionError(msg)


def make_items(
    lengths: Sequence[int],
    *,
    now: float,
    priority: Priority = Priority.NORMAL,
    timeout_s: float = 5.0,
    group: Hashable = "v1",
    bucket_of: Any = None,
) -> list[PendingItem[Hashable]]:
    """Queue items of the given lengths, enqueued at `now`; `bucket_of` maps length → bucket."""
    return [
        PendingItem(
            length=length,
            priority=priority,
            enqueued_at=now,
            deadline=now + timeout_s,
            group=group,
            payload=None,
            ticket=None,
            bucket=bucket_of(length) if bucket_of is not None else 0,
        )
        for length in lengths
    ]


def exploding_handler(name: str, version: str, max_sequence_length: int) -> Any:
    """`module:factory` entry point: a synthetic model whose forward raises for "boom" inputs.

    Used to prove that one failing batch fails only its own requests.
    """
    from fleetserve_runtime.models.synthetic import SyntheticHandler, SyntheticParams, text_digest

    boom = text_digest("boom")

    class Exploding(SyntheticHandler):
        def forward(self, batch: Any) -> Any:
            seeds, _ = batch
            if bool(seeds.eq(boom).any()):
                msg = "model exploded"
                raise RuntimeError(msg)
            return super().forward(batch)

    params = SyntheticParams(latency_ms=0, per_item_ms=0)
    return Exploding(name, version, max_sequence_length=max_sequence_length, params=params)
