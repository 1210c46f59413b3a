"""Config: defaults, env/YAML/CLI precedence, and refusals that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from fleetserve_runtime.cli import config_flags, main, parse_config
from fleetserve_runtime.config import RuntimeConfig, load_config


def test_defaults_match_the_documented_contract() -> None:
    """Default deadline 5 s, max 30 s, queue delay 10 ms."""
    config = load_config({})
    assert config.queue.default_timeout_ms == 5_000
    assert config.queue.max_timeout_ms == 30_000
    assert config.batching.max_queue_delay_ms == 10.0


def test_precedence_cli_over_env_over_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag beats FLEETSERVE_* which beats the YAML file, field by field."""
    yaml_file = tmp_path / "runtime.yaml"
    yaml_file.write_text(
        "name: from-yaml\nport: 9000\nbatching:\n  max_batch_size: 3\n  max_queue_delay_ms: 7\n"
    )
    monkeypatch.setenv("FLEETSERVE_PORT", "9100")
    monkeypatch.setenv("FLEETSERVE_BATCHING_MAX_QUEUE_DELAY_MS", "2")
    config = parse_config(["--config", str(yaml_file), "--max-batch-size", "8"])
    assert config.name == "from-yaml"
    assert config.port == 9100
    assert config.batching.max_batch_size == 8
    assert config.batching.max_queue_delay_ms == 2.0


def test_every_field_has_a_unique_flag() -> None:
    """The CLI is derived from the model: one distinct flag per leaf field, all parseable."""
    flags = config_flags()
    assert len({f.flag for f in flags}) == len(flags)
    leaves = sum(
        len(getattr(info.annotation, "model_fields", None) or [name])
        for name, info in RuntimeConfig.model_fields.items()
    )
    assert len(flags) == leaves
    config = parse_config(["--cache-max-entries", "10", "--memory-budget-bytes", "1000000"])
    assert config.cache.max_entries == 10
    assert config.memory.budget_bytes == 1_000_000


def test_boolean_flags_have_negations() -> None:
    """--no-packing and --no-warmup turn features off."""
    config = parse_config(["--no-packing", "--no-warmup", "--buckets", "8,16,32"])
    assert config.batching.packing is False
    assert config.warmup is False
    assert config.batching.buckets == [8, 16, 32]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        pytest.param(
            {"queue": {"default_timeout_ms": 10_000, "max_timeout_ms": 5_000}},
            "queue.max_timeout_ms",
            id="timeouts",
        ),
        pytest.param({"batching": {"buckets": "32,16"}}, "strictly increasing", id="buckets-order"),
        pytest.param({"batching": {"buckets": "8,x"}}, "comma-separated", id="buckets-junk"),
        pytest.param(
            {"batching": {"buckets": "512", "max_sequence_length": 256}},
            "exceeds max_sequence_length",
            id="bucket-too-long",
        ),
        pytest.param({"batching": {"max_batch_size": 0}}, "max_batch_size", id="batch-size"),
        pytest.param({"device": "tpu"}, "device", id="device"),
        pytest.param({"max_instances": 5000}, "max_instances", id="instances-over-queue"),
    ],
)
def test_bad_config_is_refused_naming_the_field(overrides: dict[str, object], field: str) -> None:
    """Bad values and combinations stop start-up with the field in the message."""
    with pytest.raises(ValidationError, match=field):
        load_config(overrides)


def test_missing_yaml_file_is_an_error(tmp_path: Path) -> None:
    """A config file that does not exist is not silently ignored."""
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config({}, yaml_path=tmp_path / "absent.yaml")


def test_main_exits_2_on_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints the validation error and exits 2 without starting a server."""
    assert main(["serve", "--max-batch-size", "-1"]) == 2
    assert "max_batch_size" in capsys.readouterr().err
