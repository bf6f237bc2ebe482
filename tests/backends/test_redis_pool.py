"""Cluster mode with several gateways ("pods") in one process sharing a real Redis.

Faster than the multi-process tests under tests/cluster, these pin down the protocol:
grants reach the waiter's own pod, the limit is one value for every pod, a silent pod's
seats come back within one lease TTL, Redis losing its state opens a learning window,
and an unreachable Redis falls back to the configured failure mode and recovers without
leaking a lease. After each, the pool's invariants are checked in Redis itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from redis.crc import key_slot

from gateway import Gateway, Rejected
from gateway.admin.health import readiness
from gateway.backends.redis import RedisBackend
from gateway.backends.redis.connect import connect
from gateway.backends.redis.keys import PoolKeys
from gateway.core.tickets import Ticket
from gateway.telemetry.instruments import watch
from tests.backends.redis_pods import TTL, Pods, backend, eventually
from tests.cluster.faults import start_replica
from tests.redis_procs import RedisClusterProcs, RedisServer, TcpProxy

pytestmark = pytest.mark.anyio


async def test_a_waiter_on_another_pod_is_woken_by_a_release(pods: Pods) -> None:
    """The grant travels to the waiter's own pod (pub/sub), in milliseconds, no polling."""
    a = await pods.start(global_max_in_flight=1)
    b = await pods.start(global_max_in_flight=1)
    holder = await a.scheduler.acquire(Ticket("t"))
    waiter = asyncio.create_task(b.scheduler.acquire(Ticket("u")))
    await eventually(lambda: _queued(pods, 1), 2)
    holder.release()
    permit = await asyncio.wait_for(waiter, 2)
    # the grant came by message; a heartbeat picking it up would count as "missed"
    assert backend(b).notes_received == {"granted": 1}
    permit.release()
    assert (await pods.wait_empty(2)).empty


async def _queued(pods: Pods, n: int) -> bool:
    return (await pods.audit()).waiters == n


async def test_the_limit_is_one_value_for_every_pod(pods: Pods) -> None:
    """set_capacity on one pod is what every pod enforces, and raising it wakes waiters
    on other pods."""
    a = await pods.start(global_max_in_flight=1)
    b = await pods.start(global_max_in_flight=50)  # the pool's limit was set first by a
    held = await b.scheduler.acquire(Ticket("t"))
    waiter = asyncio.create_task(b.scheduler.acquire(Ticket("t")))
    await eventually(lambda: _queued(pods, 1), 2)
    a.set_capacity(2)
    permit = await asyncio.wait_for(waiter, 2)
    assert await eventually(lambda: _limit_seen(b, 2), TTL)
    held.release()
    permit.release()
    assert (await pods.wait_empty(2)).limit == 2


async def _limit_seen(gateway: Gateway, limit: int) -> bool:
    return gateway.snapshot().limit == limit


async def test_a_silent_pods_seats_come_back_within_one_ttl(pods: Pods) -> None:
    """A pod that stops talking (crashed, frozen) loses its leases after lease_ttl_s."""
    silent = await pods.start(global_max_in_flight=2)
    other = await pods.start(global_max_in_flight=2)
    for _ in range(2):
        await silent.scheduler.acquire(Ticket("t"))
    _silence(silent)
    # on Redis' own clock, every lease of the silent pod ends within one TTL from now
    assert max(await _ms_left(pods, backend(silent).pod)) <= TTL * 1000
    waiter = asyncio.create_task(other.scheduler.acquire(Ticket("u")))
    permit = await asyncio.wait_for(waiter, TTL * 4)
    permit.release()
    assert (await pods.wait_empty(2)).empty


async def _ms_left(pods: Pods, pod: str) -> list[int]:
    """Milliseconds each lease of ``pod`` has left, by Redis' clock."""
    keys = PoolKeys(pods.pool)
    metas = await pods.client.hgetall(keys.key("lmeta"))
    seconds, micros = await pods.client.time()
    now_ms = seconds * 1000 + micros // 1000
    left = []
    for lease, meta in metas.items():
        if meta.endswith("|" + pod):
            left.append(int(await pods.client.zscore(keys.key("leases"), lease)) - now_ms)
    return left


def _silence(gateway: Gateway) -> None:
    """Stop a gateway's heartbeats and calls as a crash would, without releasing anything."""
    pod = backend(gateway)
    pod._running = False
    for task in pod._tasks:
        task.cancel()


