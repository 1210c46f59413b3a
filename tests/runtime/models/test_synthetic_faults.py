"""The synthetic encoder's delayed fault: `error_rate` only from `errors_after_s` after load."""

from __future__ import annotations

import time

import torch

from fleetserve_runtime.models.synthetic import SyntheticHandler, SyntheticParams


def _failed(handler: SyntheticHandler) -> list[bool]:
    _, failed = handler.forward((torch.arange(8, dtype=torch.int64), 8))
    return list(failed)


def test_errors_start_only_after_errors_after_s() -> None:
    """Every item answers until the delay has passed since `load`, then every item fails."""
    params = SyntheticParams(latency_ms=0, per_item_ms=0, error_rate=1.0, errors_after_s=0.3)
    handler = SyntheticHandler("m", "2", params=params)
    handler.load(torch.device("cpu"))
    assert not any(_failed(handler))
    time.sleep(0.35)
    assert all(_failed(handler))


def test_no_delay_fails_from_the_start() -> None:
    """`errors_after_s` unset (0): `error_rate` applies at once, as before."""
    params = SyntheticParams(latency_ms=0, per_item_ms=0, error_rate=1.0)
    handler = SyntheticHandler("m", "2", params=params)
    handler.load(torch.device("cpu"))
    assert all(_failed(handler))
