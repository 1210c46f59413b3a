"""Build llama.cpp's ``llama-server`` once, from llama-cpp-python's hash-pinned sdist, and cache it.

llama-cpp-python's sdist vendors llama.cpp with its server; the Python package's own server
(``llama_cpp.server``) steps one sequence at a time, while the C++ ``llama-server`` runs parallel
slots with continuous batching, which is what a CPU user serving many streams runs. So only
the C++ server is built:

1. a build venv gets the sdist's build backend from ``build-requirements.txt`` (hashes), so
   that pip can read the sdist's metadata without fetching an unpinned backend;
2. that venv's pip downloads the sdist pinned in ``requirements.txt`` (hash checked);
3. cmake builds the ``llama-server`` target of the vendored tree, statically linked, for this
   machine's CPU (``GGML_NATIVE``), with no web UI and no network access at build time;
4. the binary lands in ``~/.cache/fleetserve/bin/llama-server-<version>-<cpu>/``, named by the
   pinned version and a digest of the CPU's feature flags (a native build runs only on CPUs
   that have them).

cmake and a C++ compiler come from Debian (``make llamacpp-tools``). The build runs at low
priority beside whatever else the machine does; it is skipped when the binary is cached.

Usage: ``.venv/bin/python -m bench.llamacpp.build`` prints the binary's path.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
BUILD_REQUIREMENTS = HERE / "build-requirements.txt"
BINARY_NAME = "llama-server"
# The build runs beside tests and benchmarks on a shared machine: it yields the CPU to them.
BUILD_NICENESS = 10

#: cmake options: a static, CPU-only server tuned for this machine, nothing fetched.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
)


def pinned_version() -> str:
    """The llama-cpp-python version ``requirements.txt`` pins.

    Raises:
        RuntimeError: The file pins no version of it.
    """
    match = re.search(r"^llama-cpp-python==(\S+)", REQUIREMENTS.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{REQUIREMENTS} pins no llama-cpp-python version")
    return match.group(1)


def cpu_digest() -> str:
    """Eight hex digits naming this CPU's feature flags (what a native build depends on)."""
    flags = next(
        (
            line
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        ),
        "",
    )
    return hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:8]


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fleetserve`` (default ``~/.cache/fleetserve``), as the e2e tools use."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleetserve"


def binary_path() -> Path:
    """Where the built ``llama-server`` is (or will be) cached."""
    label = f"{BINARY_NAME}-{pinned_version()}-{cpu_digest()}"
    return cache_dir() / "bin" / label / BINARY_NAME


def _run(argv: list[str], *, cwd: Path | None = None) -> None:
    """Run ``argv`` at low priority; fail with its command line if it fails."""
    print("+", " ".join(argv), file=sys.stderr, flush=True)
    subprocess.run(argv, cwd=cwd, check=True, preexec_fn=lambda: os.nice(BUILD_NICENESS))


def _missing_tools() -> list[str]:
    """The build tools (from Debian) that are not on PATH."""
    return [tool for tool in ("cmake", "c++", "make") if shutil.which(tool) is None]


def _download_sdist(work: Path) -> Path:
    """Download the pinned sdist into ``work`` through a build venv; returns the archive."""
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "--require-hashes", "--no-deps", "--only-binary", ":all:",
          "-r", str(BUILD_REQUIREMENTS)])  # fmt: skip
    dist = work / "dist"
    _run([*pip, "download", "--require-hashes", "--no-deps", "--no-binary", ":all:",
          "--no-build-isolation", "-d", str(dist), "-r", str(REQUIREMENTS)])  # fmt: skip
    (archive,) = dist.glob("*.tar.gz")
    return archive


def build(target: Path) -> Path:
    """Build ``llama-server`` and install it at ``target``; returns ``target``.

    Raises:
        RuntimeError: cmake or a C++ compiler is missing (``make llamacpp-tools``).
        subprocess.CalledProcessError: A step of the download or the build failed.
    """
    missing = _missing_tools()
    if missing:
        raise RuntimeError(f"building llama-server needs {missing}: run `make llamacpp-tools`")
    build_root = cache_dir() / "build" / target.parent.name
    shutil.rmtree(build_root, ignore_errors=True)
    build_root.mkdir(parents=True)
    archive = _download_sdist(build_root)
    with tarfile.open(archive) as sdist:
        sdist.extractall(build_root / "src", filter="data")
    (source,) = (build_root / "src").glob("*/vendor/llama.cpp")
    objects = build_root / "cmake"
    _run(["cmake", "-S", str(source), "-B", str(objects), *CMAKE_OPTIONS])
    jobs = str(os.cpu_count() or 1)
    _run(["cmake", "--build", str(objects), "--target", BINARY_NAME, "-j", jobs])
    target.parent.mkdir(parents=True, exist_ok=True)
    # Copied under a temporary name and renamed: the cached binary appears whole or not at all.
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as staging:
        shutil.copyfile(objects / "bin" / BINARY_NAME, staging.name)
    os.chmod(staging.name, 0o755)
    os.replace(staging.name, target)
    shutil.rmtree(build_root, ignore_errors=True)
    return target


def ensure_llama_server() -> Path:
    """The cached ``llama-server``, built first if it is not there yet."""
    target = binary_path()
    return target if target.is_file() else build(target)


if __name__ == "__main__":
    print(ensure_llama_server())
