"""The pydantic models: defaults, parsing helpers, the examples, and the invalid objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from fleetserve_operator.errors import InvalidSpec
from fleetserve_operator.render import Owner, check_semantics
from fleetserve_operator.spec import (
    InferenceServiceSpec,
    InferenceServiceStatus,
    parse_duration_s,
    parse_quantity,
)
from fleetserve_operator.testing import make_spec

ROOT = Path(__file__).resolve().parents[3]
# examples/models/ name stores only a real cluster has; they are checked, not run.
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml")) + sorted(
    (ROOT / "examples" / "models").glob("*.yaml")
)
INVALID = sorted((Path(__file__).resolve().parents[1] / "invalid").glob("*.yaml"))


def _header(path: Path, key: str) -> str:
    prefix = f"# {key}: "
    line = next(line for line in path.read_text().splitlines() if line.startswith(prefix))
    return line.removeprefix(prefix)


def _check(document: dict[str, Any]) -> None:
    meta = document["metadata"]
    spec = InferenceServiceSpec.model_validate(document.get("spec") or {})
    check_semantics(Owner(name=meta["name"], namespace="ns", uid="uid"), spec)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("1Gi", 2**30, id="binary"),
        pytest.param("1.5Gi", 3 * 2**29, id="fraction"),
        pytest.param("512M", 512 * 10**6, id="decimal"),
        pytest.param(1000, 1000, id="int"),
        pytest.param("1e9", 10**9, id="exponent"),
        pytest.param("500m", 0, id="milli-rounds-down"),
    ],
)
def test_parse_quantity(value: int | str, expected: int) -> None:
    """Kubernetes quantities in bytes."""
    assert parse_quantity(value) == expected


def test_parse_quantity_rejects_garbage() -> None:
    """A non-quantity names itself in the error."""
    with pytest.raises(ValueError, match="'lots' is not a Kubernetes quantity"):
        parse_quantity("lots")


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("30s", 30.0), ("1m", 60.0), ("1h30m", 5400.0), ("500ms", 0.5)],
)
def test_parse_duration(value: str, seconds: float) -> None:
    """Go-style durations in seconds."""
    assert parse_duration_s(value) == seconds


def test_defaults_match_the_documented_ones() -> None:
    """A minimal spec gets the issue's defaults (steps 1-5-20-50-100, replicas provider)."""
    spec = make_spec()
    assert spec.rollout.steps == [1, 5, 20, 50, 100]
    assert spec.traffic.provider == "replicas"
    assert not spec.fallback.enabled
    assert spec.runtime.replicas.min == spec.runtime.replicas.max == 1
    assert spec.memory.budget_bytes == 0


def test_wire_names_are_camel_case() -> None:
    """Dumped by alias, fields are camelCase (maxSurgeGPUs keeps its acronym)."""
    dumped = make_spec().model_dump(by_alias=True)
    assert "maxBatchSize" in dumped["batching"]
    assert "maxSurgeGPUs" in dumped["rollout"]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_are_valid(path: Path) -> None:
    """Every example parses and passes the semantic checks."""
    for document in yaml.safe_load_all(path.read_text()):
        _check(document)


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_objects_are_rejected_naming_the_field(path: Path) -> None:
    """Each invalid object fails validation, and the error points at the field."""
    field = _header(path, "field")
    document = yaml.safe_load(path.read_text())
    with pytest.raises((ValidationError, InvalidSpec)) as caught:
        _check(document)
    if isinstance(caught.value, InvalidSpec):
        assert caught.value.field == field
        return
    errors = caught.value.errors()
    paths = [".".join(["spec", *(str(part) for part in error["loc"])]) for error in errors]
    assert any(p.startswith(field) or field.startswith(p) for p in paths), paths


def test_fallback_overrides_merge_over_batching() -> None:
    """Unset override fields follow spec.batching."""
    spec = make_spec(batching={"maxBatchSize": 64}, fallback={"batching": {"maxQueueSize": 8}})
    merged = spec.fallback.batching.merged_over(spec.batching)
    assert (merged.max_batch_size, merged.max_queue_size) == (64, 8)


@pytest.mark.parametrize(
    ("sections", "field"),
    [
        pytest.param({"model": {"name": "m", "version": "1", "uri": "builtin://gpt9"}},
                     "spec.model.uri", id="unknown-builtin"),
        pytest.param({"fallback": {"enabled": True, "batching": {"maxTimeoutMs": 10}}},
                     "spec.fallback.batching", id="merged-timeouts"),
    ],
)  # fmt: skip
def test_semantic_errors_name_the_field(sections: dict[str, Any], field: str) -> None:
    """What the schema cannot see is an InvalidSpec naming the field."""
    spec = make_spec(**sections)
    with pytest.raises(InvalidSpec) as caught:
        check_semantics(Owner(name="demo", namespace="ns", uid="u"), spec)
    assert caught.value.field == field


def test_gpu_track_digest_ignores_scaling_and_defaults() -> None:
    """Replicas and explicitly-set defaults are no rollout; a new version or image is."""
    base = make_spec().gpu_track.digest
    assert make_spec(runtime={"replicas": {"min": 3, "max": 3}}).gpu_track.digest == base
    assert make_spec(batching={"maxBatchSize": 32}).gpu_track.digest == base
    other = make_spec(model={"name": "demo", "version": "2", "uri": "builtin://synthetic"})
    assert other.gpu_track.digest != base
    assert make_spec(runtime={"image": "example/runtime:2"}).gpu_track.digest != base


def test_gpu_count_prefers_the_limit() -> None:
    """GPUs per replica: the limit, else the request, else 0."""
    assert make_spec().runtime.resources.gpu_count == 0
    limited = make_spec(runtime={"resources": {"limits": {"nvidia.com/gpu": 2}}})
    assert limited.runtime.resources.gpu_count == 2


def test_a_status_with_fields_this_operator_does_not_know_is_read_without_them() -> None:
    """Status at any depth drops unknown keys (the spec refuses them, see the invalid objects)."""
    status = InferenceServiceStatus.model_validate(
        {
            "phase": "Progressing",
            "later": 1,
            "rollout": {
                "stepIndex": 2,
                "later": 1,
                "evidence": {"canary": {"requests": 5, "later": 1}, "later": 1},
            },
            "tracks": {"stable": {"replicas": 3, "later": 1}},
        }
    )
    assert status.rollout.step_index == 2
    assert status.rollout.evidence is not None
    assert status.rollout.evidence.canary is not None
    assert status.rollout.evidence.canary.requests == 5
    assert status.tracks.stable is not None
    assert status.tracks.stable.replicas == 3
    assert "later" not in status.model_dump_json()
