"""The first-byte feed: capacity providers with ``first_byte(seconds)`` are told, once per
admitted request, the time from its hand-over to the app to its first body chunk."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import pytest
from starlette.responses import JSONResponse

from gateway import GatewayMiddleware, Settings, hookimpl
from gateway.asgi.plan import FlightPlan
from gateway.complaints import Complaints
from gateway.types import Receive, Scope, Send
from tests.asgi.conftest import Client, http_scope


class Timing:
    """A capacity provider that follows time to first byte: it keeps what it is fed."""

    def __init__(self, settings: Settings) -> None:
        self.samples: list[float] = []

    def max_in_flight(self) -> int:
        return 1000

    def first_byte(self, seconds: float) -> None:
        self.samples.append(seconds)


class Gaps(Timing):
    """A provider that also follows the longest gap between two chunks of a stream."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.gaps: list[tuple[float, float]] = []

    def longest_gap(self, seconds: float, lasted: float) -> None:
        self.gaps.append((seconds, lasted))


class Broken(Timing):
    def first_byte(self, seconds: float) -> None:
        raise RuntimeError("first_byte is broken")


class TimingProviders:
    @hookimpl
    def obleth_capacity_providers(self) -> dict[str, Callable[[Settings], object]]:
        return {"timing": Timing, "broken-timing": Broken, "gaps": Gaps}


def gateway_with(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    *providers: str,
    limit: int = 4,
) -> GatewayMiddleware:
    settings = Settings(global_max_in_flight=limit, capacity_providers=["static", *providers])
    return GatewayMiddleware(app, settings, plugins=[TimingProviders()])


def timing(gw: GatewayMiddleware) -> Timing:
    provider = gw.gateway.providers["timing"]
    assert isinstance(provider, Timing)
    return provider


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


async def say(send: Send, body: bytes, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": more})


async def start(send: Send, status: int = 200) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})


def test_the_feed_is_off_when_no_provider_follows_first_bytes() -> None:
    """Without a provider that has `first_byte`, the plan has no feed: requests pay nothing."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        pass

    gw = gateway_with(app)
    assert FlightPlan(app, gw.gateway, Complaints()).latency is None
    assert FlightPlan(app, gateway_with(app, "timing").gateway, Complaints()).latency


def test_a_streamed_response_is_timed_to_its_first_token_once() -> None:
    """The time runs to the first chunk with bytes in it (not the empty one before), and
    the provider is told then, before the stream goes on, and only that once."""
    told_before: list[int] = []

    async def scenario() -> None:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await asyncio.sleep(0.05)
            await start(send)
            await say(send, b"")
            told_before.append(len(provider.samples))
            await say(send, b"data: 1\n\n")
            told_before.append(len(provider.samples))
            await asyncio.sleep(0.05)
            await say(send, b"data: 2\n\n")
            await say(send, b"", more=False)
            told_before.append(len(provider.samples))

        gw = gateway_with(app, "timing")
        provider = timing(gw)
        client = Client()
        await gw(http_scope(), client.receive, client.send)
        assert client.text == b"data: 1\n\ndata: 2\n\n"
        assert told_before == [0, 1, 1]
        (sample,) = provider.samples
        assert sample >= 0.05

    run(scenario)


def test_a_whole_response_is_timed_to_its_one_chunk() -> None:
    """A response sent in one piece (not streamed) feeds the time to that piece, once."""

    async def scenario() -> None:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await asyncio.sleep(0.05)
            await JSONResponse({"choices": []})(scope, receive, send)

        gw = gateway_with(app, "timing")
        client = Client()
        await gw(http_scope(), client.receive, client.send)
        assert client.status == 200
        (sample,) = timing(gw).samples
        assert sample >= 0.05

    run(scenario)


def test_every_admitted_request_is_fed_once() -> None:
    """Twelve streamed requests through two seats, most of them waiting: twelve samples."""

    async def scenario() -> None:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await start(send)
            for token in (b"a", b"b", b"c"):
                await say(send, token)
                await asyncio.sleep(0.001)
            await say(send, b"", more=False)

        gw = gateway_with(app, "timing", limit=2)
        clients = [Client() for _ in range(12)]
        await asyncio.gather(*(gw(http_scope(), c.receive, c.send) for c in clients))
        assert [c.text for c in clients] == [b"abc"] * 12
        assert len(timing(gw).samples) == 12

    run(scenario)


def test_the_wait_in_the_gateways_queue_is_left_out() -> None:
    """A request that waited for the only seat is timed from its admission: its time to
    first byte is no longer than from the seat's release to its first token."""
    release = asyncio.Event()
    marks: dict[str, float] = {}
    waited: list[float] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await start(send)
        if scope["path"] == "/first":
            await say(send, b"token")
            await release.wait()
            marks["released"] = time.monotonic()
            await say(send, b"", more=False)  # the seat goes to the waiter here
        else:
            waited.append(scope["state"]["obleth"]["waited_s"])
            await say(send, b"token")
            marks["first_token"] = time.monotonic()
            await say(send, b"", more=False)

    async def scenario() -> None:
        gw = gateway_with(app, "timing", limit=1)
        first, second = Client(), Client()
        holding = asyncio.create_task(gw(http_scope("/first"), first.receive, first.send))
        await asyncio.sleep(0.01)
        waiting = asyncio.create_task(gw(http_scope("/second"), second.receive, second.send))
        await asyncio.sleep(0.2)
        assert gw.gateway.snapshot().queued == 1
        release.set()
        await asyncio.gather(holding, waiting)
        assert (first.text, second.text) == (b"token", b"token")
        _, sample = timing(gw).samples
        assert waited[0] > 0  # it did wait in the queue
        # the sample starts after the seat came back: the wait is not in it
        assert sample <= marks["first_token"] - marks["released"]

    run(scenario)


