"""The upstream's side of a proxied exchange: the client's request as each attempt sends
it, what the attempt got (a response, or the failure instead), and the hang-up that
tells the upstream the client is gone."""

from __future__ import annotations

import asyncio
import io
import os
import socket
from collections.abc import AsyncIterator

import aiohttp
import httpx
from yarl import URL

from gateway.errors import Disconnected
from gateway.proxy.client import CURRENT, Attempt, UpstreamFailure
from gateway.proxy.deadlines import Watchdog, bounded_writes
from gateway.proxy.inbound import Inbound
from gateway.proxy.upstream import target_url
from gateway.types import Scope

HANG_UP_S = 1.0
"""How long, after the client left, the upstream has to close its side of the connection
before the proxy closes it regardless (see ``Outbound.hang_up``)."""

Outcome = aiohttp.ClientResponse | UpstreamFailure
"""What one attempt got: a response (its body still to be read), or the failure instead."""

#: a body larger than this is handed to the session as a stream of its parts, which it
#: writes without holding up the event loop (aiohttp warns about larger bytes)
_WRITTEN_AT_ONCE = 1024 * 1024


class Outbound:
    """The client's request as upstreams get it: the same method, path, query, headers
    (with this hop's forwarding headers, as ``gateway.proxy.headers.as_text`` hands them
    over) and body, to whichever upstream it is sent; one attempt at a time."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        scope: Scope,
        headers: list[tuple[str, str]],
        content: bytes | Inbound | None,
        response_timeout_s: float | None,
    ) -> None:
        self._session = session
        #: the client's request
        self.scope = scope
        self.method: str = scope["method"]
        self._headers = headers
        self._content = content
        self._response_timeout_s = response_timeout_s
        #: the response being relayed, while it is
        self.response: aiohttp.ClientResponse | None = None
        #: while a streamed body is being written: what bounds each chunk's write (it
        #: goes on after the response headers, as long as the body does)
        self.writes: Watchdog | None = None
        #: the attempt under way (or the last one)
        self.attempt: Attempt | None = None

    def stop_watching(self) -> None:
        """The exchange with the current upstream is over: its body's writes no longer
        count."""
        if self.writes is not None:
            self.writes.stop()
            self.writes = None

    async def hang_up(self, relay: asyncio.Future[None]) -> None:
        """Tell the upstream the client is gone, by ending our side of the request's
        connection, and wait at most ``HANG_UP_S`` for ``relay`` to end: it does once the
        upstream has dropped the request and closed its side (what the upstream sends
        meanwhile is relayed to nobody). That holds before the response has started too
        (a completion that is not streamed): the request's seat is not handed on while
        the upstream still computes it. Without a connection yet, nothing reached the
        upstream: the caller cancels the relay."""
        response = self.response
        if response is not None:
            connection = response.connection
        else:
            connection = None if self.attempt is None else self.attempt.connection
        transport = None if connection is None else connection.transport
        sock = None if transport is None else transport.get_extra_info("socket")
        if connection is None or sock is None or sock.fileno() < 0:
            return
        protocol = connection.protocol
        if protocol is not None:
            # half-closed, it must never serve another request: an upstream that answers
            # all the same would otherwise hand it back to the pool
            protocol.force_close()
        try:
            # on a duplicate of the descriptor: uvloop's transports hand out sockets that
            # may not be shut down themselves, and a shutdown acts on the connection
            with socket.socket(fileno=os.dup(sock.fileno())) as ours:
                ours.shutdown(socket.SHUT_WR)
        except OSError:
            return
        await asyncio.wait((relay,), timeout=HANG_UP_S)

    def url_on(self, base: httpx.URL) -> URL:
        """Where the request goes on the upstream at ``base``."""
        return target_url(base, self.scope)

    async def send_to(self, url: URL) -> Outcome:
        """The response from ``url``, its body still to be read, or the failure that came
        instead (``sent`` False when the upstream cannot have run the request).

        With a response timeout, the task calling this is the one cancelled when it runs
        out: before the response headers (504 ``timeout``), and, for a streamed body, when
        the upstream takes none of it for that long while it answers (``writes``, which
        the relay checks; ``stop_watching()`` ends it).
        """
        self.stop_watching()
        self.response = None  # an earlier attempt's, given up
        timeout = self._response_timeout_s
        content = self._content
        data: bytes | io.BytesIO | AsyncIterator[bytes] | None = content
        if isinstance(content, bytes) and len(content) > _WRITTEN_AT_ONCE:
            data = io.BytesIO(content)  # written in parts, a new reader for each attempt
        # the wait for the answer: from the request written to the response headers
        answer = None if timeout is None else Watchdog(timeout)
        start_at_head = None
        if answer is not None:
            if isinstance(content, Inbound):
                self.writes = Watchdog(answer.limit_s)
                data = bounded_writes(content, self.writes, after_the_last=answer)
            else:
                # the whole request follows its head at once: the wait for the answer (and
                # for the upstream to take the body) starts there
                start_at_head = answer.start
        attempt = self.attempt = Attempt(start_at_head)
        response = None
        current = CURRENT.set(attempt)
        try:
            response = self.response = await self._session.request(
                self.method,
                url,
                headers=self._headers,
                data=data,
                allow_redirects=False,
                trace_request_ctx=attempt,
            )
            # a 1xx as the final response (a 101 nobody asked for: the gateway upgrades
            # nothing), or a status HTTP does not define, which no server can pass on
            if not 200 <= response.status <= 599:
                response.close()  # and the connection, in a state nobody can read
                return UpstreamFailure(
                    "malformed", f"answered {response.status} as its final response"
                )
            return response
        except aiohttp.ClientConnectorError as exc:
            return UpstreamFailure("unreachable", describe(exc), sent=False)
        except aiohttp.ConnectionTimeoutError as exc:
            if attempt.queued:
                return UpstreamFailure(
                    "exhausted", "no pooled connection came free in time", sent=False
                )
            return UpstreamFailure(
                "unreachable", f"connecting timed out ({describe(exc)})", sent=False
            )
        except aiohttp.ClientResponseError as exc:
            # it answered (the request ran there), with a head the session cannot read
            return UpstreamFailure("malformed", describe(exc))
        except aiohttp.ClientError as exc:
            gone = _client_gone(exc)
            if gone is not None:  # the client's body stopped, not the upstream
                raise gone from None
            return UpstreamFailure("failed", describe(exc), sent=attempt.sent)
        except asyncio.CancelledError:
            # evaluated both: each takes back its own cancellation
            stalled = self.writes is not None and self.writes.expired()
            waited = answer is not None and answer.expired()
            if not (stalled or waited):
                raise
            why = "took none of the request body" if stalled else "sent no response headers"
            return UpstreamFailure(
                "timeout",
                f"{why} within {timeout} s (upstream_response_timeout_s: raise it for "
                "long answers that are not streamed)",
            )
        finally:
            CURRENT.reset(current)
            if answer is not None:
                answer.stop()
            if response is None:
                self.stop_watching()  # no answer to relay: the body no longer matters


def describe(exc: Exception) -> str:
    """What an exception says, for a log line: its message, else its type's name."""
    return str(exc) or type(exc).__name__


def _client_gone(error: BaseException) -> Disconnected | None:
    """The client's ``Disconnected`` (it left, or its body paused past
    ``client_body_timeout_s``) behind ``error``: aiohttp wraps what the body it streams
    raises in a ``ClientError`` of its own, which would read as the upstream failing."""
    seen: BaseException | None = error
    for _ in range(8):  # a chain of a few links; never a loop, however it was built
        if seen is None or isinstance(seen, Disconnected):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
