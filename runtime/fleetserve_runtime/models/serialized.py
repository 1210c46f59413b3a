"""A generic handler for a serialized PyTorch module: numeric rows in, tensors out.

`file:///models/net.pt2?input_width=N` loads a `torch.export` program (the format PyTorch now
recommends); `file:///models/net.pt?input_width=N` loads TorchScript, which PyTorch deprecates
but many teams still ship. Each instance is a flat list of `input_width` numbers; a batch is
the stacked rows, and each output row is one item's result.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fleetserve_runtime.core.errors import InvalidInput
from fleetserve_runtime.models.base import (
    CollateContext,
    ItemResult,
    ModelMetadata,
    PreparedInput,
    TensorSpec,
)

__all__ = ["SerializedModuleHandler"]


class SerializedModuleHandler:
    """Runs an exported or scripted module on stacked FP32 rows of a fixed width."""

    def __init__(self, name: str, version: str, *, path: Path, input_width: int) -> None:
        self._path = path
        self._width = input_width
        self._module: torch.nn.Module | None = None
        self._device = torch.device("cpu")
        self._metadata = ModelMetadata(
            name=name,
            version=version,
            platform="pytorch_export" if path.suffix == ".pt2" else "pytorch_torchscript",
            inputs=(TensorSpec("input", "FP32", (-1, input_width)),),
            outputs=(TensorSpec("output", "FP32", (-1, -1)),),
            max_sequence_length=1,
        )

    @property
    def metadata(self) -> ModelMetadata:
        """Name, version, shapes and limits."""
        return self._metadata

    def load(self, device: torch.device) -> None:
        """Load the module onto `device`."""
        module: torch.nn.Module
        if self._path.suffix == ".pt2":
            module = torch.export.load(str(self._path)).module().to(device)
        else:
            with warnings.catch_warnings():
                # TorchScript still loads; its deprecation notice is for authors, not servers.
                warnings.simplefilter("ignore", FutureWarning)
                module = torch.jit.load(str(self._path), map_location=device)  # type: ignore[no-untyped-call]
            module.eval()
        self._module = module
        self._device = device

    def preprocess(self, instance: object, *, truncate: bool) -> PreparedInput:
        """Check the instance is a list of `input_width` numbers."""
        if not isinstance(instance, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in instance
        ):
            msg = f"instance must be a list of {self._width} numbers"
            raise InvalidInput(msg)
        if len(instance) != self._width:
            msg = f"instance has {len(instance)} values, the model takes {self._width}"
            raise InvalidInput(msg)
        return PreparedInput(length=1, data=instance)

    def sample_instance(self, length: int) -> object:
        """A row of zeros."""
        return [0.0] * self._width

    def collate(self, items: Sequence[PreparedInput], ctx: CollateContext) -> Any:
        """Stack rows into one [n, width] tensor."""
        rows = ctx.alloc.empty((len(items), self._width), torch.float32)
        rows.copy_(torch.tensor([item.data for item in items], dtype=torch.float32))
        return rows.to(ctx.device, non_blocking=True)

    def forward(self, batch: Any) -> Any:
        """Call the module."""
        if self._module is None:
            msg = "model not loaded"
            raise RuntimeError(msg)
        with torch.inference_mode():
            return self._module(batch)

    def postprocess(self, output: Any, count: int) -> list[ItemResult]:
        """One output row per item."""
        rows: np.ndarray = output.detach().float().cpu().numpy()
        return [rows[i] for i in range(count)]
