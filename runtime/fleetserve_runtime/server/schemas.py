"""Wire models of the Open Inference Protocol (KServe v2 / Triton) and the KServe v1 API.

Shapes live here, and the decoding of bodies into them: `decode_body` (UTF-8, JSON, schema),
`tensor_instances`, the one place that knows how OIP lays tensors out, and `check_instances`
for v1. Decoding costs time linear in the body: shape rank, element count and nesting are
checked against `TensorLimits` before any list is built from the data, so a small body that
declares a huge tensor is refused at once instead of costing seconds of CPU.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleetserve_runtime.core.errors import InvalidInput, PayloadTooLarge

__all__ = [
    "Datatype",
    "InferenceRequest",
    "LoadRequest",
    "RequestInput",
    "RequestParameters",
    "TensorLimits",
    "V1Request",
    "check_instances",
    "check_shape",
    "decode_body",
    "parse_json",
    "tensor_instances",
    "validate_body",
]

Body = TypeVar("Body", bound=BaseModel)

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


@dataclass(frozen=True, slots=True)
class TensorLimits:
    """What one request may declare; see the config fields of the same names."""

    max_rank: int
    """Most dimensions of a tensor shape; v1 data may nest as deep."""
    max_elements: int
    """Most values in one request."""
    max_instances: int
    """Most instances (first dimension) in one request."""


_UNION_MEMBER = re.compile(r"^(str|int|float|bool|list|dict|none)$|[\[(-]")
"""pydantic names the member of a union it tried in an error's location (`str`,
`list[int]`, `function-after[...]`); these are not field names."""


def _field(exc: ValidationError) -> str | None:
    """The dotted path of the field the first error is about (None for the whole body)."""
    loc = [str(part) for part in exc.errors()[0]["loc"]]
    return ".".join(part for part in loc if not _UNION_MEMBER.search(part)) or None


def _describe(exc: ValidationError) -> str:
    return f"{_field(exc) or 'body'}: {exc.errors()[0]['msg']}"


def decode_body(raw: bytes, model: type[Body]) -> Body:
    """Parse a JSON body strictly (UTF-8, JSON, then `model`); `InvalidInput` says what is wrong."""
    return validate_body(parse_json(raw), model)


def parse_json(raw: bytes) -> Any:
    """A body's JSON value (UTF-8, JSON); `InvalidInput` says what is wrong."""
    if not raw:
        msg = "request body is empty"
        raise InvalidInput(msg)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"request body is not valid UTF-8 (byte {exc.start})"
        raise InvalidInput(msg) from None
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        msg = f"request body is not valid JSON: {exc}"
        raise InvalidInput(msg) from None
    return data


def validate_body(data: Any, model: type[Body]) -> Body:
    """Check parsed JSON against `model`; `InvalidInput` names the first field that is wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(_describe(exc), param=_field(exc)) from None


def check_shape(shape: Sequence[int], limits: TensorLimits) -> int:
    """The number of values `shape` declares, after checking it against `limits`.

    Runs in time linear in the rank, which is checked first: the product is never computed
    beyond `max_elements`, so a shape of huge dimensions costs no big-number arithmetic.
    """
    if len(shape) > limits.max_rank:
        msg = (
            f"input shape has {len(shape)} dimensions, the limit is {limits.max_rank} "
            "(max_tensor_rank)"
        )
        raise InvalidInput(msg)
    if any(dim < 0 for dim in shape):
        msg = f"input shape must not have negative dimensions, got {list(shape)}"
        raise InvalidInput(msg)
    if 0 in shape:
        return 0
    elements = 1
    for dim in shape:
        elements *= dim
        if elements > limits.max_elements:
            msg = (
                f"input shape {list(shape)} declares more than {limits.max_elements} values "
                "(max_tensor_elements)"
            )
            raise PayloadTooLarge(msg)
    return elements


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


def _check_instance_count(count: int, limit: int) -> None:
    if count > limit:
        msg = f"request has {count} instances, the limit is {limit}"
        raise PayloadTooLarge(msg)


def check_instances(instances: list[Any], limits: TensorLimits) -> None:
    """Check v1 `instances` against `limits`: count, nesting depth and number of values.

    Walks the data once without recursion, so its cost is linear in the body; the
    instances list itself is the first of at most `max_rank` levels, as for a tensor.
    """
    _check_instance_count(len(instances), limits.max_instances)
    values = 0
    pending: list[tuple[Any, int]] = [(instances, 1)]
    while pending:
        node, depth = pending.pop()
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, list | dict):
                if depth >= limits.max_rank:
                    msg = f"instances nest deeper than {limits.max_rank} levels (max_tensor_rank)"
                    raise InvalidInput(msg)
                pending.append((child, depth + 1))
            else:
                values += 1
        if values > limits.max_elements:
            msg = f"request has more than {limits.max_elements} values (max_tensor_elements)"
            raise PayloadTooLarge(msg)


def tensor_instances(
    tensor: RequestInput, *, expected_name: str, expected_datatype: str, limits: TensorLimits
) -> list[object]:
    """Split an input tensor into per-instance values along its first dimension.

    BYTES tensors give one string per element of the first dimension; numeric tensors give
    one flat row per instance. Raises `InvalidInput` for a name, datatype or shape mismatch
    and `PayloadTooLarge` for too many instances or values. The shape is checked before
    the data is touched.
    """
    if tensor.name != expected_name:
        msg = f"input name must be {expected_name!r}, got {tensor.name!r}"
        raise InvalidInput(msg)
    if tensor.datatype != expected_datatype:
        msg = f"input {tensor.name!r} must have datatype {expected_datatype}, got {tensor.datatype}"
        raise InvalidInput(msg)
    elements = check_shape(tensor.shape, limits)
    count = tensor.shape[0]
    if count == 0:
        msg = "input has no instances"
        raise InvalidInput(msg)
    _check_instance_count(count, limits.max_instances)
    if expected_datatype == "BYTES" and elements != count:
        msg = f"BYTES input must have one string per instance, got shape {tensor.shape}"
        raise InvalidInput(msg)
    flat = _flatten(tensor.data, len(tensor.shape))
    if elements != len(flat):
        msg = f"input shape {tensor.shape} needs {elements} values, got {len(flat)}"
        raise InvalidInput(msg)
    if expected_datatype == "BYTES":
        return list(flat)
    width = len(flat) // count
    return [flat[i * width : (i + 1) * width] for i in range(count)]