@pytest.mark.parametrize(
    ("status", "body", "fed"),
    [(200, b"", 1), (204, b"", 1), (500, b"oops", 0), (429, b"slow down", 0), (302, b"", 0)],
)
def test_only_a_2xx_response_is_fed(status: int, body: bytes, fed: int) -> None:
    """An error answers fast without the work a token stands for: it is not fed. A 2xx
    response with no body is timed to its end."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await start(send, status)
        await say(send, body, more=False)

    async def scenario() -> None:
        gw = gateway_with(app, "timing")
        client = Client()
        await gw(http_scope(), client.receive, client.send)
        assert client.status == status
        assert len(timing(gw).samples) == fed

    run(scenario)


def test_a_provider_whose_first_byte_raises_breaks_no_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The failure is logged once (rate-limited) under the provider's name; the requests
    are answered whole, their seats come back, and the other providers are still fed."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await start(send)
        await say(send, b"one ")
        await say(send, b"two", more=False)

    async def scenario() -> None:
        gw = gateway_with(app, "broken-timing", "timing")
        clients = [Client(), Client(), Client()]
        for client in clients:
            await gw(http_scope(), client.receive, client.send)
        assert [c.text for c in clients] == [b"one two"] * 3
        assert len(timing(gw).samples) == 3
        assert gw.gateway.snapshot().inflight == 0
        assert gw.gateway.scheduler.released == 3

    with caplog.at_level(logging.ERROR, logger="obleth.capacity"):
        run(scenario)
    complaints = [r for r in caplog.records if "first_byte" in r.getMessage()]
    assert len(complaints) == 1
    assert "'broken-timing'" in complaints[0].getMessage()
    assert complaints[0].exc_info is not None


def test_a_stream_s_longest_gap_is_told_each_time_it_grows() -> None:
    """A stall between two tokens (a backend's preemption) is told as soon as it ends,
    with the time since the hand-over; a shorter gap later is not told, nor is the empty
    chunk that ends the stream, nor anything of a response that is not 2xx."""

    async def scenario() -> None:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await start(send, 200 if scope["path"] == "/ok" else 500)
            await say(send, b"a")
            await say(send, b"b")
            await asyncio.sleep(0.2)
            await say(send, b"c")
            await say(send, b"d")
            await asyncio.sleep(0.3)
            await say(send, b"", more=False)

        gw = gateway_with(app, "gaps")
        provider = gw.gateway.providers["gaps"]
        assert isinstance(provider, Gaps)
        for path in ("/ok", "/failed"):
            client = Client()
            await gw(http_scope(path), client.receive, client.send)
            assert client.text == b"abcd"
        (first, _), (stall, lasted) = provider.gaps
        assert first < stall and stall >= 0.2 and lasted >= stall
        assert len(provider.samples) == 1  # the first byte, of the 2xx response only

    run(scenario)
