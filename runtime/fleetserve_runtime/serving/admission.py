"""Who may ask what of the scheduler: a request's priority class and deadline.

Priority decides who is computed first and, when KV blocks run out, who is preempted; a long
deadline lets one request hold a sequence slot for minutes. So asking for more than the
defaults (priority `high`, a timeout above the server's default) is a privilege: only a
request bearing the priority token (`priority_token_file`) gets it, anyone else's is refused
with a 403 naming the header or field. Asking for less (`low`, a shorter timeout) is open to
every caller. On a server with a tenants table (`core.tenants`) a tenant may ask for the
classes its row allows (`high` included, if listed) and no other; the priority token still
grants any. Both the encoder's routes (`/v2/.../infer`, `/v1/...:predict`) and the
generation routes take this one decision; it is pure, `api` passes header values and
whether the caller holds the token in.

`Tenancy` is the door's other half on a server with a tenants table: which tenant a request
is for (`core.tenants.identify`) and its quota of requests in flight (`TenantLoad`), shared
by the HTTP middleware and the gRPC listener, with the per-tenant metrics.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from fleetserve_runtime.core.auth import bearer_token
from fleetserve_runtime.core.config_sections import TenantsConfig
from fleetserve_runtime.core.errors import Forbidden, InvalidInput, TenantOverQuota
from fleetserve_runtime.core.priority import Priority
from fleetserve_runtime.core.tenants import (
    CURRENT_TENANT,
    Tenant,
    TenantLoad,
    TenantsFile,
    default_tenant,
    identify,
    refuse_tenant_header,
)

__all__ = [
    "PRIORITY_HEADER",
    "TIMEOUT_HEADER",
    "Scheduling",
    "Tenancy",
    "TenantCounters",
    "scheduling",
    "served_as_tenant",
]

PRIORITY_HEADER = "x-fleetserve-priority"
TIMEOUT_HEADER = "x-fleetserve-timeout-ms"
PRIORITY_FIELD = "parameters.priority"
TIMEOUT_FIELD = "parameters.timeout_ms"


class TenantCounters(Protocol):
    """The per-tenant series the door counts into (`core.metrics.TenantCounters`).

    A protocol, so this pure module does not import the metrics (and their threads).
    """

    def declare(self, tenant: str) -> None:
        """Create `tenant`'s series at 0."""

    def observe_request(self, tenant: str) -> None:
        """Count one request of `tenant` admitted past its quota."""

    def observe_rejection(self, tenant: str) -> None:
        """Count one 429 of `tenant`."""


@dataclass(frozen=True, slots=True)
class Scheduling:
    """The priority class and deadline (ms; None: the server's default) a request gets."""

    priority: Priority
    timeout_ms: int | None


def _timeout_header(value: str) -> int:
    """The timeout header's value: at most 18 decimal digits (no sign, `_`, spaces)."""
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        msg = (
            f"{TIMEOUT_HEADER} must be a whole number of milliseconds (digits only), "
            f"got {value[:40]!r}"
        )
        raise InvalidInput(msg)
    return int(value)


