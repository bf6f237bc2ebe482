"""Cluster mode through the faults that used to blind it or let it overshoot, on real parts:
three uvicorn pods, a real redis-server, and the simulated backend's own count of requests
in flight as the ground truth.

- A new pool, FLUSHALL, a Redis restart and a failover resume admissions at once: the
  roll call closes as soon as every live pod has re-asserted, not after a timed window.
- An outage longer than the lease TTL (Redis frozen, Redis out of memory) in ``local``
  and ``closed`` modes ends without the backend seeing more than the limit.
- A pod frozen past its TTL does not run the grants it reads when it wakes, and its
  waiters Redis dropped meanwhile wait again instead of being answered ``evicted``.

Where a test shows that admissions resume, the roll call's fallback is set to a minute:
what closes it first is every pod having re-asserted, never the timer. How fast that is
(p99 over many trials) is measured by ``tests/bench/recovery.py``, not here.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.cluster.faults import Outage, PoolLoss, first_completion, lose_pool, start_replica
from tests.cluster.faults import outage as outage_of
from tests.cluster.pods import Pods, SimBackend, background, drive
from tests.cluster.steady import steady
from tests.cluster.test_failures import Pool, backend_peak, cluster_env, released_all, wait_for
from tests.redis_procs import RedisServer, TcpProxy

LIMIT = 6
TTL = 1.0  # heartbeats every 0.33 s
FALLBACK_S = 60  # a roll call's fallback far longer than any wait here


def env(url: str, pool: str, *, ttl_s: float = TTL, **extra: object) -> dict[str, str]:
    """Cluster settings with the default learning window (the roll call's fallback: two
    heartbeats plus the retry budget, 7 s with the default TTL of 10 s)."""
    defaults: dict[str, object] = {
        "global_max_in_flight": LIMIT,
        "lease_ttl_s": ttl_s,
        "redis_retry_budget_s": 0.3,
        "learning_window_s": None,
    }
    return cluster_env(url, pool, **(defaults | extra))


def test_a_new_pool_admits_its_first_request_at_once(
    sim: SimBackend, redis_server: RedisServer, pool_name: str, logs: Path
) -> None:
    """A first deployment: the first request on the first pod is answered long before the
    roll call's fallback could have passed (a new pool used to wait the whole window)."""
    sim.reset()
    settings = env(redis_server.url, pool_name, ttl_s=10, learning_window_s=FALLBACK_S)
    with Pods(3, sim.url, env=settings, log_dir=logs) as pods:
        _, answer = first_completion(pods[0].url, timeout_s=15)
        assert answer.status_code == 200, (answer.text, pods.log_tails())


@pytest.mark.parametrize("fault", ["flushall", "restart", "failover"])
def test_admissions_resume_at_once_when_redis_loses_the_pool(
    sim: SimBackend, own_redis: RedisServer, pool_name: str, logs: Path, fault: PoolLoss
) -> None:
    """Steady load on three pods; Redis loses the pool (FLUSHALL, a restart without
    persistence, a failover to a replica that missed writes). Requests sent after the
    fault are served in the 2.5 s the load goes on, long before the roll call's fallback
    (they used to wait the whole window), and the backend never sees more than the
    limit."""
    sim.reset()
    with start_replica(own_redis) as replica, TcpProxy.to(own_redis) as proxy:
        url = proxy.url if fault == "failover" else own_redis.url
        settings = env(url, pool_name, ttl_s=10, learning_window_s=FALLBACK_S)
        with Pods(3, sim.url, env=settings, log_dir=logs) as pods:
            load = background(steady(pods.urls, duration_s=4.0, concurrency=24))
            time.sleep(1.5)
            fault_at = time.monotonic()
            lose_pool(fault, own_redis, proxy, replica)
            timeline = load.result(timeout=30)
            context = f"{timeline.summary()}\n{pods.log_tails()}"
            assert backend_peak(sim) <= LIMIT, context
            assert not timeline.failures, context
            assert timeline.served_after(fault_at) > 0, context
            released_all(pods)
            Pool(replica if fault == "failover" else own_redis, pool_name).drains()


