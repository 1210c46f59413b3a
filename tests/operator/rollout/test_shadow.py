"""The shadow stage before the first step: the canary at weight 0, judged on copies.

Every row of the `Shadowing` phase: its start once the canary is Ready, the first step on a
shown agreement, the rollback on a shown disagreement (naming the measured agreement), on
no verdict within `maxDuration`, on abort or a crash, and `promote`; the ConfigMap the
stable pods follow, filled only while shadowing; the umbrella Service that keeps the canary
out of live traffic with the `replicas` provider.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from fleetserve_operator import contract, naming, observe, render, rollout
from fleetserve_operator.naming import Track
from fleetserve_operator.observe import Observation
from fleetserve_operator.records import Manifest
from fleetserve_operator.rollout import IncrementCounter, OperatorCounter
from fleetserve_operator.spec import (
    InferenceServiceStatus,
    RolloutCommand,
    RolloutSpec,
    ShadowCounts,
    TrackStatus,
)
from fleetserve_operator.testing import make_spec
from fleetserve_operator.testing.rollout import (
    OWNER,
    World,
    changed,
    event_reasons,
    stable_world,
    start_v2,
    weights,
)

SHADOW = {"shadow": {"fraction": 0.2, "minCompared": 100, "maxDuration": "5m"}}
AGREEING = ShadowCounts(mirrored=600, errors=0, compared=600, agreed=600)
DISAGREEING = ShadowCounts(mirrored=200, errors=0, compared=200, agreed=120)


def _shadowing(**knobs: Any) -> World:
    """v1 stable, v2's canary Ready and shadowed (the stable pods told to copy to it)."""
    world = stable_world(**(SHADOW | knobs))
    start_v2(world)
    assert world.status.phase == "Shadowing"
    return world


def _of_kind(world: World, kind: str) -> list[Manifest]:
    return [child for child in world.children_seen if child["kind"] == kind]


def _target(world: World) -> dict[str, Any] | None:
    (config_map,) = _of_kind(world, "ConfigMap")
    assert config_map["metadata"]["name"] == naming.shadow_target_name(OWNER.name)
    text = config_map["data"][contract.SHADOW_TARGET_KEY]
    return json.loads(text) if text else None


def _deployment(world: World, track: Track) -> Manifest:
    (found,) = [
        d
        for d in _of_kind(world, "Deployment")
        if d["metadata"]["labels"][naming.TRACK_LABEL] == track
    ]
    return found


def test_a_ready_canary_is_shadowed_at_weight_0_before_the_first_step() -> None:
    world = _shadowing()
    assert world.status.canary_weight == 0
    assert world.routes[-1] == {Track.STABLE: 100, Track.CANARY: 0, Track.FALLBACK: 0}
    assert _target(world) == {
        "url": "http://demo-canary.ns.svc:80",
        "fraction": 0.2,
        "version_label": "2",
        "min_cosine": 0.99,
    }
    stage = world.status.rollout.shadow
    assert stage is not None
    assert (stage.since, stage.until) == ("2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z")
    assert "ShadowStarted" in event_reasons(world)


def test_the_copies_are_labelled_with_the_version_status_names_under_rollout() -> None:
    world = _shadowing()
    model = world.spec.model.model_copy(update={"version": "3"})
    spec = world.spec.model_copy(update={"model": model})
    children = render.desired_children(OWNER, spec, world.status)
    (config_map,) = [child for child in children if child["kind"] == "ConfigMap"]
    target = json.loads(config_map["data"][contract.SHADOW_TARGET_KEY])
    assert target["version_label"] == world.status.canary_version == "2"


def test_only_the_stable_pods_follow_the_target_and_never_restart_for_it() -> None:
    """The mount and the flag are in stable's template from the start; the canary has none."""
    world = _shadowing()
    assert world.rolled(Track.STABLE) == []  # stable kept its template through Shadowing
    for track, follows in ((Track.STABLE, True), (Track.CANARY, False)):
        pod = _deployment(world, track)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        flag = ["--shadow-file", contract.SHADOW_TARGET_FILE]
        has_flag = any(container["args"][i : i + 2] == flag for i in range(len(container["args"])))
        volumes = [v for v in pod["volumes"] if "configMap" in v]
        assert has_flag is follows
        assert bool(volumes) is follows
    world.shadow = AGREEING
    world.tick(60)
    assert world.rolled(Track.STABLE) == []


def test_a_shown_agreement_takes_the_first_step_and_stops_the_copies() -> None:
    world = _shadowing()
    world.shadow = AGREEING
    world.tick(30)
    assert world.status.phase == "Shadowing"  # not due yet: evidence only
    stage = world.status.rollout.shadow
    assert stage is not None
    assert (stage.compared, stage.agreement, stage.mirrored, stage.error_rate) == (
        600,
        1.0,
        600,
        0.0,
    )
    world.tick(30)
    assert (world.status.phase, world.status.canary_weight) == ("Progressing", 1)
    assert world.status.rollout.shadow is None
    assert _target(world) is None
    assert weights(world)[-1] == 1
    assert "ShadowPassed" in event_reasons(world)
    assert world.status.rollout.analyses[-1].verdict == "Passed"


