"""Side-by-side benchmarks for Fleetserve (issue 2, "Benchmark (bench/)").

Run from the repository root, e.g. ``.venv/bin/python -m bench.runtime_bench``.
"""
