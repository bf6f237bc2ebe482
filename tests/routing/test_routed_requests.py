"""Routed requests end to end: ``GatewayMiddleware`` routing in front of ``ProxyApp``,
served by real uvicorn on loopback, driven by real httpx clients, answered by simulated
vLLM upstreams (``gateway.sim``), everything on the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gateway.asgi.middleware import GatewayMiddleware
from gateway.gateway import Gateway
from gateway.loopback import RunningServer, serve_in_task, serve_in_thread
from gateway.proxy import ProxyApp
from gateway.routing.httpclient import KEEPALIVE_EXPIRY_S
from gateway.routing.router import Decision
from gateway.settings import Settings
from gateway.sim import SimConfig, create_app
from gateway.sim.stats import SimSnapshot
from gateway.types import ASGIApp, Message, Receive, Scope, Send

pytestmark = pytest.mark.anyio

WAIT_S = 10.0
"""Bound on every wait: a condition still false after it fails the test, never hangs it."""

# 10 ms per token and no other cost: a 2-token answer takes about 20 ms, and a stream
# asking for a million tokens lasts until the test leaves it.
FAST = SimConfig(step_s=0.01, step_s_per_seq=0.0, prefill_s_per_token=0.0)
SHORT: dict[str, Any] = {"prompt": "Say something short.", "max_tokens": 2}
ENDLESS: dict[str, Any] = {"prompt": "Count to a million.", "max_tokens": 100_000, "stream": True}
UPSTREAM_HEADER = "x-obleth-upstream"


# -- upstreams ------------------------------------------------------------------------------


class SwitchableHealth:
    """A simulator whose ``GET /health`` answers 503 while ``failing`` is set."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.failing = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/health" and self.failing:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b"draining"})
            return
        await self.app(scope, receive, send)


@dataclass
class Sim:
    """One simulated upstream served on loopback; ``stats()`` is its ground truth."""

    server: RunningServer
    app: Starlette
    health: SwitchableHealth

    @property
    def url(self) -> str:
        return self.server.url

    def stats(self) -> SimSnapshot:
        snapshot: SimSnapshot = self.app.state.stats.snapshot()
        return snapshot


@contextlib.asynccontextmanager
async def simulators(count: int, config: SimConfig = FAST) -> AsyncIterator[list[Sim]]:
    async with contextlib.AsyncExitStack() as stack:
        sims = []
        for _ in range(count):
            app = create_app(config)
            health = SwitchableHealth(app)
            server = await stack.enter_async_context(serve_in_task(health))
            sims.append(Sim(server, app, health))
        yield sims


@contextlib.asynccontextmanager
async def serving(*models: str) -> AsyncIterator[list[Sim]]:
    """One simulator per model in ``models``, serving that model: like vLLM, each answers
    a request for any other model 404."""
    async with contextlib.AsyncExitStack() as stack:
        sims = []
        for model in models:
            config = dataclasses.replace(FAST, model=model)
            sims += await stack.enter_async_context(simulators(1, config))
        yield sims


# -- the gateway ------------------------------------------------------------------------------


