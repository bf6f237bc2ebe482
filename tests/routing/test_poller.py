"""The poller against real servers on loopback: numbers, health, hangs, staleness, pace,
lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from gateway.admin.health import readiness
from gateway.gateway import Gateway
from gateway.loopback import RunningServer, serve_in_task
from gateway.routing.activity import Activity
from gateway.routing.poller import IDLE_AFTER_ROUNDS, Poller
from gateway.routing.readings import Reading, Readings
from gateway.routing.request import RouteRequest
from gateway.settings import Settings
from gateway.sim import SimConfig, create_app
from gateway.types import Receive, Scope, Send

pytestmark = pytest.mark.anyio

INTERVAL_S = 0.05
TIMEOUT_S = 0.1
STALE_AFTER_S = 1.0
# Only a safety net against a poller that hangs for good; no test expects a round to
# take anywhere near this long.
ROUND_LIMIT_S = 10.0

VLLM_TEXT = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2
vllm:num_requests_waiting{model_name="m"} 1
vllm:kv_cache_usage_perc{model_name="m"} 0.5
"""

SGLANG_TEXT = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 6.0
sglang:num_running_reqs{model_name="qwen",tp_rank="1"} 1.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 3.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen",tp_rank="0"} 0.25
sglang:token_usage{model_name="qwen",tp_rank="1"} 0.75
"""


class FakeUpstream:
    """A raw ASGI upstream whose /health and /metrics answer as the test sets them.

    ``hang`` makes every request wait, unanswered, until the client goes away.
    """

    def __init__(
        self, metrics: str = VLLM_TEXT, *, prefix: str = "", health_path: str = "/health"
    ) -> None:
        self.metrics = metrics
        self.health_path = prefix + health_path
        self.metrics_path = prefix + "/metrics"
        self.health_status = 200
        self.metrics_status = 200
        self.hang = False
        self.delay_s = 0.0
        self.paths: list[str] = []
        self.clients: list[object] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.paths.append(scope["path"])
        self.clients.append(scope["client"])
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self._answer(scope["path"], receive, send)
        finally:
            self.in_flight -= 1

    async def _answer(self, path: str, receive: Receive, send: Send) -> None:
        if self.hang:
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        await asyncio.sleep(self.delay_s)
        if path == self.health_path:
            status, body = self.health_status, b"ok"
        elif path == self.metrics_path:
            status, body = self.metrics_status, self.metrics.encode()
        else:
            status, body = 404, b"not found"
        headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def fake(upstream: FakeUpstream) -> AsyncIterator[RunningServer]:
    async with serve_in_task(upstream, lifespan="off") as server:
        yield server


@contextlib.asynccontextmanager
async def polling(*urls: str, **options: Any) -> AsyncIterator[tuple[Poller, Readings]]:
    """A poller over ``urls`` with the test's short interval and timeout; stopped on exit."""
    readings = Readings(urls, stale_after_s=STALE_AFTER_S)
    options = {"interval_s": INTERVAL_S, "timeout_s": TIMEOUT_S, **options}
    poller = Poller(readings, **options)
    try:
        yield poller, readings
    finally:
        await poller.stop()


async def poll(poller: Poller) -> None:
    """One round, which must end: every request in it gives up after ``timeout_s``."""
    try:
        async with asyncio.timeout(ROUND_LIMIT_S):
            await poller.poll_once()
    except TimeoutError:
        pytest.fail(f"a polling round did not end within {ROUND_LIMIT_S} s")


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Check ``condition`` every 10 ms; fail the test naming ``what`` after 5 s."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"never happened: {what}")


