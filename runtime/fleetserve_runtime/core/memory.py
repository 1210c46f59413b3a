"""Memory budget accounting and the reusable input-buffer pool.

At warmup the executor measures what a batch costs (`measure_bytes`) at a few shapes;
`MemoryProfile` fits fixed overhead and bytes per padded token to those measurements, and
`max_batch_tokens` turns a per-replica budget into the largest safe batch. On CPU the
measurement reads the allocator events of `torch.profiler` (real allocations, not an
estimate); on CUDA it reads the caching allocator's peak. A handler whose batches allocate
outside torch (ONNX Runtime's arena) measures them itself (`MeasuresMemory`), typically with
`resident_peak_bytes`: the growth of the process's resident memory across the batch.

`BufferPool` keeps input buffers in power-of-two size classes. A batch leases buffers through
a `BufferLease`; they go back to the pool only when the lease is released, after the batch's
results were delivered, so a buffer is never reused while a batch may still read it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

# The profiler that measures CPU allocations logs through kineto, which is chatty on stderr.
os.environ.setdefault("KINETO_LOG_LEVEL", "99")

__all__ = [
    "BufferLease",
    "BufferPool",
    "MeasuresMemory",
    "MemoryProfile",
    "measure_bytes",
    "model_bytes",
    "resident_peak_bytes",
]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_RESET_PEAK = "5"
"""Written to `clear_refs`, resets the high-water mark VmHWM to the current VmRSS (Linux)."""
_COUNTER_BATCH_PAGES = 64
"""Most pages a thread's (or CPU's) share of the kernel's RSS counter may lag behind."""


def model_bytes(module: torch.nn.Module) -> int:
    """Bytes held by a module's parameters and buffers."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def measure_bytes(run: Callable[[], object], device: torch.device) -> tuple[int, int]:
    """Run `run()` and return (peak bytes above the start, bytes still allocated at the end)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        return max(0, peak), max(0, torch.cuda.memory_allocated(device) - base)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        run()
    # Each op event carries the net bytes it allocated itself; summed in start order they
    # give the live-bytes timeline of the CPU allocator.
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        if event.self_cpu_memory_usage:
            live += event.self_cpu_memory_usage
            peak = max(peak, live)
    return peak, max(0, live)


@runtime_checkable
class MeasuresMemory(Protocol):
    """A handler whose batches allocate where torch's measurement cannot see (ONNX Runtime).

    The executor's calibration asks it, rather than `measure_bytes`, what a batch costs.
    """

    def batch_peak_bytes(self, run: Callable[[], object]) -> int:
        """Peak bytes `run()` (one batch) allocates above what was allocated before it."""


def resident_peak_bytes(run: Callable[[], object]) -> int:
    """Peak growth of this process's resident memory while `run()` runs (Linux), in bytes.

    Conservative by construction: free heap pages are handed back to the system first
    (glibc's `malloc_trim`), so what `run` allocates is faulted in afresh and shows as growth
    instead of reusing pages already resident; memory other threads touch meanwhile counts
    too. VmHWM is reset to VmRSS through `/proc/self/clear_refs`; where that is refused, the
    process's lifetime high-water mark is used, which can only over-estimate. The kernel
    counts resident pages lazily, in batches of up to 64 pages per thread (or per CPU), so
    that much per thread or CPU, whichever are more, is added.

    Raises:
        OSError: `/proc/self/status` cannot be read (not Linux).
    """
    _trim_heap()
    # Where the reset is refused, the lifetime peak stands in: larger, never smaller.
    with contextlib.suppress(OSError):
        _CLEAR_REFS.write_text(_RESET_PEAK)
    start = _status_bytes("VmRSS")
    run()
    growth = max(0, _status_bytes("VmHWM") - start)
    counters = max(_status_count("Threads"), os.cpu_count() or 1)
    return growth + counters * _COUNTER_BATCH_PAGES * os.sysconf("SC_PAGE_SIZE")


def _status_bytes(field: str) -> int:
    return _status_count(field) * 1024  # the kernel reports kB


def _status_count(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    msg = f"{_STATUS} has no {field}"
    raise OSError(msg)


def _trim_heap() -> None:
    # Without glibc (no malloc_trim) freed heap pages may stay resident and be reused.
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).malloc_trim(0)


