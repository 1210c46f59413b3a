"""Credentials from a mounted Secret directory, and that none of them reaches a message."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from fleetserve_runtime.storage.credentials import (
    S3Keys,
    WebIdentity,
    bearer_token,
    registry_login,
    s3_keys,
    s3_web_identity,
)
from fleetserve_runtime.storage.reasons import FetchFailed, Reason


def _secret(tmp_path: Path, **files: str) -> Path:
    directory = tmp_path / "secret"
    directory.mkdir(parents=True)
    for name, value in files.items():
        (directory / name).write_text(value)
    return directory


def test_s3_keys(tmp_path: Path) -> None:
    """The S3 key files (and a session token) are read, white space dropped."""
    directory = _secret(tmp_path, accessKeyId="AKIAEXAMPLE\n", secretAccessKey="wJalr-secret-key\n")
    assert s3_keys(directory) == S3Keys("AKIAEXAMPLE", "wJalr-secret-key", None)
    (directory / "sessionToken").write_text("session-token-value")
    assert s3_keys(directory) == S3Keys("AKIAEXAMPLE", "wJalr-secret-key", "session-token-value")
    failure = FetchFailed(Reason.ACCESS_DENIED, "signed with wJalr-secret-key and AKIAEXAMPLE")
    assert "wJalr-secret-key" not in failure.message
    assert "AKIAEXAMPLE" not in failure.message


def test_no_keys_is_anonymous_and_half_a_pair_is_refused(tmp_path: Path) -> None:
    """No key file: anonymous (None); one of the two: AccessDenied naming the missing one."""
    assert s3_keys(None) is None
    directory = _secret(tmp_path)
    assert s3_keys(directory) is None
    (directory / "accessKeyId").write_text("AKIAEXAMPLE")
    with pytest.raises(FetchFailed) as failed:
        s3_keys(directory)
    assert failed.value.reason is Reason.ACCESS_DENIED
    assert "secretAccessKey" in failed.value.message


def test_web_identity(tmp_path: Path) -> None:
    """A `webIdentityToken` file and a `roleArn` make a web identity to exchange."""
    directory = _secret(tmp_path, webIdentityToken="eyJ.token", roleArn="arn:aws:iam::1:role/r")
    assert s3_web_identity(directory) == WebIdentity(
        directory / "webIdentityToken", "arn:aws:iam::1:role/r"
    )
    assert s3_web_identity(_secret(tmp_path / "other")) is None


def test_bearer_token(tmp_path: Path) -> None:
    """The token file's value, or None without one (or an empty one)."""
    assert bearer_token(_secret(tmp_path, token="hf_abcdef\n")) == "hf_abcdef"
    assert bearer_token(_secret(tmp_path / "empty", token="\n")) is None


@pytest.mark.parametrize(
    "key", ["registry.local:5000", "https://registry.local:5000", "https://registry.local:5000/v1/"]
)
def test_registry_login_by_host(tmp_path: Path, key: str) -> None:
    """A login's key names its registry with or without scheme and path."""
    auth = base64.b64encode(b"robot:pa55:word").decode()
    config = {"auths": {"other.local": {"auth": "eDp5"}, key: {"auth": auth}}}
    directory = _secret(tmp_path, **{".dockerconfigjson": json.dumps(config)})
    assert registry_login(directory, "registry.local:5000") == ("robot", "pa55:word")
    assert registry_login(directory, "third.local") is None


def test_registry_login_from_username_and_password(tmp_path: Path) -> None:
    """`username` and `password` serve when there is no `auth`."""
    config = {"auths": {"r.local": {"username": "u", "password": "p4ssword"}}}
    directory = _secret(tmp_path, **{".dockerconfigjson": json.dumps(config)})
    assert registry_login(directory, "r.local") == ("u", "p4ssword")


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("not json", id="not-json"),
        pytest.param('{"auths": {"r.local": {"auth": "!!"}}}', id="not-base64"),
        pytest.param('{"auths": {"r.local": {"auth": "bm9jb2xvbg=="}}}', id="no-colon"),
    ],
)
def test_bad_docker_config_is_access_denied(tmp_path: Path, content: str) -> None:
    """A config that cannot be read is AccessDenied, and its content is not quoted."""
    directory = _secret(tmp_path, **{".dockerconfigjson": content})
    with pytest.raises(FetchFailed) as failed:
        registry_login(directory, "r.local")
    assert failed.value.reason is Reason.ACCESS_DENIED
    assert "bm9jb2xvbg" not in failed.value.message
