"""The model URI allowlist (`allowed_model_uris`): which URIs model control may load.

Entries are compared part by part (scheme, host, path at `/` boundaries, query exactly), so
no URI reads one way to the check and another way to the loader; `file://` paths are
checked again after symlinks are resolved, on a real directory tree.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from fleetserve_runtime.core.auth import uri_refusal
from fleetserve_runtime.testing import make_config


def _never_directory(path: str) -> bool:
    return False


def _as_is(path: str) -> str:
    return path


def refusal(uri: str, allowed: list[str]) -> str | None:
    """`uri_refusal` on paths that are neither directories nor symlinks."""
    return uri_refusal(uri, allowed, is_directory=_never_directory, real_path=_as_is)


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
        pytest.param("builtin://synthetic?dim=4", None, id="entry-without-query-any-query"),
        pytest.param("builtin://synthetic-evil", "does not match", id="host-not-a-prefix"),
        pytest.param("builtin://minilm-l6", "does not match", id="unlisted"),
        pytest.param("file:///models/enc/v2.pt2?input_width=4", None, id="below-a-directory"),
        pytest.param("file:///models/a.pt2?input_width=4", None, id="glob"),
        pytest.param("file:///models/a.pt?input_width=4", "does not match", id="glob-mismatch"),
        pytest.param(
            "file:///models/sub/a.pt2?input_width=4", "does not match", id="glob-one-segment"
        ),
        pytest.param(
            "file:///models/a.pt2?input_width=4&x=1", "does not match", id="glob-extra-key"
        ),
        pytest.param("file:///models/a.pt2", "does not match", id="glob-missing-key"),
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
    """Parts match part by part, `*` globs; code-running URIs need an exact entry."""
    reason = refusal(uri, ALLOWED)
    assert (reason is None) == (refused is None), reason
    if refused is not None:
        assert refused in str(reason)


QUERY_ENTRY = ["builtin://synthetic?latency_ms=5"]


@pytest.mark.parametrize(
    ("uri", "refused"),
    [
        pytest.param("builtin://synthetic?latency_ms=5", None, id="same-query"),
        pytest.param(
            "builtin://synthetic?latency_ms=5/&latency_ms=3000&dim=4096",
            "'latency_ms' appears more than once",
            id="slash-then-repeated-key",
        ),
        pytest.param("builtin://synthetic?latency_ms=5&dim=4096", "does not match", id="extra"),
        pytest.param("builtin://synthetic?latency_ms=50", "does not match", id="other-value"),
        pytest.param("builtin://synthetic?latency_ms=5/", "does not match", id="value-suffix"),
        pytest.param("builtin://synthetic", "does not match", id="no-query"),
        pytest.param("builtin://synthetic/x?latency_ms=5", None, id="path-below"),
    ],
)
def test_an_entry_with_a_query_admits_only_that_query(uri: str, refused: str | None) -> None:
    """The query of an entry is compared parameter by parameter, never as a string prefix."""
    reason = refusal(uri, QUERY_ENTRY)
    assert (reason is None) == (refused is None), reason
    if refused is not None:
        assert refused in str(reason)


def test_an_entry_without_a_host_admits_every_host_of_its_scheme() -> None:
    """`builtin://` admits every builtin model, and nothing of another scheme."""
    assert refusal("builtin://minilm-l6", ["builtin://"]) is None
    assert refusal("file:///models/x.pt2", ["builtin://"]) is not None


def test_query_parameters_may_come_in_any_order() -> None:
    """Same parameters, same values, another order: the loader reads the same model."""
    assert refusal("builtin://synthetic?dim=4&seed=1", ["builtin://synthetic?seed=1&dim=4"]) is None


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        pytest.param("builtin://synthetic?dim=4&dim=4096", "'dim' appears more than once"),
        pytest.param("builtin://synthetic#frag", "'#fragment' is not allowed"),
        pytest.param("builtin://[oops", "not a valid URI (Invalid IPv6 URL)"),
    ],
)
def test_uris_the_loader_could_read_otherwise_are_refused(uri: str, reason: str) -> None:
    """Repeated keys, fragments and malformed URIs: a reason, never an exception."""
    assert reason in str(refusal(uri, ["builtin://synthetic", "file:///models/enc/"]))


def test_catch_all_patterns_never_admit_code() -> None:
    """`*` allows every weights file, but no module factory or handler directory."""
    assert refusal("file:///x/y.pt2", ["*"]) is None
    assert refusal("my.mod:factory", ["*"]) is not None
    assert refusal("file:///x/dir", ["*"]) is not None


def test_a_directory_named_like_weights_is_refused() -> None:
    """A `.pt2` path that is a directory would run its handler.py: only an exact entry allows it."""
    reason = uri_refusal(
        "file:///models/enc/x.pt2", ALLOWED, is_directory=lambda path: True, real_path=_as_is
    )
    assert reason is not None
    assert "directory" in reason


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """`allowed/` (weights, a link to `/`, a link to a directory outside) and `alias/` -> it."""
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "x.pt").write_bytes(b"weights")
    (allowed / "root").symlink_to("/")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "handler.py").write_text("raise SystemExit('must never run')\n")
    (allowed / "link.pt").symlink_to(outside)
    (tmp_path / "alias").symlink_to(allowed)
    return tmp_path


def on_disk(uri: str, allowed: list[str]) -> str | None:
    return uri_refusal(
        uri, allowed, is_directory=lambda path: Path(path).is_dir(), real_path=os.path.realpath
    )


def test_a_symlink_cannot_lead_out_of_an_allowed_directory(tree: Path) -> None:
    """`allowed/root -> /`: `allowed/root/etc/x.pt` resolves outside `allowed/` and is refused."""
    entry = [f"file://{tree}/allowed/"]
    assert on_disk(f"file://{tree}/allowed/x.pt", entry) is None
    assert "does not match" in str(on_disk(f"file://{tree}/allowed/root/etc/x.pt", entry))
    assert on_disk(f"file://{tree}/allowed/link.pt", entry) is not None


def test_an_entry_through_a_symlink_still_admits_its_own_files(tree: Path) -> None:
    """An entry naming the directory by a link (`alias -> allowed`) admits files in it."""
    assert on_disk(f"file://{tree}/alias/x.pt", [f"file://{tree}/alias/"]) is None
    assert on_disk(f"file://{tree}/alias/root/etc/x.pt", [f"file://{tree}/alias/"]) is not None


def test_malformed_entries_stop_start_up(tmp_path: Path) -> None:
    """An entry the check could not read one way only is a configuration error."""
    token = tmp_path / "admin-token"
    token.write_text("admin-token-0123456789")
    with pytest.raises(ValidationError, match="'dim' appears more than once"):
        make_config(
            model_control="explicit",
            admin_token_file=token,
            allowed_model_uris="builtin://synthetic?dim=4&dim=8",
        )
