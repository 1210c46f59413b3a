"""Which URLs an InferenceService may make the operator call: the operator's allowlists.

`spec.rollout.analysis.prometheusUrl` and `spec.rollout.webhooks[].url` make the operator send
requests from its own place in the cluster network, so without a check anyone who may create
an InferenceService could point it at any address the operator reaches. The operator's config
lists the Prometheus base URLs it may query (`allowed_prometheus_urls`; its own
`prometheus_url` is always allowed) and the webhook URLs it may call (`allowed_webhook_urls`;
empty: none).

Matching is structural, never a string prefix (`http://prom:9090@evil` starts with
`http://prom:9090`): a URL is allowed when its scheme, host and port equal an entry's and its
path is the entry's path or lies below it, segment by segment (`/prom` allows `/prom/eu`, not
`/prometheus`). Ports default by scheme. A URL with credentials, a query, a fragment, dot
segments or percent-escapes in its path is never allowed: each could make the request land
elsewhere than the comparison saw.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from fleetserve_operator.analysis.prometheus import MetricSource, PrometheusSource
from fleetserve_operator.errors import InvalidSpec

__all__ = [
    "PROMETHEUS_URL_FIELD",
    "BaseUrl",
    "PrometheusAllowlist",
    "UrlAllowlist",
    "parse_base_url",
]

PROMETHEUS_URL_FIELD = "spec.rollout.analysis.prometheusUrl"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_PATH_RE = re.compile(r"(/[A-Za-z0-9._~-]*)*")


@dataclass(frozen=True, slots=True)
class BaseUrl:
    """A Prometheus base URL reduced to what decides where a request goes."""

    scheme: str
    host: str
    port: int
    segments: tuple[str, ...]

    def contains(self, other: BaseUrl) -> bool:
        """True when `other` is this URL or lies below it."""
        return (self.scheme, self.host, self.port) == (
            other.scheme,
            other.host,
            other.port,
        ) and other.segments[: len(self.segments)] == self.segments


def parse_base_url(url: str) -> BaseUrl:
    """`url` as a `BaseUrl`.

    Raises:
        ValueError: `url` is no plain http(s) base URL; the message says why.
    """
    parts = urlsplit(url)  # raises ValueError itself for a malformed IPv6 host
    if parts.scheme not in _DEFAULT_PORTS:
        raise ValueError("must start with http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials")
    if parts.query or parts.fragment:
        raise ValueError("must not have a query or a fragment")
    if not parts.hostname:
        raise ValueError("has no host")
    port = parts.port  # raises ValueError for a port that is no number in 0..65535
    if _PATH_RE.fullmatch(parts.path) is None:
        raise ValueError("its path may hold only letters, digits, '/', '-', '.', '_' and '~'")
    segments = tuple(segment for segment in parts.path.split("/") if segment)
    if any(segment in (".", "..") for segment in segments):
        raise ValueError("its path must not hold '.' or '..' segments")
    return BaseUrl(
        scheme=parts.scheme,
        host=parts.hostname,
        port=_DEFAULT_PORTS[parts.scheme] if port is None else port,
        segments=segments,
    )


class UrlAllowlist:
    """The base URLs the operator may call for one purpose, and the check of a spec's URL."""

    def __init__(self, urls: Iterable[str], *, purpose: str, setting: str) -> None:
        """`urls`: the allowed base URLs; each must pass `parse_base_url` (else ValueError).

        `purpose` and `setting` name them in a refusal: "the Prometheus URLs this operator
        may query", "allowed_prometheus_urls".
        """
        self._entries = tuple(parse_base_url(url) for url in urls)
        self._purpose = purpose
        self._setting = setting

    def check(self, url: str, field: str) -> None:
        """Refuse `url`, the value of the spec's `field`, when it lies outside the allowlist.

        Raises:
            InvalidSpec: naming `field`, and why.
        """
        try:
            candidate = parse_base_url(url)
        except ValueError as exc:
            raise InvalidSpec(field, f"{url!r} {exc}") from None
        if not any(entry.contains(candidate) for entry in self._entries):
            msg = (
                f"{url!r} is not among {self._purpose}; its administrator allows more with "
                f"the operator's {self._setting} setting"
            )
            raise InvalidSpec(field, msg)


class PrometheusAllowlist:
    """The Prometheus base URLs the operator may query, and the check of a spec's URL."""

    def __init__(self, urls: Iterable[str]) -> None:
        """`urls`: the allowed base URLs; each must pass `parse_base_url` (else ValueError)."""
        self._urls = UrlAllowlist(
            urls,
            purpose="the Prometheus URLs this operator may query",
            setting="allowed_prometheus_urls",
        )

    def check(self, url: str) -> None:
        """Refuse a `spec.rollout.analysis.prometheusUrl` outside the allowlist.

        Raises:
            InvalidSpec: naming `spec.rollout.analysis.prometheusUrl`, and why.
        """
        self._urls.check(url, PROMETHEUS_URL_FIELD)

    def source(self, url: str) -> MetricSource:
        """A `PrometheusSource` for `url`, only once `check` has passed it.

        `sync` builds every metric source through this, so no request can reach a URL
        outside the allowlist, whichever path asked for it.
        """
        self.check(url)
        return PrometheusSource(url)
