"""Routing across gateway pods: ``obleth serve`` processes in front of ``obleth mock-backend``
processes, with no shared state (prefixes still stay together) and sharing a Redis (each
pod's requests in flight count in the others' routing)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.gateway import Gateway
from gateway.loopback import serve_in_task
from gateway.routing.readings import Reading
from gateway.routing.request import RouteRequest, blocks_of
from gateway.routing.router import Decision, Router
from gateway.routing.sharing import SharedRouting
from gateway.settings import Settings
from gateway.sim import SimConfig, create_app
from tests.cluster.pods import ServePod, SimBackend

WAIT_S = 10.0
"""Bound on every wait: a condition still false after it fails the test, never hangs it."""

UPSTREAM_HEADER = "x-obleth-upstream"

POD_ENV = {
    # Scrapes every 2 s, each allowed 2 s: on a busy machine no reading goes stale (three
    # intervals) and no upstream turns unhealthy while a test runs, so every pod keeps the
    # same candidates and places a new prefix on the same upstream.
    "OBLETH_UPSTREAM_POLL_INTERVAL_S": "2.0",
    "OBLETH_UPSTREAM_POLL_TIMEOUT_S": "2.0",
    # The load guard is not what these tests are about: with 4 upstreams a bound of 4 never
    # passes one over (a pod's count on one upstream never exceeds its total). At the
    # default 1.5, one request of a pod on an upstream whose last scrape caught a request
    # waiting for the next engine step is enough to pass it over, and the simulators show
    # one whenever a request arrives between two steps.
    "OBLETH_ROUTING_LOAD_BOUND": "4",
}

ENDLESS: dict[str, Any] = {"prompt": "Count to a million.", "max_tokens": 100_000, "stream": True}
SHORT: dict[str, Any] = {"prompt": "Say something short.", "max_tokens": 1}


# -- processes -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimBackend]]:
    """Four simulated upstreams for the module, 50 ms per token; tests reset them."""
    backends = [SimBackend(step_ms=50.0, name=f"sim{i}") for i in range(4)]
    try:
        for backend in backends:
            backend.start()
        for backend in backends:
            backend.wait_ready()
        yield backends
    finally:
        for backend in backends:
            backend.stop()


@contextlib.contextmanager
def serve_pods(
    sims: Sequence[SimBackend], *pod_args: Sequence[str], env: Mapping[str, str] | None = None
) -> Iterator[list[ServePod]]:
    """One ``obleth serve`` pod per ``pod_args``, routing to ``sims`` with those flags and
    ``env`` on top of ``POD_ENV``; returned once every pod sees every sim healthy, stopped
    (killed at worst) on exit."""
    pods = [
        ServePod(
            [s.url for s in sims],
            args=["--upstream-header", *args],
            env={**POD_ENV, **(env or {})},
            name=f"pod-{'abcdefgh'[i]}",
        )
        for i, args in enumerate(pod_args)
    ]
    try:
        for pod in pods:
            pod.start()
        for pod in pods:
            pod.wait_ready(timeout_s=30.0)
        for pod in pods:
            pod.wait_all_healthy(WAIT_S)
        yield pods
    finally:
        for pod in pods:
            pod.stop()


def tails(pods: Sequence[ServePod | SimBackend]) -> str:
    """Every process's last log lines, for failure messages."""
    return "\n".join(f"--- {p.name} ({p.log_path}):\n{p.log_tail(20)}" for p in pods)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(trust_env=False, timeout=WAIT_S) as client:
        yield client


async def eventually(condition: Callable[[], Awaitable[bool]], what: Callable[[], str]) -> None:
    """Poll ``condition`` every 20 ms; after ``WAIT_S`` fail with ``what()``."""
    for _ in range(int(WAIT_S / 0.02)):
        if await condition():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"still not the case after {WAIT_S} s: {what()}")


# -- no shared state: a prefix stays on one upstream across pods ------------------------------


def _document(n: int) -> str:
    """About 4 KB of text that differs from every other document from its first bytes."""
    text = f"Document {n}. " + " ".join(f"clause {n}-{i} of the contract;" for i in range(200))
    return text[:4096]


def _prefix_cache_tokens(sim: SimBackend) -> tuple[float, float]:
    """``vllm:prefix_cache_hits_total`` and ``vllm:prefix_cache_queries_total`` of ``sim``."""
    text = httpx.get(f"{sim.url}/metrics", trust_env=False, timeout=5.0).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            found[name] = float(rest.rsplit(" ", 1)[1])
    return found["vllm:prefix_cache_hits_total"], found["vllm:prefix_cache_queries_total"]


