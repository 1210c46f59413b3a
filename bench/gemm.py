"""Peak fp32 GEMM throughput of one core: the denominator of the benchmark's ``mfu``.

``bench.runtime_bench`` calls ``measure_peak_flops``, which runs this module as a child process
pinned to the server's core with one torch thread, so the peak is measured exactly where and
how the server computes ("peak GEMM FLOP/s measured in the same run on the server's
cores").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.pinning import pinned_command, single_thread_env


def best_gemm_flops(*, size: int, repeats: int) -> float:
    """Return the best FLOP/s of ``repeats`` timed ``size``³ fp32 matrix products.

    Best-of-N rather than the mean: the peak is what the hardware can do, and any slower
    run was disturbed by something else.
    """
    import torch  # Imported here: only the pinned child process needs torch.

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    out = torch.empty(size, size)
    torch.mm(a, b, out=out)  # Warm-up: first call picks kernels and faults pages in.
    best_s = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        best_s = min(best_s, time.perf_counter() - start)
    return 2.0 * size**3 / best_s


def measure_peak_flops(*, core: int, size: int = 1024, repeats: int = 50) -> float:
    """Measure peak fp32 GEMM FLOP/s on ``core`` in a pinned, single-threaded child.

    Args:
        core: CPU core to measure (the server's).
        size: Matrix side; 1024 is large enough to reach the kernel's peak.
        repeats: Timed products; the best one counts.

    Returns:
        FLOP/s of the fastest product.
    """
    argv = [sys.executable, "-m", "bench.gemm", f"--size={size}", f"--repeats={repeats}"]
    completed = subprocess.run(
        pinned_command(argv, core=core),
        env=single_thread_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return float(completed.stdout.strip())


def main() -> None:
    """Print this process's peak GEMM FLOP/s (entry point of the pinned child)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    print(best_gemm_flops(size=args.size, repeats=args.repeats))


if __name__ == "__main__":
    main()
