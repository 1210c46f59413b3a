"""Names and labels of the objects the operator manages.

The vocabulary shared with the chart, the runtime's metric labels and the tests (see
docs/explanation/architecture.md, "Names").
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "LEGACY_FINALIZER",
    "MANAGER",
    "MAX_NAME_LENGTH",
    "PLURAL",
    "SHORT_NAME",
    "VERSION",
    "Track",
    "child_name",
    "shadow_target_name",
    "labels",
    "selector",
]

GROUP = "serving.fleetserve.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SHORT_NAME = "fsvc"
MANAGER = "fleetserve-operator"
LEGACY_FINALIZER = f"{GROUP}/finalizer"
"""The finalizer kopf put on services with a rollout timer, when kopf handled them; the
operator takes it off every service that still carries it, or its deletion would hang."""
APP_NAME = "fleetserve-runtime"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
TRACK_LABEL = f"{GROUP}/track"
MODEL_VERSION_LABEL = f"{GROUP}/model-version"
POOL_LABEL = f"{GROUP}/pool"
SPEC_HASH_LABEL = f"{GROUP}/spec-hash"
"""`GpuTrackSpec.digest` a GPU track's template was rendered from (Deployment and pods)."""


class Track(StrEnum):
    """The Deployments one InferenceService owns; the value is the name suffix and label."""

    STABLE = "stable"
    CANARY = "canary"
    FALLBACK = "fallback"

    @property
    def pool(self) -> str:
        """`gpu` for the tracks that share the GPU pool, `cpu` for the fallback."""
        return "cpu" if self is Track.FALLBACK else "gpu"


MAX_NAME_LENGTH = 63 - max(len(f"-{track.value}") for track in Track)
"""Longest InferenceService name: `child_name` must stay a DNS-1035 label (a Service name) of
at most 63 characters on every track. Longer names derived from a child's (ReplicaSets,
pods, EndpointSlices) are DNS subdomains, or are truncated by the controllers that make them."""


def child_name(service: str, track: Track | None = None) -> str:
    """`<name>-<track>` for a track's Deployment and Service; `<name>` for the umbrella."""
    return service if track is None else f"{service}-{track.value}"


def shadow_target_name(service: str) -> str:
    """`<name>-shadow`: the ConfigMap holding the shadow stage's target (`rollout.shadow`)."""
    return f"{service}-shadow"


def labels(
    service: str, track: Track | None = None, model_version: str | None = None
) -> dict[str, str]:
    """Labels every child carries; track, pool and model version where they apply."""
    result = {
        NAME_LABEL: APP_NAME,
        INSTANCE_LABEL: service,
        MANAGED_BY_LABEL: MANAGER,
    }
    if track is not None:
        result[TRACK_LABEL] = track.value
        result[POOL_LABEL] = track.pool
    if model_version is not None:
        result[MODEL_VERSION_LABEL] = model_version
    return result


def selector(service: str, track: Track) -> dict[str, str]:
    """Pod selector of a track's Deployment and Service; immutable, so it has no version."""
    return {NAME_LABEL: APP_NAME, INSTANCE_LABEL: service, TRACK_LABEL: track.value}
