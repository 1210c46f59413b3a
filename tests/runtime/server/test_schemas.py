"""Bounded decoding: shapes are checked against the limits before any data is touched."""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve_runtime.core.errors import InvalidInput, PayloadTooLarge
from fleetserve_runtime.server.schemas import (
    RequestInput,
    TensorLimits,
    check_instances,
    check_shape,
    tensor_instances,
)

LIMITS = TensorLimits(max_rank=3, max_elements=100, max_instances=10)


def test_check_shape_counts_values() -> None:
    """Within the limits the shape's value count comes back; a zero dimension means none."""
    assert check_shape([4, 5], LIMITS) == 20
    assert check_shape([0, 2**63], LIMITS) == 0


@pytest.mark.parametrize(
    ("shape", "error", "message"),
    [
        pytest.param([1, 1, 1, 1], InvalidInput, "max_tensor_rank", id="rank"),
        pytest.param([1] * 100_000, InvalidInput, "100000 dimensions", id="huge-rank"),
        pytest.param([2, -1], InvalidInput, "negative", id="negative"),
        pytest.param([11, 10], PayloadTooLarge, "max_tensor_elements", id="elements"),
        pytest.param([2**63, 2**63, 2**63], PayloadTooLarge, "more than 100", id="huge-dims"),
    ],
)
def test_check_shape_refuses_with_the_limit(
    shape: list[int], error: type[Exception], message: str
) -> None:
    """Each limit is named in the refusal; the message never carries a giant product."""
    with pytest.raises(error, match=message) as caught:
        check_shape(shape, LIMITS)
    assert len(str(caught.value)) < 200


def _tensor(shape: list[int], data: list[Any], datatype: str = "BYTES") -> RequestInput:
    return RequestInput(name="text", shape=shape, datatype=datatype, data=data)  # type: ignore[arg-type]


def test_tensor_instances_refuses_declared_excess_before_reading_data() -> None:
    """A shape over the limits is refused even though its data is tiny."""
    with pytest.raises(PayloadTooLarge, match="max_tensor_elements"):
        tensor_instances(
            _tensor([10, 2**40], ["a"]),
            expected_name="text",
            expected_datatype="BYTES",
            limits=LIMITS,
        )


def test_tensor_instances_splits_rows() -> None:
    """Numeric tensors give one flat row per instance, nested or flat data alike."""
    nested = _tensor([2, 2], [[1, 2], [3, 4]], "FP32")
    flat = _tensor([2, 2], [1, 2, 3, 4], "FP32")
    for tensor in (nested, flat):
        rows = tensor_instances(
            tensor, expected_name="text", expected_datatype="FP32", limits=LIMITS
        )
        assert rows == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    ("instances", "error", "message"),
    [
        pytest.param(["a"] * 11, PayloadTooLarge, "limit is 10", id="count"),
        pytest.param([[[["a"]]]], InvalidInput, "max_tensor_rank", id="depth"),
        pytest.param([{"k": [[1]]}], InvalidInput, "max_tensor_rank", id="depth-in-objects"),
        pytest.param([list(range(60))] * 2, PayloadTooLarge, "max_tensor_elements", id="values"),
    ],
)
def test_check_instances_refuses(
    instances: list[Any], error: type[Exception], message: str
) -> None:
    """v1 instances: count, nesting (objects count as levels) and total values are bounded."""
    with pytest.raises(error, match=message):
        check_instances(instances, LIMITS)


def test_check_instances_accepts_what_fits() -> None:
    """Rows and objects within the limits pass."""
    check_instances([[1.0, 2.0], {"a": [3]}, "text"], LIMITS)
