"""Names and labels of the objects the operator manages.

The vocabulary shared with the chart, the runtime's metric labels and the tests (see
ARCHITECTURE.md, "Names").
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["GROUP", "KIND", "PLURAL", "VERSION", "Track", "child_name", "labels"]

GROUP = "serving.fleetserve.io"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
MANAGER = "fleetserve-operator"
TRACK_LABEL = f"{GROUP}/track"
MODEL_VERSION_LABEL = f"{GROUP}/model-version"


class Track(StrEnum):
    """The Deployments one InferenceService owns; the value is the name suffix and label."""

    STABLE = "stable"
    CANARY = "canary"
    FALLBACK = "fallback"


def child_name(service: str, track: Track | None = None) -> str:
    """`<name>-<track>` for a track's Deployment and Service; `<name>` for the umbrella."""
    return service if track is None else f"{service}-{track.value}"


def labels(
    service: str, track: Track | None = None, model_version: str | None = None
) -> dict[str, str]:
    """Labels every child carries; track and model version where they apply."""
    result = {
        "app.kubernetes.io/name": "fleetserve-runtime",
        "app.kubernetes.io/instance": service,
        "app.kubernetes.io/managed-by": MANAGER,
    }
    if track is not None:
        result[TRACK_LABEL] = track.value
    if model_version is not None:
        result[MODEL_VERSION_LABEL] = model_version
    return result