@pytest.mark.anyio
async def test_pods_sharing_nothing_send_each_prefix_to_one_upstream(
    sims: list[SimBackend], http: httpx.AsyncClient
) -> None:
    """Two pods that know nothing of each other, with the default weighted profile and
    plain rendezvous placement (``routing_placement_bound`` 0, as documented for pods
    without Redis), send every request of a shared prefix to the same upstream, so its
    prefix cache hits."""
    prefixes, uses, per_pod = 8, 10, 3
    for sim in sims:
        sim.reset()
    with serve_pods(sims, [], [], env={"OBLETH_ROUTING_PLACEMENT_BOUND": "0"}) as pods:
        # request (p, r) goes to pod (p + r) % 2: every prefix alternates between the pods
        work: list[list[tuple[int, int]]] = [[], []]
        for r in range(uses):
            for p in range(prefixes):
                work[(p + r) % 2].append((p, r))
        where: dict[int, Counter[str]] = {p: Counter() for p in range(prefixes)}

        async def send(pod: ServePod, p: int, r: int) -> None:
            body = {**SHORT, "prompt": f"{_document(p)}\nQuestion {r}: what does it say?"}
            answer = await http.post(f"{pod.url}/v1/completions", json=body)
            assert answer.status_code == 200, f"{answer.text}\n{tails(pods)}"
            where[p][answer.headers[UPSTREAM_HEADER]] += 1

        async def worker(pod: ServePod, requests: Iterator[tuple[int, int]]) -> None:
            for p, r in requests:  # shared by the pod's workers: each request is sent once
                await send(pod, p, r)

        queues = [iter(w) for w in work]
        await asyncio.gather(
            *(
                worker(pod, queue)
                for pod, queue in zip(pods, queues, strict=True)
                for _ in range(per_pod)
            )
        )
        cache = [_prefix_cache_tokens(sim) for sim in sims]

    split = {p: dict(c) for p, c in where.items() if len(c) != 1}
    assert not split, f"prefixes sent to more than one upstream: {split}"
    assert all(sum(c.values()) == uses for c in where.values())
    assert len({next(iter(c)) for c in where.values()}) > 1, "every prefix on one upstream"
    hits, queries = (sum(column) for column in zip(*cache, strict=True))
    # one cold request per prefix, nine that find its 4 KB in the cache: about 0.89
    assert hits / queries >= 0.8, f"prefix cache hits {hits} of {queries} prompt tokens"


def _idle_gateway(urls: Sequence[str], **settings: Any) -> Gateway:
    """A pod's gateway with the default profile, not started: every upstream healthy and
    idle as if just scraped, so that its router decides from memory alone."""
    gateway = Gateway(Settings(upstreams=tuple(urls), upstream_poll_interval_s=60.0, **settings))
    now = time.monotonic()
    for url in urls:
        gateway.readings.update(Reading(url, healthy=True, running=0.0, waiting=0.0, at=now))
    return gateway


def _sent(gateway: Gateway, document: int) -> str:
    """Where ``gateway`` routes a prompt starting with ``_document(document)``; the request
    is finished at once, as a short answer would be."""
    router = gateway.router
    assert router is not None
    prompt = f"{_document(document)}\nWhat does it say?".encode()
    request = RouteRequest(
        path="/v1/completions",
        model=None,
        blocks=blocks_of(prompt, None, gateway.settings.prefix_block_bytes),
        session_id=None,
        tenant="t",
        fleet=router.fleet,
    )
    decision = router.route(request)
    decision.finish()
    return decision.upstream


def test_a_new_prefix_goes_to_one_upstream_whichever_pod_has_served_other_prefixes() -> None:
    """Pods without Redis and with plain rendezvous placement: pod A has served three
    prefixes and pod B none, and every new prefix still goes to the same upstream from
    both pods, so two replicas never split a prefix between them."""
    urls = [f"http://127.0.0.1:{8001 + i}" for i in range(4)]
    a, b = (_idle_gateway(urls, routing_placement_bound=0) for _ in range(2))
    for document in range(3):
        _sent(a, document)

    new = range(3, 11)
    placed = {d: (_sent(a, d), _sent(b, d)) for d in new}

    disagree = {d: pair for d, pair in placed.items() if pair[0] != pair[1]}
    assert not disagree, f"new prefix -> (pod A's upstream, pod B's upstream): {disagree}"


# -- Redis: each pod's requests in flight count in the others' routing -------------------------


