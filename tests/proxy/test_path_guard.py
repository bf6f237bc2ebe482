"""Request targets ``obleth serve`` never forwards are refused before admission: a
client's mistake is answered 400 at once, even while the gate is full, and takes no
seat. ``obleth serve``'s app on a real server in front of an echoing upstream."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.core.tickets import Ticket
from tests.proxy.serving import serving

pytestmark = pytest.mark.anyio


async def raw_answer(url: str, request_line: str) -> tuple[bytes, dict[str, str]]:
    """The status line and the JSON error of ``request_line``, sent as written (an HTTP
    client would resolve its dot segments itself)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"{request_line}\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    error: dict[str, str] = json.loads(body)["error"]
    return head.split(b"\r\n")[0], error


@pytest.mark.parametrize(
    "request_line",
    [
        "GET /v1/../../admin HTTP/1.1",
        "OPTIONS * HTTP/1.1",
        "GET /v1/models/../x HTTP/1.1",
        "GET /v1/models/./llama HTTP/1.1",
    ],
)
async def test_an_unforwardable_target_gets_400_while_the_gate_is_full_and_takes_no_seat(
    request_line: str,
) -> None:
    """It used to wait for a seat like any request: under ``reject`` with the gate full
    it was answered 503 over_capacity (a client told to retry a request that can never
    pass), and with a seat free it took one and was counted as routed and completed. A
    model's path with a dot segment was answered 404 model_not_found for a model named
    ``../x``."""
    async with serving(global_max_in_flight=1, overflow_policy="reject") as served:
        held = await served.scheduler.acquire(Ticket("x"))
        try:
            status, error = await raw_answer(served.url, request_line)
        finally:
            held.release()
        assert status.startswith(b"HTTP/1.1 400 ") and error["code"] == "invalid_path"
        admitted = served.scheduler.admitted
        status, error = await raw_answer(served.url, request_line)
        assert status.startswith(b"HTTP/1.1 400 ") and error["code"] == "invalid_path"
        assert served.scheduler.admitted == admitted
        assert served.echo.received == []
        # counted among requests refused before admission, under the tenant it names
        totals = served.app.gateway.tallies.totals()
        assert totals.get(("anonymous", "standard", "bad_request", "400")) == 2


async def test_an_exempt_path_with_an_escaped_dot_segment_is_refused_unrouted() -> None:
    """``/tokenize/..%5cadmin`` counts as exempt (its segments, as written, are no dot
    segments), so it skips admission; still, it is refused before routing, as an
    admitted request would be, and its answer names no upstream."""
    async with serving(exempt_paths=("/healthz", "/tokenize"), upstream_header=True) as served:
        host, port = served.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            request = "GET /tokenize/..%5cadmin HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            writer.write(request.encode())
            answer = await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ")
        assert b"x-obleth-upstream" not in head.lower()
        assert json.loads(body)["error"]["code"] == "invalid_path"
        assert served.echo.received == []