def unused_port() -> int:
    """A port nothing listens on: bound by the kernel, then released."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_a_live_simulator_reports_the_request_it_is_running() -> None:
    """A stream in progress on the simulator shows as running 1, and as 0 once cancelled."""
    # 50 ms per token and a million tokens: the stream lasts until the test leaves it.
    config = SimConfig(step_s=0.05, step_s_per_seq=0.0, prefill_s_per_token=0.0)
    body = {"prompt": "Count to a million.", "max_tokens": 100_000, "stream": True}
    async with (
        serve_in_task(create_app(config)) as sim,
        polling(sim.url) as (poller, readings),
        httpx.AsyncClient(trust_env=False, timeout=10.0) as client,
    ):
        async with client.stream("POST", f"{sim.url}/v1/completions", json=body) as response:
            # the iterator is kept: one left by a `break` is finalized soon after, which
            # closes the response, and the simulator then withdraws the stream at once
            chunks = response.aiter_raw()
            await anext(chunks)  # a token arrived: the simulator is generating
            await poll(poller)
            busy = readings.get(sim.url)
        # leaving the block closed the connection mid-stream: the simulator cancels it
        for _ in range(500):
            await poll(poller)
            if readings.get(sim.url).running == 0:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the simulator never reported the cancelled stream gone")

    assert busy.engine == "vllm" and busy.healthy
    assert (busy.running, busy.waiting) == (1.0, 0.0)
    assert busy.kv_usage is not None and 0.0 < busy.kv_usage <= 1.0
    assert busy.at > 0.0


async def test_a_hanging_upstream_does_not_hold_back_the_others_and_turns_unhealthy() -> None:
    """While one upstream never answers, the others' readings are refreshed every round."""
    steady, stuck = FakeUpstream(), FakeUpstream()
    async with (
        fake(steady) as steady_server,
        fake(stuck) as stuck_server,
        polling(steady_server.url, stuck_server.url, unhealthy_after=2) as (poller, readings),
    ):
        await poll(poller)
        before = readings.all()
        assert before[stuck_server.url].healthy and before[stuck_server.url].running == 2.0

        stuck.hang = True
        await poll(poller)
        once = readings.all()
        await poll(poller)
        twice = readings.all()

    for reading in (before, once, twice):
        assert reading[steady_server.url].healthy
    assert before[steady_server.url].at < once[steady_server.url].at < twice[steady_server.url].at
    # one failed check is not enough; two in a row are
    assert once[stuck_server.url].healthy
    assert not twice[stuck_server.url].healthy
    # its numbers are the last ones scraped, dated to that scrape
    assert twice[stuck_server.url] == Reading(
        stuck_server.url,
        healthy=False,
        running=2.0,
        waiting=1.0,
        kv_usage=0.5,
        at=before[stuck_server.url].at,
        engine="vllm",
        models=frozenset({"m"}),
    )


async def test_health_failures_in_a_row_turn_an_upstream_unhealthy_and_one_pass_heals_it() -> None:
    """A 503 from /health counts as a failure; ``unhealthy_after`` of them flip the verdict."""
    upstream = FakeUpstream()
    async with fake(upstream) as server, polling(server.url, unhealthy_after=3) as (poller, r):
        verdicts: list[bool] = []
        for status in (200, 503, 503, 503, 503, 200, 503):
            upstream.health_status = status
            await poll(poller)
            verdicts.append(r.get(server.url).healthy)

    assert verdicts == [True, True, True, False, False, True, True]


async def test_an_upstream_is_unhealthy_until_its_first_passing_check() -> None:
    """Before any check passes, one failure is enough to call an upstream unhealthy."""
    upstream = FakeUpstream()
    upstream.health_status = 500
    async with fake(upstream) as server, polling(server.url, unhealthy_after=5) as (poller, r):
        await poll(poller)
        assert not r.get(server.url).healthy
        assert r.get(server.url).running == 2.0  # the numbers are read all the same

        upstream.health_status = 204
        await poll(poller)
        assert r.get(server.url).healthy


async def test_an_unreachable_upstream_is_unhealthy_with_no_numbers() -> None:
    """Nothing listening: unhealthy, never scraped, stale."""
    url = f"http://127.0.0.1:{unused_port()}"
    async with polling(url) as (poller, readings):
        await poll(poller)
        await poll(poller)

        assert readings.get(url) == Reading(url)
        assert readings.stale(url)


