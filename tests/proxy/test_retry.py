"""One retry on the next-best upstream, before the first byte, and only when it cannot run
a generation twice, through real servers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.loopback import serve_in_task
from gateway.proxy import ProxyApp
from gateway.sim import SimConfig, create_app
from tests.proxy.upstreams import (
    WAIT_S,
    Answering,
    FakeRoute,
    breaks_after_first_chunk,
    closed_upstream,
    proxy_over,
    raw_upstream,
    read_cut_short,
    routed,
)

pytestmark = pytest.mark.anyio

CONFIG = SimConfig(step_s=0.001, step_s_per_seq=0.0, prefill_s_per_token=0.0)
COMPLETION = {"prompt": "Say something short.", "max_tokens": 3}


async def test_a_refused_connection_is_retried_on_the_next_best_upstream(
    http: httpx.AsyncClient,
) -> None:
    """Nothing listens on the first upstream: the second one answers, after one reroute."""
    sim = create_app(CONFIG)
    async with serve_in_task(sim) as healthy:
        route = FakeRoute(closed_upstream(), healthy.url)
        async with serve_in_task(routed(ProxyApp(), route)) as proxy:
            response = await http.post(f"{proxy.url}/v1/completions", json=COMPLETION)

    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3
    assert route.reroutes == 1
    assert sim.state.stats.snapshot().completed == 1


async def test_a_503_before_the_first_byte_is_retried_with_the_same_request(
    http: httpx.AsyncClient,
) -> None:
    """The next upstream gets the method, path, query, headers and body the first one got."""
    failing, healthy = Answering("first", 503), Answering("second", 200)
    async with proxy_over(failing, healthy) as (url, route):
        response = await http.post(
            f"{url}/v1/completions?api-version=1&x=a%2Fb",
            json=COMPLETION,
            headers={"authorization": "Bearer sk-test", "x-tenant": "gold"},
        )

    assert response.status_code == 200
    assert response.json() == {"upstream": "second", "status": 200}
    assert route.reroutes == 1
    [tried], [retried] = failing.received, healthy.received
    assert retried.method == tried.method == "POST"
    assert retried.raw_path == tried.raw_path == b"/v1/completions"
    assert retried.query_string == tried.query_string == b"api-version=1&x=a%2Fb"
    assert retried.body == tried.body and b"Say something short." in tried.body
    assert [h for h in retried.headers if h[0] != b"host"] == [
        h for h in tried.headers if h[0] != b"host"
    ]
    assert (b"authorization", b"Bearer sk-test") in retried.headers


async def test_when_the_next_upstream_fails_too_its_5xx_is_relayed_without_a_second_retry(
    http: httpx.AsyncClient,
) -> None:
    """One retry only: a third upstream, healthy, is never tried."""
    sim = create_app(CONFIG)
    first, second = Answering("first", 503), Answering("second", 503)
    async with (
        serve_in_task(first, lifespan="off") as a,
        serve_in_task(second, lifespan="off") as b,
        serve_in_task(sim) as c,
    ):
        route = FakeRoute(a.url, b.url, c.url)
        async with serve_in_task(routed(ProxyApp(), route)) as proxy:
            response = await http.post(f"{proxy.url}/v1/completions", json=COMPLETION)

    assert response.status_code == 503
    assert response.json() == {"upstream": "second", "status": 503}
    assert route.reroutes == 1
    assert (len(first.received), len(second.received)) == (1, 1)
    assert sim.state.stats.snapshot().requests == 0


async def test_when_the_next_upstream_is_unreachable_too_the_client_gets_a_502(
    http: httpx.AsyncClient,
) -> None:
    """Two refused connections: one retry, then the JSON error, and a third is not tried."""
    sim = create_app(CONFIG)
    async with serve_in_task(sim) as third:
        route = FakeRoute(closed_upstream(), closed_upstream(), third.url)
        async with serve_in_task(routed(ProxyApp(), route)) as proxy:
            response = await http.post(f"{proxy.url}/v1/completions", json=COMPLETION)

    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"
    assert route.reroutes == 1
    assert sim.state.stats.snapshot().requests == 0


async def test_with_no_other_upstream_the_5xx_is_relayed_as_the_upstream_sent_it(
    http: httpx.AsyncClient,
) -> None:
    """The route has nobody to retry on: the client gets the upstream's own answer."""
    only = Answering("only", 503)
    async with serve_in_task(only, lifespan="off") as upstream:
        route = FakeRoute(upstream.url)
        async with serve_in_task(routed(ProxyApp(), route)) as proxy:
            response = await http.post(f"{proxy.url}/v1/completions", json=COMPLETION)

    assert response.status_code == 503
    assert response.json() == {"upstream": "only", "status": 503}
    assert route.reroutes == 1
    assert len(only.received) == 1


