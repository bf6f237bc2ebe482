"""How requests whose body went wrong while it was read are counted on ``/metrics``: under
the tenant their headers name, and never as ``completed`` when the client left mid-body.
The app ``obleth serve`` runs, on a real server in this process, driven over raw sockets
(bodies that stop, or that the client abandons half-way)."""

from __future__ import annotations

import asyncio

import pytest

from tests.proxy.rawhttp import host_port, request_head, send_and_read_async
from tests.proxy.serving import Served, serving
from tests.proxy.upstreams import WAIT_S, eventually

pytestmark = pytest.mark.anyio

JSON = "application/json"
BINARY = "application/octet-stream"


def upload(length: int, content_type: str, sent: bytes = b"") -> bytes:
    """The head of acme's POST announcing ``length`` bytes of ``content_type``, then
    ``sent`` of them."""
    head = request_head(
        "/v1/upload",
        ("x-tenant", "acme"),
        ("content-type", content_type),
        ("content-length", str(length)),
        method="POST",
    )
    return head + sent


async def counted(served: Served) -> dict[tuple[str, str, str], int]:
    """The one request's count, once it is there: ``(tenant, outcome, reason)``."""
    tallies = served.app.gateway.tallies
    await eventually(lambda: sum(tallies.totals().values()) == 1, "the request counted")
    totals = tallies.totals().items()
    return {(tenant, outcome, reason): n for (tenant, _, outcome, reason), n in totals}


@pytest.mark.parametrize(
    ("sent", "status", "reason"),
    [
        (upload(10_000, JSON), 413, "413"),  # the Content-Length says too much at once
        (upload(1000, JSON, b"x" * 10), 408, "408"),  # 10 bytes, then the body pauses
    ],
    ids=["too-large", "stalled"],
)
async def test_a_body_refused_while_it_is_read_counts_under_the_tenant_its_headers_name(
    sent: bytes, status: int, reason: str
) -> None:
    """A JSON body the gateway reads before admission (to route it) and refuses, 413 over
    ``max_body_bytes`` or 408 for a pause, is counted ``bad_request`` under the tenant of
    ``x-tenant``, which was known before the body, not under ``default_tenant``."""
    async with serving(
        tenant_header="x-tenant", max_body_bytes=1000, client_body_timeout_s=0.3
    ) as served:
        answer, writer = await send_and_read_async(served.url, sent)
        writer.close()
        assert answer.status == status, answer.raw[:300]
        assert await counted(served) == {("acme", "bad_request", reason): 1}


@pytest.mark.parametrize(
    ("content_type", "outcome"),
    [(JSON, "abandoned"), (BINARY, "cancelled")],
    ids=["json", "binary"],
)
async def test_a_client_that_leaves_mid_upload_is_counted_as_gone_not_completed(
    content_type: str, outcome: str
) -> None:
    """A client that announces 20 000 bytes, sends 200 and hangs up is counted as having
    left, under its tenant: ``abandoned`` for a JSON body, which the gateway reads before
    admission, ``cancelled`` for any other, which is admitted and read by the proxy."""
    async with serving(tenant_header="x-tenant") as served:
        _, writer = await asyncio.open_connection(*host_port(served.url))
        writer.write(upload(20_000, content_type, b"y" * 200))
        await writer.drain()
        scheduler = served.scheduler
        if content_type == BINARY:  # admitted first, then read by the proxy
            await eventually(lambda: scheduler.admitted == 1, "the upload admitted")
        writer.close()
        await writer.wait_closed()
        assert await counted(served) == {("acme", outcome, ""): 1}
        await eventually(lambda: scheduler.admitted == scheduler.released, "the seat back")


#: over the 8 MiB the proxy holds for a retry: the body is streamed to the upstream as
#: it comes, and what stops it reaches the proxy through aiohttp
STREAMED = 9 * 1024 * 1024


@pytest.mark.parametrize("how", ["leaves", "pauses"])
async def test_a_streamed_upload_the_client_stops_is_no_upstream_failure(how: str) -> None:
    """A client sends 8.5 of 9 MiB, then leaves, or pauses past ``client_body_timeout_s``:
    the upstream failed nothing. The request counts ``cancelled`` (a client still there
    gets ``408 body_timeout``), not ``completed`` after a ``502 upstream_failed``, and the
    upstream's count of errors stays 0."""
    async with serving(tenant_header="x-tenant", client_body_timeout_s=0.5) as served:
        reader, writer = await asyncio.open_connection(*host_port(served.url))
        writer.write(upload(STREAMED, BINARY, b"y" * (STREAMED - 512 * 1024)))
        await writer.drain()
        scheduler = served.scheduler
        await eventually(lambda: scheduler.admitted == 1, "the upload admitted")
        if how == "leaves":
            writer.close()
            await writer.wait_closed()
        else:  # the connection stays open, the body stops: the client hears why
            answer = await asyncio.wait_for(reader.read(), WAIT_S)
            assert b" 408 " in answer.split(b"\r\n", 1)[0] and b"body_timeout" in answer
            writer.close()
        assert await counted(served) == {("acme", "cancelled", ""): 1}
        await eventually(lambda: scheduler.admitted == scheduler.released, "the seat back")
        upstream_answers = served.app.gateway.answers.totals()
        assert all(status != "error" for _, status in upstream_answers), upstream_answers
