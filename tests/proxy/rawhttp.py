"""HTTP spoken by hand over real sockets: requests no well-behaved client would send
(oversized heads, heads sent a line at a time, bodies that stop), and their answers.

Every wait is bounded by ``WAIT_S``; what a test sees when it runs out is in the result,
never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from dataclasses import dataclass
from typing import Any

from tests.proxy.upstreams import WAIT_S


@dataclass(frozen=True)
class Answer:
    """What came back on one connection until the server closed it (or the wait ran out)."""

    raw: bytes
    closed: bool
    """The server closed the connection (end of stream, or reset) within the wait."""

    @property
    def status(self) -> int | None:
        """The status of the first response, None when nothing came back."""
        line = self.raw.split(b"\r\n", 1)[0]
        parts = line.split(b" ")
        return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") else None

    @property
    def headers(self) -> dict[str, str]:
        head = self.raw.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
        return {name.lower(): value.strip() for name, _, value in (h.partition(":") for h in head)}

    def json(self) -> Any:
        return json.loads(self.raw.partition(b"\r\n\r\n")[2])

    def error_code(self) -> str | None:
        """The ``code`` of an OpenAI-style JSON error answer."""
        code = self.json()["error"]["code"]
        return None if code is None else str(code)


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def connect(url: str) -> socket.socket:
    """A blocking socket to ``url``'s server whose every call gives up after ``WAIT_S``."""
    sock = socket.create_connection(host_port(url), timeout=WAIT_S)
    sock.settimeout(WAIT_S)
    return sock


def read_answer(sock: socket.socket) -> Answer:
    """Everything the server sends until it closes the connection; ``closed`` is False if
    it still had not after ``WAIT_S``."""
    received = bytearray()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except OSError:  # reset: the server closed with our bytes unread
            return Answer(bytes(received), closed=True)
        if not chunk:
            return Answer(bytes(received), closed=True)
        received += chunk
    return Answer(bytes(received), closed=False)


def send_and_read(url: str, data: bytes) -> Answer:
    """Send ``data`` on a new connection (the server may cut the sending short), then
    read the answer."""
    with connect(url) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
        return read_answer(sock)


def request_head(target: str, *headers: tuple[str, str], method: str = "GET") -> bytes:
    """A request line and headers, ``Host`` first, and the blank line ending them."""
    lines = [f"{method} {target} HTTP/1.1", "Host: gateway", *(f"{n}: {v}" for n, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def send_and_read_async(url: str, data: bytes) -> tuple[Answer, asyncio.StreamWriter]:
    """``send_and_read`` for a test on the server's event loop: sends ``data`` and reads
    until the server closes; the writer is returned open, for the caller to close."""
    reader, writer = await asyncio.open_connection(*host_port(url))
    writer.write(data)
    received = bytearray()
    try:
        async with asyncio.timeout(WAIT_S):
            while chunk := await reader.read(65536):
                received += chunk
    except TimeoutError:
        return Answer(bytes(received), closed=False), writer
    except OSError:
        pass
    return Answer(bytes(received), closed=True), writer
