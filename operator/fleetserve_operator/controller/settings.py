"""Operator configuration: `OperatorConfig` from `FLEETSERVE_*` variables, and kopf's settings.

`__main__` loads the config once at start-up (a bad value stops the operator with a message
naming the variable; nothing falls back) and `apply_kopf_settings` tunes kopf with it.
"""

from __future__ import annotations

import socket
from typing import Annotated, Literal

import kopf
from pydantic import AfterValidator, AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleetserve_operator.analysis.allowlist import (
    PrometheusAllowlist,
    UrlAllowlist,
    parse_base_url,
)
from fleetserve_operator.controller.leader import LeaseTiming
from fleetserve_operator.spec import DEFAULT_CPU_IMAGE, DEFAULT_IMAGE, Image, RuntimeImages

__all__ = ["OperatorConfig", "apply_kopf_settings", "webhook_allowlist"]


def _base_url(url: str) -> str:
    parse_base_url(url)  # raises ValueError saying what is wrong with it
    return url


_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
AllowedBaseUrl = Annotated[str, Field(max_length=512), AfterValidator(_base_url)]


class OperatorConfig(BaseSettings):
    """Everything `fleetserve-operator run` reads from its environment (`FLEETSERVE_*`)."""

    model_config = SettingsConfigDict(
        env_prefix="FLEETSERVE_", extra="forbid", frozen=True, use_attribute_docstrings=True
    )

    namespaces: list[str] = Field(default_factory=list)
    """Namespaces to watch (JSON list, e.g. `["ml","search"]`); empty: the whole cluster."""
    log_format: Literal["plain", "full", "json"] = "json"
    """kopf's log format: `json` for log collectors, `plain`/`full` for a terminal."""
    verbose: bool = False
    """Debug logging."""
    listen_address: str = Field("0.0.0.0", min_length=1)  # a pod's own IP
    """Address the metrics and liveness endpoints listen on; `127.0.0.1` outside a pod."""
    metrics_port: int = Field(8081, ge=0, le=65535)
    """Port of the operator's own `/metrics` (reconciles, errors, durations); 0 disables it."""
    liveness_port: int = Field(8080, ge=0, le=65535)
    """Port of the `/healthz` liveness endpoint; 0 disables it."""
    prometheus_url: AllowedBaseUrl | None = None
    """Prometheus for the memory-budget check when a service names none in
    `spec.rollout.analysis.prometheusUrl`; unset: services without one are not checked.
    Services may always name this one."""
    allowed_prometheus_urls: list[AllowedBaseUrl] = Field(default_factory=list, max_length=64)
    """Prometheus base URLs a service may name in `spec.rollout.analysis.prometheusUrl`
    besides `prometheus_url` (JSON list, e.g. `["http://prometheus.monitoring:9090"]`). A URL
    is allowed when scheme, host and port are an entry's and its path is the entry's or
    below it; empty: only `prometheus_url`. Any other URL is an invalid spec."""
    allowed_webhook_urls: list[AllowedBaseUrl] = Field(default_factory=list, max_length=64)
    """Base URLs a service's `spec.rollout.webhooks[].url` may name (JSON list, e.g.
    `["https://hooks.example.com/fleetserve"]`), matched as `allowed_prometheus_urls` are;
    empty (the default): no webhook at all, since a webhook makes the operator POST from its
    own place in the cluster network. Any other URL is an invalid spec."""
    runtime_image: Image = DEFAULT_IMAGE
    """Runtime image of the GPU tracks (stable, canary) of every service that sets no
    `spec.runtime.image`; a new one rolls out to them through the canary."""
    runtime_cpu_image: Image = DEFAULT_CPU_IMAGE
    """Runtime image (a CPU-only build) of the fallback track of every service that sets no
    `spec.fallback.image`; a new one replaces their fallback pods."""
    resync_interval_s: float = Field(60.0, ge=1, le=3600)
    """How often every InferenceService is re-checked (memory budget, PVCs, missed events)."""
    rollout_tick_s: float = Field(5.0, ge=0.1, le=600)
    """How often a service with a rollout in progress or an active fallback is re-checked,
    in seconds. A rollout step falls due one `interval` after it began, so keep this well
    below the shortest `spec.rollout.interval`: a step is late by up to this much."""
    retry_delay_s: float = Field(30.0, ge=1, le=3600)
    """Back-off before a create or spec change that failed (the API server, a missing PVC,
    a name taken) is reconciled again, in seconds; an invalid spec waits for a new one."""
    request_timeout_s: float = Field(30.0, gt=0, le=600)
    """Timeout of one API request, in seconds."""
    watch_timeout_s: int = Field(300, ge=10, le=3600)
    """Server-side timeout of a watch, in seconds; the watch then resumes from the last
    version it saw (re-listing when that version is too old)."""
    workers: int = Field(8, ge=1, le=256)
    """Threads for kopf's synchronous activities (starting and stopping the watches, the
    work queue and the resync lane; the liveness probe)."""
    queue_workers: int = Field(8, ge=1, le=64)
    """Threads that reconcile the queued InferenceServices: creates, changes, child and pod
    events, rollout ticks, resyncs. A reconcile mostly waits for the API server."""
    child_event_delay_s: float = Field(1.0, ge=0, le=30)
    """How long a child or pod event waits before its reconcile may start, so that the rest
    of a burst (a Deployment's status and its pods starting) merges into that reconcile. A
    change, a resync and a rollout tick do not wait."""
    leader_election: bool = True
    """Reconcile only while holding the leader Lease, so that of several replicas one works
    and the others wait to take over; false for a single replica or a local run."""
    leader_election_namespace: str = Field(
        "default",
        validation_alias=AliasChoices("FLEETSERVE_LEADER_ELECTION_NAMESPACE", "POD_NAMESPACE"),
        pattern=_DNS_LABEL,
        max_length=63,
    )
    """Namespace of the leader Lease; unset: the pod's own (`POD_NAMESPACE`), else `default`."""
    leader_election_lease: str = Field("fleetserve-operator", pattern=_DNS_LABEL, max_length=63)
    """Name of the leader Lease; replicas sharing it elect one leader among them."""
    pod_name: str = Field(
        default_factory=socket.gethostname, validation_alias="POD_NAME", min_length=1
    )
    """This replica's name in the Lease (a random suffix is added); unset: the host name."""
    lease_duration_s: int = Field(10, ge=2, le=300)
    """How long a standby waits after the leader's last renewal before taking over."""
    renew_deadline_s: float = Field(8.0, gt=0, le=300)
    """The leader exits when it could not renew for this long; below `lease_duration_s`."""
    retry_period_s: float = Field(2.0, gt=0, le=60)
    """How often the leader renews and a standby tries to take over; below the deadline."""

    @model_validator(mode="after")
    def _lease_timing_is_ordered(self) -> OperatorConfig:
        # A leader must give up before a standby may take over, or two replicas could
        # reconcile at once; and it must get to retry a failed renewal within its deadline.
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "FLEETSERVE_RETRY_PERIOD_S < FLEETSERVE_RENEW_DEADLINE_S < "
                "FLEETSERVE_LEASE_DURATION_S must hold"
            )
        return self

    @property
    def lease_timing(self) -> LeaseTiming:
        """The leader election's timing."""
        return LeaseTiming(self.lease_duration_s, self.renew_deadline_s, self.retry_period_s)

    @property
    def runtime_images(self) -> RuntimeImages:
        """The images of the services whose spec names none."""
        return RuntimeImages(gpu=self.runtime_image, cpu=self.runtime_cpu_image)

    @property
    def is_clusterwide(self) -> bool:
        """True when no namespace list restricts the watch."""
        return not self.namespaces

    @property
    def prometheus_allowlist(self) -> PrometheusAllowlist:
        """`allowed_prometheus_urls` and `prometheus_url`, the URLs a service may name."""
        own = [self.prometheus_url] if self.prometheus_url else []
        return PrometheusAllowlist([*self.allowed_prometheus_urls, *own])

    @property
    def webhook_allowlist(self) -> UrlAllowlist:
        """`allowed_webhook_urls`, the URLs a service's webhooks may name."""
        return webhook_allowlist(self.allowed_webhook_urls)


def webhook_allowlist(urls: list[str]) -> UrlAllowlist:
    """The allowlist of webhook base URLs `urls`."""
    return UrlAllowlist(
        urls, purpose="the webhook URLs this operator may call", setting="allowed_webhook_urls"
    )


def apply_kopf_settings(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Tune kopf for this operator; each choice says why.

    kopf handles no resource of the operator (its own watches do): it runs the startup and
    cleanup activities, the login and the liveness probe.
    """
    # kopf's chatter about its activities (e.g. "Handler succeeded") is not for Events.
    settings.posting.enabled = False
    settings.networking.request_timeout = config.request_timeout_s
    settings.execution.max_workers = config.workers
    # One replica runs kopf at a time: the others wait for the leader Lease (`leader`) before
    # starting it, so kopf's peering (and its cluster-scoped CRD) is not needed.
    settings.peering.standalone = True
    settings.peering.clusterwide = config.is_clusterwide