async def test_a_pod_back_after_its_ttl_reasserts_what_it_still_runs(pods: Pods) -> None:
    """A pod frozen past its TTL finds its leases gone and writes them back: the pool
    counts what really runs, and grants nothing more until it drains."""
    frozen = await pods.start(global_max_in_flight=2)
    other = await pods.start(global_max_in_flight=2)
    held = [await frozen.scheduler.acquire(Ticket("t")) for _ in range(2)]
    await backend(frozen).settled()
    tasks = list(backend(frozen)._tasks)
    for task in tasks:
        task.cancel()
    backend(frozen)._tasks.clear()
    taken = [await asyncio.wait_for(other.scheduler.acquire(Ticket("u")), TTL * 4)]
    taken.append(await asyncio.wait_for(other.scheduler.acquire(Ticket("u")), TTL * 4))
    # the frozen pod wakes up: its next heartbeat re-asserts both leases
    pod = backend(frozen)
    pod._tasks.append(asyncio.create_task(pod._heartbeats()))
    assert await eventually(lambda: _reasserted(pod, 2), TTL)
    assert (await pods.audit()).inflight == 4  # honest accounting, over the limit of 2
    late = asyncio.create_task(other.scheduler.acquire(Ticket("u")))
    await asyncio.sleep(TTL / 2)
    assert not late.done()  # nothing new until the pool is back under its limit
    for permit in held + taken:
        permit.release()
    (await asyncio.wait_for(late, 2)).release()
    assert (await pods.wait_empty(2)).empty


async def _reasserted(pod: RedisBackend, n: int) -> bool:
    return pod.reasserted >= n


async def test_cross_pod_fairness_does_not_depend_on_where_requests_land(pods: Pods) -> None:
    """Tenant a sends through three pods, b through one; equal weights, both backlogged:
    each gets half the grants (every grant holds its seat equally long)."""
    gateways = [await pods.start(global_max_in_flight=8, max_queue=10_000) for _ in range(3)]
    held: dict[str, int] = {"a": 0, "b": 0}
    stop_at = time.monotonic() + 2.0

    async def client(gateway: Gateway, tenant: str) -> None:
        while time.monotonic() < stop_at:
            try:
                permit = await gateway.scheduler.acquire(Ticket(tenant))
            except Rejected:
                continue
            held[tenant] += 1
            await asyncio.sleep(0.01)
            permit.release()

    clients = [client(g, "a") for g in gateways for _ in range(8)]
    clients += [client(gateways[0], "b") for _ in range(24)]
    await asyncio.gather(*clients)
    share_a = held["a"] / (held["a"] + held["b"])
    assert 0.45 <= share_a <= 0.55, held
    assert (await pods.wait_empty(2)).empty


async def test_tenant_ids_reach_redis_escaped(pods: Pods) -> None:
    """A tenant id with separators, spaces and non-ASCII text is one tenant, read back."""
    gateway = await pods.start(global_max_in_flight=2)
    name = "acme|corp g:1 ünïcode x" + "y" * 5
    permit = await gateway.scheduler.acquire(Ticket(name))
    snap = await backend(gateway).cluster_snapshot()
    assert list(snap.tenants) == [name]
    keys = await pods.client.keys(PoolKeys(pods.pool).prefix + "*")
    assert all(name not in key for key in keys)
    permit.release()
    assert (await pods.wait_empty(2)).empty


async def test_script_flush_costs_no_request(pods: Pods) -> None:
    gateway = await pods.start(global_max_in_flight=4)
    await pods.client.script_flush()
    permits = [await gateway.scheduler.acquire(Ticket("t")) for _ in range(4)]
    for permit in permits:
        permit.release()
    assert (await pods.wait_empty(2)).empty


async def test_waiters_end_when_the_notification_connection_is_killed(pods: Pods) -> None:
    """With the pub/sub connection gone, the heartbeat hands waiters their grants."""
    a = await pods.start(global_max_in_flight=1)
    b = await pods.start(global_max_in_flight=1)
    holder = await a.scheduler.acquire(Ticket("t"))
    waiters = [asyncio.create_task(b.scheduler.acquire(Ticket("u"))) for _ in range(3)]
    await eventually(lambda: _queued(pods, 3), 2)
    await pods.client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    holder.release()
    for waiter in waiters:
        (await asyncio.wait_for(waiter, TTL * 3)).release()
    assert (await pods.wait_empty(2)).empty