class Recording:
    """The app behind the middleware: keeps what routing left in the scope, and our
    in-flight counts as the app saw them, then hands the request to ``inner``."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner
        self.router: Any = None
        self.seen: list[dict[str, Any]] = []
        self.counts: list[dict[str, int]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append(dict(scope["state"]["obleth"]))
            self.counts.append(dict(self.router.in_flight()))
        await self.inner(scope, receive, send)


@dataclass
class Routed:
    """A routing gateway served on loopback, and the app it runs."""

    server: RunningServer
    middleware: GatewayMiddleware
    app: Recording

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def gateway(self) -> Gateway:
        return self.middleware.gateway

    def in_flight(self) -> dict[str, int]:
        assert self.gateway.router is not None
        return dict(self.gateway.router.in_flight())


@contextlib.asynccontextmanager
async def routed_gateway(
    sims: Sequence[Sim],
    *,
    app: ASGIApp | None = None,
    upstreams: Sequence[str] | None = None,
    **settings: Any,
) -> AsyncIterator[Routed]:
    """``GatewayMiddleware(Recording(app or ProxyApp()))`` routing to ``sims``."""
    options: dict[str, Any] = {
        "upstreams": tuple(upstreams if upstreams is not None else [s.url for s in sims]),
        "routing_seed": 7,
        "global_max_in_flight": 256,
        # one scrape a second: readings never go stale during a test on a busy machine
        "upstream_poll_interval_s": 1.0,
        "upstream_poll_timeout_s": 1.0,
        **settings,
    }
    recording = Recording(app if app is not None else ProxyApp())
    middleware = GatewayMiddleware(recording, settings=Settings(**options))
    recording.router = middleware.gateway.router
    async with serve_in_task(middleware) as server:
        yield Routed(server, middleware, recording)


# -- waiting, bounded -------------------------------------------------------------------------


async def eventually(condition: Callable[[], bool], what: Callable[[], str]) -> None:
    """Poll ``condition`` every 10 ms; after ``WAIT_S`` fail with ``what()``."""
    for _ in range(int(WAIT_S / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"still not the case after {WAIT_S} s: {what()}")


async def settled(gateway: Routed) -> None:
    """Wait until the gateway counts nothing in flight: no upstream, no admission seat."""

    def idle() -> bool:
        return not any(gateway.in_flight().values()) and gateway.gateway.snapshot().inflight == 0

    await eventually(
        idle,
        lambda: (
            f"in flight per upstream {gateway.in_flight()}, "
            f"seats held {gateway.gateway.snapshot().inflight}"
        ),
    )


def only(counts: Mapping[str, int], upstream: str, n: int = 1) -> dict[str, int]:
    """``counts`` as expected with ``n`` on ``upstream`` and 0 everywhere else."""
    return {u: n if u == upstream else 0 for u in counts}


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(
        max_connections=200, max_keepalive_connections=200, keepalive_expiry=KEEPALIVE_EXPIRY_S
    )
    async with httpx.AsyncClient(trust_env=False, timeout=WAIT_S, limits=limits) as client:
        yield client


@contextlib.asynccontextmanager
async def held_stream(
    http: httpx.AsyncClient, url: str, headers: Mapping[str, str] | None = None
) -> AsyncIterator[httpx.Response]:
    """A streamed completion that keeps going until the block is left, which closes the
    connection mid-stream (a client disconnect)."""
    async with http.stream(
        "POST", f"{url}/v1/completions", json=ENDLESS, headers=headers
    ) as response:
        assert response.status_code == 200, await response.aread()
        yield response


# -- what the app and the client see ----------------------------------------------------------


async def test_the_app_sees_the_route_and_the_request_reaches_the_upstream_chosen(
    http: httpx.AsyncClient,
) -> None:
    """``scope["state"]["obleth"]`` names the upstream, why, and the Decision; that
    upstream, and only it, gets the request and answers it."""
    async with simulators(3) as sims, routed_gateway(sims, upstream_header=True) as gateway:
        response = await http.post(f"{gateway.url}/v1/completions", json=SHORT)
        [seen] = gateway.app.seen
        [counts] = gateway.app.counts
        await settled(gateway)

    urls = [s.url for s in sims]
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 2
    upstream = seen["upstream"]
    assert upstream in urls
    assert [s.stats().completed for s in sims] == [int(u == upstream) for u in urls]
    assert response.headers[UPSTREAM_HEADER] == upstream
    route = seen["route"]
    assert isinstance(route, Decision)
    assert route.upstream == upstream
    assert route.ranking[0] == upstream and sorted(route.ranking) == sorted(urls)
    scores = seen["scores"]
    assert set(scores) == {"prefix-affinity", "queue-depth", "total"}
    assert set(scores["total"]) == set(urls)
    assert scores["total"][upstream] == max(scores["total"].values())
    # while the app ran, the request counted against its upstream
    assert counts == only(counts, upstream)
    assert seen["tenant"] and seen["priority"] == "standard"


@pytest.mark.parametrize("upstream_header", [True, False], ids=["header-on", "header-off"])
async def test_responses_name_the_upstream_only_when_upstream_header_is_on(
    http: httpx.AsyncClient, upstream_header: bool
) -> None:
    """``x-obleth-upstream`` is on every routed response with the setting, on none without."""
    async with (
        simulators(2) as sims,
        routed_gateway(sims, upstream_header=upstream_header) as gateway,
    ):
        answered = await http.post(f"{gateway.url}/v1/completions", json=SHORT)
        async with http.stream(
            "POST", f"{gateway.url}/v1/completions", json={**SHORT, "stream": True}
        ) as streamed:
            await streamed.aread()
        chosen = [seen["upstream"] for seen in gateway.app.seen]

    assert (answered.status_code, streamed.status_code) == (200, 200)
    names = [r.headers.get(UPSTREAM_HEADER) for r in (answered, streamed)]
    assert names == (chosen if upstream_header else [None, None])


async def test_after_a_retry_the_upstream_header_names_the_upstream_that_answered(
    http: httpx.AsyncClient,
) -> None:
    """An app (the proxy, here a stand-in) that gives up the chosen upstream and retries
    on the next one answers with the header naming that next one."""
    choices: list[tuple[str, str | None]] = []

    async def retrying(request: Request) -> Response:
        decision = request.scope["state"]["obleth"]["route"]
        choices.append((decision.upstream, decision.reroute()))
        return PlainTextResponse("answered")

    app = Starlette(routes=[Route("/v1/completions", retrying, methods=["POST"])])
    async with (
        simulators(2) as sims,
        routed_gateway(sims, app=app, upstream_header=True) as gateway,
    ):
        response = await http.post(f"{gateway.url}/v1/completions", json=SHORT)
        await settled(gateway)

    [(first, second)] = choices
    assert second is not None and second != first
    assert response.headers[UPSTREAM_HEADER] == second


# -- in-flight counts given back on every path -------------------------------------------------


async def test_in_flight_returns_to_zero_after_a_normal_response(
    http: httpx.AsyncClient,
) -> None:
    """A request counts against its upstream while it runs and not after it answered."""
    async with simulators(2) as sims, routed_gateway(sims) as gateway:
        for _ in range(3):
            response = await http.post(f"{gateway.url}/v1/completions", json=SHORT)
            assert response.status_code == 200, response.text
            await settled(gateway)

    for seen, counts in zip(gateway.app.seen, gateway.app.counts, strict=True):
        assert counts == only(counts, seen["upstream"])


async def test_in_flight_lasts_until_the_last_chunk_of_a_streamed_response(
    http: httpx.AsyncClient,
) -> None:
    """A streamed (SSE) answer counts until its ``[DONE]``, then is given back."""
    body = {"prompt": "Tell a story.", "max_tokens": 20, "stream": True}
    async with simulators(2) as sims, routed_gateway(sims, upstream_header=True) as gateway:
        async with http.stream("POST", f"{gateway.url}/v1/completions", json=body) as response:
            upstream = response.headers[UPSTREAM_HEADER]
            events = []
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    if len(events) == 1:
                        counted_mid_stream = gateway.in_flight()
        await settled(gateway)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "data: [DONE]" and len(events) == 21
    assert counted_mid_stream == only(counted_mid_stream, upstream)


class Failing:
    """An app that raises, before its response starts or after its first chunk."""

    def __init__(self, when: str) -> None:
        self.when = when

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if self.when == "after-start":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"half", "more_body": True})
        raise RuntimeError("the app behind the gateway failed")


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


@pytest.mark.parametrize("when", ["before-start", "after-start"])
async def test_in_flight_returns_to_zero_when_the_app_raises(
    http: httpx.AsyncClient, when: str
) -> None:
    """An app that raises gives the upstream's count and the admission seat back."""
    async with simulators(2) as sims, routed_gateway(sims, app=Failing(when)) as gateway:
        for _ in range(2):
            try:
                response = await http.post(f"{gateway.url}/v1/completions", json=SHORT)
            except httpx.TransportError:
                # after the start the server can only cut the response short
                assert when == "after-start"
            else:
                assert (when, response.status_code) == ("before-start", 500)
            await settled(gateway)

    assert len(gateway.app.seen) == 2
    for seen, counts in zip(gateway.app.seen, gateway.app.counts, strict=True):
        assert counts == only(counts, seen["upstream"])


