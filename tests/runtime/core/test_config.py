"""Config: defaults, env/YAML/CLI precedence, and refusals that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from fleetserve_runtime.cli import config_flags, main, parse_config
from fleetserve_runtime.core.config import RuntimeConfig, load_config


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


def test_security_defaults() -> None:
    """By default: no model control, no docs, no token, probes and metrics exempt."""
    config = load_config({})
    assert config.model_control == "none"
    assert config.http.api_docs is False
    assert config.auth_token_file is None
    assert config.auth_exempt_paths == ["/v2/health/live", "/v2/health/ready", "/metrics"]
    assert config.admin_host == "127.0.0.1"


def test_lists_and_token_files_from_flags_and_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lists are comma-separated in flags and env; FLEETSERVE_AUTH_TOKEN_FILE sets the token."""
    token = tmp_path / "token"
    token.write_text("t0ken-0123456789\n")
    monkeypatch.setenv("FLEETSERVE_AUTH_TOKEN_FILE", str(token))
    monkeypatch.setenv("FLEETSERVE_ALLOWED_MODEL_URIS", "builtin://synthetic, file:///models/")
    config = parse_config(
        [
            "--model-control", "explicit", "--admin-token-file", str(token),
            "--auth-exempt-paths", "/v2/health/live,/metrics", "--header-timeout-s", "2",
        ]
    )  # fmt: skip
    assert config.auth_token_file == token
    assert config.allowed_model_uris == ["builtin://synthetic", "file:///models/"]
    assert config.auth_exempt_paths == ["/v2/health/live", "/metrics"]
    assert config.http.header_timeout_s == 2.0


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        pytest.param({"model_control": "explicit"}, "admin_token_file", id="explicit-no-token"),
        pytest.param(
            {"model_control": "explicit", "admin_token_file": "TOKEN"},
            "allowed_model_uris",
            id="explicit-no-allowlist",
        ),
        pytest.param(
            {
                "model_control": "explicit",
                "admin_token_file": "TOKEN",
                "allowed_model_uris": "builtin://",
                "admin_port": 8080,
            },
            "admin_port",
            id="admin-port-clash",
        ),  # fmt: skip
        pytest.param({"allowed_model_uris": "builtin://"}, "allowed_model_uris", id="stray"),
        pytest.param({"auth_token_file": "EMPTY"}, "auth_token_file", id="empty-token"),
        pytest.param(
            {"admin_token_file": "SHORT"},
            r"admin_token_file[\s\S]*6-byte token; tokens must be at least 16 bytes",
            id="short-token",
        ),
        pytest.param({"auth_token_file": "MISSING"}, "auth_token_file", id="missing-token"),
        pytest.param({"auth_exempt_paths": "metrics"}, "auth_exempt_paths", id="relative-path"),
        pytest.param({"max_tensor_elements": 10}, "max_tensor_elements", id="elements-low"),
    ],
)
def test_bad_security_config_is_refused(
    tmp_path: Path, overrides: dict[str, object], field: str
) -> None:
    """Unprotected model control and unusable token files stop start-up, naming the field."""
    files = {"TOKEN": "secret-0123456789", "EMPTY": "\n", "SHORT": "s3cret\n"}
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    resolved = {
        key: str(tmp_path / value) if value in (*files, "MISSING") else value
        for key, value in overrides.items()
    }
    with pytest.raises(ValidationError, match=field):
        load_config(resolved)