async def test_numbers_of_a_failing_scrape_keep_their_time_and_go_stale_by_age() -> None:
    """A failed scrape keeps the old numbers and their time, so they age into staleness."""
    upstream = FakeUpstream()
    async with fake(upstream) as server, polling(server.url) as (poller, readings):
        await poll(poller)
        scraped = readings.get(server.url)
        upstream.metrics_status = 500
        upstream.metrics = "vllm:num_requests_running 99"
        await poll(poller)
        kept = readings.get(server.url)

        assert kept == scraped  # health still passes, so the whole reading is unchanged
        assert not readings.stale(server.url, now=scraped.at + STALE_AFTER_S / 2)
        assert readings.stale(server.url, now=scraped.at + STALE_AFTER_S * 2)

        upstream.metrics_status = 200
        await poll(poller)
        fresh = readings.get(server.url)
        assert fresh.running == 99.0 and fresh.at > scraped.at


def waiting_text(n: int) -> str:
    return (
        'vllm:num_requests_running{model_name="m"} 1\n'
        f'vllm:num_requests_waiting{{model_name="m"}} {n}\n'
    )


async def test_a_queue_counts_only_once_two_scrapes_have_seen_it() -> None:
    """The load guard's queue is the smaller waiting figure of two real scrapes: the first
    scrape alone, or one scrape followed by a failed one, is not a queue."""
    upstream = FakeUpstream(waiting_text(6))
    async with fake(upstream) as server, polling(server.url) as (poller, readings):
        await poll(poller)
        first = readings.queued(server.url)
        upstream.metrics = waiting_text(0)
        await poll(poller)
        upstream.metrics = waiting_text(6)
        await poll(poller)
        upstream.metrics_status = 500  # a scrape times out or fails: nothing new seen
        await poll(poller)
        after_failure = readings.queued(server.url)
        upstream.metrics_status = 200
        upstream.metrics = waiting_text(4)
        await poll(poller)
        confirmed = readings.queued(server.url)

    assert (first, after_failure, confirmed) == (0.0, 0.0, 4.0)


async def test_sglang_metrics_served_by_an_upstream_are_read() -> None:
    """SGLang's names give running, waiting and kv usage, summed or maxed over label sets."""
    async with fake(FakeUpstream(SGLANG_TEXT)) as server, polling(server.url) as (poller, r):
        await poll(poller)
        reading = r.get(server.url)

    assert (reading.engine, reading.running, reading.waiting, reading.kv_usage) == (
        "sglang",
        7.0,
        3.0,
        0.75,
    )


async def test_a_base_url_with_a_path_keeps_it_and_the_paths_are_configurable() -> None:
    """``http://h/engine/`` with health path ``/ping`` is checked at ``/engine/ping``."""
    upstream = FakeUpstream(prefix="/engine", health_path="/ping")
    async with fake(upstream) as server:
        url = f"{server.url}/engine/"
        async with polling(url, health_path="/ping", metrics_path="metrics") as (poller, r):
            await poll(poller)
            reading = r.get(url)

    assert sorted(upstream.paths) == ["/engine/metrics", "/engine/ping"]
    assert reading.healthy and reading.running == 2.0


async def test_subscribers_hear_of_every_round_after_its_readings_are_in() -> None:
    """``readings.subscribe`` callbacks run once per round and see that round's numbers."""
    upstream = FakeUpstream()
    async with fake(upstream) as server, polling(server.url) as (poller, readings):
        seen: list[Reading] = []
        readings.subscribe(lambda: seen.append(readings.get(server.url)))
        for running in (1, 2, 3):
            upstream.metrics = f"vllm:num_requests_running {running}"
            await poll(poller)

    assert [reading.running for reading in seen] == [1.0, 2.0, 3.0]


