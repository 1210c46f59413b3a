"""Rollout webhooks: signed JSON POSTs to the endpoints of `spec.rollout.webhooks`.

Two kinds, both bounded (`timeout` per attempt, at most 10 s, and `retries` more attempts
0.5 s, 1 s, 2 s apart), neither following redirects:

- `confirm`: asked, inside the reconcile, when a step is otherwise ready to advance
  (`rollout.asks_confirmation`); only 2xx from every one lets it. The answer enters the
  rollout as a fact (`rollout.Confirmation`), so the state machine stays pure and a veto
  is recorded in status like any other outcome.
- `notify`: told of the events they list (`rollout.Notify` actions), after the status
  write, on one background thread in order, so a slow or dead endpoint never holds up a
  reconcile. A delivery that fails is counted (`fleetserve_operator_webhook_failures`)
  and posted as a Warning Event; it never changes the rollout.

The body is a `WebhookPayload`; with `secretRef` its HMAC-SHA256 under the Secret's key
goes in `X-Fleetserve-Signature` as `sha256=<hex>` (`verify` is the receiver's check).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime

import requests
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from fleetserve_operator import rollout
from fleetserve_operator.analysis.allowlist import UrlAllowlist
from fleetserve_operator.controller.kube import Cluster, ObjectRef
from fleetserve_operator.errors import ClusterUnavailable, InvalidSpec, bounded
from fleetserve_operator.records import EventNote, rfc3339
from fleetserve_operator.spec import (
    InferenceServiceSpec,
    InferenceServiceStatus,
    WebhookSpec,
    WebhookType,
    parse_duration_s,
)

__all__ = [
    "CONFIRM_EVENT",
    "EVENT_HEADER",
    "SIGNATURE_HEADER",
    "WebhookPayload",
    "Webhooks",
    "signature",
    "verify",
]

logger = logging.getLogger(__name__)
SIGNATURE_HEADER = "X-Fleetserve-Signature"
EVENT_HEADER = "X-Fleetserve-Event"
CONFIRM_EVENT = "ConfirmStep"
"""The `event` of a `confirm` webhook's payload."""
_BACKOFF_S = (0.5, 1.0, 2.0)


class WebhookPayload(BaseModel):
    """The JSON body of every webhook POST (camelCase on the wire)."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, frozen=True)

    event: str
    """A `RolloutEvent` (notify), or `ConfirmStep` (confirm)."""
    namespace: str
    name: str
    """The InferenceService."""
    phase: str
    stable_version: str | None
    canary_version: str | None
    canary_weight: int
    """The canary's weight when the event happened (confirm: the step's, before advancing)."""
    next_weight: int | None = None
    """Confirm: the weight the canary gets if the step advances (100: promotion)."""
    message: str
    time: str
    """When the operator sent it (RFC 3339): reject old ones to stop replays."""
    delivery: str
    """Unique per event and webhook, the same in each retry: drop duplicates by it."""

    def body(self) -> bytes:
        """The bytes that are POSTed and signed."""
        return self.model_dump_json(by_alias=True).encode()


def signature(key: bytes, body: bytes) -> str:
    """The `X-Fleetserve-Signature` value of `body` under `key`: `sha256=<hex>`."""
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def verify(key: bytes, body: bytes, header: str | None) -> bool:
    """Whether `header` is `body`'s signature under `key` (a constant-time comparison)."""
    return header is not None and hmac.compare_digest(signature(key, body), header)


def _payload(
    ref: ObjectRef, status: InferenceServiceStatus, event: str, message: str, now: datetime
) -> WebhookPayload:
    return WebhookPayload(
        event=event,
        namespace=ref.namespace,
        name=ref.name,
        phase=status.current_phase.value,
        stable_version=status.stable_version,
        canary_version=status.canary_version,
        canary_weight=status.canary_weight,
        message=message,
        time=rfc3339(now),
        delivery=uuid.uuid4().hex,
    )