async def test_in_flight_returns_to_zero_when_the_client_disconnects_mid_stream(
    http: httpx.AsyncClient,
) -> None:
    """A client leaving mid-stream frees its upstream's count, and the upstream stops."""
    async with simulators(2) as sims, routed_gateway(sims, upstream_header=True) as gateway:
        async with held_stream(http, gateway.url) as response:
            upstream = response.headers[UPSTREAM_HEADER]
            async for _ in response.aiter_raw():
                break  # a token arrived: the stream runs
            counted_mid_stream = gateway.in_flight()
        await settled(gateway)
        [sim] = [s for s in sims if s.url == upstream]
        await eventually(lambda: sim.stats().concurrency == 0, lambda: f"{sim.stats()}")

    assert counted_mid_stream == only(counted_mid_stream, upstream)
    assert (sim.stats().disconnected, sim.stats().completed) == (1, 0)


# -- filters: model, health -------------------------------------------------------------------


async def answered(http: httpx.AsyncClient, gateway: Routed, model: str) -> tuple[str, str]:
    """A short completion for ``model`` through ``gateway``: the model and the upstream
    that answered it (``upstream_header`` must be on)."""
    response = await http.post(f"{gateway.url}/v1/completions", json={**SHORT, "model": model})
    assert response.status_code == 200, response.text
    return model, response.headers[UPSTREAM_HEADER]


