"""The OIP generate extension's bodies: `text_input` and `parameters` in, `text_output` out.

The request is strict: its parameters are few, and a misspelt one is refused (a 400 naming
it). `oip_generation` is the pure translation of a validated body to the engine's
`GenerationRequest`.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from fleetserve_runtime.core.config_sections import GenerationConfig
from fleetserve_runtime.generate.contracts import GenerationRequest
from fleetserve_runtime.server.generation_schemas import (
    MaxTokens,
    RequestControls,
    SamplingFields,
    UsageBody,
    sampling_params,
)

__all__ = ["GenerateParameters", "GenerateRequest", "GenerateResponse", "oip_generation"]


class GenerateParameters(SamplingFields):
    """`parameters` of an OIP generate request."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: MaxTokens | None = None
    priority: Literal["high", "normal", "low"] | None = None
    timeout_ms: int | None = Field(None, ge=1)
    stream: bool | None = None
    """Accepted as Triton's clients send it; the endpoint (`generate_stream`) decides."""


class GenerateRequest(BaseModel):
    """`POST /v2/models/{name}/generate` (and `generate_stream`) body."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, max_length=256)
    text_input: str = Field(min_length=1)
    parameters: GenerateParameters = GenerateParameters()


class GenerateResponse(TypedDict, total=False):
    """An OIP generate answer, or one `generate_stream` event.

    `finish_reason` and `usage` come with the whole answer and with a stream's last event.
    """

    model_name: str
    model_version: str
    text_output: str
    id: str
    finish_reason: str
    usage: UsageBody


def oip_generation(
    body: GenerateRequest,
    *,
    controls: RequestControls,
    limits: GenerationConfig,
    version: str | None,
) -> GenerationRequest:
    """The generation an OIP generate request asks for (of `version`, or the active one).

    `controls` already weigh the body's `priority` and `timeout_ms` against the headers.
    """
    params = body.parameters
    return GenerationRequest(
        sampling=sampling_params(
            params, max_tokens=params.max_tokens, limits=limits, prefix="parameters."
        ),
        prompt=body.text_input,
        priority=controls.priority,
        timeout_s=controls.timeout_s,
        version=version,
        request_id=controls.request_id,
    )
