"""Closed-loop streaming HTTP client for OpenAI-style SSE completions, and its latency math.

``bench.generate_bench`` drives every server configuration with it. N clients each send their
next ``/v1/completions`` request (``stream: true``) as soon as the previous stream ends, read
the Server-Sent Events line by line and stamp every chunk that carries text. From those stamps:

- time to first token (TTFT): request sent → first chunk with text;
- inter-token latency (ITL): the gaps between consecutive chunks with text of one stream,
  pooled over all streams (the definition vLLM's serving benchmark uses);
- generated tokens: the ``usage.completion_tokens`` of the stream's last chunk when the server
  sends one, else the number of chunks with text (one token per chunk).

Connections are kept alive and reused. A server may close a connection that the client has
just taken from its pool (llama.cpp's ``llama-server`` closes every connection at the end of a
stream while its headers promise keep-alive); a request that finds its connection closed before
any of its bytes were written is sent again, on another connection, and counted as resent: the
server never saw it. Every other failure ends the request and is counted as failed.

The parsing and the statistics are pure functions, tested without a server.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.loadgen import run_clients

#: Status recorded for a request that got no HTTP response (connection error, timeout).
TRANSPORT_ERROR = 0

#: The SSE end-of-stream sentinel of the OpenAI protocol.
DONE = "[DONE]"

#: How often one request may be sent again after its connection closed before it was written.
MAX_RESENDS = 3


@dataclass(frozen=True)
class ChunkInfo:
    """What one SSE ``data:`` payload of a completion stream says.

    Attributes:
        has_text: The chunk carries generated text (a token, or several).
        completion_tokens: ``usage.completion_tokens`` when the chunk has usage, else None.
        error: The error message of an in-stream error event, else None.
    """

    has_text: bool
    completion_tokens: int | None
    error: str | None


def sse_data(line: bytes) -> str | None:
    """Return the payload of an SSE ``data:`` line, or None for any other line.

    Comments (``:``), ``event:``/``id:`` fields and the blank lines between events carry no
    payload; the protocol allows one optional space after the colon.
    """
    text = line.decode("utf-8").rstrip("\r\n")
    if not text.startswith("data:"):
        return None
    payload = text[len("data:") :]
    return payload[1:] if payload.startswith(" ") else payload


def parse_chunk(payload: str) -> ChunkInfo:
    """Interpret one completion-stream payload (``/v1/completions`` or chat completions).

    Raises:
        ValueError: If the payload is not a JSON object.
    """
    document = json.loads(payload)
    if not isinstance(document, dict):
        raise ValueError(f"stream chunk is not a JSON object: {payload[:80]!r}")
    error = document.get("error")
    if error is not None:
        message = error.get("message") if isinstance(error, dict) else error
        return ChunkInfo(has_text=False, completion_tokens=None, error=str(message))
    usage = document.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return ChunkInfo(
        has_text=any(_choice_text(c) for c in document.get("choices") or ()),
        completion_tokens=int(tokens) if tokens is not None else None,
        error=None,
    )


def _choice_text(choice: Mapping[str, Any]) -> str:
    """Return a choice's generated text: ``text`` (completions) or ``delta.content`` (chat)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return str(delta.get("content") or "")
    return str(choice.get("text") or "")


