"""Chat's `response_format`: the output grammar a JSON mode or a JSON schema asks for.

`{"type": "json_object"}` holds the answer to one JSON object, `{"type": "json_schema",
"json_schema": {"name": ..., "schema": {...}, "strict": ...}}` to a value the schema
validates; `{"type": "text"}` (or none) leaves it free. The engine enforces the grammar as a
token mask (`generate.grammar`), `strict` or not (a schema is never a mere hint here), and
refuses, naming `response_format`, a schema too large or one it cannot enforce.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleetserve_runtime.generate.contracts import GrammarKind, OutputGrammar

__all__ = ["JsonSchemaFormat", "ResponseFormat", "json_grammar"]

_FORBID = ConfigDict(extra="forbid", populate_by_name=True)

ANY_OBJECT: dict[str, Any] = {"type": "object"}
"""JSON mode's schema: any one object."""


class JsonSchemaFormat(BaseModel):
    """`response_format.json_schema`."""

    model_config = _FORBID

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None
    """Accepted: the schema is enforced either way."""


class ResponseFormat(BaseModel):
    """`response_format`: free text, any JSON object, or a value a JSON schema validates."""

    model_config = _FORBID

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            msg = "json_schema is required with type 'json_schema', and only with it"
            raise ValueError(msg)
        return self

    def grammar(self) -> OutputGrammar | None:
        """The output grammar it asks for; None for free text."""
        if self.json_schema is not None:
            return json_grammar(self.json_schema.schema_, "response_format")
        if self.type == "json_object":
            return json_grammar(ANY_OBJECT, "response_format")
        return None


def json_grammar(schema: dict[str, Any], field: str) -> OutputGrammar:
    """The grammar of the values `schema` validates, refused as `field` if it cannot be."""
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return OutputGrammar(GrammarKind.JSON_SCHEMA, text, field=field)
