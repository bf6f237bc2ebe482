"""Cluster mode on real parts: three uvicorn pods sharing one real Redis, in front of one
simulated backend whose own count of concurrent requests is the ground truth.

First the headline (never over the limit under 2 000 requests from concurrent clients
across pods) and cross-pod fairness, then the ten failure tests of CLUSTER.md. After each,
the pool in Redis is consistent (seats in flight == lease seats == tenant seats, every
waiter indexed), every pod released what it admitted, and the pool is empty once load
stops and a lease TTL has passed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.backends.redis.audit import PoolAudit, audit_sync
from gateway.backends.redis.keys import PoolKeys
from tests.cluster.pods import (
    LoadResult,
    Pod,
    Pods,
    SimBackend,
    background,
    drive,
    set_limit,
    wait_for,
)
from tests.redis_procs import RedisServer, TcpProxy

LIMIT = 8
TTL = 1.5  # heartbeats every 0.5 s


def cluster_env(url: str, pool: str, **extra: object) -> dict[str, str]:
    """The pods' settings; ``extra`` overrides by setting name, and None leaves a setting
    at its default."""
    env = {
        "OBLETH_REDIS_URL": url,
        "OBLETH_POOL": pool,
        "OBLETH_GLOBAL_MAX_IN_FLIGHT": str(LIMIT),
        "OBLETH_LEASE_TTL_S": str(TTL),
        "OBLETH_REDIS_RETRY_BUDGET_S": "0.5",
        "OBLETH_LEARNING_WINDOW_S": "0",
        "OBLETH_TENANT_HEADER": "x-tenant",
        "OBLETH_MAX_QUEUE": "5000",
        "OBLETH_QUEUE_TIMEOUT_S": "30",
    }
    for name, value in extra.items():
        if value is None:
            env.pop(f"OBLETH_{name.upper()}", None)
        else:
            env[f"OBLETH_{name.upper()}"] = str(value)
    return env


class Pool:
    """The pool in Redis, read the way the tests check it."""

    def __init__(self, server: RedisServer, name: str) -> None:
        self.server = server
        self.name = name

    def audit(self) -> PoolAudit:
        with self.server.sync_client() as client:
            result = audit_sync(client, self.name)
        assert result.ok, result.problems
        return result

    def leases_of(self, pod_id: str) -> int:
        return len(self.lease_ids_of(pod_id))

    def lease_ids_of(self, pod_id: str) -> set[str]:
        with self.server.sync_client() as client:
            metas = client.hgetall(PoolKeys(self.name).key("lmeta"))
        return {lid.decode() for lid, meta in metas.items() if meta.decode().endswith("|" + pod_id)}

    def ms_left(self, pod_id: str) -> list[int]:
        """Milliseconds each lease of ``pod_id`` has left, by Redis' clock."""
        keys = PoolKeys(self.name)
        with self.server.sync_client() as client:
            metas = client.hgetall(keys.key("lmeta"))
            seconds, micros = client.time()
            now_ms = seconds * 1000 + micros // 1000
            return [
                int(client.zscore(keys.key("leases"), lease) or 0) - now_ms
                for lease, meta in metas.items()
                if meta.decode().endswith("|" + pod_id)
            ]

    def drains(self, within_s: float = TTL + 2) -> PoolAudit:
        """The pool once empty; fails with what is left when it does not empty in time."""
        deadline = time.monotonic() + within_s
        while True:
            result = self.audit()
            if result.empty:
                return result
            assert time.monotonic() < deadline, f"pool not empty after {within_s} s: {result}"
            time.sleep(0.05)


@pytest.fixture
def pool(redis_server: RedisServer, pool_name: str) -> Pool:
    return Pool(redis_server, pool_name)


@pytest.fixture
def own_pool(own_redis: RedisServer, pool_name: str) -> Pool:
    return Pool(own_redis, pool_name)


def released_all(pods: Pods | list[Pod]) -> list[dict[str, Any]]:
    group = pods if isinstance(pods, Pods) else None
    stats = group.settled_stats() if group else [p.stats() for p in pods]
    for pod in stats:
        assert pod["admitted"] == pod["released"], stats
    return stats


def backend_peak(sim: SimBackend) -> int:
    return int(sim.stats()["max_concurrency"])


# -- the headline ------------------------------------------------------------------------


