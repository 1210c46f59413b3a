"""Where the shadow mirror copies to (`server.shadow`): the target, from flags or a file.

A target is the next version's base URL, the share of requests copied, the version that
labels the shadow metrics, and the cosine at which two vectors agree. It is given either by
the `shadow.*` flags, fixed for the pod's life, or by a JSON file (`shadow.file`) that the
serving pods re-read: the operator writes it into a ConfigMap mounted in the stable pods, so
it starts and stops a shadow stage without restarting them. An absent or empty file is no
target (off); a file that does not parse is refused (`read_target` raises, the mirror stops).

The file holds one JSON object with the keys of `ShadowTarget`, e.g.
`{"url": "http://m-canary.ns.svc:8080", "fraction": 0.1, "version_label": "2"}`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "MinCosine",
    "ShadowFraction",
    "ShadowTarget",
    "ShadowUrl",
    "ShadowVersionLabel",
    "read_target",
]

ShadowUrl = Annotated[str, Field(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$", max_length=2048)]
"""Base URL of the shadow version (its Service), `http://` or `https://`."""
ShadowFraction = Annotated[float, Field(gt=0, le=1)]
"""Share of the mirrorable requests (embeddings, infer, predict, OpenAI completions and
chat) copied to the shadow."""
ShadowVersionLabel = Annotated[str, Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.+-]{0,62}$")]
"""The shadow's version, the `shadow_version` label of the shadow metrics."""
MinCosine = Annotated[float, Field(ge=0, le=1)]
"""Cosine similarity at or above which two embedding vectors agree."""

MAX_TARGET_BYTES = 64 * 1024
"""Most bytes a target file may hold; a larger one is refused, not read."""


class ShadowTarget(BaseModel):
    """Where copies go and how they are labelled and compared: one shadow stage."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    url: ShadowUrl
    """Base URL of the shadow version (its Service)."""
    fraction: ShadowFraction = 0.1
    """Share of the mirrorable requests copied."""
    version_label: ShadowVersionLabel = "shadow"
    """The `shadow_version` label of the shadow metrics: the next version."""
    min_cosine: MinCosine = 0.99
    """Cosine similarity at or above which two embedding vectors agree."""


def read_target(path: Path) -> ShadowTarget | None:
    """The target `path` holds now; None when the file is absent or blank (no shadow).

    Raises:
        ValueError: the file cannot be read, is too large, or is not a valid target; the
            message names the file.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        msg = f"cannot read shadow file {path}: {exc.strerror}"
        raise ValueError(msg) from None
    if len(data) > MAX_TARGET_BYTES:
        msg = f"shadow file {path} holds {len(data)} bytes, more than {MAX_TARGET_BYTES}"
        raise ValueError(msg)
    if not data.strip():
        return None
    try:
        return ShadowTarget.model_validate_json(data)
    except ValidationError as exc:
        msg = f"shadow file {path} is not a shadow target: {exc}"
        raise ValueError(msg) from None