@dataclass(frozen=True, eq=False)
class Webhooks:
    """Posts to a service's webhooks; `failures` counts what could not be delivered."""

    kube: Cluster
    failures: Counter
    _: KW_ONLY
    clock: Callable[[], datetime]
    sleep: Callable[[float], None] = time.sleep
    allowlist: UrlAllowlist | None = None
    notifier: ThreadPoolExecutor = field(
        init=False,
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhooks"),
    )
    """Delivers notifications one at a time, off the reconcile's thread."""

    def confirm(
        self,
        ref: ObjectRef,
        spec: InferenceServiceSpec,
        before: InferenceServiceStatus,
        after: InferenceServiceStatus,
    ) -> rollout.Confirmation:
        """Ask every `confirm` webhook whether the step may go from `before` to `after`."""
        hooks = spec.rollout.webhooks_of(WebhookType.CONFIRM)
        message = f"advance from {before.canary_weight}% to {after.canary_weight}%?"
        payload = _payload(ref, before, CONFIRM_EVENT, message, self.clock())
        payload = payload.model_copy(update={"next_weight": after.canary_weight})
        for hook in hooks:
            failure = self._post(ref, hook, payload)
            if failure is not None:
                self.failures.labels(WebhookType.CONFIRM.value, failure[0]).inc()
                return rollout.Confirmation(False, f"confirm webhook {hook.name}: {failure[1]}")
        return rollout.Confirmation(True, "confirmed by " + ", ".join(h.name for h in hooks))

    def notify(self, ref: ObjectRef, action: rollout.Notify) -> None:
        """Queue the notification; it is sent after the ones queued before it."""
        payload = _payload(ref, action.status, action.event.value, action.message, self.clock())
        self.notifier.submit(self._deliver, ref, action.webhook, payload)

    def drain(self, timeout_s: float = 60.0) -> None:
        """Wait until every queued notification was sent or given up (tests, shutdown)."""
        self.notifier.submit(lambda: None).result(timeout=timeout_s)

    def _deliver(self, ref: ObjectRef, hook: WebhookSpec, payload: WebhookPayload) -> None:
        try:
            failure = self._post(ref, hook, payload)
        except Exception:  # a notification must never take the notifier thread down
            logger.exception("webhook %s of %s/%s", hook.name, ref.namespace, ref.name)
            failure = ("error", "an unexpected error (see the operator's log)")
        if failure is None:
            return
        self.failures.labels(WebhookType.NOTIFY.value, failure[0]).inc()
        detail = f"webhook {hook.name} ({payload.event}): {failure[1]}"
        self.kube.post_event(ref, EventNote("Warning", "WebhookFailed", detail))

    def _prepare(
        self, ref: ObjectRef, hook: WebhookSpec, body: bytes, headers: dict[str, str]
    ) -> tuple[str, str] | None:
        """Sign `body` into `headers`; (reason, detail) when the call must not be made.

        A URL outside the allowlist is refused here too, whichever path asked for the call,
        and a webhook with a `secretRef` whose key cannot be read is never called unsigned.
        """
        if self.allowlist is not None:
            try:
                self.allowlist.check(hook.url, "url")
            except InvalidSpec as exc:
                return "refused", str(exc)
        if hook.secret_ref is not None:
            secret = hook.secret_ref
            try:
                key = self.kube.read_secret(ref.namespace, secret.name, secret.key)
            except ClusterUnavailable as exc:
                return "secret", f"Secret {secret.name} could not be read: {exc}"
            if key is None:
                return "secret", f"Secret {secret.name} has no key {secret.key!r}"
            headers[SIGNATURE_HEADER] = signature(key, body)
        return None

    def _post(
        self, ref: ObjectRef, hook: WebhookSpec, payload: WebhookPayload
    ) -> tuple[str, str] | None:
        """POST `payload` with retries; None when answered 2xx, else (reason, detail)."""
        body = payload.body()
        headers = {"Content-Type": "application/json", EVENT_HEADER: payload.event}
        refused = self._prepare(ref, hook, body, headers)
        if refused is not None:
            return refused
        timeout_s = parse_duration_s(hook.timeout)
        failure = ("unreachable", "not sent")
        for attempt in range(hook.retries + 1):
            if attempt:
                self.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S)) - 1])
            try:
                answer = requests.post(
                    hook.url, data=body, headers=headers, timeout=timeout_s, allow_redirects=False
                )
            except requests.Timeout:
                failure = ("timeout", f"no answer within {hook.timeout}")
            except requests.RequestException as exc:
                failure = ("unreachable", bounded(str(exc), 256))
            else:
                if 200 <= answer.status_code < 300:
                    return None
                failure = ("status", f"answered {answer.status_code}")
        attempts = hook.retries + 1
        return failure[0], f"{failure[1]} ({attempts} attempt{'s' if attempts > 1 else ''})"