def test_never_over_the_limit_under_2000_requests_across_pods(
    sim: SimBackend, redis_server: RedisServer, pool: Pool, logs: Path
) -> None:
    sim.reset()
    with Pods(3, sim.url, env=cluster_env(redis_server.url, pool.name), log_dir=logs) as pods:
        load = asyncio.run(drive(pods.urls, requests=2000, concurrency=96, max_tokens=6))
        stats = released_all(pods)
        context = f"{load.summary()}\n{stats}\n{pods.log_tails()}"
        assert load.statuses == {200: 2000}, context
        peak = backend_peak(sim)
        assert LIMIT // 2 < peak <= LIMIT, context
        assert sum(s["admitted"] for s in stats) == 2000
        assert pool.drains().limit == LIMIT


def test_a_tenants_share_does_not_depend_on_which_pods_it_uses(
    sim: SimBackend, redis_server: RedisServer, pool: Pool, logs: Path
) -> None:
    """Tenant A sends through all three pods, B through one; equal weights, both
    backlogged for the whole window: each gets half of the seat time.

    Requests last ~80 ms at the backend, so seats (not the pods' CPU) are what is scarce.
    """
    sim.reset()
    with Pods(3, sim.url, env=cluster_env(redis_server.url, pool.name), log_dir=logs) as pods:

        async def both() -> tuple[LoadResult, LoadResult]:
            window = dict(requests=100_000, max_tokens=40, issue_for_s=5.0, deadline_s=30.0)
            return await asyncio.gather(
                drive(pods.urls, concurrency=48, tenants=("A",), **window),  # type: ignore[arg-type]
                drive(pods.urls[:1], concurrency=48, tenants=("B",), **window),  # type: ignore[arg-type]
            )

        a, b = asyncio.run(both())
        served = {"A": a.statuses[200], "B": b.statuses[200]}
        share = served["A"] / (served["A"] + served["B"])
        assert 0.45 <= share <= 0.55, (served, a.summary(), b.summary())
        assert backend_peak(sim) <= LIMIT
        released_all(pods)
        pool.drains()


# -- the failure tests of CLUSTER.md -------------------------------------------------------


def test_1_killed_pod_seats_come_back_within_one_ttl(
    sim: SimBackend, redis_server: RedisServer, pool: Pool, logs: Path
) -> None:
    sim.reset()
    with Pods(3, sim.url, env=cluster_env(redis_server.url, pool.name), log_dir=logs) as pods:
        victim = pods[0]
        victim_id = victim.stats()["pod"]
        doomed = background(
            drive(pods.urls[:1], requests=40, concurrency=8, max_tokens=400, deadline_s=20)
        )
        others = background(drive(pods.urls[1:], requests=600, concurrency=48, max_tokens=6))
        wait_for(lambda: pool.leases_of(victim_id) > 0, 5, "the victim holds leases")
        victim.kill()
        # on Redis' own clock, every lease of the dead pod ends within one TTL from now
        assert max(pool.ms_left(victim_id)) <= TTL * 1000
        wait_for(lambda: pool.leases_of(victim_id) == 0, TTL + 5, "seats come back")
        load = others.result(timeout=60)
        doomed.result(timeout=30)
        assert load.statuses == {200: 600}, load.summary()
        assert backend_peak(sim) <= LIMIT
        released_all([pods[1], pods[2]])
        pool.drains()


def test_2_pod_paused_past_its_ttl_notices_its_leases_were_gone(
    sim: SimBackend, redis_server: RedisServer, pool: Pool, logs: Path
) -> None:
    sim.reset()
    with Pods(3, sim.url, env=cluster_env(redis_server.url, pool.name), log_dir=logs) as pods:
        frozen = pods[0]
        frozen_id = frozen.stats()["pod"]
        held = background(
            drive(pods.urls[:1], requests=8, concurrency=4, max_tokens=300, deadline_s=30)
        )
        wait_for(lambda: pool.leases_of(frozen_id) == 4, 5, "the pod holds 4 leases")
        frozen.pause()
        wait_for(lambda: pool.leases_of(frozen_id) == 0, TTL + 1, "its leases expire")
        load = asyncio.run(drive(pods.urls[1:], requests=100, concurrency=16, max_tokens=6))
        frozen.resume()
        wait_for(lambda: frozen.stats()["reasserted"] > 0, 3, "the pod re-asserts")
        assert "re-asserted" in frozen.log_tail()
        held.result(timeout=30)
        assert load.statuses == {200: 100}, load.summary()
        released_all(pods)
        pool.drains()


