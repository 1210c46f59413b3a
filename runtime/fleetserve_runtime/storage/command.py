"""`fleetserve-runtime fetch`: the storage initializer's command line, for an init container.

Flags become `FetchOptions` (a flag not given keeps the option's default); the fetch writes
JSON lines on stdout: `{"event": "progress", "bytes_done": N, "bytes_total": M or null}` as
bytes arrive, then `{"event": "fetched", "digest": ..., "bytes": N, "files": N, "reused":
bool}` (with `"cache"`: hit, stored, present or unwritable, given `--cache-dir`) and writes the
same record without `event` and `reused` to the termination log
(`--termination-log`, by default /dev/termination-log where /dev exists), which Kubernetes
shows as the init container's termination message: the operator reports from it which bytes
each track serves. On failure it writes `{"event": "failed", "reason": ..., "message": ...}`,
writes `{"reason": ..., "message": ...}` to the termination log and exits 1. A malformed
command line exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from fleetserve_runtime.storage.digests import Digest
from fleetserve_runtime.storage.fetch import fetch
from fleetserve_runtime.storage.install import WORK_DIR
from fleetserve_runtime.storage.options import FetchOptions, HfSettings, S3Settings
from fleetserve_runtime.storage.reasons import FetchFailed, Reason

__all__ = ["EXIT_FETCH_FAILED", "add_arguments", "fetch_options", "run"]

EXIT_FETCH_FAILED = 1
_DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `fetch` subcommand's flags."""
    parser.add_argument("--uri", required=True, help="s3://, oci://, https:// or hf:// URI")
    parser.add_argument("--dest", required=True, type=Path, help="volume to install into")
    parser.add_argument("--digest", help="sha256:<hex> the fetched content must have")
    parser.add_argument("--max-bytes", type=_count, help="most bytes the model may take")
    parser.add_argument("--max-files", type=_count, help="most files (and archive members)")
    parser.add_argument("--ca-file", type=Path, help="PEM bundle to trust instead of the roots")
    parser.add_argument("--credentials-dir", type=Path, help="mounted Secret with credentials")
    parser.add_argument("--allow-http", action="store_true", default=None, help="allow http://")
    parser.add_argument("--connect-timeout-s", type=_seconds, help="longest wait to connect")
    parser.add_argument("--read-timeout-s", type=_seconds, help="longest wait between bytes")
    parser.add_argument("--parallelism", type=_count, help="S3 objects fetched at once")
    parser.add_argument(
        "--cache-dir", type=Path, help="the node's model cache, keyed by the pinned digest"
    )
    parser.add_argument("--s3-endpoint", help="S3 endpoint URL")
    parser.add_argument("--s3-region", help="S3 signing region")
    parser.add_argument("--s3-addressing", choices=["auto", "path", "virtual"])
    parser.add_argument("--s3-web-identity-token-file", type=Path, help="token to exchange")
    parser.add_argument("--s3-role-arn", help="role the web identity token assumes")
    parser.add_argument("--s3-sts-endpoint", help="STS endpoint (default: the S3 endpoint)")
    parser.add_argument("--hf-endpoint", help="Hugging Face hub URL")
    parser.add_argument("--hf-cache-dir", type=Path, help="huggingface_hub cache to use")
    parser.add_argument(
        "--hf-offline", action="store_true", default=None, help="read only the cache"
    )
    parser.add_argument("--termination-log", type=Path, help="where a failure's reason goes")


def run(args: argparse.Namespace) -> int:
    """Fetch as `args` say; the exit status."""
    # The init container's root file system is read-only: huggingface_hub's home (where it
    # looks for a token, where hf_xet keeps its chunk cache) goes in the volume's work area.
    os.environ.setdefault("HF_HOME", str(args.dest / WORK_DIR / "hf-home"))
    try:
        fetched = fetch(args.uri, fetch_options(args), _emit)
    except FetchFailed as exc:
        failure = exc
    except Exception as exc:
        traceback.print_exc()
        failure = FetchFailed(Reason.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
    else:
        record = fetched.record
        done: dict[str, Any] = {
            "digest": record.digest,
            "bytes": record.bytes,
            "files": len(record.files),
        }
        if fetched.cache is not None:
            done["cache"] = fetched.cache.value
        _emit({"event": "fetched", **done, "reused": fetched.reused})
        _write_termination_log(args.termination_log, done)
        return 0
    _emit({"event": "failed", "reason": failure.reason.value, "message": failure.message})
    _write_termination_log(
        args.termination_log, {"reason": failure.reason.value, "message": failure.message}
    )
    return EXIT_FETCH_FAILED


def fetch_options(args: argparse.Namespace) -> FetchOptions:
    """The options `fetch` flags give (those not given keep their defaults)."""
    given = {key: value for key, value in vars(args).items() if value is not None}
    s3 = {key.removeprefix("s3_"): given.pop(key) for key in list(given) if key.startswith("s3_")}
    hf = {key.removeprefix("hf_"): given.pop(key) for key in list(given) if key.startswith("hf_")}
    for unused in ("uri", "termination_log", "command"):
        given.pop(unused, None)
    if "digest" in given:
        try:
            given["digest"] = Digest.parse(given["digest"])
        except ValueError as exc:
            raise FetchFailed(Reason.INVALID_URI, f"--digest: {exc}") from None
    return FetchOptions(**given, s3=S3Settings(**s3), hf=HfSettings(**hf))


def _emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


def _write_termination_log(path: Path | None, report: dict[str, Any]) -> None:
    if path is None and _DEFAULT_TERMINATION_LOG.parent.is_dir():
        path = _DEFAULT_TERMINATION_LOG
    if path is None:
        return
    try:
        path.write_text(json.dumps(report))
    except OSError as exc:
        print(f"fleetserve-runtime: cannot write {path}: {exc.strerror}", file=sys.stderr)


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        msg = f"must be at least 1, not {value}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        msg = f"must be more than 0, not {text}"
        raise argparse.ArgumentTypeError(msg)
    return value
