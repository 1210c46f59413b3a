"""Rollout webhooks against a real HTTP server on 127.0.0.1: signed, bounded, vetoing."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import ValidationError

from fleetserve_operator.controller.kube import ObjectRef
from fleetserve_operator.controller.metrics import OperatorMetrics
from fleetserve_operator.controller.settings import OperatorConfig, webhook_allowlist
from fleetserve_operator.controller.sync import Sync
from fleetserve_operator.controller.webhooks import (
    CONFIRM_EVENT,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    WebhookPayload,
    Webhooks,
    verify,
)
from fleetserve_operator.errors import InvalidSpec
from fleetserve_operator.spec import (
    ConditionType,
    InferenceServiceStatus,
    RolloutPhase,
    WebhookSpec,
)
from fleetserve_operator.testing import FakeClock, FakeKube, make_service, make_spec

KEY = b"a-shared-hmac-key"
SECRET = {"name": "hooks", "key": "hmac"}


@dataclass
class Receiver:
    """What the server received, and how it answers (`answers` first, then `status`)."""

    url: str = ""
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)
    status: int = 200
    delay_s: float = 0.0

    def payloads(self) -> list[WebhookPayload]:
        """The bodies received, parsed."""
        return [WebhookPayload.model_validate_json(body) for _, body in self.requests]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """An HTTP server on 127.0.0.1 that records every POST."""
    seen = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.requests.append((dict(self.headers.items()), body))
            time.sleep(seen.delay_s)
            self.send_response(seen.answers.pop(0) if seen.answers else seen.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    seen.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    yield seen
    server.shutdown()
    server.server_close()


class Operator:
    """A FakeKube with one InferenceService under a Sync on a FakeClock.

    `allowed`: the operator's `allowed_webhook_urls`; None: no allowlist (every URL).
    """

    def __init__(self, webhooks: list[dict[str, Any]], allowed: list[str] | None = None) -> None:
        self.webhooks = webhooks
        self.kube = FakeKube(secrets={("ns", SECRET["name"], SECRET["key"]): KEY})
        self.kube.add_service(make_service(self.spec("1")))
        self.clock = FakeClock()
        self.metrics = OperatorMetrics()
        self.sync = Sync(
            self.kube,
            metrics=self.metrics,
            clock=lambda: self.clock.now,
            webhook_allowlist=None if allowed is None else webhook_allowlist(allowed),
        )

    def spec(self, version: str) -> dict[str, Any]:
        """The spec at `version`: steps 50 and 100, 10 s each, no analysis, the webhooks."""
        return {
            "model": {"name": "demo", "version": version, "uri": "builtin://synthetic"},
            "rollout": {"steps": [50, 100], "interval": "10s", "webhooks": self.webhooks},
            "traffic": {"provider": "gateway-api", "parentRefs": [{"name": "gw"}]},
        }

    def reconcile(self, *, after_s: float = 0.0) -> InferenceServiceStatus:
        """One reconcile `after_s` later, its notifications sent; returns the status."""
        self.clock.advance(after_s)
        assert self.sync.run_by_name("ns", "demo", trigger="test") is None
        self.sync.webhooks.drain()
        return self.kube.status_of("ns", "demo")

    def at_first_step(self) -> InferenceServiceStatus:
        """Version 1 stable, version 2's canary at 50%."""
        self.reconcile()
        self.kube.set_ready("demo-stable")
        assert self.reconcile().phase == "Succeeded"
        body = self.kube.objects[("InferenceService", "ns", "demo")]
        body["spec"] = self.spec("2")
        body["metadata"]["generation"] += 1
        assert self.reconcile().phase == "Starting"
        self.kube.set_ready("demo-canary")
        status = self.reconcile()
        assert (status.phase, status.canary_weight) == ("Progressing", 50)
        return status

    def failures(self, kind: str, reason: str) -> float:
        """The webhook failures counted for `kind` and `reason`."""
        labels = {"type": kind, "reason": reason}
        value = self.metrics.registry.get_sample_value(
            "fleetserve_operator_webhook_failures_total", labels
        )
        return value or 0.0

    def reasons(self) -> list[str]:
        """The reasons of the Events posted so far."""
        return [event.reason for event in self.kube.events]


def _notify(receiver: Receiver, *events: str, **knobs: Any) -> dict[str, Any]:
    hook = {"name": "chat", "url": receiver.url, "events": list(events), "secretRef": SECRET}
    return hook | knobs