@pytest.mark.parametrize("fault", ["flushall", "restart"])
def test_3_redis_losing_its_state_mid_load_never_lets_the_backend_over_the_limit(
    sim: SimBackend, own_redis: RedisServer, own_pool: Pool, logs: Path, fault: str
) -> None:
    sim.reset()
    env = cluster_env(
        own_redis.url, own_pool.name, learning_window_s=1.2, redis_failure_mode="closed"
    )
    with Pods(3, sim.url, env=env, log_dir=logs) as pods:
        load = background(
            drive(pods.urls, requests=1500, concurrency=64, max_tokens=10, deadline_s=60)
        )
        time.sleep(1.0)
        if fault == "flushall":
            with own_redis.sync_client() as client:
                client.flushall()
        else:
            own_redis.restart_empty()
        result = load.result(timeout=90)
        context = f"{result.summary()}\n{pods.log_tails()}"
        assert backend_peak(sim) <= LIMIT, context
        assert set(result.statuses) <= {200, 503} and result.statuses[200] > 0, context
        assert not result.failures and not result.malformed, context
        assert "Redis lost pool" in pods.log_tails(200), context
        released_all(pods)
        own_pool.drains()


def test_4_waiters_end_when_the_notification_connections_are_killed(
    sim: SimBackend, redis_server: RedisServer, pool: Pool, logs: Path
) -> None:
    sim.reset()
    with Pods(3, sim.url, env=cluster_env(redis_server.url, pool.name), log_dir=logs) as pods:
        load = background(drive(pods.urls, requests=900, concurrency=96, max_tokens=6))
        for _ in range(3):
            time.sleep(0.4)
            with redis_server.sync_client() as client:
                client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        result = load.result(timeout=60)
        assert result.statuses == {200: 900}, result.summary()
        assert backend_peak(sim) <= LIMIT
        released_all(pods)
        pool.drains()


def test_5_ten_millisecond_timeouts_racing_releases_lose_no_seat(
    sim: SimBackend, redis_server: RedisServer, pool: Pool, logs: Path
) -> None:
    sim.reset()
    env = cluster_env(redis_server.url, pool.name, queue_timeout_s=0.01)
    with Pods(3, sim.url, env=env, log_dir=logs) as pods:
        load = asyncio.run(drive(pods.urls, requests=1200, concurrency=96, max_tokens=4))
        assert set(load.statuses) == {200, 503}, load.summary()
        assert set(load.error_codes) == {"queue_timeout"}, load.summary()
        released_all(pods)
        pool.drains()
        # every seat is still there: LIMIT long requests at once all run together
        sim.reset()
        probe = asyncio.run(drive(pods.urls, requests=LIMIT, concurrency=LIMIT, max_tokens=100))
        assert probe.statuses == {200: LIMIT}, probe.summary()
        assert backend_peak(sim) == LIMIT
        pool.drains()


def test_6_disconnecting_clients_and_failing_apps_release_what_they_took(
    sim: SimBackend, redis_server: RedisServer, pool: Pool, logs: Path
) -> None:
    sim.reset()
    with Pods(3, sim.url, env=cluster_env(redis_server.url, pool.name), log_dir=logs) as pods:

        async def faults() -> tuple[int, LoadResult]:
            return await asyncio.gather(
                abandon_streams(pods.urls, 60),
                drive(pods.urls, requests=60, concurrency=12, path="/_pod/raise"),
            )

        abandoned, raised = asyncio.run(faults())
        assert abandoned == 60
        assert raised.statuses[500] > 0, raised.summary()
        stats = released_all(pods)
        assert sum(s["admitted"] for s in stats) > 0
        assert sim.stats()["disconnected"] > 0
        pool.drains()


