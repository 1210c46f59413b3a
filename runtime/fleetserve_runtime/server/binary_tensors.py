"""The OIP binary tensor data extension: raw little-endian tensors after a JSON header.

A request in the extension carries `Inference-Header-Content-Length: N`: its first N bytes
are the JSON inference request, and each input whose `parameters.binary_data_size` is set
has no `data`; its values follow the header, in input order, as raw little-endian bytes
(BYTES: each element a 4-byte little-endian length, then that many bytes). A response lays
out its binary outputs the same way. The gRPC protocol's `raw_input_contents` and
`raw_output_contents` use the same element encoding, so `grpc_api` decodes and encodes with
`decode_tensor` and `encode_tensor` too.

Pure functions, no I/O. Every length a client declares (the header length, each
`binary_data_size`, each BYTES element length) is checked against the bytes actually
received before anything is sliced or allocated, and tensor shapes against `TensorLimits`
first (`declared_elements`: values, instances, and BYTES strings, which are one per
instance), so a hostile body costs time linear in its size and never more memory than it
occupies, and a body over a limit is refused before a single value is decoded: decoding a
4 MB body of a million empty BYTES elements took about a second of the event loop. Every
inconsistency is an `InvalidInput` naming the input; a count over a limit is a
`PayloadTooLarge` naming the limit.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from pydantic import BaseModel, Field, ValidationError

from fleetserve_runtime.core.errors import InvalidInput, PayloadTooLarge
from fleetserve_runtime.server.schemas import Datatype, TensorLimits, check_shape

__all__ = [
    "DTYPES",
    "attach_binary_inputs",
    "declared_elements",
    "decode_tensor",
    "encode_tensor",
    "join_binary_body",
    "split_binary_body",
    "stack_results",
    "wants_binary_output",
]

DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
"""Wire dtype of each fixed-size OIP datatype (BYTES is length-prefixed instead)."""

_LENGTH = struct.Struct("<I")


class _BinaryInput(BaseModel):
    """The fields of a binary input the codec needs; the full schema is checked afterwards."""

    name: str = Field(min_length=1)
    shape: list[int] = Field(min_length=1)
    datatype: Datatype
    binary_data_size: int = Field(ge=0)


def split_binary_body(body: bytes, header_length: str) -> tuple[Any, memoryview]:
    """The parsed JSON header and the bytes after it, given `Inference-Header-Content-Length`."""
    if not (header_length.isascii() and header_length.isdigit() and len(header_length) <= 18):
        shown = header_length[:40]
        msg = f"Inference-Header-Content-Length must be a byte count (digits only), got {shown!r}"
        raise InvalidInput(msg)
    size = int(header_length)
    if size > len(body):
        msg = f"Inference-Header-Content-Length is {size} but the body has only {len(body)} bytes"
        raise InvalidInput(msg)
    view = memoryview(body)
    try:
        header = orjson.loads(view[:size])
    except orjson.JSONDecodeError as exc:
        msg = f"the JSON header (Inference-Header-Content-Length bytes) is not valid JSON: {exc}"
        raise InvalidInput(msg) from None
    return header, view[size:]


def _binary_input(index: int, tensor: Any) -> _BinaryInput | None:
    """The binary view of input `index`, or None when it carries JSON `data`."""
    if not isinstance(tensor, dict):
        return None
    parameters = tensor.get("parameters")
    if not isinstance(parameters, dict) or "binary_data_size" not in parameters:
        return None
    where = f"inputs.{index}"
    if "data" in tensor:
        msg = f"input {tensor.get('name')!r} has both data and parameters.binary_data_size"
        raise InvalidInput(msg, param=f"{where}.data")
    try:
        return _BinaryInput.model_validate({**tensor, **parameters})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        msg = f"input {tensor.get('name')!r}: {field}: {first['msg']}"
        raise InvalidInput(msg, param=f"{where}.{field}") from None


def attach_binary_inputs(header: Any, tail: memoryview, limits: TensorLimits) -> None:
    """Decode the binary inputs of `header` from `tail` into their `data`, in place.

    `header` is the parsed JSON header; anything that is not an OIP request is left for
    the schema check that follows. The binary sizes must account for `tail` exactly.
    """
    inputs = header.get("inputs") if isinstance(header, dict) else None
    offset = 0
    for index, tensor in enumerate(inputs if isinstance(inputs, list) else []):
        spec = _binary_input(index, tensor)
        if spec is None:
            continue
        end = offset + spec.binary_data_size
        if end > len(tail):
            msg = (
                f"input {spec.name!r} declares binary_data_size {spec.binary_data_size} but "
                f"only {len(tail) - offset} bytes follow the JSON header"
            )
            raise InvalidInput(msg)
        elements = declared_elements(spec.name, spec.shape, spec.datatype, limits)
        tensor["data"] = decode_tensor(spec.name, spec.datatype, elements, tail[offset:end])
        offset = end
    if offset != len(tail):
        msg = (
            f"{len(tail) - offset} bytes follow the JSON header and binary inputs that no "
            "input's binary_data_size accounts for"
        )
        raise InvalidInput(msg)


def declared_elements(name: str, shape: Sequence[int], datatype: str, limits: TensorLimits) -> int:
    """The number of values input `name` declares, refused at once when over `limits`.

    What `schemas.tensor_instances` would refuse after decoding, refused before it: too many
    values (`check_shape`), too many instances (the first dimension), and, for BYTES, more
    strings than instances may be: a request carries one string per instance, so a BYTES
    tensor of more than `max_instances` elements is refused whatever the model.
    """
    elements = check_shape(shape, limits)
    count = shape[0] if shape else 0
    if count > limits.max_instances:
        msg = (
            f"input {name!r} declares {count} instances, the limit is "
            f"{limits.max_instances} (max_instances)"
        )
        raise PayloadTooLarge(msg)
    if datatype == "BYTES" and elements > limits.max_instances:
        msg = (
            f"input {name!r} declares {elements} BYTES elements; a request carries one string "
            f"per instance, at most {limits.max_instances} (max_instances)"
        )
        raise PayloadTooLarge(msg)
    return elements


def decode_tensor(name: str, datatype: str, elements: int, raw: memoryview) -> list[Any]:
    """`elements` values of `datatype` from their raw encoding, as JSON data would give them.

    BYTES elements are decoded as UTF-8 text: the models served take text. The size of
    `raw` is checked against `elements` before any value is decoded.
    """
    if datatype == "BYTES":
        if len(raw) < elements * _LENGTH.size:
            msg = (
                f"input {name!r} is {len(raw)} bytes, too few for {elements} BYTES elements "
                f"of at least {_LENGTH.size} bytes (the length prefix) each"
            )
            raise InvalidInput(msg)
        return _decode_bytes(name, elements, raw)
    dtype = DTYPES[datatype]
    if len(raw) != elements * dtype.itemsize:
        msg = (
            f"input {name!r} is {len(raw)} bytes, but {elements} {datatype} values are "
            f"{elements * dtype.itemsize} bytes"
        )
        raise InvalidInput(msg)
    values: list[Any] = np.frombuffer(raw, dtype=dtype).tolist()
    return values


def _decode_bytes(name: str, elements: int, raw: memoryview) -> list[Any]:
    values: list[Any] = []
    offset = 0
    while offset < len(raw):
        if len(values) == elements:
            msg = f"input {name!r} has bytes after its {elements} BYTES elements"
            raise InvalidInput(msg)
        if offset + _LENGTH.size > len(raw):
            msg = f"input {name!r}: BYTES element {len(values)} has a truncated length prefix"
            raise InvalidInput(msg)
        (length,) = _LENGTH.unpack_from(raw, offset)
        start, offset = offset + _LENGTH.size, offset + _LENGTH.size + length
        if offset > len(raw):
            msg = (
                f"input {name!r}: BYTES element {len(values)} declares {length} bytes, "
                f"past the end of the input"
            )
            raise InvalidInput(msg)
        try:
            values.append(str(raw[start:offset], "utf-8"))
        except UnicodeDecodeError:
            msg = f"input {name!r}: BYTES element {len(values)} is not valid UTF-8 text"
            raise InvalidInput(msg) from None
    if len(values) != elements:
        msg = f"input {name!r} has {len(values)} BYTES elements, its shape needs {elements}"
        raise InvalidInput(msg)
    return values


def encode_tensor(values: Any, datatype: str) -> bytes:
    """The raw encoding of `values` (an array, or a flat sequence) as `datatype`."""
    if datatype == "BYTES":
        return b"".join(_length_prefixed(value) for value in np.asarray(values).reshape(-1))
    return np.ascontiguousarray(values, dtype=DTYPES[datatype]).tobytes()


def _length_prefixed(value: Any) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode()
    return _LENGTH.pack(len(data)) + data


def stack_results(results: list[Any]) -> tuple[Any, list[int]]:
    """The flat values and shape of a request's per-instance results (arrays stack)."""
    if len(results) == 1 and isinstance(only := results[0], np.ndarray):
        # Most requests carry one instance: its row is the stack, without `np.stack`'s copy.
        return only.reshape(-1), [1, *only.shape]
    if results and all(isinstance(r, np.ndarray) for r in results):
        stacked = np.stack(results)
        return stacked.reshape(-1), list(stacked.shape)
    return results, [len(results)]


def wants_binary_output(
    outputs: Sequence[dict[str, Any]] | None, parameters: dict[str, Any], name: str
) -> bool:
    """Whether output `name` goes back binary (its own `binary_data`, else `binary_data_output`)."""
    for output in outputs or []:
        own = output.get("parameters")
        if output.get("name") == name and isinstance(own, dict) and "binary_data" in own:
            return own["binary_data"] is True
    return parameters.get("binary_data_output") is True


def join_binary_body(header: dict[str, Any], tensors: Sequence[bytes]) -> tuple[bytes, int]:
    """A response body in the extension, and its `Inference-Header-Content-Length`."""
    head = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    return b"".join([head, *tensors]), len(head)
