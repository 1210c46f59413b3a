"""Shared pieces of the InferenceService models: the wire base class, quantities, durations, CEL.

Every model derives from `Wire`: snake_case in Python, camelCase on the wire, frozen, unknown
fields rejected, and each field's docstring becomes its description in the CRD. A rule between
two fields (`AtLeast`) is stated once, and becomes both a CEL validation and a model check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Context, Decimal
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel, to_snake
from pydantic.config import JsonDict, JsonValue

__all__ = [
    "Timestamp",
    "GPU_RESOURCE",
    "MAX_QUANTITY",
    "AtLeast",
    "DnsLabel",
    "DnsSubdomain",
    "Duration",
    "LabelValue",
    "QualifiedName",
    "Quantity",
    "Wire",
    "cel",
    "int_or_string",
    "keyed_list",
    "parse_duration_s",
    "parse_quantity",
]

GPU_RESOURCE = "nvidia.com/gpu"

QUANTITY_MAX_LENGTH = 64
MAX_QUANTITY = 2**63 - 1
"""The largest quantity Kubernetes represents; anything above it is refused, not capped."""
# Two exponent digits already reach far past MAX_QUANTITY; more only let a short string stand
# for a number too large to compute with.
_QUANTITY_RE = r"^[0-9]+(\.[0-9]+)?([eE][0-9]{1,2}|[KMGTPE]i|[kMGTPE]|m)?$"
# At most six digits before each unit: the longest duration 32 characters can then spell is
# centuries, not a number that overflows a datetime.
_DURATION_RE = r"^([0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h))+$"
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
# Exact for every string the grammar and QUANTITY_MAX_LENGTH allow: 64 digits times at most
# 10**99 never rounds, so "rounded down" is the only rounding there is.
_EXACT = Context(prec=200)

Duration = Annotated[str, Field(pattern=_DURATION_RE, max_length=32)]
Timestamp = Annotated[str, Field(max_length=64, json_schema_extra={"format": "date-time"})]
"""An RFC 3339 time, as status records it."""
"""A Go-style duration: `30s`, `1m`, `1h30m`, `500ms`."""

_DNS_LABEL_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL_VALUE_RE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# An optional DNS-subdomain prefix (its length bounded, its dots loosely) and a 63-character name.
_QUALIFIED_NAME_RE = (
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)

DnsLabel = Annotated[str, Field(pattern=_DNS_LABEL_RE, max_length=63)]
"""A DNS-1123 label: a namespace, a Service, a listener's port name."""
DnsSubdomain = Annotated[str, Field(pattern=_DNS_SUBDOMAIN_RE, max_length=253)]
"""A DNS-1123 subdomain: the name of most Kubernetes objects."""
LabelValue = Annotated[str, Field(pattern=_LABEL_VALUE_RE, max_length=63)]
"""A Kubernetes label value (also what node selectors and taints compare)."""
QualifiedName = Annotated[str, Field(pattern=_QUALIFIED_NAME_RE, max_length=317)]
"""A label key or resource name: `[prefix/]name`, e.g. `nvidia.com/gpu`."""


VALIDATIONS = "x-kubernetes-validations"
"""The schema key under which the API server finds an object's CEL rules."""


def cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """One `VALIDATIONS` entry; `field_path` points the error at a field."""
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def cel_rules(*rules: JsonDict) -> ConfigDict:
    """A model's config that puts `rules` (from `cel`) in its schema, so the CRD carries them."""
    return ConfigDict(json_schema_extra={VALIDATIONS: list(rules)})