async def abandon_streams(urls: list[str], count: int) -> int:
    """Start ``count`` long streamed completions and hang up on each after its first chunk."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:

        async def one(i: int) -> int:
            body = {"prompt": f"p{i}", "max_tokens": 500, "stream": True}
            url = urls[i % len(urls)] + "/v1/completions"
            async with http.stream("POST", url, json=body, headers={"x-tenant": "t"}) as answer:
                async for _ in answer.aiter_bytes():
                    return 1  # leaving the block mid-stream closes the connection
            return 0

        return sum(await asyncio.gather(*(one(i) for i in range(count))))


def test_7_paused_redis_gets_503_with_retry_after_bounded_waiters_and_flat_memory(
    sim: SimBackend, own_redis: RedisServer, own_pool: Pool, logs: Path
) -> None:
    sim.reset()
    env = cluster_env(own_redis.url, own_pool.name, redis_failure_mode="closed")
    with Pods(3, sim.url, env=env, log_dir=logs) as pods:
        asyncio.run(drive(pods.urls, requests=60, concurrency=12))  # warm up
        before = [_rss_kib(pod) for pod in pods]
        own_redis.pause()
        try:
            paused = asyncio.run(
                drive(pods.urls, requests=1500, concurrency=96, request_timeout_s=10)
            )
            answer = httpx.post(
                pods.urls[0] + "/v1/completions",
                json={"prompt": "x", "max_tokens": 2},
                headers={"x-tenant": "t"},
                timeout=10,
                trust_env=False,
            )
            stats = [pod.stats() for pod in pods]
        finally:
            own_redis.resume()
        after = [_rss_kib(pod) for pod in pods]
        assert paused.statuses == {503: 1500}, paused.summary()
        assert set(paused.error_codes) == {"unavailable"}, paused.summary()
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert all(s["queued"] <= 5000 for s in stats)
        assert all(a - b < 30_000 for a, b in zip(after, before, strict=True)), (before, after)
        wait_for(lambda: all(p.stats()["mode"] == "redis" for p in pods), 5, "recovery")
        load = asyncio.run(drive(pods.urls, requests=300, concurrency=48))
        assert load.statuses == {200: 300}, load.summary()
        released_all(pods)
        own_pool.drains()


def _rss_kib(pod: Pod) -> int:
    status = Path(f"/proc/{pod.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1])


def test_8_limit_lowered_and_raised_live_converges_without_revoking(
    sim: SimBackend, redis_server: RedisServer, pool: Pool, logs: Path
) -> None:
    sim.reset()
    with Pods(3, sim.url, env=cluster_env(redis_server.url, pool.name), log_dir=logs) as pods:
        load = background(
            drive(pods.urls, requests=100_000, concurrency=96, max_tokens=50, deadline_s=6)
        )
        time.sleep(1.0)
        set_limit(pods[1], 3)
        time.sleep(0.8)  # the running requests finish; nothing new past 3
        sim.reset()
        time.sleep(1.0)
        lowered = backend_peak(sim)
        set_limit(pods[2], 12)
        time.sleep(0.3)
        sim.reset()
        time.sleep(1.0)
        raised = backend_peak(sim)
        result = load.result(timeout=60)
        assert lowered <= 3 and raised == 12, (lowered, raised)
        assert set(result.statuses) == {200}, result.summary()  # nothing revoked or failed
        assert all(s["limit"] == 12 for s in pods.stats())  # every pod sees the one limit
        released_all(pods)
        assert pool.drains().limit == 12


def test_9_script_flush_mid_load_fails_no_request(
    sim: SimBackend, redis_server: RedisServer, pool: Pool, logs: Path
) -> None:
    sim.reset()
    with Pods(3, sim.url, env=cluster_env(redis_server.url, pool.name), log_dir=logs) as pods:
        load = background(drive(pods.urls, requests=900, concurrency=64, max_tokens=6))
        for _ in range(3):
            time.sleep(0.3)
            with redis_server.sync_client() as client:
                client.script_flush()
        result = load.result(timeout=60)
        assert result.statuses == {200: 900}, result.summary()
        assert backend_peak(sim) <= LIMIT
        released_all(pods)
        pool.drains()


def test_10_partitioned_pod_keeps_its_failure_mode_and_rejoins_when_healed(
    sim: SimBackend, redis_server: RedisServer, pool: Pool, logs: Path
) -> None:
    sim.reset()
    with TcpProxy.to(redis_server) as proxy:
        cut = Pod(sim.url, env=cluster_env(proxy.url, pool.name), name="cut", log_dir=logs)
        rest = [
            Pod(sim.url, env=cluster_env(redis_server.url, pool.name), name=f"p{i}", log_dir=logs)
            for i in range(2)
        ]
        group = [cut, *rest]
        with cut, rest[0], rest[1]:
            proxy.partition()
            wait_for(lambda: cut.stats()["mode"] == "local", 5, "failure mode")
            during = asyncio.run(drive([p.url for p in group], requests=300, concurrency=24))
            share = cut.stats()
            proxy.heal()
            wait_for(lambda: cut.stats()["mode"] == "redis", 5, "rejoins")
            after = asyncio.run(drive([p.url for p in group], requests=300, concurrency=48))
            assert during.statuses == {200: 300}, during.summary()
            assert share["admitted"] > 0  # the cut pod kept serving, within its share
            assert after.statuses == {200: 300}, after.summary()
            assert "failure mode 'local'" in cut.log_tail(100)
            released_all(group)
            pool.drains()
