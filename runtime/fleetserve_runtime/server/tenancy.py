"""The tenants middleware: which tenant a request is for, and its quota, at the door.

Between the bearer-token check and the routes (`app`): it identifies the tenant
(`core.tenants.identify`: a tenant's token, or `X-Fleetserve-Tenant` from a trusted
gateway), refuses a request whose tenant is at its quota with 429 + Retry-After before the
body is read, counts the tenant's request, and serves the request with the tenant in
`CURRENT_TENANT`, where admission (allowed priorities), the engines (fair share, cache
salt) and the result cache find it. The request holds its place in the quota until its
answer is sent, a stream's last byte included. Installed only with a tenants table.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetserve_runtime.core.auth import bearer_token
from fleetserve_runtime.core.config import TenantsConfig
from fleetserve_runtime.core.errors import InvalidInput, TenantOverQuota
from fleetserve_runtime.core.metrics import TenantMetrics
from fleetserve_runtime.core.tenants import (
    CURRENT_TENANT,
    TENANT_HEADER,
    Tenant,
    TenantLoad,
    TenantsFile,
    default_tenant,
    identify,
)
from fleetserve_runtime.server.responses import failure_response

__all__ = ["Tenancy", "TenantMiddleware"]


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
        self.metrics: TenantMetrics | None = None
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

    def _declare(self, metrics: TenantMetrics) -> None:
        """Every tenant's series at 0, once the registry exists (first request)."""
        for name in (self.default.name, *self.table.current().by_name):
            metrics.declare(name)
        self._declared = True


class TenantMiddleware:
    """Identify the tenant, hold its quota for the request's life; see the module docstring."""

    def __init__(self, app: ASGIApp, *, tenancy: Tenancy, exempt: frozenset[str]) -> None:
        self.app = app
        self.tenancy = tenancy
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request as its tenant's, or answer 400 / 429 for it."""
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            tenant = self.tenancy.admit(headers.get("authorization"), headers.get(TENANT_HEADER))
        except (InvalidInput, TenantOverQuota) as exc:
            await failure_response(exc, scope["path"])(scope, receive, send)
            return
        token = CURRENT_TENANT.set(tenant)
        try:
            await self.app(scope, receive, send)
        finally:
            CURRENT_TENANT.reset(token)
            self.tenancy.release(tenant)
