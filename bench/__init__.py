"""Side-by-side benchmarks for Fleetserve.

Run from the repository root, e.g. ``.venv/bin/python -m bench.runtime_bench``.
"""