async def test_requests_for_a_model_reach_only_the_upstreams_serving_it(
    http: httpx.AsyncClient,
) -> None:
    """With ``URL=model-a`` and ``URL=model-b``, each model's requests go to its upstream."""
    async with serving("model-a", "model-b") as sims:
        a, b = sims
        upstreams = [f"{a.url}=model-a", f"{b.url}=model-b"]
        async with routed_gateway(sims, upstreams=upstreams, upstream_header=True) as gateway:
            asks = (answered(http, gateway, m) for m in ["model-a", "model-b"] * 5)
            answers = await asyncio.gather(*asks)

    assert Counter(answers) == {("model-a", a.url): 5, ("model-b", b.url): 5}
    assert (a.stats().completed, b.stats().completed) == (5, 5)


async def test_without_model_lists_requests_follow_the_models_the_upstreams_metrics_name(
    http: httpx.AsyncClient,
) -> None:
    """Upstreams configured by URL alone, each serving its own model: the ``model_name``
    label of their metrics says which serves what, and each model's requests go there; a
    model no metrics name (a LoRA adapter, say) may go to either, for the upstream to
    answer (these simulators serve no adapter: each answers 404, as vLLM would)."""
    async with serving("model-a", "model-b") as sims:
        a, b = sims
        async with routed_gateway(sims, upstream_header=True) as gateway:
            readings = gateway.gateway.readings
            await eventually(
                lambda: all(readings.get(s.url).models for s in (a, b)),
                lambda: f"readings {[readings.get(s.url) for s in (a, b)]}",
            )

            asks = (answered(http, gateway, m) for m in ["model-a", "model-b"] * 6)
            answers = await asyncio.gather(*asks)
            adapter = {**SHORT, "model": "sql-adapter"}
            adapters = await asyncio.gather(
                *(http.post(f"{gateway.url}/v1/completions", json=adapter) for _ in range(12))
            )

    assert Counter(answers) == {("model-a", a.url): 6, ("model-b", b.url): 6}
    assert {response.status_code for response in adapters} == {404}
    assert {response.headers[UPSTREAM_HEADER] for response in adapters} == {a.url, b.url}


