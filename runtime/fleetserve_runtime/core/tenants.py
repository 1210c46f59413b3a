"""Tenants: who a request is for, what it may ask, and how much it may hold at once.

The tenants table (`tenants.file`, a mounted Secret, YAML or JSON) lists each tenant's
name, bearer tokens, fair-share weight, quota (`max_requests`: requests in flight at once,
queued, running or streaming) and the priority classes it may ask for. `TenantsFile` reads
it, validated, and reads it again whenever the file changes, as `auth.TokenFile` does; an
unreadable or invalid file yields no table, so tenant tokens stop matching (fail closed).

`identify` is the decision the edge makes per request: the tenant whose token the request
bears, or the one a trusted gateway names in `X-Fleetserve-Tenant` (only where
`tenants.trust_header` allows it; otherwise a request carrying the header is refused), or
the default tenant. Tokens are found by their SHA-256 digest and then compared in constant
time, so the look-up costs the same for any token and leaks nothing of one. `TenantLoad`
counts each tenant's requests in flight and refuses one over its quota with
`TenantOverQuota` (429 + Retry-After). The tenant of the request being served travels in
`CURRENT_TENANT`, a context variable the edge sets and the engines read: without a table
it stays None and every engine behaves as it did without tenants.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleetserve_runtime.core.auth import MIN_TOKEN_BYTES, token_matches
from fleetserve_runtime.core.errors import InvalidInput, TenantOverQuota
from fleetserve_runtime.core.fair_share import DEFAULT_TENANT
from fleetserve_runtime.core.priority import Priority

__all__ = [
    "CURRENT_TENANT",
    "MAX_TENANTS",
    "TENANT_HEADER",
    "Tenant",
    "TenantDirectory",
    "TenantLoad",
    "TenantSpec",
    "TenantTable",
    "TenantsFile",
    "default_tenant",
    "identify",
    "read_table",
    "refuse_tenant_header",
]

log = logging.getLogger("fleetserve.tenants")

TENANT_HEADER = "x-fleetserve-tenant"
MAX_TENANTS = 256
MAX_TOKENS_PER_TENANT = 16
PriorityName = Literal["high", "normal", "low"]


class TenantSpec(BaseModel):
    """One row of the tenants table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    """A DNS label: it becomes a metrics label value and a cache salt."""
    tokens: list[Annotated[str, Field(min_length=MIN_TOKEN_BYTES, max_length=4096)]] = Field(
        min_length=1, max_length=MAX_TOKENS_PER_TENANT
    )
    """Bearer tokens that identify the tenant (several, so one can be rotated at a time)."""
    weight: float = Field(1.0, gt=0, le=1000)
    """Share of the engine, relative to the other tenants waiting in the same class."""
    max_requests: int | None = Field(None, ge=1, le=1_000_000)
    """Most requests in flight at once (queued, running or streaming); None: no quota."""
    priorities: list[PriorityName] = Field(["normal", "low"], min_length=1, max_length=3)
    """Priority classes the tenant may ask for."""

    @field_validator("tokens")
    @classmethod
    def _check_tokens(cls, tokens: list[str]) -> list[str]:
        for token in tokens:
            if token != token.strip() or len(token.encode()) < MIN_TOKEN_BYTES:
                msg = (
                    f"tokens must be at least {MIN_TOKEN_BYTES} bytes without surrounding "
                    "whitespace (e.g. the output of `openssl rand -hex 32`)"
                )
                raise ValueError(msg)
        return tokens


class TenantTable(BaseModel):
    """The tenants file: at most `MAX_TENANTS` tenants, names and tokens unique."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenants: list[TenantSpec] = Field(max_length=MAX_TENANTS)

    @model_validator(mode="after")
    def _check_unique(self) -> TenantTable:
        names = [tenant.name for tenant in self.tenants]
        if len(set(names)) != len(names):
            msg = "tenant names must be unique"
            raise ValueError(msg)
        tokens = [token for tenant in self.tenants for token in tenant.tokens]
        if len(set(tokens)) != len(tokens):
            msg = "a token may belong to one tenant only"
            raise ValueError(msg)
        return self


@dataclass(frozen=True, slots=True)
class Tenant:
    """The tenant a request is served for, as the edge and the engines use it."""

    name: str
    weight: float = 1.0
    max_requests: int | None = None
    priorities: frozenset[Priority] = frozenset({Priority.NORMAL, Priority.LOW})

    @property
    def default_priority(self) -> Priority:
        """The class of a request that asks for none: normal, else its lowest allowed."""
        return Priority.NORMAL if Priority.NORMAL in self.priorities else max(self.priorities)

    @classmethod
    def of(cls, spec: TenantSpec) -> Tenant:
        """The tenant a table row describes."""
        return cls(
            spec.name,
            spec.weight,
            spec.max_requests,
            frozenset(Priority.parse(name) for name in spec.priorities),
        )


CURRENT_TENANT: contextvars.ContextVar[Tenant | None] = contextvars.ContextVar(
    "fleetserve_tenant", default=None
)
"""The tenant of the request being served; None on a server without a tenants table."""


@dataclass(frozen=True, slots=True)
class TenantDirectory:
    """A table, indexed: tenants by name, and by the SHA-256 digest of each token."""

    by_name: dict[str, Tenant]
    by_digest: dict[bytes, tuple[bytes, Tenant]]

    @classmethod
    def of(cls, table: TenantTable) -> TenantDirectory:
        """`table`, indexed."""
        by_name = {spec.name: Tenant.of(spec) for spec in table.tenants}
        by_digest = {
            hashlib.sha256(token.encode()).digest(): (token.encode(), by_name[spec.name])
            for spec in table.tenants
            for token in spec.tokens
        }
        return cls(by_name, by_digest)

    def by_token(self, presented: bytes | None) -> Tenant | None:
        """The tenant whose token `presented` is (found by digest, compared in constant time)."""
        if presented is None:
            return None
        entry = self.by_digest.get(hashlib.sha256(presented).digest())
        if entry is None or not token_matches(presented, entry[0]):
            return None
        return entry[1]


def read_table(path: Path) -> TenantTable:
    """The table in `path` (YAML or JSON); `ValueError` naming the file when it is invalid."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        msg = f"tenants file {path} is not valid YAML or JSON: {exc}"
        raise ValueError(msg) from None
    try:
        return TenantTable.model_validate(data)
    except ValidationError as exc:
        msg = f"tenants file {path} is invalid: {exc}"
        raise ValueError(msg) from None