@pytest.mark.parametrize("mode", ["local", "closed"])
@pytest.mark.parametrize("outage", ["sigstop", "oom", "down"])
def test_an_outage_longer_than_the_ttl_ends_without_overshoot(
    sim: SimBackend, own_redis: RedisServer, pool_name: str, logs: Path, mode: str, outage: Outage
) -> None:
    """Redis frozen, refusing writes at maxmemory, or down (and back empty), for 2.5 lease
    TTLs under load: the leases expire meanwhile and every pod admits on its own
    (``local``) or refuses (``closed``). When Redis answers again, nothing is granted until
    every pod has written back what it holds: the backend never sees more than the limit.
    (Down, the first pod back used to presume the others dead, their liveness having
    passed while it heard nothing from anyone, and grant before they re-asserted.)"""
    sim.reset()
    settings = env(own_redis.url, pool_name, redis_failure_mode=mode)
    with Pods(3, sim.url, env=settings, log_dir=logs) as pods:
        load = background(steady(pods.urls, duration_s=6.0, concurrency=24, max_tokens=20))
        time.sleep(1.5)
        outage_of(own_redis, outage, 2.5 * TTL)
        timeline = load.result(timeout=30)
        context = f"{timeline.summary()}\n{pods.log_tails()}"
        assert backend_peak(sim) <= LIMIT, context
        assert not timeline.failures, context
        assert set(timeline.statuses) <= {200, 503}, context
        assert set(timeline.error_codes) <= {"unavailable"}, context
        wait_for(lambda: all(s["mode"] == "redis" for s in pods.stats()), 5, "recovery")
        released_all(pods)
        Pool(own_redis, pool_name).drains()


def test_a_pod_frozen_past_its_ttl_runs_no_stale_grant_and_never_answers_evicted(
    sim: SimBackend, redis_server: RedisServer, pool_name: str, logs: Path
) -> None:
    """Every pod has waiters queued in Redis; one is frozen (SIGSTOP) for 2.5 TTLs. The
    grants published to it meanwhile expire unseen and their seats go to the others; when
    it wakes it confirms each grant with Redis before running it, and queues again the
    waiters Redis dropped. The backend never sees more than the limit, and the frozen
    pod's clients get their answers, none of them ``evicted``."""
    sim.reset()
    with Pods(3, sim.url, env=env(redis_server.url, pool_name), log_dir=logs) as pods:
        frozen = pods[0]
        # requests of 0.2 s, well under a TTL: the seats the frozen pod ran are back at
        # the backend before its leases expire (a lease outlives the last heartbeat by
        # 0.67 s at least), so any excess would be a stale grant. At 0.4 s (200 tokens),
        # a busy two-core machine once stretched them past that: 12 at the backend, the
        # six still running for the frozen pod and six granted to the others, as leases
        # allow (docs/cluster.md)
        long = {"max_tokens": 100, "deadline_s": 30.0, "request_timeout_s": 20.0}
        on_frozen = background(drive(pods.urls[:1], requests=40, concurrency=12, **long))  # type: ignore[arg-type]
        others = background(drive(pods.urls[1:], requests=80, concurrency=24, **long))  # type: ignore[arg-type]
        wait_for(lambda: sum(s["queued"] for s in pods.stats()) > 12, 10, "waiters queued")
        frozen.pause()
        time.sleep(2.5 * TTL)
        frozen.resume()
        frozen_load = on_frozen.result(timeout=60)
        other_load = others.result(timeout=60)
        context = f"{frozen_load.summary()}\n{other_load.summary()}\n{pods.log_tails()}"
        assert backend_peak(sim) <= LIMIT, context
        assert frozen_load.statuses == {200: 40}, context
        assert other_load.statuses == {200: 80}, context
        released_all(pods)
        Pool(redis_server, pool_name).drains()


def test_a_killed_pods_waiters_do_not_take_the_seats_freed_after_its_death(
    sim: SimBackend, redis_server: RedisServer, pool_name: str, logs: Path
) -> None:
    """Every pod has waiters queued in Redis when one is killed (``kill -9``): from then
    on its channel has no listener, and no seat freed afterwards is granted to it (its
    leases in Redis never grow); they go to the pods still alive. They used to be granted
    to the dead pod's waiters, the oldest in the queue, one by one, and stay stuck until its
    liveness passed (3 s here), stopping every admission."""
    sim.reset()
    pool = Pool(redis_server, pool_name)
    with Pods(3, sim.url, env=env(redis_server.url, pool_name, ttl_s=3), log_dir=logs) as pods:
        victim = pods[2].stats()["pod"]
        doomed = background(steady(pods.urls[2:], duration_s=1.5, concurrency=12, max_tokens=20))
        load = background(steady(pods.urls[:2], duration_s=3.0, concurrency=24, max_tokens=20))
        wait_for(lambda: pods[2].stats()["queued"] > 0, 5, "the victim has waiters")
        pods[2].kill()
        held = pool.lease_ids_of(victim)
        granted_later: set[str] = set()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            granted_later |= pool.lease_ids_of(victim) - held
            time.sleep(0.01)
        timeline = load.result(timeout=30)
        doomed.result(timeout=30)
        context = f"{timeline.summary()}\n{pods.log_tails()}"
        assert not granted_later, (sorted(granted_later), context)
        assert backend_peak(sim) <= LIMIT, context
        released_all([pods[0], pods[1]])
        pool.drains(within_s=3 + 2)
