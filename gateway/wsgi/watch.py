"""``ResponseWatch``: what the gateway reads of a WSGI response in the server's worker
thread, handed to the gateway's loop: the time to its first byte, for the first-byte feed
(``gateway.asgi.plan.FirstByteFeed``), and the tokens it reports it used, for the
tenant's token budget (``gateway.rates.usage``), as the ASGI path reads both from the
messages it sends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from wsgiref.types import StartResponse

from gateway.asgi.plan import FirstByteFeed
from gateway.rates.usage import UsageReader


class ResponseWatch:
    """Watches one admitted WSGI request's response from its hand-over to the app.

    - With a ``feed``: the time to the first body chunk that is not empty (or to the end
      of an empty body) goes to it, on the loop, for a 2xx response only.
    - With ``settle``: at the end of the body (not when it is cut short), the usage the
      response reported goes to it, on the loop, if it reported one.

    ``noting`` wraps ``start_response``; the response iterable calls ``chunk`` for each
    body chunk and ``ended`` once after the last."""

    __slots__ = ("_feed", "_handed", "_loop", "_reader", "_settle", "status")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        feed: FirstByteFeed | None,
        settle: Callable[[int], None] | None,
    ) -> None:
        self._loop = loop
        self._feed = feed
        self._settle = settle
        self._reader = UsageReader() if settle is not None else None
        self._handed = time.monotonic()
        self.status = 0

    def noting(self, start_response: StartResponse) -> StartResponse:
        """``start_response`` that notes the response's status and headers."""

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            code = status.partition(" ")[0]
            self.status = int(code) if code.isdigit() else 0
            if self._reader is not None:
                raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
                self._reader.started(self.status, raw)
            return start_response(status, headers, exc_info)

        return start

    def chunk(self, chunk: bytes) -> None:
        if chunk and self._feed is not None:
            self._first_byte()
        if self._reader is not None:
            self._reader.read(chunk)

    def ended(self) -> None:
        self._first_byte()
        reader, self._reader = self._reader, None
        if reader is not None and self._settle is not None:
            used = reader.ended()
            if used is not None:
                self._loop.call_soon_threadsafe(self._settle, used)

    def _first_byte(self) -> None:
        feed, self._feed = self._feed, None
        if feed is not None and 200 <= self.status < 300:
            self._loop.call_soon_threadsafe(feed, time.monotonic() - self._handed)