async def test_rounds_never_overlap() -> None:
    """``poll_once`` while a round is in progress waits for it: one request of each kind."""
    upstream = FakeUpstream()
    upstream.delay_s = 0.05  # keeps the first round busy while the second is asked for
    async with fake(upstream) as server, polling(server.url, timeout_s=5.0) as (poller, _):
        try:
            async with asyncio.timeout(ROUND_LIMIT_S):
                await asyncio.gather(poller.poll_once(), poller.poll_once())
        except TimeoutError:
            pytest.fail("two polling rounds did not end")

    assert len(upstream.paths) == 4
    assert upstream.max_in_flight == 2


async def test_start_has_numbers_ready_and_polling_goes_on_until_stop() -> None:
    """After ``start()`` every reading is in; rounds follow on their own; ``stop()`` ends them."""
    upstream = FakeUpstream()
    async with fake(upstream) as server, polling(server.url) as (poller, readings):
        rounds: list[None] = []
        readings.subscribe(lambda: rounds.append(None))

        await poller.start()
        started = readings.get(server.url)
        assert started.healthy and started.running == 2.0 and started.at > 0.0
        assert len(rounds) == 1

        await wait_until(lambda: len(rounds) >= 3, "two more rounds in the background")
        await poller.stop()
        stopped_at = len(rounds)
        await asyncio.sleep(INTERVAL_S * 4)
        assert len(rounds) == stopped_at

        await poller.stop()  # again: nothing happens
        with pytest.raises(RuntimeError, match="starts once"):
            await poller.start()


async def test_rounds_reuse_their_connections() -> None:
    """Rounds after the first open no connection: the upstream sees two client addresses
    (metrics and health, side by side) however many rounds it answers."""
    upstream = FakeUpstream()
    async with fake(upstream) as server, polling(server.url) as (poller, _):
        for _ in range(5):
            await poll(poller)

    assert len(upstream.paths) == 10
    assert len(set(upstream.clients)) == 2


async def test_an_idle_gateway_polls_slowly_until_a_request_arrives() -> None:
    """With no request for a few rounds the poller rests: no round for many intervals, and
    readings stay fresh as long, in rounds, as before. The first request starts a round at
    once, and rounds follow at the full pace until the gateway is idle again."""
    upstream = FakeUpstream()
    activity = Activity()
    idle_s = 60.0  # so long that any round seen while resting was started by a request
    options = {"idle_interval_s": idle_s, "activity": activity}
    async with fake(upstream) as server, polling(server.url, **options) as (poller, readings):
        await poller.start()
        await wait_until(lambda: poller.resting, "the poller resting")
        assert readings.stale_after_s == STALE_AFTER_S * idle_s / INTERVAL_S
        reading = readings.get(server.url)
        assert not readings.stale(server.url, now=reading.at + STALE_AFTER_S * 2)

        polled = len(upstream.paths)
        await asyncio.sleep(INTERVAL_S * 10)
        assert len(upstream.paths) == polled  # ten intervals, not one round

        activity.arrived()
        await wait_until(lambda: len(upstream.paths) > polled, "a round right after a request")
        await wait_until(lambda: not poller.resting, "the full pace again")
        assert readings.stale_after_s == STALE_AFTER_S
        # four more rounds: at the idle pace they would take minutes
        await wait_until(lambda: len(upstream.paths) >= polled + 10, "rounds at the full pace")

        await wait_until(lambda: poller.resting, "the poller resting again")


async def test_requests_in_flight_keep_the_full_pace() -> None:
    """While requests are in flight (a long stream, say) the poller never rests."""
    upstream = FakeUpstream()
    activity = Activity(busy=lambda: True)
    options = {"idle_interval_s": 60.0, "activity": activity}
    async with fake(upstream) as server, polling(server.url, **options) as (poller, readings):
        resting: list[bool] = []
        readings.subscribe(lambda: resting.append(poller.resting))
        await poller.start()
        # twice the rounds it takes an idle poller to rest
        await wait_until(lambda: len(resting) >= 2 * (IDLE_AFTER_ROUNDS + 1), "ten rounds")

    assert not any(resting)
    assert readings.stale_after_s == STALE_AFTER_S


