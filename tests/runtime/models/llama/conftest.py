"""Fixtures shared by the Llama model's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One thread per test process: the machine's cores are shared with other test runs.

    The numeric bounds these modules check were measured at one thread, and a matmul's
    rounding follows how its work is split between threads.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
