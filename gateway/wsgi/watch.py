"""``ResponseWatch``: what the gateway reads of a WSGI response in the server's worker
thread, handed to the gateway's loop: its latency, for the capacity providers that follow
it (``gateway.asgi.timing``), and the tokens it reports it used, for the tenant's token
budget (``gateway.rates.usage``), as the ASGI path reads both from the messages it
sends."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any
from wsgiref.types import StartResponse

from gateway.asgi.timing import ChunkClock, LatencyFeed
from gateway.rates.usage import UsageReader
from gateway.wsgi.loopthread import call_soon_unless_closed


class ResponseWatch:
    """Watches one admitted WSGI request's response from its hand-over to the app.

    - With a ``feed``: the time to the first body chunk that is not empty (or to the end
      of an empty body), and the longest gap between two such chunks as it grows (by the
      rule of ``gateway.asgi.timing.ChunkClock``), go to it on the loop, for a 2xx
      response only.
    - With ``settle``: at the end of the body (not when it is cut short), the usage the
      response reported goes to it, on the loop, if it reported one.

    ``noting`` wraps ``start_response``; the response iterable calls ``chunk`` for each
    body chunk and ``ended`` once after the last."""

    __slots__ = ("_clock", "_loop", "_reader", "_settle")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        feed: LatencyFeed | None,
        settle: Callable[[int], None] | None,
    ) -> None:
        self._loop = loop
        self._settle = settle
        self._reader = UsageReader() if settle is not None else None
        self._clock: ChunkClock | None = None
        if feed is not None:
            gap = functools.partial(self._to_loop, feed.longest_gap) if feed.follows_gaps else None
            self._clock = ChunkClock(functools.partial(self._to_loop, feed.first_byte), gap)

    def noting(self, start_response: StartResponse) -> StartResponse:
        """``start_response`` that notes the response's status and headers."""

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            code = status.partition(" ")[0]
            status_code = int(code) if code.isdigit() else 0
            if not 200 <= status_code < 300:
                self._clock = None
            if self._reader is not None:
                raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
                self._reader.started(status_code, raw)
            return start_response(status, headers, exc_info)

        return start

    def chunk(self, chunk: bytes) -> None:
        if self._clock is not None and not self._clock.chunk(bool(chunk), True):
            self._clock = None
        if self._reader is not None:
            self._reader.read(chunk)

    def ended(self) -> None:
        clock, self._clock = self._clock, None
        if clock is not None:
            clock.chunk(False, False)
        reader, self._reader = self._reader, None
        if reader is not None and self._settle is not None:
            used = reader.ended()
            if used is not None:
                call_soon_unless_closed(self._loop, self._settle, used)

    def _to_loop(self, callback: Callable[..., object], *args: object) -> None:
        call_soon_unless_closed(self._loop, callback, *args)