def test_a_shown_disagreement_is_rolled_back_at_once_naming_the_agreement() -> None:
    """A rejection acts at the look it happens; the reason carries the measured agreement."""
    world = _shadowing()
    world.clear()
    world.shadow = DISAGREEING
    world.tick(5)
    assert (world.status.phase, world.status.canary_weight) == ("RolledBack", 0)
    message = world.status.rollout.message
    assert message.startswith("ShadowFailed: version 2 withdrawn at 0%: at the shadow stage")
    assert "agreement 0.6 (120 of 200 answers)" in message
    assert world.of(IncrementCounter) == [
        IncrementCounter(OperatorCounter.ROLLBACKS, "ShadowFailed")
    ]
    assert world.canary is None
    assert _target(world) is None
    assert world.status.rollout.shadow is None
    assert set(weights(world)) == {0}  # the canary never had a share


def test_no_verdict_within_max_duration_rolls_back() -> None:
    """No series: inconclusive at every look, never a pass; at maxDuration, rolled back."""
    world = _shadowing()
    for _ in range(4):
        world.tick(60)
        assert world.status.phase == "Shadowing"
        assert "NoData" in world.status.rollout.message
    world.tick(60)
    assert world.status.phase == "RolledBack"
    assert "ShadowInconclusive" in world.status.rollout.message
    assert "maxDuration 5m" in world.status.rollout.message


def test_too_few_answers_never_pass() -> None:
    world = _shadowing()
    world.shadow = ShadowCounts(mirrored=50, errors=0, compared=50, agreed=50)
    world.tick(60)
    assert world.status.phase == "Shadowing"
    assert "TooFewRequests" in world.status.rollout.message


def test_abort_and_a_crash_while_shadowing_roll_back() -> None:
    world = _shadowing()
    world.command(RolloutCommand.ABORT, "now")
    assert world.status.phase == "RolledBack"
    assert _target(world) is None
    crashed = _shadowing()
    crashed.canary = changed(crashed.canary, restarts=1)
    crashed.tick()
    assert crashed.status.phase == "RolledBack"
    assert _target(crashed) is None


def test_promote_ends_the_stage_unjudged_at_the_first_step() -> None:
    world = _shadowing()
    world.command(RolloutCommand.PROMOTE, "next")
    assert (world.status.phase, world.status.canary_weight) == ("Progressing", 1)
    assert "ShadowSkipped" in event_reasons(world)
    assert _target(world) is None


def test_pause_does_not_apply_while_shadowing() -> None:
    world = _shadowing()
    world.command(RolloutCommand.PAUSE, "1")
    assert world.status.phase == "Shadowing"
    assert world.status.rollout.acknowledged[-1].result == "ignored in phase Shadowing"


@pytest.mark.parametrize(
    ("phase", "stable_only"),
    [
        ("Starting", True),
        ("Shadowing", True),
        ("Progressing", False),
        ("Succeeded", False),
    ],
)
def test_with_replicas_traffic_the_umbrella_service_keeps_the_canary_out(
    phase: str, stable_only: bool
) -> None:
    """Before and during the stage the Service every client reaches selects stable's pods."""
    spec = make_spec(
        model={"name": "demo", "version": "2", "uri": "builtin://synthetic"},
        rollout=SHADOW | {"interval": "60s"},
    )
    status = InferenceServiceStatus.model_validate(
        {"phase": phase, "canaryVersion": "2", "stableVersion": "1"}
    )
    children = render.desired_children(OWNER, spec, status)
    (umbrella,) = [
        c for c in children if c["kind"] == "Service" and c["metadata"]["name"] == OWNER.name
    ]
    selected = umbrella["spec"]["selector"].get(naming.TRACK_LABEL)
    assert selected == (Track.STABLE.value if stable_only else None)
    assert rollout.stable_only(spec, status) is stable_only
    seen = Observation(generation=1, deployments={}, problem=None, now="", stable_only=stable_only)
    ready = {track: TrackStatus(ready_replicas=1) for track in (Track.STABLE, Track.CANARY)}
    assert observe.effective_canary_weight(status, seen, ready) == (0 if stable_only else 50)


def test_the_shadow_spec_is_validated_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"rollout.shadow.maxDuration must be at least"):
        RolloutSpec.model_validate({"interval": "2m", "shadow": {"maxDuration": "1m"}})
    with pytest.raises(ValidationError, match="min_agreement|minAgreement"):
        RolloutSpec.model_validate({"shadow": {"minAgreement": 1}})
    with pytest.raises(ValidationError, match="fraction"):
        RolloutSpec.model_validate({"shadow": {"fraction": 0}})