async def test_with_no_other_upstream_a_refused_connection_is_answered_502(
    http: httpx.AsyncClient,
) -> None:
    """The route has nobody to retry on: the usual JSON error, not a hang or a traceback."""
    route = FakeRoute(closed_upstream())
    async with serve_in_task(routed(ProxyApp(), route)) as proxy:
        response = await http.post(f"{proxy.url}/v1/completions", json=COMPLETION)

    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"
    assert route.reroutes == 1


@pytest.mark.parametrize(("size", "retried"), [(64, True), (65, False)], ids=["at", "over"])
async def test_only_a_body_within_retry_body_bytes_is_sent_again(
    http: httpx.AsyncClient, size: int, retried: bool
) -> None:
    """A body over the bound goes upstream as it comes, whole, and its 5xx is relayed."""
    body = b"0123456789abcdef" * 5

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, size, 16):
            yield body[start : min(start + 16, size)]

    failing, healthy = Answering("first", 503), Answering("second", 200)
    async with proxy_over(failing, healthy, ProxyApp(retry_body_bytes=64)) as (url, route):
        response = await http.post(f"{url}/v1/completions", content=pieces())

    assert response.status_code == (200 if retried else 503)
    assert route.reroutes == (1 if retried else 0)
    assert [r.body for r in failing.received] == [body[:size]]
    assert [r.body for r in healthy.received] == ([body[:size]] if retried else [])


async def test_nothing_is_retried_once_the_response_has_started(
    http: httpx.AsyncClient,
) -> None:
    """Headers and a first event reached the client: a broken stream stays broken."""
    sim = create_app(CONFIG)
    async with (
        serve_in_task(breaks_after_first_chunk, lifespan="off") as broken,
        serve_in_task(sim) as healthy,
    ):
        route = FakeRoute(broken.url, healthy.url)
        async with (
            serve_in_task(routed(ProxyApp(), route)) as proxy,
            http.stream("POST", f"{proxy.url}/v1/completions", json=COMPLETION) as response,
        ):
            assert response.status_code == 200
            assert await read_cut_short(response) == b"data: 1\n\n"

    assert route.reroutes == 0
    assert sim.state.stats.snapshot().requests == 0


async def test_a_route_without_an_upstream_key_is_followed_by_its_own_upstream(
    http: httpx.AsyncClient,
) -> None:
    """``scope["state"]["obleth"]["route"]`` alone routes a request of an app with no
    configured upstream."""
    sim = create_app(CONFIG)
    async with serve_in_task(sim) as upstream:
        route = FakeRoute(upstream.url)
        async with serve_in_task(routed(ProxyApp(), route, with_upstream_key=False)) as proxy:
            response = await http.post(f"{proxy.url}/v1/completions", json=COMPLETION)

    assert response.status_code == 200
    assert route.reroutes == 0
    assert sim.state.stats.snapshot().completed == 1


