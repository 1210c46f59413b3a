"""Prometheus as a metric source: the `MetricSource` protocol and its HTTP client.

Every read of the analysis goes through `MetricSource`, so tests feed numbers through
`testing.FakeMetricSource`/`ScriptedMetricSource` instead of a Prometheus. A failed query
raises `MetricsUnavailable`; a query with no series, or NaN (`value_of`), is no data.
"""

from __future__ import annotations

import json
import math
import time
from http import HTTPStatus
from typing import Any, Protocol

import requests
import urllib3

from fleetserve_operator.errors import MetricsUnavailable

__all__ = ["MetricSource", "PrometheusSource", "value_of"]


class MetricSource(Protocol):
    """Where PromQL results come from."""

    def query(self, promql: str) -> float | None:
        """The single value of an instant query; None when it returns no series."""
        ...

    def query_by(self, promql: str, label: str) -> dict[str, float]:
        """An instant query's series values by their `label` value; {} with no series."""
        ...

    def is_online(self) -> bool:
        """Whether the source answers at all."""
        ...


class PrometheusSource:
    """A `MetricSource` over Prometheus's HTTP API (`GET /api/v1/query`).

    Nothing Prometheus sends is repeated: a failure is reported as the HTTP status code and
    its standard phrase, or a fixed reason, never the body or the server's own reason text,
    so status and Events publish nothing fetched (they are readable by everyone who may read
    the InferenceService). Redirects are not followed: an allowed URL must not lead to one
    that is not. A body longer than `MAX_BODY_BYTES` is a failure, and no more of it is read.
    """

    MAX_BODY_BYTES = 4 * 2**20

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self._timeout_s = timeout_s

    def _failure(self, reason: str) -> MetricsUnavailable:
        return MetricsUnavailable(f"Prometheus {self.url}: {reason}")

    def _get(self, path: str, params: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(status code, body) of one GET; raises `MetricsUnavailable` when none came in time.

        Every wait (to connect, for the headers, for each part of the body) lasts at most
        `timeout_s`, and the body is given up once `timeout_s` have passed since the request
        began: a frozen Prometheus (stopped, or hung: the kernel accepts the connection and
        nothing answers) fails a query after `timeout_s`, one that trickles its answer after
        at most twice that. So a reconcile never waits on Prometheus for long, and a query
        that ran out of time is a failed query, never an answer.
        """
        deadline = time.monotonic() + self._timeout_s
        try:
            # No retries: a failed query is an inconclusive check, and the next reconcile
            # asks again; retrying here would only stall the reconcile.
            with requests.get(
                self.url + path,
                params=params,
                timeout=self._timeout_s,
                allow_redirects=False,
                stream=True,
            ) as response:
                body = bytearray()
                while len(body) <= self.MAX_BODY_BYTES:
                    left = self.MAX_BODY_BYTES + 1 - len(body)
                    chunk = response.raw.read1(left, decode_content=True)
                    if not chunk:
                        break
                    body += chunk
                    if time.monotonic() > deadline:
                        raise self._failure(f"no whole answer within {self._timeout_s:g} s")
                return response.status_code, bytes(body)
        except (requests.Timeout, urllib3.exceptions.TimeoutError):
            raise self._failure(f"no answer within {self._timeout_s:g} s") from None
        except requests.ConnectionError:
            raise self._failure("could not connect") from None
        # The body is read from urllib3 directly, whose errors are not requests'.
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._failure(f"request failed ({type(exc).__name__})") from None

    def _data(self, promql: str) -> Any:
        """The `data` of an instant query's answer; raises `MetricsUnavailable` on failure."""
        status, body = self._get("/api/v1/query", {"query": promql})
        if status != HTTPStatus.OK:
            raise self._failure(f"answered HTTP {_status_text(status)}")
        if len(body) > self.MAX_BODY_BYTES:
            raise self._failure(f"answered more than {self.MAX_BODY_BYTES} bytes")
        try:
            return json.loads(body)["data"]
        except (ValueError, KeyError, TypeError):
            raise self._failure("answered HTTP 200 without an instant-query result") from None

    def query(self, promql: str) -> float | None:
        """The first series' value of `promql`; raises `MetricsUnavailable` on any failure."""
        data = self._data(promql)
        try:
            return _instant_value(data)
        except (ValueError, KeyError, IndexError, TypeError):
            raise self._failure("answered HTTP 200 without an instant-query result") from None

    def query_by(self, promql: str, label: str) -> dict[str, float]:
        """Each series' value of `promql` by its `label`; raises `MetricsUnavailable`."""
        data = self._data(promql)
        try:
            if data["resultType"] != "vector":
                raise TypeError(data["resultType"])
            return {str(s["metric"][label]): float(s["value"][1]) for s in data["result"]}
        except (ValueError, KeyError, IndexError, TypeError):
            raise self._failure("answered HTTP 200 without an instant vector") from None

    def is_online(self) -> bool:
        """Whether Prometheus answers at all (its `/` redirects to the UI: that counts)."""
        try:
            status, _ = self._get("/")
        except MetricsUnavailable:
            return False
        return status < HTTPStatus.BAD_REQUEST


def _status_text(code: int) -> str:
    """`503 Service Unavailable`: the standard phrase, never the one the server sent."""
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


def _instant_value(data: Any) -> float | None:
    """The value of an instant query's `data`: a vector's first sample, or a scalar."""
    result = data["result"]
    if data["resultType"] == "scalar":
        return float(result[1])
    if not result:
        return None
    return float(result[0]["value"][1])


def value_of(source: MetricSource, promql: str) -> float | None:
    """The query's value; NaN (0/0, a quantile of no samples) is no data, like no series."""
    value = source.query(promql)
    return None if value is None or math.isnan(value) else value
