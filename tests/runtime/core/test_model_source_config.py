"""The task and the model's source, digest and facts: flags, env, YAML, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from fleetserve_runtime.cli import main, parse_config
from fleetserve_runtime.core.config import load_config

DIGEST = "sha256:" + "0123456789abcdef" * 4


def test_flags_set_the_task_source_digest_and_facts() -> None:
    """`key=value` pairs, comma-separated; a value may hold '='; spaces around are dropped."""
    config = parse_config(
        [
            "--task", "generate", "--model-source", "hf://org/model@0123abc",
            "--model-digest", DIGEST, "--model-metadata", "commit=3f2a9c1, query=a=b,empty=",
        ]
    )  # fmt: skip
    assert config.task == "generate"
    assert config.model_source == "hf://org/model@0123abc"
    assert config.model_digest == DIGEST
    assert config.model_metadata == {"commit": "3f2a9c1", "query": "a=b", "empty": ""}


def test_facts_as_json_from_env_and_as_a_yaml_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JSON object carries values with commas; YAML gives a mapping; the defaults are empty."""
    defaults = load_config({})
    assert (defaults.task, defaults.model_source, defaults.model_digest) == ("auto", None, None)
    assert defaults.model_metadata == {}
    monkeypatch.setenv("FLEETSERVE_MODEL_METADATA", '{"datasets": "wiki,books", "v": "2"}')
    assert parse_config([]).model_metadata == {"datasets": "wiki,books", "v": "2"}
    monkeypatch.delenv("FLEETSERVE_MODEL_METADATA")
    yaml_file = tmp_path / "runtime.yaml"
    yaml_file.write_text("model_metadata:\n  team: search\n  run.id: r-17\n")
    assert load_config({}, yaml_path=yaml_file).model_metadata == {
        "team": "search",
        "run.id": "r-17",
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(
            {"model_metadata": ",".join(f"k{n}=v" for n in range(17))},
            "holds 17 facts; at most 16 are allowed",
            id="seventeen-facts",
        ),
        pytest.param(
            {"model_metadata": "Bad Key=v"}, "model_metadata.Bad Key.\\[key\\]", id="key-grammar"
        ),
        pytest.param({"model_metadata": "-lead=v"}, "String should match pattern", id="key-start"),
        pytest.param({"model_metadata": f"{'k' * 64}=v"}, "at most 63 characters", id="key-length"),
        pytest.param(
            {"model_metadata": f"k={'v' * 257}"}, "at most 256 characters", id="value-length"
        ),
        pytest.param(
            {"model_metadata": "commit"}, "entry 'commit' is not key=value", id="no-equals"
        ),
        pytest.param(
            {"model_metadata": "a=1,a=2"}, "key 'a' appears more than once", id="repeated"
        ),
        pytest.param({"model_metadata": "{not json"}, "not a valid JSON object", id="bad-json"),
        pytest.param({"model_metadata": '["a=b"]'}, "model_metadata", id="json-list"),
        pytest.param({"model_digest": "sha256:abc"}, "model_digest", id="short-digest"),
        pytest.param({"model_digest": "md5:" + "0" * 32}, "model_digest", id="other-digest"),
        pytest.param({"model_source": ""}, "model_source", id="empty-source"),
        pytest.param({"task": "classify"}, "task", id="unknown-task"),
    ],
)
def test_bad_values_are_refused_naming_the_field(overrides: dict[str, str], message: str) -> None:
    """More than 16 facts, keys that are not label-like, long values, malformed digests."""
    with pytest.raises(ValidationError, match=message):
        load_config(overrides)


def test_an_allowlist_without_model_control_needs_a_model_source() -> None:
    """`allowed_model_uris` admits a fetched directory's code; without a source it is stray."""
    allowed = {"allowed_model_uris": "file:///models/model"}
    with pytest.raises(ValidationError, match="or with model_source"):
        load_config(allowed)
    config = load_config({**allowed, "model_source": "s3://models/m"})
    assert config.allowed_model_uris == ["file:///models/model"]


def test_main_says_how_many_facts_are_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    """The command line stops with status 2 and the reason, YAML's mapping held to it too."""
    facts = ",".join(f"k{n}=v" for n in range(17))
    assert main(["serve", "--model-metadata", facts]) == 2
    assert "model_metadata holds 17 facts; at most 16 are allowed" in capsys.readouterr().err
    with pytest.raises(ValidationError, match="holds 20 facts"):
        load_config({"model_metadata": {f"k{n}": "v" for n in range(20)}})
