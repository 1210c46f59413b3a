"""`fleetserve-runtime fetch` as a process: JSON lines, exit statuses, the termination log."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fleetserve_e2e.pki import ClusterPki

from fleetserve_runtime.cli import build_parser
from fleetserve_runtime.storage import command
from fleetserve_runtime.storage.command import EXIT_FETCH_FAILED
from tests.runtime.storage.file_server import FileServer, Route

BODY = b"weights" * 1000


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetserve_runtime", "fetch", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _lines(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_fetches_and_reports(server: FileServer, pki: ClusterPki, tmp_path: Path) -> None:
    """Exit 0; progress events, then `fetched` with the digest and the byte count.

    The termination log holds the same record, for the operator to report.
    """
    server.routes["/model.onnx"] = Route(body=BODY)
    sha = hashlib.sha256(BODY).hexdigest()
    uri = f"{server.url('/model.onnx')}#sha256={sha}"
    args = ("--uri", uri, "--dest", tmp_path / "v", "--ca-file", pki.ca_cert)
    done = _run(*args, "--termination-log", tmp_path / "log")
    assert done.returncode == 0, done.stderr
    events = _lines(done.stdout)
    assert events[0] == {"event": "progress", "bytes_done": 0, "bytes_total": len(BODY)}
    assert events[-1] == {
        "event": "fetched",
        "digest": f"sha256:{sha}",
        "bytes": len(BODY),
        "files": 1,
        "reused": False,
    }
    assert (tmp_path / "v/model/model.onnx").read_bytes() == BODY
    report = json.loads((tmp_path / "log").read_text())
    assert report == {"digest": f"sha256:{sha}", "bytes": len(BODY), "files": 1}
    again = _run(*args)
    assert _lines(again.stdout) == [{**events[-1], "reused": True}]


def test_failure_writes_the_termination_log(
    server: FileServer, pki: ClusterPki, tmp_path: Path
) -> None:
    """Exit 1, a `failed` event, and `{"reason", "message"}` in the termination log."""
    uri = f"{server.url('/missing.onnx')}#sha256={'a' * 64}"
    log = tmp_path / "termination-log"
    done = _run(
        "--uri", uri, "--dest", tmp_path / "v", "--ca-file", pki.ca_cert, "--termination-log", log
    )
    assert done.returncode == EXIT_FETCH_FAILED
    written = json.loads(log.read_text())
    assert written["reason"] == "ModelNotFound"
    assert "404" in written["message"]
    assert _lines(done.stdout)[-1] == {"event": "failed", **written}
    assert not (tmp_path / "v/model").exists()


def test_bad_uri_and_digest_are_invalid_uri(tmp_path: Path) -> None:
    """A URI or --digest that cannot be parsed fails InvalidUri, naming the part."""
    log = tmp_path / "log"
    done = _run("--uri", "hf://org/name", "--dest", tmp_path / "v", "--termination-log", log)
    assert done.returncode == EXIT_FETCH_FAILED
    assert json.loads(log.read_text())["reason"] == "InvalidUri"
    assert "no revision" in json.loads(log.read_text())["message"]
    done = _run(
        "--uri", "s3://b/p", "--digest", "md5:x", "--dest", tmp_path / "v", "--termination-log", log
    )
    assert json.loads(log.read_text()) == {
        "reason": "InvalidUri",
        "message": "--digest: 'md5:x' is not a digest of the form sha256:<64 lowercase hex digits>",
    }


def test_malformed_command_line_exits_2(tmp_path: Path) -> None:
    """A missing required flag is a usage error (2), not a fetch failure."""
    done = _run("--uri", "s3://b/p")
    assert done.returncode == 2
    assert "--dest" in done.stderr


def test_an_unexpected_error_is_an_internal_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure no reason explains still writes a termination message: InternalError."""

    def broken(*_: object) -> None:
        msg = "boom"
        raise RuntimeError(msg)

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(command, "fetch", broken)
    log = tmp_path / "log"
    args = build_parser().parse_args(
        ["fetch", "--uri", "s3://b/p", "--dest", str(tmp_path / "v"), "--termination-log", str(log)]
    )
    assert command.run(args) == EXIT_FETCH_FAILED
    assert json.loads(log.read_text()) == {
        "reason": "InternalError",
        "message": "RuntimeError: boom",
    }