def scheduling(
    *,
    priority_header: str | None,
    timeout_header: str | None,
    priority: str | None,
    timeout_ms: int | None,
    default_timeout_ms: int,
    privileged: bool,
    tenant: Tenant | None = None,
) -> Scheduling:
    """What a request gets: headers beat the body's `priority` / `timeout_ms`.

    `InvalidInput` for a value that does not parse; `Forbidden`, naming where it was asked,
    for priority above normal or a timeout above `default_timeout_ms` unless `privileged`
    (the request bears the priority token). With a `tenant`, the priority must be one of
    its allowed classes instead (unless `privileged`), and a request that names none gets
    the tenant's default class. The timeout's upper bound (`max_timeout_ms`) is
    the engine's to check, for every caller.
    """
    priority_from, priority_name = (
        (PRIORITY_HEADER, priority_header) if priority_header else (PRIORITY_FIELD, priority)
    )
    default = "normal" if tenant is None else tenant.default_priority.name
    try:
        level = Priority.parse(priority_name or default)
    except ValueError as exc:
        raise InvalidInput(f"{priority_from}: {exc}", param=priority_from) from None
    timeout_from = TIMEOUT_FIELD
    if timeout_header is not None:
        timeout_from, timeout_ms = TIMEOUT_HEADER, _timeout_header(timeout_header)
    if not privileged:
        if tenant is not None:
            if level not in tenant.priorities:
                allowed = ", ".join(p.name.lower() for p in sorted(tenant.priorities))
                msg = (
                    f"{priority_from} {level.name.lower()} is not allowed for tenant "
                    f"{tenant.name!r}, which may ask for {allowed}"
                )
                raise Forbidden(msg)
        elif level < Priority.NORMAL:
            msg = (
                f"{priority_from} {level.name.lower()} needs the priority token "
                "(priority_token_file); other callers may ask for normal or low"
            )
            raise Forbidden(msg)
        if timeout_ms is not None and timeout_ms > default_timeout_ms:
            msg = (
                f"{timeout_from} {timeout_ms} is above the default of {default_timeout_ms} ms "
                "and needs the priority token (priority_token_file); other callers may ask "
                "for a shorter deadline only"
            )
            raise Forbidden(msg)
    return Scheduling(level, timeout_ms)


class Tenancy:
    """The tenants table and the quota counts, shared by the HTTP and gRPC listeners."""

    def __init__(self, config: TenantsConfig, *, retry_after_s: float) -> None:
        if config.file is None:
            msg = "Tenancy needs tenants.file"
            raise ValueError(msg)
        self.table = TenantsFile(config.file)
        self.trust_header = config.trust_header
        self.default = default_tenant(
            weight=config.default_weight, max_requests=config.default_max_requests
        )
        self.load = TenantLoad(retry_after_s)
        self.metrics: TenantCounters | None = None
        """Set once the runtime (which owns the registry) exists."""
        self._declared = False

    def knows(self, presented: bytes | None) -> bool:
        """Whether `presented` is a tenant's token (it authenticates inference requests)."""
        return self.table.knows(presented)

    def admit(self, authorization: str | None, header: str | None) -> Tenant:
        """The request's tenant, counted in its quota: `InvalidInput` / `TenantOverQuota`."""
        metrics = self.metrics
        if metrics is not None and not self._declared:
            self._declare(metrics)
        try:
            tenant = identify(
                self.table,
                presented=bearer_token(authorization),
                header=header,
                trust_header=self.trust_header,
                default=self.default,
            )
            self.load.enter(tenant)
        except TenantOverQuota as exc:
            if metrics is not None:
                metrics.observe_rejection(exc.tenant)
            raise
        if metrics is not None:
            metrics.observe_request(tenant.name)
        return tenant

    def release(self, tenant: Tenant) -> None:
        """The request of `tenant` was answered: its place in the quota is free again."""
        self.load.leave(tenant)

    def _declare(self, metrics: TenantCounters) -> None:
        """Every tenant's series at 0, once the registry exists (first request)."""
        for name in (self.default.name, *self.table.current().by_name):
            metrics.declare(name)
        self._declared = True


@contextmanager
def served_as_tenant(
    tenancy: Tenancy | None, authorization: str | None, header: str | None
) -> Iterator[None]:
    """Serve one request as its tenant's, for both listeners (HTTP and gRPC).

    Entering raises `InvalidInput` (a tenant header that may not be honoured, or any tenant
    header without a table) or `TenantOverQuota`; inside, `CURRENT_TENANT` holds the tenant
    and its quota counts the request until the block ends (a stream's last byte included).
    """
    if tenancy is None:
        refuse_tenant_header(header)
        yield
        return
    tenant = tenancy.admit(authorization, header)
    token = CURRENT_TENANT.set(tenant)
    try:
        yield
    finally:
        CURRENT_TENANT.reset(token)
        tenancy.release(tenant)
