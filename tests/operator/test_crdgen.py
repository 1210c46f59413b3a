"""The CRD is generated from the pydantic models, structural, and checked in up to date."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve_operator import crdgen

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / crdgen.DEFAULT_PATH


def _schema() -> dict[str, Any]:
    crd = crdgen.build_crd()
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for name, child in node.get("properties", {}).items():
            found += _walk(child, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                found += _walk(node[key], f"{path}[]")
    return found


def _rules(path: str) -> list[str]:
    node = dict(_walk(_schema()))[path]
    return [rule["rule"] for rule in node.get("x-kubernetes-validations", [])]


def test_checked_in_crd_is_up_to_date() -> None:
    """crds/ holds exactly what crdgen renders (run `make crds` after changing spec.py)."""
    assert CHECKED_IN.read_text() == crdgen.render_crd()


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    """`--check` exits 1 on a difference and 0 once the file is written."""
    target = tmp_path / "crd.yaml"
    target.write_text("stale")
    assert crdgen.main(["--check", str(target)]) == 1
    assert crdgen.main([str(target)]) == 0
    assert crdgen.main(["--check", str(target)]) == 0


def test_schema_is_structural() -> None:
    """No refs, no nullable unions; every node has a type unless it is int-or-string."""
    for path, node in _walk(_schema()):
        assert "$ref" not in node, path
        assert "title" not in node, path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "anyOf" not in node, path
            assert "type" in node, path
        assert node.get("additionalProperties") is not False, path


def test_names_scope_and_subresources() -> None:
    """Group, kind, short name, status subresource and the printer columns."""
    crd = crdgen.build_crd()
    assert crd["metadata"]["name"] == "inferenceservices.serving.fleetserve.io"
    assert crd["spec"]["names"]["shortNames"] == ["fsvc"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if "priority" not in c]
    assert columns == ["Model", "Stable", "Canary", "Weight", "Phase", "Ready", "Age"]
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1]
    assert wide == ["Image", "Fallback Image", "Source", "Digest", "Metadata"]


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        pytest.param(".spec.rollout.steps", "self[i - 1] < x", id="steps-increasing"),
        pytest.param(".spec.rollout.steps", "self[size(self) - 1] == 100", id="steps-end-100"),
        pytest.param(".spec.batching", "self.maxTimeoutMs >= self.defaultTimeoutMs", id="timeouts"),
        pytest.param(".spec.runtime.replicas", "self.min <= self.max", id="replicas"),
        pytest.param(".spec.fallback.replicas", "self.min <= self.max", id="fallback-replicas"),
        pytest.param(".spec.fallback", "nvidia.com/gpu", id="no-gpu-in-fallback"),
        pytest.param(".spec.model", "has(self.uri) != has(self.handler)", id="uri-xor-handler"),
        pytest.param(".spec.traffic", "size(self.parentRefs) > 0", id="gateway-parents"),
        pytest.param("", "self.metadata.name.matches", id="name-dns-1035"),
    ],
)
def test_cel_rules_are_present(path: str, fragment: str) -> None:
    """Each cross-field rule is enforced by the API server, not only in Python."""
    assert any(fragment in rule for rule in _rules(path))


@pytest.mark.parametrize(
    ("path", "key", "value"),
    [
        pytest.param(".spec.rollout.steps", "default", [1, 5, 20, 50, 100], id="steps"),
        pytest.param(".spec.batching.maxBatchSize", "default", 32, id="batch-size"),
        pytest.param(".spec.batching.maxBatchSize", "maximum", 4096, id="batch-size-max"),
        pytest.param(".spec.traffic.provider", "enum", ["gateway-api", "replicas"], id="provider"),
        pytest.param(".spec.runtime", "default", {}, id="object-default-filled-by-server"),
        pytest.param(".spec", "required", ["model"], id="model-required"),
        pytest.param(".spec.memory.reserveFraction", "exclusiveMaximum", True, id="openapi-3.0"),
        pytest.param(".status.conditions", "x-kubernetes-list-map-keys", ["type"], id="conditions"),
    ],
)
def test_schema_carries_defaults_bounds_and_enums(path: str, key: str, value: Any) -> None:
    """Defaults, ranges, enums and required fields come from the pydantic models."""
    assert dict(_walk(_schema()))[path][key] == value


IMAGES = [".spec.runtime.image", ".spec.fallback.image", ".status.rollout.stableSpec.runtime.image"]


@pytest.mark.parametrize("path", IMAGES)
def test_images_have_no_default_so_the_operator_sees_them_unset(path: str) -> None:
    """The API server fills in no image: left out, the operator runs its configured default."""
    node = dict(_walk(_schema()))[path]
    assert "default" not in node
    assert (node["type"], node["minLength"], node["maxLength"]) == ("string", 1, 512)


def test_rendered_yaml_has_no_aliases() -> None:
    """Shared sub-schemas are written out in full (no YAML anchors)."""
    text = crdgen.render_crd()
    assert "&id" not in text
    assert "*id" not in text
    assert yaml.safe_load(text) == crdgen.build_crd()


def test_every_string_list_and_map_is_bounded() -> None:
    """Nothing in spec or status is unbounded: strings, lists, maps and their keys."""
    for path, node in _walk(_schema()):
        if path in (".apiVersion", ".kind"):  # the API server checks these itself
            continue
        kind = node.get("type")
        if kind == "string" or node.get("x-kubernetes-int-or-string"):
            assert "maxLength" in node or "enum" in node, path
        if kind == "array":
            assert "maxItems" in node, path
        if kind == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path
            assert any("size(k) <=" in rule for rule in _rules(path)), path


def test_map_keys_become_a_cel_rule_naming_the_field() -> None:
    """Constrained map keys (no `propertyNames` in a structural schema) are a CEL rule."""
    node = dict(_walk(_schema()))[".spec.runtime.nodeSelector"]
    assert "propertyNames" not in node
    assert "patternProperties" not in node
    (rule,) = node["x-kubernetes-validations"]
    assert rule["rule"].startswith("self.all(k, size(k) <= 317 && k.matches(")
    assert rule["message"].startswith("spec.runtime.nodeSelector keys must")
    assert node["additionalProperties"]["maxLength"] == 63


def test_map_key_rules_name_the_offending_key() -> None:
    """Every key rule's message is an expression that names the first key it refuses."""
    rules = [
        (path, rule)
        for path, node in _walk(_schema())
        for rule in node.get("x-kubernetes-validations", [])
        if rule["rule"].startswith("self.all(k, ")
    ]
    assert any(path.endswith("nodeSelector") for path, _ in rules), [p for p, _ in rules]
    for path, rule in rules:
        condition = rule["rule"].removeprefix("self.all(k, ").removesuffix(")")
        assert f"self.filter(k, !({condition}))[0]" in rule["messageExpression"], path
