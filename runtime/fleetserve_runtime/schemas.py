"""Wire models of the Open Inference Protocol (KServe v2 / Triton) and the KServe v1 API.

Only shapes live here; `api` validates bodies against them and turns tensors into instances
with `tensor_instances`, the one place that knows how OIP lays tensors out.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetserve_runtime.errors import InvalidInput, PayloadTooLarge

__all__ = [
    "InferenceRequest",
    "LoadRequest",
    "RequestInput",
    "RequestParameters",
    "V1Request",
    "check_instance_count",
    "tensor_instances",
]

Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
]  # fmt: skip


class RequestParameters(BaseModel):
    """Per-request parameters Fleetserve understands; other keys are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    priority: Literal["high", "normal", "low"] | None = None
    timeout_ms: int | None = Field(None, ge=1)
    truncate: bool = False


class RequestInput(BaseModel):
    """One input tensor of an OIP request."""

    name: str = Field(min_length=1)
    shape: list[int] = Field(min_length=1)
    datatype: Datatype
    parameters: dict[str, Any] | None = None
    data: list[Any]


class InferenceRequest(BaseModel):
    """`POST /v2/models/{name}/infer` body."""

    id: str | None = None
    parameters: RequestParameters | None = None
    inputs: list[RequestInput] = Field(min_length=1, max_length=1)
    outputs: list[dict[str, Any]] | None = None


class V1Request(BaseModel):
    """`POST /v1/models/{name}:predict` body."""

    instances: list[Any] = Field(min_length=1)
    parameters: RequestParameters | None = None


class LoadParameters(BaseModel):
    """What to load through the repository API."""

    model_config = ConfigDict(extra="forbid")

    version: str = Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.+-]{0,62}$")
    uri: str | None = None


class LoadRequest(BaseModel):
    """`POST /v2/repository/models/{name}/load` body."""

    parameters: LoadParameters


def _flatten(data: list[Any], depth: int) -> list[Any]:
    """Flatten nested lists of at most `depth` levels (the tensor's rank), without recursion."""
    flat = data
    for _ in range(depth):
        if not any(isinstance(value, list) for value in flat):
            return flat
        flat = [leaf for value in flat for leaf in (value if isinstance(value, list) else [value])]
    if any(isinstance(value, list) for value in flat):
        msg = f"input data is nested deeper than its shape's {depth} dimensions"
        raise InvalidInput(msg)
    return flat


def check_instance_count(count: int, limit: int) -> None:
    """Raise `PayloadTooLarge` when a request carries more than `limit` instances."""
    if count > limit:
        msg = f"request has {count} instances, the limit is {limit}"
        raise PayloadTooLarge(msg)


def tensor_instances(
    tensor: RequestInput, *, expected_name: str, expected_datatype: str, max_instances: int
) -> list[object]:
    """Split an input tensor into per-instance values along its first dimension.

    BYTES tensors give one string per element of the first dimension; numeric tensors give
    one flat row per instance. Raises `InvalidInput` for a name, datatype or shape mismatch
    and `PayloadTooLarge` for too many instances.
    """
    if tensor.name != expected_name:
        msg = f"input name must be {expected_name!r}, got {tensor.name!r}"
        raise InvalidInput(msg)
    if tensor.datatype != expected_datatype:
        msg = f"input {tensor.name!r} must have datatype {expected_datatype}, got {tensor.datatype}"
        raise InvalidInput(msg)
    if any(dim < 0 for dim in tensor.shape):
        msg = f"input shape must not have negative dimensions, got {tensor.shape}"
        raise InvalidInput(msg)
    flat = _flatten(tensor.data, len(tensor.shape))
    count = tensor.shape[0]
    if math.prod(tensor.shape) != len(flat):
        msg = f"input shape {tensor.shape} needs {math.prod(tensor.shape)} values, got {len(flat)}"
        raise InvalidInput(msg)
    if count == 0:
        msg = "input has no instances"
        raise InvalidInput(msg)
    check_instance_count(count, max_instances)
    if expected_datatype == "BYTES":
        if math.prod(tensor.shape[1:]) != 1:
            msg = f"BYTES input must have one string per instance, got shape {tensor.shape}"
            raise InvalidInput(msg)
        return list(flat)
    width = len(flat) // count
    return [flat[i * width : (i + 1) * width] for i in range(count)]