async def test_learning_window_after_redis_forgets_the_pool(own_pods: Pods) -> None:
    """FLUSHALL while seats are held: nothing is granted until the pods re-asserted what
    they hold, so the pool never counts less than what runs."""
    pods = own_pods
    a = await pods.start(global_max_in_flight=2, learning_window_s=TTL)
    b = await pods.start(global_max_in_flight=2, learning_window_s=TTL)
    held = [await a.scheduler.acquire(Ticket("t")), await b.scheduler.acquire(Ticket("u"))]
    await pods.client.flushall()
    late = asyncio.create_task(a.scheduler.acquire(Ticket("v")))
    await asyncio.sleep(TTL * 0.8)
    assert not late.done()
    result = await pods.audit()
    assert result.inflight == 2 and result.leases == 2  # both pods re-asserted
    held[0].release()
    (await asyncio.wait_for(late, TTL * 3)).release()
    held[1].release()
    assert (await pods.wait_empty(2)).empty


@pytest.mark.parametrize("fault", ["flushed", "paused"])
async def test_a_tenants_waiters_stay_first_come_first_served_across_a_fault(
    own_pods: Pods, own_redis: RedisServer, fault: str
) -> None:
    """Waiters queued in Redis when it loses the pool are queued again, and when it stops
    answering are taken over by the failure mode, in the order they came. They used to
    go in the order of their ids as text, so the tenant's 10th to 12th requests went
    before its 2nd."""
    pods = own_pods
    gateway = await pods.start(global_max_in_flight=1, redis_failure_mode="local")
    holder = await gateway.scheduler.acquire(Ticket("t"))
    granted: list[int] = []

    async def request(n: int) -> None:
        permit = await gateway.scheduler.acquire(Ticket("t"))
        granted.append(n)
        permit.release()

    waiters = []
    for n in range(12):
        waiters.append(asyncio.create_task(request(n)))
        assert await eventually(lambda n=n: _queued(pods, n + 1), 2)
    if fault == "flushed":
        await pods.client.flushall()
        assert await eventually(lambda: _queued(pods, 12), 3 * TTL)  # queued again
        holder.release()
        await asyncio.wait_for(asyncio.gather(*waiters), 10)
    else:
        own_redis.pause()
        try:
            assert await eventually(lambda: _mode_is(gateway, "local"), 3 * TTL)
            holder.release()
            await asyncio.wait_for(asyncio.gather(*waiters), 10)
        finally:
            own_redis.resume()
        assert await eventually(lambda: _mode_is(gateway, "redis"), 3 * TTL)
    assert granted == list(range(12))
    assert (await pods.wait_empty(2)).empty


@pytest.mark.parametrize(
    ("mode", "admitted"),
    [("closed", 0), ("local", 2), ("open", 6)],
)
async def test_failure_mode_while_redis_is_paused(
    own_pods: Pods, own_redis: RedisServer, mode: str, admitted: int
) -> None:
    """Redis frozen: after the retry budget each mode does what it says, and once Redis
    answers again the pod re-asserts its permits and the pool drains to zero."""
    pods = own_pods
    gateways = [
        await pods.start(global_max_in_flight=4, redis_failure_mode=mode, queue_timeout_s=0.5)
        for _ in range(2)
    ]
    pod = gateways[0]
    assert await eventually(lambda: _live_pods(pod, 2), TTL)  # a heartbeat counted both
    own_redis.pause()
    try:
        outcomes = await asyncio.gather(
            *(pod.scheduler.acquire(Ticket("t")) for _ in range(6)), return_exceptions=True
        )
    finally:
        own_redis.resume()
    permits = [o for o in outcomes if not isinstance(o, BaseException)]
    reasons = {o.reason for o in outcomes if isinstance(o, Rejected)}
    assert len(permits) == admitted, outcomes
    assert backend(pod).mode == mode
    if mode == "closed":
        assert reasons == {"unavailable"}
    assert await eventually(lambda: _mode_is(pod, "redis"), 3 * TTL)
    result = await pods.audit()
    assert result.inflight == admitted  # what runs is counted again
    for permit in permits:
        permit.release()
    assert (await pods.wait_empty(2)).empty


async def test_a_pod_refusing_everything_in_closed_mode_is_not_ready(
    own_pods: Pods, own_redis: RedisServer
) -> None:
    """While Redis cannot be reached under redis_failure_mode=closed, /readyz says so (the
    load balancer should send traffic elsewhere), and says ready again once it answers."""
    pod = await own_pods.start(redis_failure_mode="closed", queue_timeout_s=0.5)
    assert readiness(pod)[0] == 200
    own_redis.pause()
    try:
        with pytest.raises(Rejected):
            await pod.scheduler.acquire(Ticket("t"))
        status, body = readiness(pod)
        assert status == 503
        assert body["not_ready"] == ["Redis cannot be reached and redis_failure_mode is closed"]
    finally:
        own_redis.resume()

    async def ready() -> bool:
        return readiness(pod)[0] == 200

    assert await eventually(ready, 3 * TTL)


