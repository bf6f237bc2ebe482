"""``FirstByteClock``: the first-byte feed for a WSGI response (see
``gateway.asgi.plan.FirstByteFeed``), timed in the server's worker thread and handed to
the gateway's loop, where the capacity providers that follow it live."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from wsgiref.types import StartResponse

from gateway.asgi.plan import FirstByteFeed


class FirstByteClock:
    """Times one admitted WSGI request from its hand-over to the app to its first body
    chunk that is not empty (or the end of an empty body); ``fire()`` hands the time to
    the feed, on the loop, for a 2xx response only, as the ASGI path does."""

    __slots__ = ("_feed", "_handed", "_loop", "status")

    def __init__(self, feed: FirstByteFeed, loop: asyncio.AbstractEventLoop) -> None:
        self._feed = feed
        self._loop = loop
        self._handed = time.monotonic()
        self.status = 0

    def noting(self, start_response: StartResponse) -> StartResponse:
        """``start_response`` that notes the response's status for ``fire``."""

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            code = status.partition(" ")[0]
            self.status = int(code) if code.isdigit() else 0
            return start_response(status, headers, exc_info)

        return start

    def fire(self) -> None:
        if 200 <= self.status < 300:
            self._loop.call_soon_threadsafe(self._feed, time.monotonic() - self._handed)