def test_notifications_are_signed_with_the_secret_key(receiver: Receiver) -> None:
    """Each listed event is POSTed once, signed with the Secret's key; others are not sent."""
    operator = Operator([_notify(receiver, "StepAdvanced", "Promoting")])
    operator.at_first_step()
    assert operator.reconcile(after_s=10).canary_weight == 100
    assert operator.reconcile(after_s=10).phase == "Promoting"
    assert [p.event for p in receiver.payloads()] == ["StepAdvanced", "StepAdvanced", "Promoting"]
    for headers, body in receiver.requests:
        assert verify(KEY, body, headers[SIGNATURE_HEADER])
        assert not verify(b"another key", body, headers[SIGNATURE_HEADER])
        assert headers[EVENT_HEADER] == json.loads(body)["event"]
    first = receiver.payloads()[0]
    assert (first.namespace, first.name, first.canary_version, first.canary_weight) == (
        "ns",
        "demo",
        "2",
        50,
    )


def test_a_failing_notification_is_counted_and_reported_never_rolled_back(
    receiver: Receiver,
) -> None:
    """500 on every attempt: 1 + retries POSTs, a counted failure, a Warning Event."""
    receiver.status = 500
    operator = Operator([_notify(receiver, "StepAdvanced", retries=1)])
    status = operator.at_first_step()
    assert len(receiver.requests) == 2
    assert operator.failures("notify", "status") == 1
    assert "WebhookFailed" in operator.reasons()
    assert status.phase == "Progressing"


def test_a_notification_without_its_key_is_not_sent_unsigned(receiver: Receiver) -> None:
    """A missing Secret key is a counted failure; nothing goes out unsigned."""
    hook = _notify(receiver, "StepAdvanced", secretRef={"name": "hooks", "key": "gone"})
    operator = Operator([hook])
    operator.at_first_step()
    assert receiver.requests == []
    assert operator.failures("notify", "secret") == 1


def _confirm(receiver: Receiver, **knobs: Any) -> dict[str, Any]:
    hook = {"name": "change-window", "type": "confirm", "url": receiver.url, "secretRef": SECRET}
    return hook | knobs


def test_a_confirm_webhook_vetoes_advancing_until_it_answers_2xx(receiver: Receiver) -> None:
    """Asked only when the step is ready; 403 keeps the step, the next pass asks again."""
    receiver.answers = [403]
    operator = Operator([_confirm(receiver, retries=0)])
    operator.at_first_step()
    assert receiver.requests == []  # nothing was ready to advance yet
    status = operator.reconcile(after_s=10)
    assert (status.phase, status.canary_weight) == ("Progressing", 50)
    assert "advancing was vetoed: confirm webhook change-window: answered 403" in (
        status.rollout.message
    )
    assert "StepVetoed" in operator.reasons()
    assert operator.failures("confirm", "status") == 1
    (asked,) = receiver.payloads()
    assert (asked.event, asked.canary_weight, asked.next_weight) == (CONFIRM_EVENT, 50, 100)
    headers, body = receiver.requests[0]
    assert verify(KEY, body, headers[SIGNATURE_HEADER])
    assert operator.reconcile(after_s=5).canary_weight == 50  # not asked between analyses
    assert len(receiver.requests) == 1
    assert operator.reconcile(after_s=5).canary_weight == 100
    assert len(receiver.requests) == 2


def test_a_confirm_webhook_that_does_not_answer_in_time_vetoes(receiver: Receiver) -> None:
    """The timeout bounds each attempt; no answer is a veto, never a pass."""
    receiver.delay_s = 1.0
    operator = Operator([_confirm(receiver, timeout="200ms", retries=0)])
    operator.at_first_step()
    started = time.monotonic()
    status = operator.reconcile(after_s=10)
    assert time.monotonic() - started < 1.0
    assert status.canary_weight == 50
    assert "no answer within 200ms" in status.rollout.message
    assert operator.failures("confirm", "timeout") == 1


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        pytest.param({"name": "x", "url": "ftp://example.com/", "events": ["Promoted"]},
                     "String should match pattern", id="not-http"),
        pytest.param({"name": "x", "url": "http://example.com/"}, "needs events", id="no-events"),
        pytest.param({"name": "x", "type": "confirm", "url": "http://example.com/",
                      "events": ["Promoted"]}, "takes none", id="confirm-with-events"),
        pytest.param({"name": "x", "url": "http://example.com/", "events": ["Promoted"],
                      "timeout": "1m"}, "above 10s", id="timeout"),
    ],
)  # fmt: skip
def test_invalid_webhooks_are_refused_naming_the_field(hook: dict[str, Any], message: str) -> None:
    """Only http(s) URLs; notify needs events, confirm takes none; timeouts are bounded."""
    with pytest.raises(ValidationError, match=message) as caught:
        make_spec(rollout={"webhooks": [hook]})
    assert "rollout.webhooks.0" in str(caught.value)


