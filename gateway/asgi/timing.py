"""What the capacity providers that follow the backends' latency are told of each
admitted request (``LatencyFeed``), and the timing of an ASGI response that gives it
(``ResponseTimer``).

Two measures, both from the moment the admitted (and routed) request is handed to the
app or the proxy, so that the wait in the gateway's queue is left out, and both of a 2xx
response only (an error answers fast, without the work a token stands for):

- its *time to first byte*: to the first chunk of its body that is not empty (the first
  token of a streamed answer; the whole answer of one that is not streamed; the end of
  an empty body), told to ``first_byte(seconds)``, once per request;
- its *longest gap*: the longest wait between two of its body chunks that are not empty,
  told to ``longest_gap(seconds, lasted)`` with the time since the hand-over, at the
  chunk that ends it: at the second chunk, then whenever a wait ends that is more than
  ``GAP_GROWTH`` (2) times the last one told. A batching backend sends a running
  sequence's tokens a step apart (steps lengthen a little as sequences grow, which this
  leaves untold: a stream tells a few gaps at most); a sequence it preempts for want of
  KV cache stops until it is computed again, many steps long, and that stall is told as
  soon as it ends.

The WSGI middleware times its responses the same way in the server's worker thread and
hands the figures to the loop (``gateway.wsgi.watch``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.complaints import Complaints
from gateway.faults import PASSED_ON
from gateway.types import Message, Send

if TYPE_CHECKING:
    from gateway.gateway import Gateway

log = logging.getLogger("obleth.capacity")

GAP_GROWTH = 2.0
"""A stream tells a longer gap only when it is more than this many times the last one it
told: a stall is told, the slow drift of a backend's steps is not."""

Listener = tuple[str, str, Callable[..., object]]
"""A provider's name, where it comes from (for the log) and the method told."""


class LatencyFeed:
    """Tells every capacity provider with ``first_byte`` or ``longest_gap`` each admitted
    request's figures (see the module's docstring), on the event loop.

    A provider's methods must return at once and do no I/O. One that raises is logged on
    the ``obleth.capacity`` logger under its name and its plugin's (at most once a minute),
    and the request goes on; the other providers are still told."""

    __slots__ = ("_complaints", "_first_bytes", "_gaps", "follows_gaps")

    def __init__(
        self, first_bytes: list[Listener], gaps: list[Listener], complaints: Complaints
    ) -> None:
        self._first_bytes = first_bytes
        self._gaps = gaps
        self._complaints = complaints
        #: whether any provider hears the longest gaps: only then are all chunks timed
        self.follows_gaps = bool(gaps)

    @classmethod
    def of(cls, gateway: Gateway, complaints: Complaints) -> LatencyFeed | None:
        """The feed of ``gateway``'s providers; None when none has either method (its
        requests are then not timed at all)."""
        found: dict[str, list[Listener]] = {"first_byte": [], "longest_gap": []}
        for name, provider in gateway.providers.items():
            for method_name, listeners in found.items():
                method = getattr(provider, method_name, None)
                if callable(method):
                    origin = gateway.plugins.origin_text("capacity provider", name)
                    listeners.append((name, origin, method))
        if not any(found.values()):
            return None
        return cls(found["first_byte"], found["longest_gap"], complaints)

    def first_byte(self, seconds: float) -> None:
        self._tell(self._first_bytes, "first_byte", seconds)

    def longest_gap(self, seconds: float, lasted: float) -> None:
        self._tell(self._gaps, "longest_gap", seconds, lasted)

    def _tell(self, listeners: list[Listener], method: str, *figures: float) -> None:
        for name, origin, listener in listeners:
            try:
                listener(*figures)
            except PASSED_ON:
                raise
            except BaseException:
                if self._complaints.may((method, name)):
                    log.exception(
                        "capacity provider %r%s raised in %s(); the request goes on",
                        name,
                        origin,
                        method,
                    )


class ChunkClock:
    """The timing rule of one 2xx response, for both middlewares: fed each body chunk
    (``chunk``), it tells ``first_byte`` and ``longest_gap`` (see the module's docstring)
    through the callables it is given: the feed's own methods on the loop, or ones that
    hand the figures to the loop from a WSGI worker thread. Started at the hand-over."""

    __slots__ = ("_first_byte", "_handed", "_last", "_longest", "_longest_gap")

    def __init__(
        self,
        first_byte: Callable[[float], object],
        longest_gap: Callable[[float, float], object] | None,
    ) -> None:
        self._first_byte = first_byte
        self._longest_gap = longest_gap  # None: only the first byte is wanted
        self._handed = time.monotonic()
        self._last: float | None = None  # the last non-empty chunk's time
        self._longest = -1.0  # the longest gap told; -1: none yet

    def chunk(self, filled: bool, more: bool) -> bool:
        """A chunk of the body, with bytes in it or not, the last one or not; answers
        whether later chunks are still wanted."""
        if not filled and more:
            return True
        now = time.monotonic()
        last, longest_gap = self._last, self._longest_gap
        if last is None:
            self._first_byte(now - self._handed)
            if longest_gap is None:
                return False
        elif filled and longest_gap is not None and now - last > GAP_GROWTH * self._longest:
            self._longest = now - last
            longest_gap(self._longest, now - self._handed)
        if filled:
            self._last = now
        return more


class ResponseTimer:
    """Wraps an admitted request's ``send``: passes every message on unchanged, and times
    a 2xx response for ``feed`` (``ChunkClock``). Built at the hand-over."""

    __slots__ = ("_clock", "_send", "_timing")

    def __init__(self, send: Send, feed: LatencyFeed) -> None:
        self._send = send
        self._clock = ChunkClock(feed.first_byte, feed.longest_gap if feed.follows_gaps else None)
        self._timing = False  # a 2xx response whose figures are still wanted

    def __call__(self, message: Message) -> Awaitable[None]:
        kind = message["type"]
        if kind == "http.response.body" and self._timing:
            more = message.get("more_body", False)
            self._timing = self._clock.chunk(bool(message.get("body")), more)
        elif kind == "http.response.start":
            self._timing = 200 <= message["status"] < 300
        return self._send(message)