@dataclass
class StreamRecord:
    """One request's stream as the client saw it.

    Attributes:
        requested_tokens: The request's ``max_tokens``.
        sent_at: When the request was sent (``time.perf_counter``).
        chunk_times: When each chunk with text arrived.
        completion_tokens: Tokens the server reported in its usage, if it did.
        status: HTTP status; ``TRANSPORT_ERROR`` without a response.
        error: An in-stream error, or why the stream broke off.
        finished: The stream ended normally (``[DONE]`` or end of body, no error).
        resent: Times the request was sent again because its connection closed before any of
            its bytes were written (``closed_before_sent``).
    """

    requested_tokens: int
    sent_at: float
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int | None = None
    status: int = TRANSPORT_ERROR
    error: str | None = None
    finished: bool = False
    resent: int = 0

    @property
    def generated_tokens(self) -> int:
        """Tokens generated: the server's usage figure, else one per chunk with text."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.chunk_times)

    @property
    def ttft_s(self) -> float | None:
        """Seconds from sending to the first chunk with text, or None without one."""
        return self.chunk_times[0] - self.sent_at if self.chunk_times else None

    @property
    def gaps_s(self) -> list[float]:
        """Seconds between consecutive chunks with text."""
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]


def quantile(values: Sequence[float], level: float) -> float:
    """Return the nearest-rank quantile of ``values`` at ``level`` in (0, 1]; NaN if empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(math.ceil(level * len(ordered)) - 1, 0)]


@dataclass(frozen=True)
class StreamStats:
    """One configuration's streaming figures over a measured window.

    Attributes:
        sent: Requests sent.
        finished: Streams that ended normally.
        status_counts: Requests per HTTP status (0 = no response).
        errors: Streams that ended with an error, by message (first 80 characters).
        timed_out: The global time limit cut the run short.
        elapsed_s: From the first send to the last stream's end, in seconds.
        generated_tokens: Tokens generated by all streams, finished or not.
        requested_tokens: Sum of ``max_tokens`` over the finished streams.
        short_streams: Finished streams that generated fewer tokens than requested (natural EOS
            on a server that cannot ignore it).
        resent: Sends repeated because a connection closed before the request was written.
        tokens_per_s: ``generated_tokens / elapsed_s``.
        ttft_p50_ms: Median time to first token, in milliseconds.
        ttft_p99_ms: 99th-percentile time to first token.
        itl_p50_ms: Median inter-token latency, in milliseconds.
        itl_p99_ms: 99th-percentile inter-token latency.
    """

    sent: int
    finished: int
    status_counts: Mapping[int, int]
    errors: Mapping[str, int]
    timed_out: bool
    elapsed_s: float
    generated_tokens: int
    requested_tokens: int
    short_streams: int
    resent: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float


def summarise_streams(
    records: Iterable[StreamRecord], *, elapsed_s: float, timed_out: bool
) -> StreamStats:
    """Compute a window's figures from its stream records.

    Every stream counts towards the generated tokens, including those the time limit cut
    short, so that a slow configuration is not flattered by only its completed streams.
    """
    records = list(records)
    done = [r for r in records if r.finished]
    ttfts = [t for r in records if (t := r.ttft_s) is not None]
    gaps = [g for r in records for g in r.gaps_s]
    generated = sum(r.generated_tokens for r in records)
    return StreamStats(
        sent=len(records),
        finished=len(done),
        status_counts=dict(Counter(r.status for r in records)),
        errors=dict(Counter(r.error[:80] for r in records if r.error is not None)),
        timed_out=timed_out,
        elapsed_s=elapsed_s,
        generated_tokens=generated,
        requested_tokens=sum(r.requested_tokens for r in done),
        short_streams=sum(1 for r in done if r.generated_tokens < r.requested_tokens),
        resent=sum(r.resent for r in records),
        tokens_per_s=generated / elapsed_s if elapsed_s > 0 else 0.0,
        ttft_p50_ms=1000.0 * quantile(ttfts, 0.50),
        ttft_p99_ms=1000.0 * quantile(ttfts, 0.99),
        itl_p50_ms=1000.0 * quantile(gaps, 0.50),
        itl_p99_ms=1000.0 * quantile(gaps, 0.99),
    )


@dataclass(frozen=True)
class StreamRequest:
    """One request of the workload, ready to send.

    Attributes:
        body: The serialised JSON body.
        max_tokens: The tokens it asks for.
    """

    body: bytes
    max_tokens: int


