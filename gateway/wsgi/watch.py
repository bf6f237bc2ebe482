"""``ResponseWatch``: what the gateway reads of a WSGI response in the server's worker
thread, handed to the gateway's loop: its latency, for the capacity providers that follow
it (``gateway.asgi.timing``), and the tokens it reports it used, for the tenant's token
budget (``gateway.rates.usage``), as the ASGI path reads both from the messages it
sends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from wsgiref.types import StartResponse

from gateway.asgi.timing import GAP_GROWTH, LatencyFeed
from gateway.rates.usage import UsageReader


class ResponseWatch:
    """Watches one admitted WSGI request's response from its hand-over to the app.

    - With a ``feed``: the time to the first body chunk that is not empty (or to the end
      of an empty body), and the longest gap between two such chunks as it grows (by the
      rule of ``gateway.asgi.timing``), go to it on the loop, for a 2xx response only.
    - With ``settle``: at the end of the body (not when it is cut short), the usage the
      response reported goes to it, on the loop, if it reported one.

    ``noting`` wraps ``start_response``; the response iterable calls ``chunk`` for each
    body chunk and ``ended`` once after the last."""

    __slots__ = ("_feed", "_handed", "_last", "_longest", "_loop", "_reader", "_settle", "status")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        feed: LatencyFeed | None,
        settle: Callable[[int], None] | None,
    ) -> None:
        self._loop = loop
        self._feed = feed
        self._settle = settle
        self._reader = UsageReader() if settle is not None else None
        self._handed = time.monotonic()
        self._last: float | None = None  # the last non-empty chunk's time
        self._longest = -1.0  # the longest gap told; -1: none yet
        self.status = 0

    def noting(self, start_response: StartResponse) -> StartResponse:
        """``start_response`` that notes the response's status and headers."""

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            code = status.partition(" ")[0]
            self.status = int(code) if code.isdigit() else 0
            if not 200 <= self.status < 300:
                self._feed = None
            if self._reader is not None:
                raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
                self._reader.started(self.status, raw)
            return start_response(status, headers, exc_info)

        return start

    def chunk(self, chunk: bytes) -> None:
        feed = self._feed
        if chunk and feed is not None:
            now = time.monotonic()
            last = self._last
            if last is None:
                self._to_loop(feed.first_byte, now - self._handed)
                if not feed.follows_gaps:
                    self._feed = None
            elif now - last > GAP_GROWTH * self._longest:
                self._longest = now - last
                self._to_loop(feed.longest_gap, self._longest, now - self._handed)
            self._last = now
        if self._reader is not None:
            self._reader.read(chunk)

    def ended(self) -> None:
        feed, self._feed = self._feed, None
        if feed is not None:
            now = time.monotonic()
            if self._last is None:  # an empty body: its end is its first byte
                self._to_loop(feed.first_byte, now - self._handed)
        reader, self._reader = self._reader, None
        if reader is not None and self._settle is not None:
            used = reader.ended()
            if used is not None:
                self._to_loop(self._settle, used)

    def _to_loop(self, callback: Callable[..., object], *args: object) -> None:
        """Run ``callback(*args)`` on the gateway's loop; nothing once the loop has closed
        (``WSGIGatewayMiddleware.close()`` under a response still streaming, which goes on)."""
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            if not self._loop.is_closed():
                raise
