"""What kopf writes into an InferenceService's annotations holds no literal env value."""

from __future__ import annotations

import copy
import json
from typing import Any

import kopf

from fleetserve_operator.controller.settings import OperatorConfig, apply_kopf_settings
from fleetserve_operator.testing import make_service

SECRET = "hunter2-db-password"


def _storage() -> kopf.DiffBaseStorage:
    settings = kopf.OperatorSettings()
    apply_kopf_settings(settings, OperatorConfig())
    return settings.persistence.diffbase_storage


def _service(value: str) -> dict[str, Any]:
    env = [{"name": "DB_PASSWORD", "value": value}, {"name": "MODE", "value": "fast"}]
    service = make_service({"runtime": {"env": env}})
    service["metadata"]["annotations"] = {"team": "search"}
    return service


def _written(raw: dict[str, Any]) -> tuple[dict[str, str], kopf.BodyEssence]:
    """The annotations kopf's diff-base storage patches onto `raw`, and the essence."""
    storage = _storage()
    body = kopf.Body(raw)
    essence = storage.build(body=body)
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=essence)
    return dict(patch["metadata"]["annotations"]), essence


def test_the_last_handled_configuration_holds_no_env_value() -> None:
    """The annotation kopf writes has a digest where the spec has a literal value."""
    annotations, _ = _written(_service(SECRET))
    assert annotations  # kopf stores the configuration it handled
    for key, text in annotations.items():
        assert SECRET not in text, key
        assert "fast" not in text, key
    stored = json.loads(annotations["serving.fleetserve.io/last-handled-configuration"])
    assert stored["spec"]["runtime"]["env"][0]["name"] == "DB_PASSWORD"
    assert stored["spec"]["runtime"]["env"][0]["value"].startswith("sha256:")
    assert stored["metadata"]["annotations"] == {"team": "search"}


def test_a_new_env_value_is_still_an_update_and_the_same_one_is_not() -> None:
    """The digest follows the value; the stored essence reads back as the one built."""
    raw = _service(SECRET)
    annotations, essence = _written(raw)
    _, changed = _written(_service("another-password"))
    assert changed != essence
    stored = copy.deepcopy(raw)
    stored["metadata"]["annotations"].update(annotations)
    storage = _storage()
    assert storage.fetch(body=kopf.Body(stored)) == storage.build(body=kopf.Body(stored))
    # The body kopf hands to the handlers keeps its value.
    assert raw["spec"]["runtime"]["env"][0]["value"] == SECRET