@pytest.mark.parametrize("status", [500, 502, 504])
async def test_a_post_answered_500_502_or_504_is_relayed_and_never_run_again(
    http: httpx.AsyncClient, status: int
) -> None:
    """The upstream (or a gateway in front of it) may have run the completion, or run it
    still: the client gets that answer, and no other upstream runs it a second time (a
    5xx on a POST used to be retried)."""
    failing, healthy = Answering("first", status), Answering("second", 200)
    async with proxy_over(failing, healthy) as (url, route):
        response = await http.post(f"{url}/v1/completions", json=COMPLETION)

    assert response.status_code == status
    assert response.json() == {"upstream": "first", "status": status}
    assert route.reroutes == 0
    assert (len(failing.received), len(healthy.received)) == (1, 0)


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
async def test_an_idempotent_request_answered_500_is_retried(
    http: httpx.AsyncClient, method: str
) -> None:
    """A method that may run twice by definition (RFC 9110) still gets its retry on any
    5xx."""
    failing, healthy = Answering("first", 500), Answering("second", 200)
    async with proxy_over(failing, healthy) as (url, route):
        response = await http.request(method, f"{url}/v1/files/f-1")

    assert response.status_code == 200
    assert response.json() == {"upstream": "second", "status": 200}
    assert route.reroutes == 1
    assert [r.method for r in healthy.received] == [method]


class HangingUp:
    """A raw upstream that reads a request (head, and a body of its Content-Length) and
    closes the connection without answering, as a server that crashed on it does;
    ``requests`` counts the requests it read."""

    def __init__(self) -> None:
        self.requests = 0

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(WAIT_S):
                head = await reader.readuntil(b"\r\n\r\n")
                for line in head.lower().split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        await reader.readexactly(int(line.partition(b":")[2]))
                self.requests += 1
        finally:
            writer.close()

    def serving(self) -> contextlib.AbstractAsyncContextManager[str]:
        return raw_upstream(self.accept)


@pytest.mark.parametrize(("method", "retried"), [("POST", False), ("GET", True)])
async def test_a_connection_broken_after_the_request_was_sent_is_retried_only_if_idempotent(
    http: httpx.AsyncClient, method: str, retried: bool
) -> None:
    """The upstream read the request, then closed without answering: it may have started
    the generation, so a POST gets 502 ``upstream_failed`` and runs nowhere else; a GET
    goes to the next upstream."""
    hanging, healthy = HangingUp(), Answering("second", 200)
    async with hanging.serving() as first, serve_in_task(healthy, lifespan="off") as second:
        route = FakeRoute(first, second.url)
        async with serve_in_task(routed(ProxyApp(), route)) as proxy:
            response = await http.request(
                method, f"{proxy.url}/v1/completions", content=b'{"prompt": "hi"}'
            )

    # a POST ran there once; aiohttp itself sends an idempotent request to the same
    # upstream once more first (RFC 9112 section 9.3.1), before the proxy moves on
    assert hanging.requests >= 1 if retried else hanging.requests == 1
    assert route.reroutes == (1 if retried else 0)
    assert len(healthy.received) == (1 if retried else 0)
    if retried:
        assert response.status_code == 200
    else:
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_failed"


async def test_a_client_that_leaves_during_the_retry_is_neither_answered_nor_logged_as_a_failure(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The first upstream answers 503, the retry goes to the second, and the client gives
    up while the second computes: the second drops the request (it is told), and nothing
    reads as an upstream failure (it used to log ``answered 502 upstream_failed``)."""
    slow = SimConfig(step_s=0.01, step_s_per_seq=0.0, prefill_s_per_token=0.0)
    sim = create_app(slow)
    body = {"prompt": "Count slowly.", "max_tokens": 500}
    async with proxy_over(Answering("first", 503), sim) as (url, route):
        with caplog.at_level(logging.WARNING, logger="obleth"):
            with pytest.raises(httpx.TimeoutException):
                await http.post(f"{url}/v1/completions", json=body, timeout=0.3)
            for _ in range(300):  # the second upstream hears the client left
                if sim.state.stats.snapshot().disconnected:
                    break
                await asyncio.sleep(0.01)

    assert route.reroutes == 1
    assert sim.state.stats.snapshot().disconnected == 1
    assert "upstream_failed" not in caplog.text, caplog.text
