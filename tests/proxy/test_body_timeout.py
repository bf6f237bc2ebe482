"""A request body that stops arriving is answered 408 and gives its seat back; a request
waiting for a seat is not a slow client. The app ``obleth serve`` runs, with its uvicorn
options, on a real server in this process, so that the scheduler's counters can be read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.proxy.rawhttp import Answer, request_head, send_and_read_async
from tests.proxy.serving import Served
from tests.proxy.serving import serving as served_app
from tests.proxy.upstreams import eventually, within

pytestmark = pytest.mark.anyio

BODY_TIMEOUT_S = 0.3


@contextlib.asynccontextmanager
async def serving(**settings: object) -> AsyncIterator[Served]:
    async with served_app(client_body_timeout_s=BODY_TIMEOUT_S, **settings) as served:
        yield served


def upload_head(length: int, content_type: str = "application/octet-stream") -> bytes:
    """A POST of ``length`` bytes. A body the gateway does not read to classify (not
    JSON) is admitted first and read by the proxy after; a JSON one is read whole first,
    to route it."""
    return request_head(
        "/v1/upload",
        ("content-type", content_type),
        ("content-length", str(length)),
        ("connection", "close"),
        method="POST",
    )


async def stalled_upload(url: str, content_type: str = "application/octet-stream") -> Answer:
    """Headers for a 1000-byte body, 10 bytes of it, then silence until the server ends
    the exchange."""
    answer, writer = await send_and_read_async(url, upload_head(1000, content_type) + b"x" * 10)
    writer.close()
    return answer


@pytest.mark.parametrize(
    ("content_type", "admitted"), [("application/octet-stream", 1), ("application/json", 0)]
)
async def test_a_body_that_stalls_is_answered_408_and_gives_its_seat_back(
    content_type: str, admitted: int
) -> None:
    """Headers, part of the body, then nothing: once the body timeout has passed with the
    proxy (or, for JSON, the gateway reading it to route) waiting for more, the client
    gets 408 with a JSON error and the connection is closed, and the seat its request was
    admitted to, if any, is released."""
    async with serving() as served:
        answer = await stalled_upload(served.url, content_type)
        assert answer.status == 408, answer.raw[:300]
        assert answer.closed
        assert answer.headers["content-type"] == "application/json"
        assert answer.error_code() == "body_timeout"
        scheduler = served.scheduler
        await eventually(lambda: scheduler.admitted == scheduler.released, "the seat released")
        assert scheduler.admitted == admitted
        if not admitted:  # refused before admission: a bad request, not a client that left
            outcomes = {key[2:]: n for key, n in served.app.gateway.tallies.totals().items()}
            assert outcomes == {("bad_request", "408"): 1}


async def test_only_a_stalled_body_times_out_not_a_request_waiting_in_the_queue() -> None:
    """With the one seat held, a whole upload waits in the fair queue for many body
    timeouts and then goes through; an upload that stalls meanwhile is answered 408 while
    it waits: its client stopped sending, the queue did not stop it."""
    async with serving(global_max_in_flight=1) as served, httpx.AsyncClient() as http:
        holding = asyncio.ensure_future(http.get(f"{served.url}/hold", timeout=10.0))
        scheduler = served.scheduler
        await eventually(lambda: scheduler.admitted == 1, "the seat taken by /hold")
        body = b"q" * (256 * 1024)
        queued = asyncio.ensure_future(
            send_and_read_async(served.url, upload_head(len(body)) + body)
        )
        await eventually(lambda: served.app.gateway.snapshot().queued == 1, "the upload queued")

        stalled = await within(stalled_upload(served.url), "the stalled upload's answer")
        assert stalled.status == 408, stalled.raw[:300]
        await asyncio.sleep(3 * BODY_TIMEOUT_S)  # the whole upload keeps waiting meanwhile
        assert not queued.done()

        served.echo.release.set()
        held = await within(holding, "the answer to /hold")
        answer, writer = await within(queued, "the queued upload's answer")
        writer.close()
        assert held.status_code == 200
        assert answer.status == 200, answer.raw[:300]
        assert answer.json()["body_bytes"] == len(body)
        await eventually(lambda: scheduler.admitted == scheduler.released, "every seat released")