async def test_a_gateway_at_rest_wakes_its_poller_with_the_first_routed_request() -> None:
    """Through the gateway's own wiring: an idle gateway reads its upstreams slowly, stays
    ready with fresh (not stale) readings; routing a request starts a round, and the
    pace stays full until the request is finished."""
    upstream = FakeUpstream()
    async with fake(upstream) as server:
        settings = Settings(
            upstreams=(server.url,),
            upstream_poll_interval_s=INTERVAL_S,
            upstream_idle_poll_factor=1200.0,  # a minute
            upstream_poll_timeout_s=TIMEOUT_S,
        )
        gateway = Gateway(settings, entry_points=False)
        await gateway.start()
        try:
            readings, router = gateway.readings, gateway.router
            assert router is not None
            normal = readings.stale_after_s
            await wait_until(lambda: readings.stale_after_s > normal, "the poller resting")
            polled = len(upstream.paths)
            assert readiness(gateway)[0] == 200
            assert not readings.stale(server.url, now=readings.get(server.url).at + normal * 2)

            request = RouteRequest("/v1/completions", None, (), None, "tenant", router.fleet)
            decision = router.route(request)
            await wait_until(lambda: len(upstream.paths) > polled, "a round after the request")
            await wait_until(lambda: readings.stale_after_s == normal, "the full pace again")

            # while it is in flight, twice the rounds it takes an idle poller to rest
            paces: list[float] = []
            readings.subscribe(lambda: paces.append(readings.stale_after_s))
            await wait_until(lambda: len(paces) >= 2 * (IDLE_AFTER_ROUNDS + 1), "ten rounds")
            assert set(paces) == {normal}
            decision.finish()
            await wait_until(lambda: readings.stale_after_s > normal, "resting once it ended")
        finally:
            await gateway.stop()


async def test_changes_of_state_are_logged_once_each_not_every_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A WARNING when health or scraping breaks, an INFO when it mends, silence in between."""
    caplog.set_level(logging.INFO, logger="obleth.routing")
    upstream = FakeUpstream()
    async with fake(upstream) as server, polling(server.url, unhealthy_after=2) as (poller, _):

        async def rounds(count: int) -> list[tuple[int, str]]:
            caplog.clear()
            for _ in range(count):
                await poll(poller)
            return [(r.levelno, r.getMessage()) for r in caplog.records]

        assert await rounds(2) == []

        upstream.health_status, upstream.metrics_status = 503, 500
        broke = await rounds(5)

        upstream.health_status, upstream.metrics_status = 200, 200
        mended = await rounds(3)

    assert [level for level, _ in broke] == [logging.WARNING, logging.WARNING]
    assert "metrics" in broke[0][1] and "answered 500" in broke[0][1]
    assert "unhealthy" in broke[1][1] and "answered 503" in broke[1][1]
    assert [level for level, _ in mended] == [logging.INFO, logging.INFO]
    assert all(server.url in message for _, message in broke + mended)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"interval_s": 0}, "interval_s"),
        ({"idle_interval_s": 0.5}, "idle_interval_s"),
        ({"timeout_s": -1.0}, "timeout_s"),
        ({"unhealthy_after": 0}, "unhealthy_after"),
        ({"unhealthy_after": True}, "unhealthy_after"),
    ],
)
async def test_unusable_settings_are_refused_naming_them(
    options: dict[str, Any], problem: str
) -> None:
    """A poller that could not work is refused at construction, naming the argument."""
    readings = Readings(["http://127.0.0.1:8000"], stale_after_s=1.0)
    arguments: dict[str, Any] = {"interval_s": 1.0, "timeout_s": 1.0, **options}
    with pytest.raises(ValueError, match=problem):
        Poller(readings, **arguments)


async def test_an_upstream_that_is_not_an_http_url_is_refused() -> None:
    """The poller speaks HTTP; any other scheme is a configuration mistake."""
    readings = Readings(["ftp://127.0.0.1:8000"], stale_after_s=1.0)
    with pytest.raises(ValueError, match="ftp://"):
        Poller(readings, interval_s=1.0, timeout_s=1.0)
