"""Access-control decisions: bearer parsing, token comparison, token files, URI allowlist."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetserve_runtime.auth import (
    TokenFile,
    bearer_token,
    read_token,
    token_matches,
    uri_refusal,
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


def test_read_token_strips_and_refuses_empty(tmp_path: Path) -> None:
    """A trailing newline is not part of the token; an empty file is an error."""
    path = tmp_path / "token"
    path.write_text("abc\n")
    assert read_token(path) == b"abc"
    path.write_text(" \n")
    with pytest.raises(ValueError, match="empty"):
        read_token(path)


def test_token_file_follows_replacement_and_fails_closed(tmp_path: Path) -> None:
    """A replaced file's new token is used at once; a missing or empty file matches nothing."""
    path = tmp_path / "token"
    path.write_text("one")
    token = TokenFile(path)
    assert token.current() == b"one"
    replacement = tmp_path / "token.new"
    replacement.write_text("two")
    os.replace(replacement, path)
    assert token.current() == b"two"
    path.unlink()
    assert token.current() is None
    path.write_text("")
    assert token.current() is None
    path.write_text("three")
    assert token.current() == b"three"


def _never_directory(path: str) -> bool:
    return False


ALLOWED = [
    "builtin://synthetic",
    "file:///models/enc/",
    "file:///models/*.pt2?input_width=*",
    "pkg.handlers:create",
    "file:///models/custom",
]


@pytest.mark.parametrize(
    ("uri", "refused"),
    [
        pytest.param("builtin://synthetic", None, id="exact"),
        pytest.param("builtin://synthetic?dim=4", None, id="prefix-query"),
        pytest.param("builtin://synthetic-evil", "does not match", id="prefix-not-a-boundary"),
        pytest.param("builtin://minilm-l6", "does not match", id="unlisted"),
        pytest.param("file:///models/enc/v2.pt2?input_width=4", None, id="prefix-dir"),
        pytest.param("file:///models/a.pt2?input_width=4", None, id="glob"),
        pytest.param("file:///models/a.pt?input_width=4", "does not match", id="glob-mismatch"),
        pytest.param("file:///models/a.bin?input_width=4", "runs code", id="not-weights"),
        pytest.param("file:///models/enc/sub", "runs code", id="directory-by-prefix"),
        pytest.param("file:///models/custom", None, id="directory-exact"),
        pytest.param("file:///models/enc/../../etc/x.pt2", "segments", id="dot-segments"),
        pytest.param("file://host/models/enc/x.pt2", "absolute path", id="remote-host"),
        pytest.param("pkg.handlers:create", None, id="module-exact"),
        pytest.param("pkg.handlers:other", "runs code", id="module-unlisted"),
        pytest.param("builtins:print", "runs code", id="builtins"),
    ],
)
def test_uri_refusal(uri: str, refused: str | None) -> None:
    """Prefixes end at separators, `*` globs; code-running URIs need an exact entry."""
    reason = uri_refusal(uri, ALLOWED, is_directory=_never_directory)
    assert (reason is None) == (refused is None), reason
    if refused is not None:
        assert refused in str(reason)


def test_catch_all_patterns_never_admit_code() -> None:
    """`*` allows every weights file, but no module factory or handler directory."""
    assert uri_refusal("file:///x/y.pt2", ["*"], is_directory=_never_directory) is None
    assert uri_refusal("my.mod:factory", ["*"], is_directory=_never_directory) is not None
    assert uri_refusal("file:///x/dir", ["*"], is_directory=_never_directory) is not None


def test_a_directory_named_like_weights_is_refused() -> None:
    """A `.pt2` path that is a directory would run its handler.py: only an exact entry allows it."""
    reason = uri_refusal("file:///models/enc/x.pt2", ALLOWED, is_directory=lambda path: True)
    assert reason is not None
    assert "directory" in reason