def test_a_slow_notification_does_not_hold_up_the_reconcile(receiver: Receiver) -> None:
    """Notifications are sent off the reconcile: a 1 s answer does not slow it down."""
    operator = Operator([_notify(receiver, "StepAdvanced")])
    operator.at_first_step()
    receiver.delay_s = 1.0
    operator.clock.advance(10)
    started = time.monotonic()
    assert operator.sync.run_by_name("ns", "demo", trigger="test") is None
    assert time.monotonic() - started < 0.5
    assert operator.kube.status_of("ns", "demo").canary_weight == 100
    operator.sync.webhooks.drain()
    assert [p.canary_weight for p in receiver.payloads()] == [50, 100]


def test_promote_by_hand_is_not_asked_about(receiver: Receiver) -> None:
    """A person's `promote` is a decision already: the confirm webhook is not asked."""
    receiver.status = 403
    operator = Operator([_confirm(receiver, retries=0)])
    operator.at_first_step()
    body = operator.kube.objects[("InferenceService", "ns", "demo")]
    body["metadata"]["annotations"] = {"serving.fleetserve.io/promote": "next"}
    assert operator.reconcile().canary_weight == 100
    assert receiver.requests == []


def test_a_webhook_outside_the_allowlist_is_an_invalid_spec(receiver: Receiver) -> None:
    """The operator may call only `allowed_webhook_urls`: another URL names its field at once.

    Nothing is created and nothing is sent.
    """
    operator = Operator([_notify(receiver, "StepAdvanced")], allowed=["http://hooks.example"])
    error = operator.sync.run_by_name("ns", "demo", trigger="create")
    assert isinstance(error, InvalidSpec)
    assert error.field == "spec.rollout.webhooks[0].url"
    assert "allowed_webhook_urls" in str(error)
    status = operator.kube.status_of("ns", "demo")
    degraded = status.condition(ConditionType.DEGRADED)
    assert degraded is not None
    assert degraded.reason == "InvalidSpec"
    assert status.phase is RolloutPhase.FAILED
    assert [action for action, _, _ in operator.kube.writes] == ["status"]
    assert receiver.requests == []


def test_an_allowlisted_webhook_is_called(receiver: Receiver) -> None:
    """The receiver's base URL in the allowlist: the same service rolls out and is notified."""
    base = receiver.url.removesuffix("/hook")
    operator = Operator([_notify(receiver, "StepAdvanced")], allowed=[base])
    operator.at_first_step()
    assert [p.event for p in receiver.payloads()] == ["StepAdvanced"]


def test_the_sender_refuses_a_url_outside_the_allowlist_whoever_asks(receiver: Receiver) -> None:
    """Past the spec's check too: the webhooks never POST to a URL outside the allowlist."""
    kube = FakeKube()
    metrics = OperatorMetrics()
    hooks = Webhooks(
        kube,
        metrics.webhook_failures,
        clock=lambda: FakeClock().now,
        allowlist=webhook_allowlist(["http://hooks.example"]),
    )
    hook = WebhookSpec.model_validate({"name": "x", "type": "confirm", "url": receiver.url})
    spec = make_spec(rollout={"webhooks": [hook.model_dump(by_alias=True, exclude_unset=True)]})
    status = InferenceServiceStatus()
    answer = hooks.confirm(ObjectRef("ns", "demo", "uid"), spec, status, status)
    assert not answer.allowed
    assert "allowed_webhook_urls" in answer.detail
    assert receiver.requests == []
    labels = {"type": "confirm", "reason": "refused"}
    assert metrics.registry.get_sample_value("fleetserve_operator_webhook_failures_total", labels)


def test_by_default_the_operator_allows_no_webhook(monkeypatch: pytest.MonkeyPatch) -> None:
    """`FLEETSERVE_ALLOWED_WEBHOOK_URLS` unset: every URL is refused; set (JSON): those."""
    monkeypatch.delenv("FLEETSERVE_ALLOWED_WEBHOOK_URLS", raising=False)
    with pytest.raises(InvalidSpec):
        OperatorConfig().webhook_allowlist.check("https://hooks.example/a", "url")
    monkeypatch.setenv("FLEETSERVE_ALLOWED_WEBHOOK_URLS", json.dumps(["https://hooks.example"]))
    OperatorConfig().webhook_allowlist.check("https://hooks.example/a", "url")
    with pytest.raises(InvalidSpec):
        OperatorConfig().webhook_allowlist.check("https://hooks.example.evil/a", "url")
