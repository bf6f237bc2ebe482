"""A body whose ``Content-Length`` is over the bound is refused before any of it is taken:
413 with a JSON error and the connection closed, without the ``100 Continue`` that would
invite the client to send it, and without waiting for the body (or the body timeout).
``obleth serve``'s gateway and admin apps, on real servers in this process."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from gateway.cli.serve import build_admin_app, server_options
from gateway.loopback import serve_in_task
from tests.proxy.rawhttp import Answer, request_head, send_and_read_async
from tests.proxy.serving import serving

pytestmark = pytest.mark.anyio

HUGE = 99_999_999_999
TOKEN = "a-token-of-sixteen-or-more"


async def declaring(url: str, target: str, *headers: tuple[str, str], sent: bytes) -> Answer:
    """A request declaring a ``HUGE`` body, of which ``sent`` follows the head."""
    head = request_head(
        target,
        ("content-type", "application/json"),
        ("content-length", str(HUGE)),
        *headers,
        method="PUT" if target.startswith("/api/") else "POST",
    )
    answer, writer = await send_and_read_async(url, head + sent)
    writer.close()
    return answer


def refused_at_once(answer: Answer) -> None:
    """A 413 with a JSON error, the connection closed, and nothing before it."""
    assert answer.closed, answer.raw  # not still waiting for the body after WAIT_S
    assert answer.raw.startswith(b"HTTP/1.1 413 "), answer.raw[:200]
    assert answer.headers["connection"] == "close"
    assert "larger than" in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("expect", "sent"),
    [(True, b""), (False, b"{" * 65536)],
    ids=["expect-100-continue", "body-arriving"],
)
async def test_a_gateway_request_declaring_a_body_over_max_body_bytes_is_refused_at_once(
    expect: bool, sent: bytes
) -> None:
    """No seat is taken, and the body timeout (an hour here) plays no part."""
    async with serving(client_body_timeout_s=3600.0) as served:
        headers = [("expect", "100-continue")] if expect else []
        answer = await declaring(served.url, "/v1/completions", *headers, sent=sent)
        admitted = served.scheduler.admitted

    refused_at_once(answer)
    assert b"100 Continue" not in answer.raw
    assert admitted == 0


@contextlib.asynccontextmanager
async def admin() -> AsyncIterator[str]:
    async with serving(admin_token=TOKEN, client_body_timeout_s=3600.0) as served:
        settings = served.app.gateway.settings
        app = build_admin_app(settings, served.app.gateway)
        async with serve_in_task(app, **server_options(settings)) as server:
            yield server.url


async def test_an_admin_put_declaring_a_body_over_its_bound_is_refused_at_once() -> None:
    async with admin() as url:
        answer = await declaring(
            url,
            "/api/v1/capacity",
            ("authorization", f"Bearer {TOKEN}"),
            ("expect", "100-continue"),
            sent=b"",
        )

    refused_at_once(answer)
    assert answer.error_code() == "invalid_body"
