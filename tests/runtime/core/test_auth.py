"""Access-control decisions: bearer parsing, token comparison, token files.

The model URI allowlist has its own file, test_allowlist.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fleetserve_runtime.core.auth import (
    MIN_TOKEN_BYTES,
    TokenFile,
    bearer_token,
    read_token,
    token_matches,
)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        pytest.param("Bearer abc", b"abc", id="bearer"),
        pytest.param("bearer   abc ", b"abc", id="case-and-spaces"),
        pytest.param("Basic abc", None, id="basic"),
        pytest.param("Bearer", None, id="no-credentials"),
        pytest.param("Bearer ", None, id="blank-credentials"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_bearer_token(header: str | None, token: bytes | None) -> None:
    """Only `Bearer <token>` yields a token."""
    assert bearer_token(header) == token


def test_token_matches_only_equal_tokens() -> None:
    """Equal tokens match; a missing token on either side never does."""
    assert token_matches(b"s3cret", b"s3cret")
    assert not token_matches(b"s3cret", b"s3cret2")
    assert not token_matches(b"", b"s3cret")
    assert not token_matches(None, b"s3cret")
    assert not token_matches(b"s3cret", None)


ONE, TWO, THREE = "token-one-0123456789", "token-two-0123456789", "token-three-0123456789"


def test_read_token_strips_and_refuses_empty_or_short(tmp_path: Path) -> None:
    """A trailing newline is not part of the token; an empty or short file is an error."""
    path = tmp_path / "token"
    path.write_text(ONE + "\n")
    assert read_token(path) == ONE.encode()
    path.write_text(" \n")
    with pytest.raises(ValueError, match="empty"):
        read_token(path)
    path.write_text("x" * (MIN_TOKEN_BYTES - 1) + "\n")
    with pytest.raises(
        ValueError, match=f"15-byte token; tokens must be at least {MIN_TOKEN_BYTES}"
    ):
        read_token(path)
    path.write_text("x" * MIN_TOKEN_BYTES)
    assert read_token(path) == b"x" * MIN_TOKEN_BYTES


def test_token_file_follows_replacement_and_fails_closed(tmp_path: Path) -> None:
    """A replaced file's token is used at once; a missing, empty or short one matches nothing."""
    path = tmp_path / "token"
    path.write_text(ONE)
    token = TokenFile(path)
    assert token.current() == ONE.encode()
    replacement = tmp_path / "token.new"
    replacement.write_text(TWO)
    os.replace(replacement, path)
    assert token.current() == TWO.encode()
    path.unlink()
    assert token.current() is None
    path.write_text("")
    assert token.current() is None
    path.write_text(THREE)
    assert token.current() == THREE.encode()
    path.write_text("short")
    assert token.current() is None


def test_token_file_notices_a_change_that_keeps_size_and_mtime(tmp_path: Path) -> None:
    """Rewritten in place with the same size and modification time: the change time tells."""
    path = tmp_path / "token"
    path.write_text(ONE)
    token = TokenFile(path)
    assert token.current() == ONE.encode()
    before = os.stat(path)
    time.sleep(0.05)  # past the file system's timestamp granularity, so the change time moves
    rewritten = "token-ONE-0123456789"
    assert len(rewritten) == len(ONE)
    path.write_text(rewritten)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    assert after.st_ctime_ns != before.st_ctime_ns
    assert token.current() == rewritten.encode()