@dataclass(frozen=True, slots=True)
class MemoryProfile:
    """Measured memory cost of the loaded model: weights, fixed overhead, bytes per token."""

    weights_bytes: int
    fixed_bytes: int
    bytes_per_token: float

    @classmethod
    def fit(cls, weights_bytes: int, samples: list[tuple[int, int]]) -> MemoryProfile:
        """Fit from `(padded_tokens, peak_bytes)` samples.

        The fixed part is the smallest sample's cost; the per-token cost is the largest
        slope seen from it, so the fit is an upper bound at every measured shape (attention
        grows faster than linearly in length, and the budget must hold for long rows).
        """
        ordered = sorted(samples)
        base_tokens, base_bytes = ordered[0]
        slopes = [
            (peak - base_bytes) / (tokens - base_tokens)
            for tokens, peak in ordered[1:]
            if tokens > base_tokens
        ]
        per_token = max([*slopes, base_bytes / max(base_tokens, 1)])
        fixed = max(0, int(base_bytes - per_token * base_tokens))
        return cls(weights_bytes=weights_bytes, fixed_bytes=fixed, bytes_per_token=per_token)

    def batch_bytes(self, padded_tokens: int) -> int:
        """Predicted activation bytes of a batch of `padded_tokens`."""
        return int(self.fixed_bytes + self.bytes_per_token * padded_tokens)

    def max_batch_tokens(self, budget_bytes: int, reserve_fraction: float) -> int:
        """Largest padded-token count whose batch fits the budget; 0 when nothing fits."""
        usable = budget_bytes * (1 - reserve_fraction) - self.weights_bytes - self.fixed_bytes
        if usable <= 0 or self.bytes_per_token <= 0:
            return 0
        return int(usable // self.bytes_per_token)


@dataclass(slots=True)
class PoolStats:
    """Counters the metrics module reads."""

    hits: int = 0
    misses: int = 0
    pooled_bytes: int = 0
    leased_bytes: int = 0


class BufferPool:
    """Power-of-two size classes of flat byte buffers, shared by all batches; thread-safe."""

    MIN_CLASS = 256

    def __init__(self, *, max_bytes: int, pin: bool = False) -> None:
        self._max_bytes = max_bytes
        self._pin = pin
        self._free: dict[int, list[torch.Tensor]] = defaultdict(list)
        self._lock = threading.Lock()
        self.stats = PoolStats()

    @staticmethod
    def size_class(nbytes: int) -> int:
        """Smallest power of two ≥ `nbytes` (at least `MIN_CLASS`)."""
        return max(BufferPool.MIN_CLASS, 1 << (max(nbytes, 1) - 1).bit_length())

    def lease(self) -> BufferLease:
        """A lease that collects the buffers of one batch."""
        return BufferLease(self)

    def _acquire(self, nbytes: int) -> torch.Tensor:
        size = self.size_class(nbytes)
        with self._lock:
            free = self._free[size]
            if free:
                self.stats.hits += 1
                self.stats.pooled_bytes -= size
                self.stats.leased_bytes += size
                return free.pop()
            self.stats.misses += 1
            self.stats.leased_bytes += size
        return torch.empty(size, dtype=torch.uint8, pin_memory=self._pin)

    def _release(self, buffers: list[torch.Tensor]) -> None:
        with self._lock:
            for buf in buffers:
                size = buf.numel()
                self.stats.leased_bytes -= size
                if self.stats.pooled_bytes + size <= self._max_bytes:
                    self._free[size].append(buf)
                    self.stats.pooled_bytes += size


class BufferLease:
    """The buffers of one batch; implements the handler's `TensorAllocator`."""

    def __init__(self, pool: BufferPool) -> None:
        self._pool = pool
        self._buffers: list[torch.Tensor] = []
        self._released = False

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor backed by a pooled buffer, valid until `release`."""
        if self._released:
            msg = "lease already released"
            raise RuntimeError(msg)
        numel = 1
        for dim in shape:
            numel *= dim
        itemsize = dtype.itemsize
        buf = self._pool._acquire(numel * itemsize)  # lease and pool are one unit
        self._buffers.append(buf)
        return buf[: numel * itemsize].view(dtype).view(shape)

    def release(self) -> None:
        """Return every buffer to the pool; call once the batch is completely done."""
        if not self._released:
            self._released = True
            self._pool._release(self._buffers)
            self._buffers = []
