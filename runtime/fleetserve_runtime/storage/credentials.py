"""Credentials from a mounted Secret directory (`--credentials-dir`), never from the URI.

One value a file (surrounding white space dropped), as a Secret mounted as a volume lays
out its keys:

- `accessKeyId` and `secretAccessKey`, and `sessionToken` if the keys are temporary: S3;
  or `webIdentityToken` (a token to exchange for temporary keys) and `roleArn`.
- `.dockerconfigjson`: registry logins, as a `kubernetes.io/dockerconfigjson` Secret holds
  them (`auths` keyed by registry host, each with `auth` = base64 `user:password`, or
  `username` and `password`).
- `token`: a bearer token for HTTPS, or a Hugging Face access token.

No file, no credentials: the store is asked anonymously. Every value read is remembered by
`redact`, so no message, log line or termination message can show it.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

from fleetserve_runtime.storage.reasons import FetchFailed, Reason
from fleetserve_runtime.storage.redact import remember_secret

__all__ = [
    "S3Keys",
    "WebIdentity",
    "bearer_token",
    "read_secret",
    "registry_login",
    "s3_keys",
    "s3_web_identity",
]

DOCKER_CONFIG_FILE = ".dockerconfigjson"


@dataclass(frozen=True)
class S3Keys:
    """Static S3 keys (with a session token when temporary)."""

    access_key: str
    secret_key: str
    session_token: str | None


@dataclass(frozen=True)
class WebIdentity:
    """A web identity token (the file, read at each exchange) and the role it assumes."""

    token_file: Path
    role_arn: str | None


class _Login(BaseModel):
    auth: str | None = None
    username: str | None = None
    password: str | None = None


class _DockerConfig(BaseModel):
    auths: dict[str, _Login] = {}


def read_secret(path: Path) -> str:
    """The value in `path`, remembered as a secret; AccessDenied if it cannot be read."""
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise FetchFailed(
            Reason.ACCESS_DENIED, f"cannot read the credentials file {path}: {type(exc).__name__}"
        ) from exc
    remember_secret(value)
    return value


def s3_keys(directory: Path | None) -> S3Keys | None:
    """The S3 keys in `directory`, or None when it holds neither key file."""
    if directory is None:
        return None
    access, secret = directory / "accessKeyId", directory / "secretAccessKey"
    if not access.exists() and not secret.exists():
        return None
    if not access.exists() or not secret.exists():
        missing = access if not access.exists() else secret
        raise FetchFailed(
            Reason.ACCESS_DENIED,
            f"the credentials directory {directory} lacks {missing.name}: S3 keys need "
            "accessKeyId and secretAccessKey",
        )
    session = directory / "sessionToken"
    return S3Keys(
        access_key=read_secret(access),
        secret_key=read_secret(secret),
        session_token=read_secret(session) if session.exists() else None,
    )


def s3_web_identity(directory: Path | None) -> WebIdentity | None:
    """The web identity in `directory` (`webIdentityToken`, `roleArn`), or None."""
    if directory is None or not (directory / "webIdentityToken").exists():
        return None
    role = directory / "roleArn"
    return WebIdentity(directory / "webIdentityToken", read_secret(role) if role.exists() else None)


def bearer_token(directory: Path | None) -> str | None:
    """The token in `directory/token`, or None."""
    if directory is None or not (directory / "token").exists():
        return None
    return read_secret(directory / "token") or None


def registry_login(directory: Path | None, registry: str) -> tuple[str, str] | None:
    """(user, password) for `registry` (host[:port]) from `directory/.dockerconfigjson`."""
    if directory is None or not (directory / DOCKER_CONFIG_FILE).exists():
        return None
    path = directory / DOCKER_CONFIG_FILE
    try:
        config = _DockerConfig.model_validate_json(read_secret(path))
    except ValidationError as exc:
        raise FetchFailed(
            Reason.ACCESS_DENIED, f"{path} is not a docker config ({exc.error_count()} errors)"
        ) from None
    for key, login in config.auths.items():
        if _registry_of(key) == registry.lower():
            return _user_password(login, path)
    return None


def _registry_of(key: str) -> str:
    """`https://registry:5000/v1/` and `registry:5000` both name `registry:5000`."""
    return key.split("://", 1)[-1].split("/", 1)[0].lower()


def _user_password(login: _Login, path: Path) -> tuple[str, str]:
    if login.username is not None and login.password is not None:
        remember_secret(login.password)
        return login.username, login.password
    try:
        decoded = base64.b64decode(login.auth or "", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        decoded = ""
    user, colon, password = decoded.partition(":")
    if not colon:
        raise FetchFailed(
            Reason.ACCESS_DENIED, f"{path}: a login's auth is not base64 of user:password"
        )
    remember_secret(password)
    return user, password
