"""``BoundedHttpToolsProtocol``: uvicorn's httptools protocol with two bounds on a request's
head (request line and headers), its size and the time it takes to arrive, and JSON errors
for a head that breaks them or that is no HTTP at all."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.asgi.responses import error_document

log = logging.getLogger("obleth.server")

LINGER_S = 2.0
"""After answering a refused request, how long the connection is still read (and what
arrives dropped) before it is closed: closing a socket that holds unread data makes the
kernel reset the connection, and a client still writing its head would never read the
answer."""

# the request line's fixed part (two spaces, "HTTP/1.1", CRLF) and the blank line ending
# the head; each header adds ": " and CRLF to its name and value
_LINE_FRAMING = len(b"  HTTP/1.1\r\n") + len(b"\r\n")
_HEADER_FRAMING = len(b": \r\n")


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """One HTTP/1.1 connection, as uvicorn's ``HttpToolsProtocol`` serves it, with bounds.

    What a client gets (``max_header_bytes`` and ``header_timeout_s`` are class attributes;
    ``bounded_protocol`` makes a class with the settings' values):

    - A request whose line and headers are longer than ``max_header_bytes`` is answered
      ``431`` with an OpenAI-style JSON error (code ``headers_too_large``), and its
      connection is closed; the app never sees it. A head still arriving is cut off as
      soon as it is over the bound, so a connection holds at most the bound plus one read
      from its socket (256 KiB at most) of an unfinished head.
    - A head not complete ``header_timeout_s`` after the connection opened (its first
      request) or after its first byte arrived (a later request on a kept-alive
      connection) is answered ``408`` (code ``header_timeout``) and the connection closed.
      A new connection that sent nothing in that time is closed without an answer. While
      uvicorn itself has stopped reading (a pipelined request waits its turn) the clock
      starts over rather than run out.
    - After either answer nothing more is read as a request: what the client still sends
      is dropped for up to ``LINGER_S``, then the connection is closed (at once, if the
      client closes its side first). A refused request pipelined behind one still being
      answered gets no answer of its own: the connection closes after the current one.

    What it relies on in uvicorn (read in 0.54; ``tests/proxy/test_header_bounds.py``
    exercises the installed version):

    - ``data_received`` hands every byte it gets to ``self.parser`` (httptools) and keeps
      none elsewhere, so that the bytes received while a head is incomplete are that head.
    - The parser callbacks ``on_message_begin``, ``on_headers_complete``, ``on_body`` and
      ``on_message_complete`` run inside ``parser.feed_data``. ``on_headers_complete``
      creates the request cycle and starts the app, and by then ``self.url`` and
      ``self.headers`` hold the request target and headers; ``on_body`` and
      ``on_message_complete`` hand the body to that cycle; ``handle_websocket_upgrade``
      hands the connection over after an upgrade request's head. Not calling them for a
      refused request is what keeps it from the app.
    - ``self.cycle`` is the request being answered, ``self.flow.read_paused`` says whether
      uvicorn has paused reading, ``self.server_state.default_headers`` are the headers it
      adds to every response, and ``STATUS_LINE`` holds its status lines.
    """

    max_header_bytes: ClassVar[int] = 64 * 1024
    header_timeout_s: ClassVar[float] = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # bytes of the incomplete head received in whole chunks
        self._head_begun = False  # the parser has seen the first byte of the current head
        self._in_body = False  # between a head's end and its request's end
        self._ended_in_chunk = False  # a request ended inside the chunk being parsed
        self._refused = False
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self._head_timed_out, self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering after the answer: what still arrives is dropped
        self._ended_in_chunk = False
        super().data_received(data)
        if self._refused or self._in_body or self._ended_in_chunk or self.transport.is_closing():
            return
        # no head ended in this chunk and no request either: all of it is the head arriving
        self._head_bytes += len(data)
        if self._head_bytes > self.max_header_bytes:
            self._refuse_too_large(f"more than {self.max_header_bytes} bytes so far")

    # -- parser callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begun = True
        if self._timer is None and not self._refused:
            self._arm(self._head_timed_out, self.header_timeout_s)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._disarm()
        size = self._head_size()
        self._head_bytes = 0
        self._head_begun = False
        if size > self.max_header_bytes:
            self._refuse_too_large(f"{size} bytes")
            return
        version = self.parser.get_http_version()
        if version not in ("1.1", "1.0"):  # httptools takes a line without one as 0.9
            said = "no HTTP version" if version == "0.9" else f"HTTP/{version}"
            self.send_400_response(f"the request line has {said}")
            return
        self._in_body = True
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._in_body = False
        self._ended_in_chunk = True
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        if not self._refused:
            super().handle_websocket_upgrade()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes the parser cannot read as HTTP/1.1 (a bad request
        line, a header with a space in its name, broken chunked framing): between
        requests, the gateway's own JSON error instead of uvicorn's plain text (after the
        response under way, if any: ``_refuse``). While a request's body is being read
        (its body is what broke), or once the connection was refused, nothing is
        written: the connection closes, which tells the app the client is gone. uvicorn
        wrote its plain-text 400 there, into the response's own stream when that had
        begun."""
        cycle = self.cycle
        if self._refused or (self._in_body and cycle is not None):
            if not self._refused:
                peer = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
                log.warning(
                    "%s: %s, in a request's body; closed the connection",
                    peer,
                    msg.rstrip("."),
                )
            self._refused = True
            self._disarm()
            self.transport.close()
            return
        self._refuse(
            400,
            "invalid_http",
            f"{msg.rstrip('.')}: the bytes are not an HTTP/1.1 request line and headers "
            "(look for spaces in header names, bare LF line ends or a missing version)",
        )

    # -- the bounds ------------------------------------------------------------------------

    def _head_size(self) -> int:
        """The complete head's size as a client writes it (``Name: value`` lines)."""
        size = len(self.parser.get_method()) + len(self.url) + _LINE_FRAMING
        for name, value in self.headers:
            size += len(name) + len(value) + _HEADER_FRAMING
        return size

    def _head_timed_out(self) -> None:
        self._timer = None
        if self._refused or self.transport.is_closing():
            return
        if self.flow.read_paused:
            self._arm(self._head_timed_out, self.header_timeout_s)
        elif not self._head_begun and self._head_bytes == 0:
            self.transport.close()  # nothing was asked: there is nobody to answer
        else:
            self._refuse(
                408,
                "header_timeout",
                f"the request line and headers did not arrive within "
                f"{self.header_timeout_s:g} s; send them at once",
            )

    def _refuse_too_large(self, size: str) -> None:
        self._refuse(
            431,
            "headers_too_large",
            f"the request line and headers are larger than the gateway accepts ({size}; "
            f"at most {self.max_header_bytes} bytes); send smaller headers, or raise "
            "max_header_bytes",
        )

    def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer ``status`` and stop reading requests from this connection."""
        self._refused = True
        self._disarm()
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.warning("%s: %s; answered %d %s", peer, message, status, code)
        if self.cycle is not None and not self.cycle.response_complete:
            # an answer now would cut into the response being written: close after it
            self.cycle.keep_alive = False
            return
        body = json.dumps(error_document(status, message, code=code)).encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: application/json\r\n")
        head.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        transport = self.transport
        transport.write(b"".join(head) + body)
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.flow.resume_reading()
        self._arm(transport.close, LINGER_S)

    def _arm(self, then: Callable[[], object], delay_s: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay_s, then)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def bounded_protocol(
    *, max_header_bytes: int, header_timeout_s: float
) -> type[BoundedHttpToolsProtocol]:
    """A ``BoundedHttpToolsProtocol`` class with these bounds, for uvicorn's ``http``
    option (uvicorn makes one protocol object per connection from the class)."""

    class Bounded(BoundedHttpToolsProtocol):
        pass

    Bounded.max_header_bytes = max_header_bytes
    Bounded.header_timeout_s = header_timeout_s
    return Bounded