class RouteKeys:
    """The in-flight reports of one pool in Redis, read the way a test needs them."""

    def __init__(self, client: aioredis.Redis, pool: str) -> None:
        self.client = client
        self.pods_key = f"obleth:{{{pool}}}:route:pods"
        self.pod_prefix = f"obleth:{{{pool}}}:route:pod:"

    async def members(self) -> dict[str, float]:
        """Pod id -> the expiry of its report (ms, Redis clock); renewed on every sync."""
        pairs = await self.client.zrange(self.pods_key, 0, -1, withscores=True)
        return {member.decode(): score for member, score in pairs}

    async def report(self, pod: str) -> dict[str, int]:
        """What ``pod`` reported last: upstream -> requests in flight."""
        counts = await self.client.hgetall(self.pod_prefix + pod)
        return {u.decode(): int(n) for u, n in counts.items()}

    async def exists(self, pod: str) -> bool:
        return bool(await self.client.exists(self.pod_prefix + pod))


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def held_streams(
    http: httpx.AsyncClient, url: str, count: int, headers: Mapping[str, str] | None = None
) -> AsyncIterator[list[httpx.Response]]:
    """``count`` endless streams through ``url``, opened one after the other (each routed
    knowing the ones before), closed mid-stream on exit."""
    async with contextlib.AsyncExitStack() as stack:
        responses = []
        for _ in range(count):
            response = await stack.enter_async_context(
                http.stream("POST", f"{url}/v1/completions", json=ENDLESS, headers=headers)
            )
            assert response.status_code == 200, await response.aread()
            responses.append(response)
        yield responses


@pytest.mark.anyio
async def test_pods_sharing_a_redis_route_around_each_others_requests_in_flight(
    sims: list[SimBackend],
    http: httpx.AsyncClient,
    redis_url: str,
    redis_client: aioredis.Redis,
    pool_name: str,
) -> None:
    """Pod B, balancing by queue depth, sends nothing to the upstream holding pod A's
    streams; when A dies, its streams stop counting once its report expires in Redis."""
    keys = RouteKeys(redis_client, pool_name)
    for sim in sims:
        sim.reset()
    shared = ("--redis-url", redis_url, "--pool", pool_name)
    # A pins its streams to one upstream (one session); B balances by queue depth alone
    pinning, balancing = ("--scorers", "session-affinity:1"), ("--scorers", "queue-depth:1")
    # a new pool waits out a learning window before its first grant (docs/cluster.md); this
    # Redis never loses its state, so there is nothing to learn
    no_window = {"OBLETH_LEARNING_WINDOW_S": "0"}
    with serve_pods(sims, (*pinning, *shared), (*balancing, *shared), env=no_window) as pods:
        pod_a, pod_b = pods

        async def two_pods_report() -> bool:
            return len(await keys.members()) == 2

        await eventually(two_pods_report, lambda: f"pods reporting in Redis\n{tails(pods)}")
        ids = set(await keys.members())
        async with held_streams(http, pod_a.url, 8, {"x-session-id": "pinned"}) as streams:
            [loaded] = {r.headers[UPSTREAM_HEADER] for r in streams}

            async def a_reported() -> bool:
                reports = [await keys.report(pod) for pod in ids]
                return sorted(reports, key=len) == [{}, {loaded: 8}]

            await eventually(a_reported, lambda: "pod A's eight streams never reached Redis")
            [a_id] = [pod for pod in ids if await keys.report(pod)]
            [b_id] = ids - {a_id}
            # B's report renewed after A's was in Redis: B's routing has read A's counts
            renewed_before = (await keys.members())[b_id]

            async def b_synced() -> bool:
                return (await keys.members()).get(b_id, 0) > renewed_before

            await eventually(b_synced, lambda: f"pod B stopped reporting\n{tails([pod_b])}")

            through_b = Counter[str]()
            for _ in range(16):
                answer = await http.post(f"{pod_b.url}/v1/completions", json=SHORT)
                assert answer.status_code == 200, f"{answer.text}\n{tails([pod_b])}"
                through_b[answer.headers[UPSTREAM_HEADER]] += 1

            # a crash: no goodbye, A's report stays in Redis until it expires
            pod_a.kill()
            left_behind = await keys.report(a_id)

            async def a_forgotten() -> bool:
                return not await keys.exists(a_id) and a_id not in await keys.members()

            await eventually(a_forgotten, lambda: "pod A's report outlived its TTL in Redis")
            with contextlib.suppress(httpx.HTTPError):
                await asyncio.gather(*(r.aclose() for r in streams))

        # B no longer counts A's streams: the upstream that held them gets B's again
        async with held_streams(http, pod_b.url, 8) as streams:
            spread = Counter(r.headers[UPSTREAM_HEADER] for r in streams)

    assert loaded not in through_b, f"pod B sent {through_b} while A held 8 on {loaded}"
    assert sum(through_b.values()) == 16
    assert left_behind == {loaded: 8}
    assert spread[loaded] >= 1, f"pod B still avoids {loaded}: {spread}"


# -- Redis, in one process: what gateway B's router reads --------------------------------------


def _route(router: Router) -> Decision:
    request = RouteRequest(
        path="/v1/completions",
        model=None,
        blocks=(),
        session_id=None,
        tenant="t",
        fleet=router.fleet,
    )
    return router.route(request)


