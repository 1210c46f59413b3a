"""Reference results kept on disk across test runs, keyed by everything they are computed from.

Some references are slow to compute and a pure function of their inputs: transformers' greedy
tokens for fixed weights and prompts, transformers' dequantised GGUF tensors for one file. A
test computes such a result once, stores it as JSON under `~/.cache/fleetserve/test-references/`
(or `$FLEETSERVE_TEST_REFERENCES`; CI keeps `~/.cache/fleetserve` between runs) and reads it on
later runs, keyed by the sha256 of its inputs (a file's or a state dict's bytes, the prompts,
the recipe's own source) and of the versions of the packages that compute it.

Equally strict: the stored value is what the computation returned for exactly those inputs, so
comparing against it is comparing against a fresh computation; any change to an input, to the
code that computes the reference or to a package version gives another key, and the reference
is computed again. The stored key is compared too, so a corrupted or colliding entry is
recomputed rather than trusted. Only our side of each comparison runs every time, which is the
side under test.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

REFERENCE_PACKAGES = ("transformers", "torch", "gguf", "numpy")
"""The packages whose versions every key carries: what computes the references."""


def references_dir() -> Path:
    """Where references are kept: `$FLEETSERVE_TEST_REFERENCES`, else under ~/.cache/fleetserve."""
    override = os.environ.get("FLEETSERVE_TEST_REFERENCES")
    if override:
        return Path(override)
    return Path.home() / ".cache" / "fleetserve" / "test-references"


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tensor_sha256(tensor: torch.Tensor) -> str:
    """The sha256 of a tensor's dtype, shape and values, with -0.0 read as 0.0 like `torch.equal`.

    Adding 0.0 turns -0.0 into 0.0 and leaves every other value's bits as they are, so two
    finite tensors hash alike exactly when `torch.equal` holds (NaN, never equal there, is for
    the caller to refuse).
    """
    values = tensor.detach().cpu()
    if values.is_floating_point():
        values = values + 0.0
    digest = hashlib.sha256(f"{values.dtype} {tuple(values.shape)}".encode())
    digest.update(values.contiguous().view(torch.uint8).numpy().data)
    return digest.hexdigest()


def state_dict_sha256(weights: Mapping[str, torch.Tensor]) -> str:
    """The sha256 of every tensor (name, dtype, shape, values) in name order."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(f"{name} {tensor_sha256(weights[name])}\n".encode())
    return digest.hexdigest()


def cached_reference(name: str, inputs: Mapping[str, Any], compute: Callable[[], Any]) -> Any:
    """`compute()`'s JSON value for `inputs`, read from disk if stored, else computed and stored.

    `inputs` must name everything the value depends on besides `REFERENCE_PACKAGES`' versions.
    The file is written atomically (a temporary file renamed over), so a run stopped midway or
    running beside another leaves no half-written reference.
    """
    versions = {package: importlib.metadata.version(package) for package in REFERENCE_PACKAGES}
    key = json.loads(json.dumps({"inputs": inputs, "versions": versions}, sort_keys=True))
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    directory = references_dir()
    path = directory / f"{name}-{digest}.json"
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        stored = None
    if isinstance(stored, dict) and stored.get("key") == key and "value" in stored:
        return stored["value"]
    value = json.loads(json.dumps(compute()))
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=directory, suffix=".tmp", delete=False) as handle:
        json.dump({"key": key, "value": value}, handle)
    os.replace(handle.name, path)
    return value
