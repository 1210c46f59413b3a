"""Operator → fetch init container: rendered flags parse, reasons agree, paths meet.

The flags the operator renders parse with the runtime's own parser and name a URI the fetch
accepts; the reasons the fetch writes are those the operator reads; the fetch installs the
model where the runtime is told to serve it from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve_operator import contract
from fleetserve_operator.spec import ModelSpec
from fleetserve_operator.testing import make_spec
from fleetserve_runtime.cli import build_parser
from fleetserve_runtime.storage.command import fetch_options
from fleetserve_runtime.storage.install import MODEL_DIR
from fleetserve_runtime.storage.reasons import Reason
from fleetserve_runtime.storage.uri import parse_uri

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "models").glob("*.yaml"))
DIGEST = "sha256:" + "b" * 64
MODELS: dict[str, dict[str, Any]] = {
    "http-with-allow": {
        "uri": "http://files.local/enc.onnx",
        "digest": DIGEST,
        "storage": {"allowHttp": True},
    },
    "s3-plain-endpoint": {
        "uri": "s3://models/enc",
        "storage": {
            "endpoint": "http://objects.local:8333",
            "allowHttp": True,
            "addressing": "virtual",
        },
    },
}


def _model(name: str) -> ModelSpec:
    if name in MODELS:
        return make_spec(model={"name": "enc", "version": "1", **MODELS[name]}).model
    document = yaml.safe_load(Path(name).read_text())
    return make_spec(**document["spec"]).model


CASES = [*MODELS, *(str(path) for path in EXAMPLES)]


@pytest.mark.parametrize("name", CASES, ids=[Path(c).stem for c in CASES])
def test_rendered_fetch_flags_parse_and_name_a_fetchable_uri(name: str) -> None:
    """Every flag the operator renders is the fetch's; the URI parses with those options."""
    model = _model(name)
    args = build_parser().parse_args([*contract.FETCH_COMMAND[1:], *contract.fetch_args(model)])
    options = fetch_options(args)
    assert options.dest == Path(contract.MODEL_MOUNT)
    assert options.max_bytes == contract.fetch_budget_bytes(model)
    assert args.uri == model.uri
    assert (options.digest and str(options.digest)) == model.digest
    parse_uri(args.uri, allow_http=options.allow_http, digest=options.digest)
    storage = model.storage
    if storage is not None and storage.endpoint is not None:
        assert options.s3.endpoint == storage.endpoint
    if storage is not None and storage.ca_config_map is not None:
        assert options.ca_file == Path(contract.STORAGE_CA_FILE)


def test_the_operator_reads_every_reason_it_names() -> None:
    """The operator knows every reason the fetch writes, spelled the same."""
    assert {str(r) for r in contract.FetchFailure} == {r.value for r in Reason}


def test_the_fetch_installs_what_the_runtime_serves() -> None:
    """The runtime's --model is the directory the fetch installs under its --dest."""
    model = _model(str(EXAMPLES[0]))
    args = build_parser().parse_args([*contract.FETCH_COMMAND[1:], *contract.fetch_args(model)])
    assert contract.FETCHED_MODEL_DIR == MODEL_DIR
    assert contract.runtime_model_uri(model) == f"file://{args.dest / MODEL_DIR}"


def test_a_failed_fetch_writes_a_reason_the_operator_reads(tmp_path: Path) -> None:
    """With the rendered flags and no store there, the termination message is the operator's."""
    model = make_spec(
        model={"name": "enc", "version": "1", "uri": "s3://models/enc",
               "storage": {"endpoint": "https://127.0.0.1:9"}}
    ).model  # fmt: skip
    log = tmp_path / "termination-log"
    done = subprocess.run(
        [sys.executable, "-m", "fleetserve_runtime", *contract.FETCH_COMMAND[1:],
         *contract.fetch_args(model), "--dest", str(tmp_path / "models"),
         "--termination-log", str(log)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    report = json.loads(log.read_text())
    assert set(report) == {"reason", "message"}
    assert report["reason"] == contract.FetchFailure.STORAGE_UNREACHABLE
    assert len(log.read_bytes()) < 4096
