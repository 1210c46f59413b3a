"""llama.cpp's ``llama-server``, the CPU peer of ``bench.generate_bench``, from a pinned sdist."""