def _consume_line(line: bytes, record: StreamRecord) -> bool:
    """Apply one SSE line to ``record``; return True when the stream has ended."""
    payload = sse_data(line)
    if payload is None:
        return False
    if payload.strip() == DONE:
        return True
    chunk = parse_chunk(payload)
    if chunk.has_text:
        record.chunk_times.append(time.perf_counter())
    if chunk.completion_tokens is not None:
        record.completion_tokens = chunk.completion_tokens
    if chunk.error is not None:
        record.error = chunk.error
        return True
    return False


def closed_before_sent(exc: BaseException) -> bool:
    """Return True when ``exc`` says that none of the request reached the connection.

    aiohttp writes a request's headers together with its body in one write, and refuses that
    write with ``ClientConnectionResetError`` when the connection is already closing (the
    server's close arrived after the connection left the pool); it reports the refusal as
    ``ClientOSError`` "Can not write request body", caused by that error. Such a request is
    safe to send again: the server never received a byte of it. A failure after the write
    (the server dropped the connection while holding the request) is not. The same cause can
    also come from waiting for a full write buffer to drain, after bytes went out, but only
    for bodies over aiohttp's 64 KiB buffer limit; this benchmark's are a few kilobytes.
    """
    return isinstance(exc, aiohttp.ClientOSError) and isinstance(
        exc.__cause__, aiohttp.ClientConnectionResetError
    )


async def _exchange(
    session: aiohttp.ClientSession, url: str, request: StreamRequest, record: StreamRecord
) -> None:
    """Send one streaming request once and fill ``record`` as its events arrive."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    async with session.post(url, data=request.body, headers=headers) as response:
        record.status = response.status
        if response.status != 200:
            record.error = f"HTTP {response.status}: {(await response.text())[:200]}"
            return
        async for line in response.content:
            if _consume_line(line, record):
                break


async def stream_one(
    session: aiohttp.ClientSession, url: str, request: StreamRequest, record: StreamRecord
) -> None:
    """Stream one request into ``record``, resending it while it was never written.

    A request is sent again, at most ``MAX_RESENDS`` times, only when ``closed_before_sent``
    holds; ``record.sent_at`` stays the first send, so the resend counts in its TTFT.
    """
    while True:
        try:
            await _exchange(session, url, request, record)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            if closed_before_sent(exc) and record.resent < MAX_RESENDS:
                record.resent += 1
                continue
            record.error = f"{type(exc).__name__}: {exc}"
            return
        record.finished = record.error is None
        return


@dataclass
class _Cursor:
    """The next request to claim; the workers share it (one event loop, so no lock)."""

    next_index: int = 0


async def _worker(
    session: aiohttp.ClientSession,
    url: str,
    requests: Sequence[StreamRequest],
    cursor: _Cursor,
    records: list[StreamRecord],
) -> None:
    """Stream requests back to back until all have been claimed."""
    while cursor.next_index < len(requests):
        request = requests[cursor.next_index]
        cursor.next_index += 1
        record = StreamRecord(requested_tokens=request.max_tokens, sent_at=time.perf_counter())
        records.append(record)
        await stream_one(session, url, request, record)


async def run_streaming_closed_loop(
    url: str,
    requests: Sequence[StreamRequest],
    *,
    concurrency: int,
    time_limit_s: float,
    request_timeout_s: float,
) -> StreamStats:
    """Run ``concurrency`` streaming clients over ``requests`` and summarise the window.

    Args:
        url: The completions endpoint.
        requests: The requests, each sent once, in order.
        concurrency: Clients, each with at most one stream open.
        time_limit_s: Global limit; open streams are cut when it passes (and it says so).
        request_timeout_s: Limit per stream, from send to its last event.

    Returns:
        The window's figures.
    """
    records: list[StreamRecord] = []
    cursor = _Cursor()
    elapsed, timed_out = await run_clients(
        lambda session: _worker(session, url, requests, cursor, records),
        concurrency=concurrency,
        time_limit_s=time_limit_s,
        request_timeout_s=request_timeout_s,
    )
    return summarise_streams(records, elapsed_s=elapsed, timed_out=timed_out)