@pytest.mark.anyio
async def test_a_gateways_decisions_show_in_the_other_gateways_counts_until_they_finish(
    redis_url: str, redis_client: aioredis.Redis, pool_name: str
) -> None:
    """B's ``router.in_flight()`` adds A's requests after both synced, not twice on A;
    finished on A, they leave B's counts; A stopping removes its report at once."""
    config = SimConfig(step_s=0.01, step_s_per_seq=0.0, prefill_s_per_token=0.0)
    async with (
        serve_in_task(create_app(config)) as first,
        serve_in_task(create_app(config)) as second,
    ):
        urls = (first.url, second.url)
        settings = Settings(upstreams=urls, redis_url=redis_url, pool=pool_name, routing_seed=3)
        a, b = Gateway(settings), Gateway(settings)
        await a.start()
        await b.start()
        try:
            assert a.router is not None and b.router is not None
            a_shared, b_shared = a.sharing, b.sharing
            assert isinstance(a_shared, SharedRouting) and isinstance(b_shared, SharedRouting)

            decisions = [_route(a.router) for _ in range(3)]
            on_a = Counter(d.upstream for d in decisions)
            expected = {u: on_a[u] for u in urls}
            await a_shared.sync()
            await b_shared.sync()
            await a_shared.sync()
            b_while_running, a_while_running = (
                dict(b.router.in_flight()),
                dict(a.router.in_flight()),
            )

            for decision in decisions:
                decision.finish()
            await a_shared.sync()
            await b_shared.sync()
            b_after_finish = dict(b.router.in_flight())

            decision = _route(a.router)
            await a_shared.sync()
            await b_shared.sync()
            b_before_stop = dict(b.router.in_flight())
            await a.stop()
            a_id_left = await RouteKeys(redis_client, pool_name).exists(a_shared.pod)
            await b_shared.sync()
            b_after_stop = dict(b.router.in_flight())
            decision.finish()
        finally:
            await a.stop()
            await b.stop()

    assert b_while_running == expected
    assert a_while_running == expected, "A counted its own requests twice"
    assert b_after_finish == dict.fromkeys(urls, 0)
    assert b_before_stop == {u: int(u == decision.upstream) for u in urls}
    assert not a_id_left
    assert b_after_stop == dict.fromkeys(urls, 0)


# -- Redis: where one pod placed a new prefix, the others send it --------------------------------


@pytest.mark.anyio
async def test_a_prefix_placed_off_its_rendezvous_choice_is_followed_by_the_other_pod(
    redis_url: str, pool_name: str
) -> None:
    """Pod A, whose requests crowd the upstream that hashing picks for a new document,
    places it on another (the placement bound); once both pods have synced, idle pod B
    sends the document to the same upstream, where on its own it would have hashed it
    to the crowded one."""
    urls = [f"http://127.0.0.1:{8101 + i}" for i in range(4)]
    shared = {"redis_url": redis_url, "pool": pool_name, "routing_seed": 1}
    a, b, alone = _idle_gateway(urls, **shared), _idle_gateway(urls, **shared), _idle_gateway(urls)
    assert a.router is not None and a.sharing is not None and b.sharing is not None
    try:
        hashed = _sent(alone, 20)
        for _ in range(6):
            a.router.fleet.inflight.add(hashed)
        on_a = _sent(a, 20)
        await a.sharing.sync()
        await b.sharing.sync()
        on_b = _sent(b, 20)
    finally:
        await a.sharing.stop()
        await b.sharing.stop()
    assert on_a != hashed, "the bound did not move the placement: the test shows nothing"
    assert on_b == on_a


@pytest.mark.anyio
async def test_pods_that_placed_a_prefix_differently_converge_on_the_first_placement(
    redis_url: str, pool_name: str
) -> None:
    """A and B place the same new document before hearing of each other, A off the hashed
    upstream (crowded on A), B on it. A's placement reaches Redis first, so after the
    next sync both send the document to A's upstream, B included, although B had already
    sent it to its own choice once."""
    urls = [f"http://127.0.0.1:{8201 + i}" for i in range(4)]
    shared = {"redis_url": redis_url, "pool": pool_name, "routing_seed": 1}
    a, b = _idle_gateway(urls, **shared), _idle_gateway(urls, **shared)
    assert a.router is not None and a.sharing is not None and b.sharing is not None
    try:
        hashed = _sent(b, 30)
        for _ in range(6):
            a.router.fleet.inflight.add(hashed)
        first = _sent(a, 30)
        await a.sharing.sync()
        await b.sharing.sync()
        await a.sharing.sync()
        for _ in range(6):
            a.router.fleet.inflight.remove(hashed)
        after = [(_sent(a, 30), _sent(b, 30)) for _ in range(3)]
    finally:
        await a.sharing.stop()
        await b.sharing.stop()
    assert first != hashed
    assert after == [(first, first)] * 3
