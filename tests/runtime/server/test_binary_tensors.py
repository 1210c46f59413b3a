"""The binary tensor data extension's codec: round trips, and every lying length refused."""

from __future__ import annotations

import struct
from typing import Any, NoReturn

import numpy as np
import orjson
import pytest

from fleetserve_runtime.core.errors import InvalidInput, PayloadTooLarge
from fleetserve_runtime.server import binary_tensors
from fleetserve_runtime.server.binary_tensors import (
    DTYPES,
    attach_binary_inputs,
    decode_tensor,
    encode_tensor,
    join_binary_body,
    split_binary_body,
    wants_binary_output,
)
from fleetserve_runtime.server.schemas import TensorLimits

LIMITS = TensorLimits(max_rank=4, max_elements=1000, max_instances=100)


def prefixed(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


@pytest.mark.parametrize("datatype", sorted(DTYPES))
def test_fixed_size_datatypes_round_trip(datatype: str) -> None:
    """Every numeric datatype: encode, then decode, gives the values back (little-endian)."""
    values = np.arange(6).astype(DTYPES[datatype])
    raw = encode_tensor(values, datatype)
    assert raw == values.astype(DTYPES[datatype].newbyteorder("<")).tobytes()
    assert decode_tensor("x", datatype, 6, memoryview(raw)) == values.tolist()


def test_bytes_round_trip_as_utf8_text() -> None:
    """BYTES: 4-byte little-endian lengths, then the UTF-8 text; empty elements allowed."""
    texts = ["héllo", "", "✓ done"]
    raw = encode_tensor(np.array(texts, dtype=np.object_), "BYTES")
    assert raw == prefixed(*(t.encode() for t in texts))
    assert decode_tensor("text", "BYTES", 3, memoryview(raw)) == texts


@pytest.mark.parametrize(
    ("elements", "raw", "says"),
    [
        pytest.param(2, prefixed(b"abcd"), "has 1 BYTES elements, its shape needs 2", id="too-few"),
        pytest.param(1, prefixed(b"a", b"b"), "bytes after its 1", id="too-many"),
        pytest.param(
            2, prefixed(b"abcd") + b"\x05\x00", "truncated length prefix", id="cut-prefix"
        ),
        pytest.param(1, struct.pack("<I", 2**32 - 1) + b"abc", "past the end", id="huge-length"),
        pytest.param(1, prefixed(b"\xff\xfe"), "not valid UTF-8", id="not-utf8"),
    ],
)
def test_bytes_that_lie_are_refused(elements: int, raw: bytes, says: str) -> None:
    with pytest.raises(InvalidInput, match=says) as caught:
        decode_tensor("text", "BYTES", elements, memoryview(raw))
    assert "'text'" in caught.value.message


def test_numeric_size_must_match_the_shape() -> None:
    with pytest.raises(InvalidInput, match=r"'x' is 7 bytes, but 2 FP32 values are 8 bytes"):
        decode_tensor("x", "FP32", 2, memoryview(b"\0" * 7))


def header(size: int, shape: list[int], **extra: Any) -> dict[str, Any]:
    tensor = {"name": "text", "datatype": "BYTES", "shape": shape}
    return {"inputs": [{**tensor, "parameters": {"binary_data_size": size}, **extra}]}


def test_split_and_attach_give_json_data() -> None:
    """A body in the extension becomes the request JSON would have sent."""
    tail = prefixed(b"one", b"two")
    head = orjson.dumps(header(len(tail), [2]))
    parsed, rest = split_binary_body(head + tail, str(len(head)))
    attach_binary_inputs(parsed, rest, LIMITS)
    assert parsed["inputs"][0]["data"] == ["one", "two"]


@pytest.mark.parametrize(
    "length", ["-5", "+5", " 5", "0x10", "1e3", "9" * 19, "٣"], ids=lambda v: repr(v)
)
def test_header_length_must_be_plain_digits(length: str) -> None:
    with pytest.raises(InvalidInput, match="digits only"):
        split_binary_body(b"{}", length)


def test_header_length_past_the_body_is_refused() -> None:
    with pytest.raises(InvalidInput, match="is 30 but the body has only 2 bytes"):
        split_binary_body(b"{}", "30")


@pytest.mark.parametrize(
    ("parsed", "tail", "error", "says"),
    [
        pytest.param(header(9, [1]), prefixed(b"a"), InvalidInput, "only 5 bytes follow",
                     id="size-past-end"),
        pytest.param(header(5, [1]), prefixed(b"a") + b"!", InvalidInput, "1 bytes follow",
                     id="bytes-left-over"),
        pytest.param(header(-1, [1]), b"", InvalidInput, "binary_data_size", id="negative"),
        pytest.param(header(5, [1], data=["a"]), prefixed(b"a"), InvalidInput,
                     "both data and", id="data-and-binary"),
        pytest.param(header(0, [10**6]), b"", PayloadTooLarge, "max_tensor_elements",
                     id="huge-shape"),
        pytest.param({"inputs": []}, b"x", InvalidInput, "1 bytes follow", id="no-inputs"),
    ],
)  # fmt: skip
def test_attach_refuses_sizes_that_lie(
    parsed: dict[str, Any], tail: bytes, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        attach_binary_inputs(parsed, memoryview(tail), LIMITS)


def refuse_to_decode(*args: object) -> NoReturn:
    raise AssertionError("decoded a request that its declared counts already refuse")


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        pytest.param([1000], "1000 instances", id="bytes-instances"),
        pytest.param([1, 1000], "1000 BYTES elements", id="bytes-one-instance"),
        pytest.param([1001], "max_tensor_elements", id="values"),
    ],
)
def test_counts_over_a_limit_are_refused_before_decoding(
    monkeypatch: pytest.MonkeyPatch, shape: list[int], says: str
) -> None:
    """The decoder never runs for a request whose declared counts are over a limit."""
    monkeypatch.setattr(binary_tensors, "decode_tensor", refuse_to_decode)
    tail = prefixed(*[b""] * 1000)
    parsed = header(len(tail), shape)
    with pytest.raises(PayloadTooLarge, match=says) as caught:
        attach_binary_inputs(parsed, memoryview(tail), LIMITS)
    assert "max_" in caught.value.message


