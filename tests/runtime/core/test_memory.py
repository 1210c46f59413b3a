"""Memory: measured profiles, the derived token limit, and the buffer pool's reuse rules."""

from __future__ import annotations

import torch

from fleetserve_runtime.core.memory import BufferPool, MemoryProfile, measure_bytes


def test_measure_bytes_sees_real_allocations() -> None:
    """The CPU measurement reports the bytes live at once during a real computation."""
    layer = torch.nn.Linear(64, 256)
    x = torch.randn(128, 64)

    def run() -> None:
        with torch.inference_mode():
            layer(x).relu().sum()

    peak, retained = measure_bytes(run, torch.device("cpu"))
    one_output = 128 * 256 * 4
    assert 2 * one_output <= peak < 4 * one_output
    assert retained < one_output


def test_profile_fit_is_an_upper_bound_at_every_sample() -> None:
    """The fitted line lies on or above every measured point."""
    samples = [(8, 1_000), (256, 20_000), (512, 60_000)]
    profile = MemoryProfile.fit(5_000, samples)
    for tokens, peak in samples:
        assert profile.batch_bytes(tokens) >= peak - 1


def test_max_batch_tokens_from_budget() -> None:
    """Budget minus reserve, weights and fixed overhead, divided by bytes per token."""
    profile = MemoryProfile(weights_bytes=1_000, fixed_bytes=1_000, bytes_per_token=10)
    assert profile.max_batch_tokens(12_000, 0.0) == 1_000
    assert profile.max_batch_tokens(12_000, 0.5) == 400
    assert profile.max_batch_tokens(1_500, 0.0) == 0


def test_pool_size_classes_are_powers_of_two() -> None:
    """Requests round up to the next power of two, with a minimum class."""
    assert BufferPool.size_class(1) == BufferPool.MIN_CLASS
    assert BufferPool.size_class(1000) == 1024
    assert BufferPool.size_class(1024) == 1024
    assert BufferPool.size_class(1025) == 2048


def test_buffers_return_only_when_the_lease_is_released() -> None:
    """A buffer leased by a running batch is not handed to another batch."""
    pool = BufferPool(max_bytes=1 << 20)
    first = pool.lease()
    a = first.empty((10, 10), torch.int64)
    second = pool.lease()
    b = second.empty((10, 10), torch.int64)
    assert a.data_ptr() != b.data_ptr()
    assert pool.stats.misses == 2
    first.release()
    third = pool.lease()
    c = third.empty((12, 8), torch.int64)
    assert c.data_ptr() == a.data_ptr()
    assert pool.stats.hits == 1


def test_pool_keeps_at_most_max_bytes() -> None:
    """Released buffers beyond the pool's byte cap are dropped, not hoarded."""
    pool = BufferPool(max_bytes=1024)
    lease = pool.lease()
    lease.empty((256,), torch.float32)
    lease.empty((256,), torch.float32)
    lease.release()
    assert pool.stats.pooled_bytes == 1024
    assert pool.stats.leased_bytes == 0
