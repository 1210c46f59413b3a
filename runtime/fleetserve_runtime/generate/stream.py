"""One generation's events as its caller reads them: an async iterator with its own deadline.

The stream lives on the event loop that submitted the request; the engine's worker thread
hands it events through `post` (one event) or `deliver` (one step's events for every stream,
one hop per event loop). The deadline runs on the event loop (a timer), so a 504 is not late
by a step: before the first token it is raised from the iterator, after it an `ErrorEvent`
ends the stream. The stream knows nothing of the engine: it is given a callback that ends
its sequence (at a deadline or `aclose`) and one that says the stream ended.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable

from fleetserve_runtime.core.errors import DeadlineExceeded
from fleetserve_runtime.generate.contracts import (
    ErrorEvent,
    FinishEvent,
    GenerationEvent,
    TokenEvent,
)

__all__ = ["Delivery", "GenerationStream", "deliver"]


class GenerationStream:
    """Events of one generation, as an async iterator; `aclose` cancels it.

    An error before the first `TokenEvent` is raised from the iterator (the caller can still
    answer with a status code); after it, an `ErrorEvent` is the stream's last event.
    """

    def __init__(
        self, *, prompt_tokens: int, request_id: str | None, on_end: Callable[[], None]
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.request_id = request_id
        self._on_end = on_end
        self._loop = asyncio.get_running_loop()
        self._events: deque[GenerationEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._started = False
        self._timer: asyncio.TimerHandle | None = None
        self._cancel: Callable[[], None] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the stream is read on (where its events must be pushed)."""
        return self._loop

    def watch(self, timeout_s: float, cancel: Callable[[], None]) -> None:
        """Start the deadline; `cancel` takes the sequence out at a deadline or `aclose`."""
        self._cancel = cancel
        self._timer = self._loop.call_later(timeout_s, self._expire, timeout_s)

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        while not self._events:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        event = self._events.popleft()
        if isinstance(event, ErrorEvent) and not self._started:
            raise event.error
        if isinstance(event, TokenEvent):
            self._started = True
        return event

    async def aclose(self) -> None:
        """Stop generating: the sequence leaves the batch at the next step and frees its blocks."""
        if not self._ended:
            self._end()
            if self._cancel is not None:
                self._cancel()
        self._events.clear()

    def push(self, events: Iterable[GenerationEvent]) -> None:
        """Queue events (on the event loop); it ends at the final finish or an error event."""
        if self._ended:
            return
        for event in events:
            self._events.append(event)
            if not isinstance(event, TokenEvent) and not (
                isinstance(event, FinishEvent) and not event.final
            ):
                self._end()
                break
        self._wake()

    def post(self, events: list[GenerationEvent]) -> None:
        """`push` from any thread: hand `events` to the stream's event loop."""
        try:
            self._loop.call_soon_threadsafe(self.push, events)
        except RuntimeError:
            # Its loop is closed: nobody is left to read the stream.
            return

    def _expire(self, timeout_s: float) -> None:
        if self._ended:
            return
        phase = "generating" if self._started or self._events else "before the first token"
        error = DeadlineExceeded(f"deadline of {timeout_s:g}s passed {phase}")
        self.push([ErrorEvent(error)])
        if self._cancel is not None:
            self._cancel()

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._on_end()
        if self._timer is not None:
            self._timer.cancel()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


Delivery = tuple[GenerationStream, list[GenerationEvent]]
"""Events for one stream."""


def deliver(deliveries: list[Delivery]) -> None:
    """Post one step's events from any thread, one hop per event loop (usually there is one)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Delivery]] = {}
    for stream, events in deliveries:
        if events:
            by_loop.setdefault(stream.loop, []).append((stream, events))
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_push_all, batch)
        except RuntimeError:
            continue


def _push_all(batch: list[Delivery]) -> None:
    for stream, events in batch:
        stream.push(events)