class TenantsFile:
    """The tenants table kept in a file, re-read whenever the file's identity or contents change.

    As `auth.TokenFile`: a mounted Secret is updated by swapping a symlink, so the next
    request after an update sees the new table. An unreadable or invalid file yields an
    empty directory: no tenant token matches until the file is fixed.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._signature: tuple[int, ...] | None = None
        self._directory = TenantDirectory({}, {})

    def current(self) -> TenantDirectory:
        """The table as the file holds it now (empty when the file is missing or invalid)."""
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            if self._signature is not None:
                log.error(
                    "tenants file unreadable; no tenant token matches", extra={"why": str(exc)}
                )
            self._signature, self._directory = None, TenantDirectory({}, {})
            return self._directory
        signature = (stat.st_ino, stat.st_dev, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        if signature != self._signature:
            self._signature = signature
            try:
                self._directory = TenantDirectory.of(read_table(self.path))
            except (OSError, ValueError) as exc:
                log.error("tenants file unusable; no tenant token matches", extra={"why": str(exc)})
                self._directory = TenantDirectory({}, {})
            else:
                log.info("tenants file read", extra={"path": str(self.path)})
        return self._directory

    def knows(self, presented: bytes | None) -> bool:
        """Whether `presented` is one of the table's tokens (it authenticates a request)."""
        return self.current().by_token(presented) is not None


def identify(
    table: TenantsFile,
    *,
    presented: bytes | None,
    header: str | None,
    trust_header: bool,
    default: Tenant,
) -> Tenant:
    """The tenant a request is served for.

    `header` is the `X-Fleetserve-Tenant` value: honoured only with `trust_header` (a
    gateway in front authenticated the caller), where it must name a tenant of the table;
    without it, a request carrying the header is refused, so nobody believes a setting took
    effect that did not. Otherwise the tenant whose token `presented` is, else `default`.
    `InvalidInput` names the header in both refusals.
    """
    directory = table.current()
    if header is not None:
        if not trust_header:
            msg = (
                f"{TENANT_HEADER} is honoured only from a trusted gateway "
                "(tenants.trust_header); send the tenant's bearer token instead"
            )
            raise InvalidInput(msg, param=TENANT_HEADER)
        tenant = directory.by_name.get(header.strip())
        if tenant is None:
            msg = f"{TENANT_HEADER} names no tenant of the tenants table: {header[:64]!r}"
            raise InvalidInput(msg, param=TENANT_HEADER)
        return tenant
    return directory.by_token(presented) or default


def refuse_tenant_header(header: str | None) -> None:
    """Refuse a request that names a tenant to a runtime without a tenants table.

    `InvalidInput` names the header: the caller must not believe it was served as that tenant.
    """
    if header is not None:
        msg = (
            f"{TENANT_HEADER} names a tenant, but this runtime has no tenants table "
            "(tenants.file); remove the header"
        )
        raise InvalidInput(msg, param=TENANT_HEADER)


def default_tenant(*, weight: float, max_requests: int | None) -> Tenant:
    """The tenant of requests without a tenant's token: normal and low, like any caller."""
    return Tenant(DEFAULT_TENANT, weight, max_requests)


class TenantLoad:
    """Requests in flight per tenant, and the quota check (event loop only)."""

    def __init__(self, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        self._in_flight: dict[str, int] = {}

    def in_flight(self, name: str) -> int:
        """Requests of tenant `name` in flight now."""
        return self._in_flight.get(name, 0)

    def enter(self, tenant: Tenant) -> None:
        """Count one more request of `tenant`; `TenantOverQuota` when it is at its quota."""
        held = self._in_flight.get(tenant.name, 0)
        if tenant.max_requests is not None and held >= tenant.max_requests:
            msg = (
                f"tenant {tenant.name!r} has {held} requests in flight, its quota "
                f"(max_requests); retry after {self.retry_after_s:g}s"
            )
            raise TenantOverQuota(msg, retry_after_s=self.retry_after_s, tenant=tenant.name)
        self._in_flight[tenant.name] = held + 1

    def leave(self, tenant: Tenant) -> None:
        """One request of `tenant` ended."""
        held = self._in_flight.get(tenant.name, 0) - 1
        if held > 0:
            self._in_flight[tenant.name] = held
        else:
            self._in_flight.pop(tenant.name, None)