async def test_a_model_no_upstream_serves_gets_404_model_not_found_and_frees_its_seat(
    http: httpx.AsyncClient,
) -> None:
    """An unserved model is answered 404 with an OpenAI-style error naming the served
    models; no upstream sees it, and its admission seat is given back."""
    async with serving("model-a", "model-b") as sims:
        a, b = sims
        upstreams = [f"{a.url}=model-a", f"{b.url}=model-b"]
        async with routed_gateway(sims, upstreams=upstreams, upstream_header=True) as gateway:
            response = await http.post(
                f"{gateway.url}/v1/completions", json={**SHORT, "model": "model-c"}
            )
            seats_held = gateway.gateway.snapshot().inflight
            counts = gateway.in_flight()
            served = await http.post(
                f"{gateway.url}/v1/completions", json={**SHORT, "model": "model-b"}
            )

    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "model-c" in error["message"]
    assert "model-a" in error["message"] and "model-b" in error["message"]
    assert UPSTREAM_HEADER not in response.headers
    assert (seats_held, counts) == (0, {a.url: 0, b.url: 0})
    assert gateway.app.seen[0]["upstream"] == b.url and len(gateway.app.seen) == 1
    assert served.status_code == 200
    assert (a.stats().requests, b.stats().requests) == (0, 1)
    # OpenAI answers an unknown model 404 with type invalid_request_error, and so does the
    # gateway for its other client errors (400, 413)
    assert error["type"] == "invalid_request_error"


async def test_a_model_name_that_is_no_valid_utf8_is_routed_like_any_other(
    http: httpx.AsyncClient,
) -> None:
    """JSON may carry a lone surrogate (``\\ud800``) in the model name; the router hashes
    it like any other name, the upstream answers it (404: it serves no such model), and
    the request takes and gives back its seat as usual."""
    body = b'{"model": "m\\ud800", "prompt": "Say something short.", "max_tokens": 2}'
    async with simulators(1) as sims, routed_gateway(sims) as gateway:
        response = await http.post(
            f"{gateway.url}/v1/completions",
            content=body,
            headers={"content-type": "application/json"},
        )
        await settled(gateway)

    assert response.status_code == 404, response.text
    assert response.json()["error"]["type"] == "NotFoundError"  # the upstream's answer
    assert (sims[0].stats().requests, sims[0].stats().failed) == (1, 1)


async def test_a_body_nested_too_deep_to_parse_is_left_for_the_upstream_to_refuse(
    http: httpx.AsyncClient,
) -> None:
    """The gateway routes a body it cannot parse (here JSON nested deeper than Python's
    parser goes) without a model or a prompt, so the upstream answers it, 400; the
    gateway neither fails with a 500 nor keeps the seat."""
    body = b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with simulators(1) as sims, routed_gateway(sims, global_max_in_flight=1) as gateway:
        refused = await http.post(
            f"{gateway.url}/v1/completions",
            content=body,
            headers={"content-type": "application/json"},
        )
        served = await http.post(f"{gateway.url}/v1/completions", json=SHORT)
        await settled(gateway)

    assert refused.status_code == 400, refused.text
    assert "not valid JSON" in refused.json()["error"]["message"]
    assert served.status_code == 200 and sims[0].stats().completed == 1