@pytest.mark.parametrize(("mode", "admitted"), [("closed", 0), ("local", 2)])
async def test_an_error_reply_from_redis_is_a_failure_not_a_hang(
    own_pods: Pods, mode: str, admitted: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis at maxmemory answers every call with an OOM error: after the retry budget
    the pod is in its failure mode, as when Redis is unreachable, instead of leaving the
    requests waiting for an answer that never comes; once Redis takes writes again the
    pod goes back and the pool drains to zero."""
    pods = own_pods
    gateways = [
        await pods.start(global_max_in_flight=4, redis_failure_mode=mode, queue_timeout_s=0.5)
        for _ in range(2)
    ]
    pod = gateways[0]
    assert await eventually(lambda: _live_pods(pod, 2), TTL)
    await pods.client.config_set("maxmemory", 1)
    caplog.set_level(logging.ERROR, logger="obleth.cluster")
    try:
        outcomes = await asyncio.wait_for(
            asyncio.gather(
                *(pod.scheduler.acquire(Ticket("t")) for _ in range(3)), return_exceptions=True
            ),
            5,
        )
        assert backend(pod).mode == mode
    finally:
        await pods.client.config_set("maxmemory", 0)
    permits = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(permits) == admitted, outcomes
    if mode == "closed":
        assert {o.reason for o in outcomes if isinstance(o, Rejected)} == {"unavailable"}
    # the operator reads which Redis, and what it answered
    said = [r.getMessage() for r in caplog.records if r.name == "obleth.cluster"]
    assert any(f"redis_url={pods.url}" in line and "OOM" in line for line in said), said
    assert await eventually(lambda: _mode_is(pod, "redis"), 3 * TTL)
    for permit in permits:
        permit.release()
    assert (await pods.wait_empty(2)).empty


async def test_a_grant_for_a_waiter_the_failure_mode_took_over_is_not_run(
    own_pods: Pods, own_redis: RedisServer
) -> None:
    """Redis frozen while a waiter of pod A is queued in it: A's failure mode takes the
    waiter over and tells Redis to cancel it. If Redis, back, grants that waiter before
    the cancel arrives (another pod released a seat), the grant is not run: the cancel
    gives that seat back, so a request run on it would hold a seat Redis counts as free.
    Once A is back the waiter rejoins the shared queue and gets a seat the pool counts.
    (Whether the grant's notification reaches A before A is back is a matter of timing; the
    test publishes it once more through Redis, as the script does, to be sure it does.)"""
    pods = own_pods
    # A's heartbeats (and recovery attempts) come every 2 s, B's every 0.2 s: B is back and
    # releases while A is still in its failure mode
    a = await pods.start(global_max_in_flight=2, lease_ttl_s=6.0, queue_timeout_s=15)
    b = await pods.start(global_max_in_flight=2, queue_timeout_s=0.5)
    assert await eventually(lambda: _live_pods(a, 2), 6.0)
    held_a = await a.scheduler.acquire(Ticket("t"))
    held_b = await b.scheduler.acquire(Ticket("t"))
    waiter = asyncio.create_task(a.scheduler.acquire(Ticket("t")))

    async def queued_in_redis() -> bool:
        return (await pods.audit()).waiters == 1

    assert await eventually(queued_in_redis, 2)
    own_redis.pause()
    try:
        # a call from A while Redis is frozen puts A in its failure mode after the budget
        probe = asyncio.create_task(a.scheduler.acquire(Ticket("t")))
        assert await eventually(lambda: _mode_is(a, "local"), 2)
        assert await eventually(lambda: _mode_is(b, "local"), 2)  # B's heartbeat failed too
    finally:
        own_redis.resume()
    assert await eventually(lambda: _mode_is(b, "redis"), 2)
    channel = PoolKeys(pods.pool).channel(backend(a).pod)
    heard = backend(a).notes_received["granted"]

    async def a_listens() -> bool:
        # a note for no waiter of A's (A gives such a "grant" back): heard once A's
        # subscription works again, after the reconnect the freeze may have caused
        await pods.client.publish(channel, "g:nobody")
        return backend(a).notes_received["granted"] > heard

    assert await eventually(a_listens, 3)
    held_b.release()  # Redis hands this seat to A's waiter: its cancel is still on its way
    waiter_id = next(iter(backend(a)._waiting))  # the waiter Redis queued, first of A's

    async def granted_in_redis() -> bool:
        leases = PoolKeys(pods.pool).key("leases")
        return await pods.client.zscore(leases, waiter_id) is not None

    assert await eventually(granted_in_redis, 2)
    # the grant's notification, as the script publishes it (it may be on its way still,
    # or lost with a connection; here it surely arrives while A is in its failure mode)
    await pods.client.publish(channel, f"g:{waiter_id}")
    await asyncio.sleep(0.2)
    assert backend(a).mode == "local", "A recovered too early: the race was not exercised"
    assert not waiter.done(), "a grant for a waiter the failure mode took over was run"
    assert await eventually(lambda: _mode_is(a, "redis"), 6)
    permit = await asyncio.wait_for(waiter, 3)
    # the seat it runs on is a lease Redis holds, not one the cancel gave back
    leases = PoolKeys(pods.pool).key("leases")
    assert await pods.client.zscore(leases, str(permit.token)) is not None
    assert (await pods.audit()).inflight == 2  # held_a and the waiter's seat, both counted
    with pytest.raises(Rejected) as caught:
        await b.scheduler.acquire(Ticket("t"))
    assert caught.value.reason == "queue_timeout"
    probe.cancel()
    await asyncio.gather(probe, return_exceptions=True)
    permit.release()
    held_a.release()
    assert (await pods.wait_empty(3)).empty


async def _live_pods(gateway: Gateway, n: int) -> bool:
    return backend(gateway).live_pods == n


async def _mode_is(gateway: Gateway, mode: str) -> bool:
    return backend(gateway).mode == mode


async def test_a_pool_lives_in_one_slot_of_a_redis_cluster(
    redis_cluster: RedisClusterProcs, pool_name: str
) -> None:
    """Every key of a pool shares one hash tag: the step script runs on a 3-master Redis
    Cluster, and waiters on one pod are granted by releases on another."""
    pods = Pods(redis_cluster.url, pool_name)
    try:
        a = await pods.start(global_max_in_flight=1)
        b = await pods.start(global_max_in_flight=1)
        holder = await a.scheduler.acquire(Ticket("t"))
        waiter = asyncio.create_task(b.scheduler.acquire(Ticket("u")))
        await eventually(lambda: _queued(pods, 1), 2)
        holder.release()
        (await asyncio.wait_for(waiter, 2)).release()
        assert (await pods.wait_empty(2)).empty
        slots = {key_slot(key.encode()) for key in PoolKeys(pool_name).keys}
        assert len(slots) == 1
    finally:
        await pods.close()


async def test_local_failure_mode_is_announced_in_a_metric(
    own_pods: Pods, own_redis: RedisServer
) -> None:
    """While Redis is unreachable, obleth.cluster.degraded is 1 with the mode, and the
    local share is what the pod admits on its own; both fall back once Redis answers."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    pods = own_pods
    gateways = [await pods.start(global_max_in_flight=4) for _ in range(2)]
    pod = gateways[0]
    watch(pod, provider)
    assert await eventually(lambda: _live_pods(pod, 2), TTL)
    assert _gauges(reader) == {"obleth.cluster.degraded": 0, "obleth.cluster.local_share": 0}
    own_redis.pause()
    try:
        permit = await pod.scheduler.acquire(Ticket("t"))
        assert _gauges(reader) == {"obleth.cluster.degraded": 1, "obleth.cluster.local_share": 2}
    finally:
        own_redis.resume()
    assert await eventually(lambda: _mode_is(pod, "redis"), 3 * TTL)
    assert _gauges(reader)["obleth.cluster.degraded"] == 0
    permit.release()
    assert (await pods.wait_empty(2)).empty
    provider.shutdown()


async def test_a_pod_that_starts_while_redis_is_down_admits_nothing_on_its_own(
    own_pods: Pods, own_redis: RedisServer
) -> None:
    """A pod that has never heard from Redis knows neither the pool's ceiling nor how many
    pods share it. It counted itself alone and admitted its whole limit beside the pods
    admitting their shares (a sweep saw 20 in flight against a limit of 12, when an
    autoscaler or a restart added a pod during an outage). Its local share is 0 now: what
    it gets waits, and is handed to the shared queue once Redis answers."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    first = await own_pods.start(global_max_in_flight=4)
    own_redis.pause()
    try:
        late = await own_pods.start(global_max_in_flight=4)
        watch(late, provider)
        waiting = asyncio.ensure_future(late.scheduler.acquire(Ticket("u")))
        await asyncio.sleep(0.2)  # with a share, it was granted within a round
        assert _gauges(reader) == {"obleth.cluster.degraded": 1, "obleth.cluster.local_share": 0}
        assert not waiting.done()
    finally:
        own_redis.resume()
    permit = await asyncio.wait_for(waiting, 3 * TTL)  # granted from the shared pool
    permit.release()
    assert first.snapshot().limit == 4
    assert (await own_pods.wait_empty(2)).empty
    provider.shutdown()


def _gauges(reader: InMemoryMetricReader) -> dict[str, float]:
    data = reader.get_metrics_data()
    assert data is not None
    found = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name in ("obleth.cluster.degraded", "obleth.cluster.local_share"):
                    [point] = metric.data.data_points
                    found[metric.name] = point.value
    return found


async def test_a_pool_that_goes_back_in_time_holds_grants_until_every_pod_reasserted(
    pods: Pods, caplog: pytest.LogCaptureFixture
) -> None:
    """A failover to a replica that missed writes shows as a pool behind what a pod saw:
    the very call that reveals it opens a roll call, so the seat the lost write granted is
    written back before anything new is granted (limit 2, both seats held: the newcomer
    waits)."""
    a = await pods.start(global_max_in_flight=2, learning_window_s=5)
    b = await pods.start(global_max_in_flight=2, learning_window_s=5)
    held_a = await a.scheduler.acquire(Ticket("t"))
    await backend(a).settled()
    replica = await _dump(pods)  # what a replica has when the next write is lost
    held_b = await b.scheduler.acquire(Ticket("u"))
    await backend(b).settled()
    await _restore(pods, replica)
    late = asyncio.create_task(b.scheduler.acquire(Ticket("v")))
    for _ in range(100):  # the late acquire's own call finds the pool behind (bounded wait)
        if "went back in time" in caplog.text:
            break
        await asyncio.sleep(0.05)
    assert "went back in time" in caplog.text
    assert not late.done()  # held by the roll call, though a seat looks free
    result = await pods.audit()
    assert result.inflight == 2 and result.leases == 2  # the lost grant is counted again
    held_b.release()
    (await asyncio.wait_for(late, 2)).release()
    held_a.release()
    assert (await pods.wait_empty(2)).empty


async def _dump(pods: Pods) -> dict[str, bytes]:
    raw = connect(pods.url, pool_size=1, timeout_s=5)
    raw.connection_pool.connection_kwargs["decode_responses"] = False  # DUMP is binary
    try:
        names = await raw.keys(PoolKeys(pods.pool).prefix + "*")
        return {name: await raw.dump(name) for name in names}
    finally:
        await raw.aclose()


async def _restore(pods: Pods, dumped: dict[str, bytes]) -> None:
    """Put the pool back as ``_dump`` read it, in one transaction (pods keep calling)."""
    raw = connect(pods.url, pool_size=1, timeout_s=5)
    raw.connection_pool.connection_kwargs["decode_responses"] = False
    try:
        names = await raw.keys(PoolKeys(pods.pool).prefix + "*")
        async with raw.pipeline(transaction=True) as swap:
            for name in names:
                if name not in dumped:
                    swap.delete(name)
            for name, value in dumped.items():
                swap.restore(name, 0, value, replace=True)
            await swap.execute()
    finally:
        await raw.aclose()


async def test_a_roll_call_closes_once_every_pod_has_reasserted_not_on_a_timer(
    own_pods: Pods,
) -> None:
    """FLUSHALL with a 30 s fallback window: both pods re-assert within milliseconds, so
    a newcomer is granted as soon as a seat frees, not after the window."""
    pods = own_pods
    a = await pods.start(global_max_in_flight=2, learning_window_s=30)
    b = await pods.start(global_max_in_flight=2, learning_window_s=30)
    held_a = await a.scheduler.acquire(Ticket("t"))
    held_b = await b.scheduler.acquire(Ticket("u"))
    await pods.client.flushall()
    late = asyncio.create_task(a.scheduler.acquire(Ticket("v")))
    await asyncio.sleep(0.2)
    assert not late.done()  # both seats are held, and both pods said so
    result = await pods.audit()
    assert result.inflight == 2 and result.leases == 2
    held_b.release()
    (await asyncio.wait_for(late, 2)).release()  # well within the 30 s fallback
    held_a.release()
    assert (await pods.wait_empty(2)).empty


async def test_a_new_pool_admits_its_first_request_before_any_window(pods: Pods) -> None:
    """A first deployment: the pool does not exist and roll calls are on (a 30 s fallback);
    the first request is granted at once or after the short grace, never the window."""
    gateway = await pods.start(global_max_in_flight=2, learning_window_s=30)
    permit = await asyncio.wait_for(gateway.scheduler.acquire(Ticket("t")), 2)
    permit.release()
    assert (await pods.wait_empty(2)).empty


async def test_a_grant_without_a_wait_counts_its_round_trip_to_redis_as_waiting(
    pods: Pods,
) -> None:
    """``waited_s`` (the queue-wait histogram, the app's record) runs from the request's
    arrival: in cluster mode that includes the call to Redis, even for a free seat. It
    used to be exactly 0; what it measures is not asserted (no timed asserts here)."""
    gateway = await pods.start(global_max_in_flight=4)
    permit = await asyncio.wait_for(gateway.scheduler.acquire(Ticket("t")), 5)
    assert permit.waited_s > 0, permit.waited_s
    permit.release()
    assert (await pods.wait_empty(2)).empty


async def test_a_request_gone_before_its_acquire_was_sent_leaves_no_waiter_in_redis(
    pods: Pods,
) -> None:
    """A request cancelled while its acquire waits for the call under way to end (client
    gone, a handler's timeout) used to leave a waiter in Redis with no request behind it:
    the cancel rode in the same call as the acquire, and Redis runs cancels first. That
    waiter took room in the queue, so a newcomer got ``queue_full`` with the queue half
    empty."""
    gateway = await pods.start(global_max_in_flight=1, max_queue=2, overflow_policy="drop-newest")
    holder = await gateway.scheduler.acquire(Ticket("t"))
    first = asyncio.create_task(gateway.scheduler.acquire(Ticket("t")))
    await asyncio.sleep(0)  # its call to Redis is under way
    gone = asyncio.create_task(gateway.scheduler.acquire(Ticket("t")))
    await asyncio.sleep(0)  # its acquire waits for the next call
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    await backend(gateway).settled()
    assert (await pods.audit()).waiters == 1
    newcomer = asyncio.create_task(gateway.scheduler.acquire(Ticket("u")))
    assert await eventually(lambda: _queued(pods, 2), 2)
    holder.release()
    (await asyncio.wait_for(first, 5)).release()
    (await asyncio.wait_for(newcomer, 5)).release()
    assert (await pods.wait_empty(2)).empty


async def test_stopping_answers_a_request_whose_acquire_was_not_sent_yet(pods: Pods) -> None:
    """``stop()`` answers every waiter 503 ``unavailable``, one whose acquire still waits
    for the call under way to end too (taking its acquire back must not leave it
    waiting for an answer from Redis that will never come)."""
    gateway = await pods.start(global_max_in_flight=1)
    await gateway.scheduler.acquire(Ticket("t"))
    waiters = [asyncio.create_task(gateway.scheduler.acquire(Ticket("t")))]
    await asyncio.sleep(0)  # its call to Redis is under way
    waiters.append(asyncio.create_task(gateway.scheduler.acquire(Ticket("t"))))
    await asyncio.sleep(0)  # its acquire waits for the next call
    await asyncio.wait_for(gateway.stop(), 5)
    for outcome in await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 5):
        assert isinstance(outcome, Rejected) and outcome.reason == "unavailable", outcome


async def test_stopping_answers_a_request_whose_acquire_is_in_the_call_under_way(
    own_pods: Pods, own_redis: RedisServer
) -> None:
    """``stop()`` cancels a call to Redis that has not come back (Redis is frozen here):
    the request whose acquire it carried is answered 503 ``unavailable`` too, not left
    waiting for an answer that the cancelled call will never give."""
    gateway = await own_pods.start(global_max_in_flight=1)
    await gateway.scheduler.acquire(Ticket("t"))
    own_redis.pause()
    try:
        waiter = asyncio.create_task(gateway.scheduler.acquire(Ticket("t")))
        await asyncio.sleep(0.05)  # its call is under way, unanswered
        await asyncio.wait_for(gateway.stop(), 5)
        (outcome,) = await asyncio.wait_for(asyncio.gather(waiter, return_exceptions=True), 5)
    finally:
        own_redis.resume()
    assert isinstance(outcome, Rejected) and outcome.reason == "unavailable", outcome


async def test_a_silent_pod_holds_the_roll_call_until_its_liveness_passes(
    own_pods: Pods,
) -> None:
    """A pod that neither answers nor listens (hung, partitioned) after FLUSHALL may still
    run what it held: nothing is granted until its liveness, as the others last saw it,
    has passed; then the roll call closes without it, long before the 30 s fallback.
    (A TTL of 3 s here: b's liveness as a saw it lasts at least 2 s past the flush.)"""
    pods = own_pods
    a = await pods.start(global_max_in_flight=1, learning_window_s=30, lease_ttl_s=3)
    b = await pods.start(global_max_in_flight=1, learning_window_s=30, lease_ttl_s=3)
    assert await eventually(lambda: _live_pods(a, 2), 3)
    await _heartbeat(a)  # a's roster lists b with a liveness at most one heartbeat old
    _silence(b)
    await pods.client.flushall()
    late = asyncio.create_task(a.scheduler.acquire(Ticket("t")))
    await asyncio.sleep(0.5)
    assert not late.done()  # b may still run what it held
    (await asyncio.wait_for(late, 8)).release()
    assert (await pods.wait_empty(2)).empty


async def test_a_failover_to_a_replica_that_missed_writes_opens_a_roll_call(
    own_redis: RedisServer, pool_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A real failover: a replica is promoted after the master took a write it never
    replicated, and the pods' address now leads to it. The pods see another run_id on
    their first call and re-assert before anything new is granted: the seat the replica
    never heard of is counted, and a newcomer waits for it."""
    with start_replica(own_redis) as replica, TcpProxy.to(own_redis) as proxy:
        pods = Pods(proxy.url, pool_name)
        try:
            a = await pods.start(global_max_in_flight=2, learning_window_s=5)
            b = await pods.start(global_max_in_flight=2, learning_window_s=5)
            held_a = await a.scheduler.acquire(Ticket("t"))
            await backend(a).settled()
            with replica.sync_client() as client:
                _wait_replicated(client, own_redis)
                client.execute_command("REPLICAOF", "NO", "ONE")  # promoted, then lost
            held_b = await b.scheduler.acquire(Ticket("u"))  # only the old master has it
            await backend(b).settled()
            proxy.retarget(replica)
            late = asyncio.create_task(a.scheduler.acquire(Ticket("v")))
            await asyncio.sleep(0.5)
            assert not late.done()
            assert "another Redis server" in caplog.text
            result = await pods.audit()
            assert result.inflight == 2 and result.leases == 2
            held_b.release()
            (await asyncio.wait_for(late, 2)).release()
            held_a.release()
            assert (await pods.wait_empty(2)).empty
        finally:
            await pods.close()


def _wait_replicated(client: Any, master: RedisServer) -> None:
    with master.sync_client() as source:
        target = source.info("replication")["master_repl_offset"]
    deadline = time.monotonic() + 5
    while client.info("replication")["master_repl_offset"] < target:
        assert time.monotonic() < deadline, "the replica fell behind"
        time.sleep(0.02)


async def test_a_waiter_redis_dropped_is_queued_again_never_evicted_under_block(
    pods: Pods,
) -> None:
    """Redis drops a waiter whose pod it stopped hearing from; when the pod is back its
    heartbeat finds the waiter gone and queues it again, under block as under any policy:
    the request still gets its seat, never a 503 evicted."""
    gateway = await pods.start(global_max_in_flight=1, overflow_policy="block")
    held = await gateway.scheduler.acquire(Ticket("t"))
    waiter = asyncio.create_task(gateway.scheduler.acquire(Ticket("u")))
    await asyncio.sleep(0.1)
    await backend(gateway).settled()
    keys = PoolKeys(pods.pool)
    [waiter_id] = await pods.client.hkeys(keys.key("wmeta"))
    await _drop_waiter(pods, waiter_id)
    await _heartbeat(gateway)
    held.release()
    (await asyncio.wait_for(waiter, 3)).release()
    assert backend(gateway).notes_received["queued_again"] == 1
    assert (await pods.wait_empty(2)).empty


async def _drop_waiter(pods: Pods, waiter_id: str) -> None:
    """Take ``waiter_id`` out of the pool as the script does for a pod it thinks dead."""
    keys = PoolKeys(pods.pool)
    meta = (await pods.client.hget(keys.key("wmeta"), waiter_id)).split("|")
    rank, tenant, arrival = meta[0], meta[1], meta[2]
    await pods.client.zrem(keys.key("wq"), f"{rank}|{tenant}|{arrival}|{waiter_id}")
    await pods.client.hdel(keys.key("wmeta"), waiter_id)
    await pods.client.zrem(keys.key("wdl"), waiter_id)
    await pods.client.hdel(keys.key("tq"), tenant)
    await pods.client.zremrangebyrank(keys.key(f"ready:{rank}"), 0, -1)
    await pods.client.delete(keys.key("rmem"))


async def _heartbeat(gateway: Gateway) -> None:
    pod = backend(gateway)
    pod._batch.heartbeat = True
    pod._kick()
    await pod.settled()
