"""kopf registration: which events reach the operator, and how errors become retries.

Every trigger funnels into `Sync.run` (sync.py): on create, update and resume of an
InferenceService; on a resync timer; on a faster rollout timer while a rollout runs or the
fallback carries the traffic (steps fall due by the clock); and on any event of a
Deployment, Service, HTTPRoute or pod the operator manages, so a deleted or edited child is
restored and status follows pod readiness and failures (a crash loop changes no
Deployment). A DELETED watch event only calls `Sync.forget`, to drop the service's gauges
(Kubernetes deletes the children by their owner references). Handlers are synchronous (kopf
runs them in worker threads; the `kubernetes` client blocks). Domain errors are turned into
kopf's retry policy here, in `_kopf_error`, and nowhere else.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from fleetserve_operator import naming
from fleetserve_operator.errors import FleetserveError, InvalidSpec
from fleetserve_operator.spec import ConditionType, InferenceServiceStatus
from fleetserve_operator.sync import Sync

__all__ = ["register"]

logger = logging.getLogger(__name__)


def _kopf_error(
    error: FleetserveError, *, delay_s: float
) -> kopf.PermanentError | kopf.TemporaryError:
    """Only a new spec fixes an invalid one; anything else may heal (a PVC appears), so retry."""
    if isinstance(error, InvalidSpec):
        return kopf.PermanentError(str(error))
    return kopf.TemporaryError(str(error), delay=delay_s)


def _is_ticking(status: kopf.Status, **_: Any) -> bool:
    """Whether the rollout timer runs: a rollout is active or the fallback serves."""
    current = InferenceServiceStatus.model_validate(dict(status))
    fallback = current.condition(ConditionType.FALLBACK_ACTIVE)
    active = current.current_phase.is_rollout_active
    return active or (fallback is not None and fallback.is_true)


class Handlers:
    """The handler functions, bound to one `Sync`."""

    def __init__(self, sync: Sync, *, retry_delay_s: float) -> None:
        self._sync = sync
        self._delay_s = retry_delay_s

    def service_changed(self, body: kopf.Body, reason: str, **_: Any) -> None:
        """Converge and report on create, update and resume of an InferenceService."""
        try:
            error = self._sync.run(dict(body), trigger=str(reason))
        except FleetserveError as exc:
            raise _kopf_error(exc, delay_s=self._delay_s) from exc
        if error is not None:
            raise _kopf_error(error, delay_s=self._delay_s)

    def resync(self, body: kopf.Body, **_: Any) -> None:
        """Timer: re-check what no watch covers (the memory budget, PVCs) and heal missed events.

        A spec error is already in status and waits for a new spec, so only temporary
        errors are raised (and retried).
        """
        self._tick(body, trigger="resync")

    def rollout_tick(self, body: kopf.Body, **_: Any) -> None:
        """Timer while `_is_ticking`: a step or an analysis falls due by the clock alone."""
        self._tick(body, trigger="rollout")

    def _tick(self, body: kopf.Body, *, trigger: str) -> None:
        try:
            self._sync.run(dict(body), trigger=trigger)
        except FleetserveError as exc:
            raise _kopf_error(exc, delay_s=self._delay_s) from exc

    def child_changed(self, body: kopf.Body, **_: Any) -> None:
        """Any event of a managed child or pod: re-converge its InferenceService."""
        meta = body.get("metadata", {})
        owner = meta.get("labels", {}).get(naming.INSTANCE_LABEL)
        if owner is None:
            return
        try:
            self._sync.run_by_name(meta["namespace"], owner, trigger="child")
        except FleetserveError as exc:
            # Event handlers are not retried; the resync timer heals what this one could not.
            logger.warning(
                "re-converging %s/%s after a child event failed: %s", meta["namespace"], owner, exc
            )

    def service_event(self, body: kopf.Body, type: str | None, **_: Any) -> None:
        """On DELETED, forget the InferenceService's gauges; its children go by owner refs.

        `type` is kopf's name for the watch event type; None on the initial listing.
        """
        if type == "DELETED":
            meta = body["metadata"]
            self._sync.forget(meta["namespace"], meta["name"])

    def probe(self, **_: Any) -> int:
        """Liveness: the number of reconciles so far (kopf serves probes on /healthz)."""
        return self._sync.reconcile_count


def register(
    registry: kopf.OperatorRegistry,
    sync: Sync,
    *,
    resync_interval_s: float,
    rollout_tick_s: float,
    retry_delay_s: float,
) -> None:
    """Register every handler of the operator in `registry`."""
    handlers = Handlers(sync, retry_delay_s=retry_delay_s)
    # An explicit registry starts without kopf's implicit login handlers; log in the way
    # `kube` does (in-cluster service account, else $KUBECONFIG).
    kopf.on.login(id="login", registry=registry)(kopf.login_via_client)
    resource = (naming.GROUP, naming.VERSION, naming.PLURAL)
    for cause, on_change in (
        ("create", kopf.on.create),
        ("update", kopf.on.update),
        ("resume", kopf.on.resume),
    ):
        on_change(*resource, id=f"converge-on-{cause}", registry=registry)(handlers.service_changed)
    # A watch event, not an on.delete handler: it needs no finalizer and still sees an
    # object whose finalizer someone removed by hand. A reconcile that finds the object
    # going forgets it earlier.
    kopf.on.event(*resource, id="forget-on-deleted", registry=registry)(handlers.service_event)
    kopf.on.timer(
        *resource, id="resync", interval=resync_interval_s, initial_delay=resync_interval_s,
        registry=registry,
    )(handlers.resync)  # fmt: skip
    kopf.on.timer(
        *resource, id="rollout", interval=rollout_tick_s, when=_is_ticking, registry=registry,
    )(handlers.rollout_tick)  # fmt: skip
    managed = {naming.MANAGED_BY_LABEL: naming.MANAGER}
    # HTTPRoutes too: a weight edited by hand would otherwise send users to a canary, or
    # away from stable, until the next resync. Without the Gateway API CRDs kopf warns
    # ("Unresolved resources cannot be served") and starts watching once they appear.
    # Pods: a container that crashes at start, or whose image cannot be pulled, changes
    # neither its Deployment nor its ReplicaSet; only its pod says so.
    for group, plural in (
        ("apps", "deployments"),
        ("", "services"),
        ("gateway.networking.k8s.io", "httproutes"),
        ("", "pods"),
    ):
        kopf.on.event(group, "v1", plural, labels=managed, registry=registry)(
            handlers.child_changed
        )
    kopf.on.probe(id="reconciles", registry=registry)(handlers.probe)