async def test_a_fault_while_routing_gives_the_seat_back(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever goes wrong while choosing the upstream, the request's seat comes back:
    the client gets the server's 500 and the next request finds the seat free."""
    async with simulators(1) as sims, routed_gateway(sims, global_max_in_flight=1) as gateway:
        router = gateway.gateway.router
        assert router is not None

        def broken(request: object) -> Decision:
            raise RuntimeError("a fault while routing")

        with monkeypatch.context() as patch:
            patch.setattr(router, "route", broken)
            failed = [
                (await http.post(f"{gateway.url}/v1/completions", json=SHORT)).status_code
                for _ in range(3)
            ]
        seats_held = gateway.gateway.snapshot().inflight
        served = await http.post(f"{gateway.url}/v1/completions", json=SHORT)

    assert (failed, seats_held) == ([500, 500, 500], 0)
    assert served.status_code == 200


async def test_with_every_upstream_unhealthy_a_request_gets_503_with_retry_after(
    http: httpx.AsyncClient,
) -> None:
    """No healthy upstream: 503 ``no_healthy_upstream`` with ``Retry-After`` (the next
    health check), and the seat is given back."""
    async with (
        simulators(1) as sims,
        routed_gateway(sims, upstream_poll_interval_s=2.0) as gateway,
    ):
        sims[0].health.failing = True
        readings = gateway.gateway.readings
        await eventually(lambda: not readings.get(sims[0].url).healthy, lambda: f"{readings.all()}")
        response = await http.post(f"{gateway.url}/v1/completions", json=SHORT)
        seats_held = gateway.gateway.snapshot().inflight

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_healthy_upstream"
    assert response.headers["retry-after"] == "2"
    assert seats_held == 0


async def test_an_unhealthy_upstream_gets_no_traffic_until_it_recovers(
    http: httpx.AsyncClient,
) -> None:
    """Once the poller sees an upstream's /health fail it is skipped, even when it is the
    least loaded; once /health passes again it gets traffic again."""
    async with (
        simulators(2) as sims,
        routed_gateway(
            sims,
            upstream_header=True,
            routing_scorers="queue-depth:1",
            upstream_poll_interval_s=0.1,
        ) as gateway,
    ):
        sick, well = sims
        readings = gateway.gateway.readings

        def health() -> str:
            return f"readings {readings.all()}"

        sick.health.failing = True
        await eventually(lambda: not readings.get(sick.url).healthy, health)
        # two streams at once: queue-depth alone would put the second on the idle upstream
        async with (
            held_stream(http, gateway.url) as first,
            held_stream(http, gateway.url) as second,
        ):
            while_sick = [first.headers[UPSTREAM_HEADER], second.headers[UPSTREAM_HEADER]]
        await settled(gateway)
        requests_while_sick = sick.stats().requests

        sick.health.failing = False
        await eventually(lambda: readings.get(sick.url).healthy, health)
        async with (
            held_stream(http, gateway.url) as first,
            held_stream(http, gateway.url) as second,
        ):
            recovered = [first.headers[UPSTREAM_HEADER], second.headers[UPSTREAM_HEADER]]
        await settled(gateway)

    assert while_sick == [well.url, well.url]
    assert requests_while_sick == 0
    assert sorted(recovered) == sorted([sick.url, well.url])
    assert sick.stats().requests == 1


# -- load: no pile-on between scrapes ---------------------------------------------------------


async def test_a_burst_between_two_scrapes_spreads_evenly_over_the_upstreams(
    http: httpx.AsyncClient,
) -> None:
    """100 long streams arriving at once, with no scrape during the burst, land 25 on each
    of 4 upstreams: our own in-flight counts, taken at decision time, spread them."""
    streams, per_upstream = 100, 25
    # one token every half second: the streams stay open and cost little while they do
    slow = SimConfig(step_s=0.5, step_s_per_seq=0.0, prefill_s_per_token=0.0, max_num_seqs=256)
    async with (
        simulators(4, slow) as sims,
        routed_gateway(
            sims,
            upstream_header=True,
            routing_scorers="queue-depth:1",
            # no scrape after the first one while the test runs
            upstream_poll_interval_s=30.0,
        ) as gateway,
    ):
        opened: list[str] = []
        all_open, release = asyncio.Event(), asyncio.Event()

        async def one() -> None:
            async with held_stream(http, gateway.url) as response:
                opened.append(response.headers[UPSTREAM_HEADER])
                if len(opened) == streams:
                    all_open.set()
                await release.wait()

        tasks = [asyncio.ensure_future(one()) for _ in range(streams)]
        try:
            async with asyncio.timeout(WAIT_S * 2):
                await asyncio.wait(
                    [asyncio.ensure_future(all_open.wait()), *tasks],
                    return_when=asyncio.FIRST_COMPLETED,
                )
            if not all_open.is_set():
                failed = [t for t in tasks if t.done()]
                pytest.fail(f"only {len(opened)} streams opened; first failure: {failed[:1]}")
            concurrency = {s.url: s.stats().concurrency for s in sims}
            counted = gateway.in_flight()
        except TimeoutError:
            pytest.fail(f"only {len(opened)} of {streams} streams opened within {WAIT_S * 2} s")
        finally:
            release.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        await settled(gateway)
        await eventually(
            lambda: all(s.stats().concurrency == 0 for s in sims),
            lambda: f"{[s.stats() for s in sims]}",
        )

    assert sum(concurrency.values()) == streams
    assert all(per_upstream - 1 <= n <= per_upstream + 1 for n in concurrency.values()), concurrency
    assert counted == concurrency
    assert Counter(opened) == concurrency


# -- session affinity ---------------------------------------------------------------------------


def _sessions(count: int) -> Iterator[str]:
    for i in range(count):
        yield f"session-{i:02d}"


async def test_every_request_of_a_session_goes_to_one_upstream_through_any_gateway(
    http: httpx.AsyncClient,
) -> None:
    """With ``session-affinity``, a session's requests all go to one upstream, and two
    gateways that share nothing agree on which; different sessions use different ones."""
    settings: dict[str, Any] = {
        "upstream_header": True,
        # queue-depth is scaled between the least and the most loaded upstream, so at equal
        # weights one request waiting on the session's upstream ties it with an idle one
        "routing_scorers": "session-affinity:2,queue-depth:1",
    }
    async with (
        simulators(3) as sims,
        routed_gateway(sims, routing_seed=1, **settings) as first,
        routed_gateway(sims, routing_seed=2, **settings) as second,
    ):
        where: dict[str, set[str]] = {}
        for k in range(4):
            for i, session in enumerate(_sessions(12)):
                gateway = (first, second)[(i + k) % 2]
                response = await http.post(
                    f"{gateway.url}/v1/completions", json=SHORT, headers={"x-session-id": session}
                )
                assert response.status_code == 200, response.text
                where.setdefault(session, set()).add(response.headers[UPSTREAM_HEADER])
                # the next request finds nothing of ours in flight, so the load guard stays
                # out of it (see the test of sequential clients below)
                await settled(gateway)

    assert {s: len(u) for s, u in where.items()} == dict.fromkeys(_sessions(12), 1)
    assert len(set.union(*where.values())) > 1
    assert sum(s.stats().completed for s in sims) == 48


# -- a client that waits for each answer before it sends the next -----------------------------


@contextlib.contextmanager
def gateway_in_thread(
    upstreams: int, **settings: Any
) -> Iterator[tuple[RunningServer, GatewayMiddleware, Recording]]:
    """Simulators and a routing gateway each on their own thread and event loop, as
    independent of the test's client as separate machines would be."""
    with contextlib.ExitStack() as stack:
        urls = [
            stack.enter_context(serve_in_thread(create_app(FAST))).url for _ in range(upstreams)
        ]
        recording = Recording(ProxyApp())
        options = {"upstreams": tuple(urls), "upstream_poll_interval_s": 1.0, **settings}
        middleware = GatewayMiddleware(recording, settings=Settings(**options))
        recording.router = middleware.gateway.router
        server = stack.enter_context(serve_in_thread(middleware))
        yield server, middleware, recording


async def test_a_finished_request_no_longer_counts_when_the_same_client_sends_its_next(
    http: httpx.AsyncClient,
) -> None:
    """A client that reads each whole response before sending its next request has one
    request in flight at a time, and routing never counts more than that one."""
    with gateway_in_thread(2) as (server, _, recording):
        for _ in range(50):
            response = await http.post(f"{server.url}/v1/completions", json=SHORT)
            assert response.status_code == 200, response.text

    assert len(recording.counts) == 50
    overlapping = [counts for counts in recording.counts if sum(counts.values()) != 1]
    assert not overlapping, (
        f"{len(overlapping)} of 50 requests were routed while the same client's previous, "
        f"already answered request still counted: {overlapping[:3]}"
    )


async def test_a_client_sending_one_request_at_a_time_is_never_refused_a_seat(
    http: httpx.AsyncClient,
) -> None:
    """With one seat and no queue, a client that waits for each answer is always admitted:
    its finished request has given its seat back before the next one arrives."""
    one_seat = {"global_max_in_flight": 1, "max_queue": 0, "overflow_policy": "drop-newest"}
    with gateway_in_thread(1, **one_seat) as (server, _, _):
        statuses = Counter[int]()
        for _ in range(50):
            response = await http.post(f"{server.url}/v1/completions", json=SHORT)
            statuses[response.status_code] += 1

    assert statuses == {200: 50}
