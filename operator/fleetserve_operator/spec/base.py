"""Shared pieces of the InferenceService models: the wire base class, quantities, durations, CEL.

Every model derives from `Wire`: snake_case in Python, camelCase on the wire, frozen, unknown
fields rejected, and each field's docstring becomes its description in the CRD.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

__all__ = [
    "DEFAULT_IMAGE",
    "GPU_RESOURCE",
    "Duration",
    "Quantity",
    "Wire",
    "cel",
    "parse_duration_s",
    "parse_quantity",
]

DEFAULT_IMAGE = "ghcr.io/fleetserve/fleetserve-runtime:0.1.0"
GPU_RESOURCE = "nvidia.com/gpu"

_QUANTITY_RE = r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|[KMGTPE]i|[kMGTPE]|m)?$"
_DURATION_RE = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Decimal | int] = {
    "m": Decimal("0.001"),
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}
_DECIMAL |= {"P": 10**15, "E": 10**18}
_DURATION_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

Duration = Annotated[str, Field(pattern=_DURATION_RE, max_length=32)]
"""A Go-style duration: `30s`, `1m`, `1h30m`, `500ms`."""


def cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """One `x-kubernetes-validations` entry; `field_path` points the error at a field."""
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def parse_quantity(value: int | str) -> int:
    """A Kubernetes quantity in base units, rounded down (`"1Gi"` → 1073741824).

    Raises:
        ValueError: `value` is not a quantity.
    """
    text = str(value)
    if re.fullmatch(_QUANTITY_RE, text) is None:
        msg = f"{value!r} is not a Kubernetes quantity (for example 8Gi, 512Mi, 1000000)"
        raise ValueError(msg)
    suffix = text.lstrip("0123456789.")
    number = Decimal(text[: len(text) - len(suffix)])
    if suffix[:1] in ("e", "E"):
        return int(number * Decimal(10) ** int(suffix[1:]))
    return int(number * _BINARY.get(suffix, _DECIMAL.get(suffix, 1)))


def _valid_quantity(value: int | str) -> int | str:
    parse_quantity(value)  # raises ValueError naming the bad value
    return value


# A Kubernetes quantity ("8Gi", "500m", 1000000): the API server keeps ints and strings apart,
# so the schema is the standard int-or-string one, with the quantity grammar on strings.
Quantity = Annotated[
    int | str,
    AfterValidator(_valid_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "pattern": _QUANTITY_RE,
        }
    ),
]


def parse_duration_s(value: str) -> float:
    """A Go-style duration in seconds (`"1m30s"` → 90.0)."""
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)", value)
    return sum(float(number) * _DURATION_UNITS_S[unit] for number, unit in parts)


class Wire(BaseModel):
    """Base of every spec model: camelCase on the wire, frozen, no unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        extra="forbid",
        frozen=True,
        protected_namespaces=(),
        use_attribute_docstrings=True,
    )