def test_too_many_instances_are_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """A numeric tensor of 101 instances (limit 100) is refused by name, undecoded."""
    monkeypatch.setattr(binary_tensors, "decode_tensor", refuse_to_decode)
    parsed = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [101, 2],
                          "parameters": {"binary_data_size": 808}}]}  # fmt: skip
    with pytest.raises(PayloadTooLarge, match=r"'x' declares 101 instances.*max_instances"):
        attach_binary_inputs(parsed, memoryview(b"\0" * 808), LIMITS)


def test_too_few_bytes_for_the_bytes_elements_are_refused_before_decoding() -> None:
    """Each BYTES element takes at least its 4-byte length: a shorter input is refused at once."""
    with pytest.raises(InvalidInput, match="7 bytes, too few for 2 BYTES elements"):
        decode_tensor("text", "BYTES", 2, memoryview(b"\0" * 7))


@pytest.mark.parametrize(
    ("outputs", "parameters", "binary"),
    [
        pytest.param(None, {}, False, id="json-by-default"),
        pytest.param(None, {"binary_data_output": True}, True, id="request-wide"),
        pytest.param([{"name": "e", "parameters": {"binary_data": True}}], {}, True, id="own"),
        pytest.param(
            [{"name": "e", "parameters": {"binary_data": False}}],
            {"binary_data_output": True},
            False,
            id="own-beats-request-wide",
        ),
        pytest.param(
            [{"name": "other", "parameters": {"binary_data": True}}], {}, False, id="other-output"
        ),
    ],
)
def test_which_outputs_go_binary(
    outputs: list[dict[str, Any]] | None, parameters: dict[str, Any], binary: bool
) -> None:
    assert wants_binary_output(outputs, parameters, "e") is binary


def test_response_body_is_header_then_tensors() -> None:
    body, length = join_binary_body({"outputs": []}, [b"\x01\x02", b"\x03"])
    assert orjson.loads(body[:length]) == {"outputs": []}
    assert body[length:] == b"\x01\x02\x03"