@dataclass(frozen=True, slots=True)
class AtLeast:
    """A section's rule that field `high` is >= field `low` (wire names), stated once.

    The same rule is a CEL validation in the CRD (`cel`), so the API server refuses the
    object, and a check in the model (`check`), so a spec the operator reads is refused alike;
    `why`, if given, ends both messages.
    """

    section: str
    high: str
    low: str
    why: str = ""

    def cel(self) -> JsonDict:
        """The rule's `VALIDATIONS` entry, pointed at `high`."""
        message = f"{self.section}.{self.high} must be >= {self.section}.{self.low}"
        return cel(f"self.{self.high} >= self.{self.low}", message + self._why, f".{self.high}")

    def check(self, model: BaseModel) -> None:
        """Raise ValueError, naming both fields and their values, if `model` breaks the rule."""
        high, low = getattr(model, to_snake(self.high)), getattr(model, to_snake(self.low))
        if high < low:
            msg = (
                f"{self.section}.{self.high} ({high}) must be >= "
                f"{self.section}.{self.low} ({low}){self._why}"
            )
            raise ValueError(msg)

    @property
    def _why(self) -> str:
        return f": {self.why}" if self.why else ""


def parse_quantity(value: int | str) -> int:
    """A Kubernetes quantity in base units, rounded down (`"1Gi"` → 1073741824).

    Total: every input either parses or raises `ValueError`, whatever its size.

    Raises:
        ValueError: `value` is not a quantity, or is above `MAX_QUANTITY`.
    """
    if isinstance(value, int):
        return _bounded(value, value)
    if len(value) > QUANTITY_MAX_LENGTH:
        msg = f"a quantity has at most {QUANTITY_MAX_LENGTH} characters, got {len(value)}"
        raise ValueError(msg)
    if re.fullmatch(_QUANTITY_RE, value) is None:
        msg = (
            f"{value!r} is not a Kubernetes quantity (for example 8Gi, 512Mi, 1e9; "
            "an exponent has at most 2 digits)"
        )
        raise ValueError(msg)
    suffix = value.lstrip("0123456789.")
    number = Decimal(value[: len(value) - len(suffix)])
    factor = _BINARY.get(suffix, _DECIMAL.get(suffix))
    if factor is None:  # "e<digits>": "E" alone and "Ei" are units, matched above
        scaled = number.scaleb(int(suffix[1:]), context=_EXACT)
    else:
        scaled = _EXACT.multiply(number, Decimal(factor))
    return _bounded(int(scaled), value)


def _bounded(number: int, value: int | str) -> int:
    if not 0 <= number <= MAX_QUANTITY:
        shown = repr(value) if isinstance(value, str) else "the integer"
        msg = f"{shown} is outside 0..{MAX_QUANTITY} (2^63-1), the range of a quantity"
        raise ValueError(msg)
    return number


def _valid_quantity(value: int | str) -> int | str:
    parse_quantity(value)  # raises ValueError naming the bad value
    return value


def int_or_string(**bounds: JsonValue) -> WithJsonSchema:
    """Kubernetes' int-or-string schema, with `bounds` (camelCase keywords) on either form."""
    return WithJsonSchema(
        {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
        | bounds
    )


# A Kubernetes quantity ("8Gi", "500m", 1000000): the API server keeps ints and strings apart,
# so the schema is the standard int-or-string one, with the quantity grammar and length on
# strings and the sign on integers.
Quantity = Annotated[
    int | str,
    AfterValidator(_valid_quantity),
    int_or_string(pattern=_QUANTITY_RE, maxLength=QUANTITY_MAX_LENGTH, minimum=0),
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


class StatusWire(Wire):
    """Base of every model of `.status`: as `Wire`, but fields it does not know are dropped.

    The operator reads back a status that another operator version may have written (an
    upgrade, a rollback of the operator itself); a field it does not know must not make that
    status unreadable.
    """

    model_config = ConfigDict(extra="ignore")


def keyed_list(key: str, *, max_length: int) -> Any:
    """A list field, empty by default, whose items Kubernetes tells apart by `key`.

    `x-kubernetes-list-type: map` lets a server-side apply merge the list item by item.
    """
    return Field(
        default_factory=list,
        max_length=max_length,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]},
    )
