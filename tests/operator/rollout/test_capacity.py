"""GPU-aware track sizes: canary replicas from the weight, the surge bound, each phase's sizes."""

from __future__ import annotations

import pytest

from fleetserve_operator import rollout
from fleetserve_operator.spec import InferenceServiceStatus
from fleetserve_operator.testing import make_spec
from fleetserve_operator.testing.rollout import canary_world


@pytest.mark.parametrize(
    ("replicas", "gpus", "surge", "weight", "expected"),
    [
        pytest.param(4, 1, None, 20, (4, 1), id="no-bound"),
        pytest.param(4, 1, 1, 1, (4, 1), id="surge-1-at-1%"),
        pytest.param(4, 1, 1, 50, (3, 2), id="surge-1-at-50%"),
        pytest.param(4, 1, 1, 100, (1, 4), id="surge-1-at-100%"),
        pytest.param(4, 2, 2, 50, (3, 2), id="two-gpus-per-replica"),
        pytest.param(4, 1, 0, 1, (4, 1), id="bound-too-tight-for-own-weight"),
        pytest.param(10, 1, 2, 20, (10, 2), id="ceil-weight"),
        pytest.param(4, 0, 0, 50, (4, 2), id="cpu-only-ignores-bound"),
    ],
)
def test_gpu_aware_capacity(
    replicas: int, gpus: int, surge: int | None, weight: int, expected: tuple[int, int]
) -> None:
    """Canary = ceil(weight x stable), >= 1; maxSurgeGPUs shrinks stable, never below its share."""
    limits = {"nvidia.com/gpu": gpus} if gpus else {}
    spec = make_spec(
        runtime={"replicas": {"min": replicas, "max": replicas}, "resources": {"limits": limits}},
        rollout={"maxSurgeGPUs": surge} if surge is not None else {},
    )
    status = InferenceServiceStatus(phase="Progressing", canary_weight=weight)
    plan = rollout.plan_capacity(spec, status, stable_replicas=replicas)
    assert (plan.stable, plan.canary) == expected


def test_rendered_replicas_follow_the_weight() -> None:
    """The canary starts with one replica and grows to the stable size at 100%; then goes."""
    world = canary_world()
    for _ in range(5):
        world.tick(60)
    assert world.scales[1:] == [(2, 1), (2, 2)]
    world.tick()
    assert world.scales[-1] == (2, 0)


def _capacity(
    phase: str,
    weight: int,
    *,
    replicas: dict[str, int],
    observed: int,
    gpus: int = 1,
    surge: int | None = None,
) -> tuple[int | None, int]:
    """`plan_capacity` for a spec with these replica bounds, GPUs and surge bound."""
    spec = make_spec(
        runtime={"replicas": replicas, "resources": {"limits": {"nvidia.com/gpu": gpus}}},
        rollout={"maxSurgeGPUs": surge} if surge is not None else {},
    )
    status = InferenceServiceStatus(phase=phase, canary_weight=weight)
    plan = rollout.plan_capacity(spec, status, stable_replicas=observed)
    return plan.stable, plan.canary


@pytest.mark.parametrize(
    ("phase", "weight", "replicas", "observed", "surge", "expected"),
    [
        pytest.param("Progressing", 50, {"min": 2, "max": 10}, 6, None, (None, 3),
                     id="autoscaled-canary-follows-observed-stable"),
        pytest.param("Progressing", 50, {"min": 2, "max": 10}, 6, 1, (None, 3),
                     id="autoscaled-ignores-surge-bound"),
        pytest.param("Promoting", 100, {"min": 2, "max": 10}, 7, None, (None, 7),
                     id="autoscaled-promoting"),
        pytest.param("Promoting", 100, {"min": 4, "max": 4}, 4, 1, (4, 4),
                     id="promoting-keeps-stable-full-despite-surge"),
        pytest.param("Promoting", 20, {"min": 4, "max": 4}, 4, None, (4, 4),
                     id="promoting-canary-full-whatever-the-recorded-weight"),
        pytest.param("Succeeded", 0, {"min": 3, "max": 3}, 3, 1, (3, 0), id="no-rollout"),
        pytest.param("Succeeded", 0, {"min": 2, "max": 10}, 5, None, (None, 0),
                     id="no-rollout-autoscaled"),
    ],
)  # fmt: skip
def test_capacity_by_phase_and_autoscaling(
    phase: str,
    weight: int,
    replicas: dict[str, int],
    observed: int,
    surge: int | None,
    expected: tuple[int | None, int],
) -> None:
    """Track sizes by phase, with and without an autoscaler.

    An autoscaled stable is left to its autoscaler (None) and sizes the canary from the
    observed count; promotion gives the canary the full size and keeps the stable full; with
    no rollout the canary has no replica.
    """
    got = _capacity(phase, weight, replicas=replicas, observed=observed, surge=surge)
    assert got == expected


@pytest.mark.parametrize(
    ("replicas", "gpus", "surge", "weight", "expected"),
    [
        pytest.param(4, 1, 0, 50, (2, 2), id="own-share-exact-under-zero-surge"),
        pytest.param(4, 2, 3, 50, (3, 2), id="surge-not-a-multiple-of-gpus"),
        pytest.param(101, 1, 0, 1, (100, 2), id="large-fleet-rounds-up-both-shares"),
        pytest.param(200, 1, None, 51, (200, 102), id="large-fleet-canary-ceil"),
    ],
)
def test_surge_bound_rounding(
    replicas: int, gpus: int, surge: int | None, weight: int, expected: tuple[int, int]
) -> None:
    """Whole replicas under a surge bound.

    The canary is ceil(weight x size), the stable keeps ceil of its own share, and
    `maxSurgeGPUs` is counted in whole replicas of `gpus` GPUs each.
    """
    exact = {"min": replicas, "max": replicas}
    got = _capacity(
        "Progressing", weight, replicas=exact, observed=replicas, gpus=gpus, surge=surge
    )
    assert got == expected
    assert all(isinstance(n, int) for n in got)
