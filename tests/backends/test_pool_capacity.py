"""One computed limit for the pool: gateways ("pods") in one process sharing a real Redis,
each with a computed provider of its own opinion (a dial the test turns). The pod holding
the leader lease computes; every pod enforces its value under the operator's ceiling,
which any pod sets; the lease changes hands when its holder stops or falls silent."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from gateway import Gateway, Settings
from gateway.admin.status import status
from gateway.backends.redis.keys import PoolKeys
from gateway.core.tickets import Ticket
from tests.backends.dial import Dial, DialPlugin, Gauge
from tests.backends.redis_pods import TTL, Pods, backend, eventually
from tests.redis_procs import RedisServer

pytestmark = pytest.mark.anyio


class DialPods(Pods):
    """Pods whose providers are ``static`` and a dial of their own."""

    async def start_with(self, dial: Dial, **settings: Any) -> Gateway:
        values = {
            "redis_url": self.url,
            "pool": self.pool,
            "capacity_providers": ("static", "dial"),
            **self.settings,
            **settings,
        }
        gateway = Gateway(Settings(**values), plugins=[DialPlugin(dial)], entry_points=False)
        await gateway.start()
        self.started.append(gateway)
        return gateway


@pytest.fixture
def pods_class() -> type[Pods]:
    return DialPods  # the conftest's pods and own_pods, made of these


def leaders(gateways: list[Gateway]) -> list[Gateway]:
    return [g for g in gateways if backend(g).leading]


async def one_leader(gateways: list[Gateway]) -> Gateway:
    """The one pod that leads, once every pod names it and enforces its value."""

    async def settled() -> bool:
        found = leaders(gateways)
        if len(found) != 1:
            return False
        value = found[0].provider_limits()["dial"]
        return all(
            backend(g).leader == backend(found[0]).pod and g.provider_limits()["dial"] == value
            for g in gateways
        )

    assert await eventually(settled, 4 * TTL), [status(g)["capacity"] for g in gateways]
    (leader,) = leaders(gateways)
    return leader


async def limits_are(gateways: list[Gateway], limit: int) -> bool:
    return all(g.snapshot().limit == limit for g in gateways)


async def test_every_pod_enforces_the_value_the_leader_computed(pods: DialPods) -> None:
    """Three pods with three opinions: the pool's limit is the leader's, on every pod, in
    Redis and in each status, which names the leader and when it wrote."""
    dials = [Dial(5), Dial(9), Dial(7)]
    gateways = [await pods.start_with(d, global_max_in_flight=20) for d in dials]
    leader = await one_leader(gateways)
    value = dials[gateways.index(leader)].value
    assert await eventually(lambda: limits_are(gateways, value), 2 * TTL)
    assert (await pods.audit()).limit == value
    for gateway in gateways:
        capacity = status(gateway)["capacity"]
        assert capacity["max_in_flight"] == value
        assert capacity["providers"] == {"static": 20, "dial": value}
        where = capacity["computed"]["dial"]
        assert (where["source"], where["pod"]) == ("pool", backend(leader).pod)
        assert where["at"] > 0
        assert status(gateway)["cluster"]["leader"] == backend(leader).pod
    # what is enforced: the leader's value, whichever pod the requests arrive at
    follower = next(g for g in gateways if g is not leader)
    held = [await follower.scheduler.acquire(Ticket("t")) for _ in range(value)]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(follower.scheduler.acquire(Ticket("t")), 0.2)
    for permit in held:
        permit.release()


async def test_only_the_leaders_own_changes_reach_the_pool(pods: DialPods) -> None:
    """A follower's provider changing its mind changes nothing; the leader's change is
    every pod's limit, and a raise admits a follower's waiter at once."""
    dials = [Dial(4), Dial(4)]
    gateways = [await pods.start_with(d, global_max_in_flight=20) for d in dials]
    leader = await one_leader(gateways)
    follower = next(g for g in gateways if g is not leader)
    leader_dial, follower_dial = (dials[gateways.index(g)] for g in (leader, follower))
    follower_dial.turn(1)
    await backend(follower).settled()
    await asyncio.sleep(2 * TTL)  # heartbeats of both, which would carry a wrong value
    assert await limits_are(gateways, 4)
    assert follower.provider_limits()["dial"] == 4
    held = [await follower.scheduler.acquire(Ticket("t")) for _ in range(4)]
    waiter = asyncio.create_task(follower.scheduler.acquire(Ticket("u")))
    assert await eventually(lambda: _waiting(pods, 1), 2)
    leader_dial.turn(5)
    permit = await asyncio.wait_for(waiter, 2)
    assert await eventually(lambda: limits_are(gateways, 5), 2 * TTL)
    for p in [*held, permit]:
        p.release()


async def _waiting(pods: Pods, n: int) -> bool:
    return (await pods.audit()).waiters == n


async def test_a_ceiling_set_on_a_follower_is_every_pods(pods: DialPods) -> None:
    """``set_capacity`` on a follower sets the pool's ceiling: below the computed value it
    is the limit everywhere, the leader's provider is handed it (``use_ceiling``), and
    raised again the computed value is the limit once more."""
    dials = [Dial(8), Dial(6)]
    gateways = [await pods.start_with(d, global_max_in_flight=20) for d in dials]
    leader = await one_leader(gateways)
    follower = next(g for g in gateways if g is not leader)
    value = dials[gateways.index(leader)].value
    follower.set_capacity(3)
    assert await eventually(lambda: limits_are(gateways, 3), 2 * TTL)
    assert await eventually(lambda: _ceilings_are(gateways, 3), 2 * TTL)
    assert dials[gateways.index(leader)].ceiling() == 3
    follower.set_capacity(50)
    assert await eventually(lambda: limits_are(gateways, value), 2 * TTL)
    assert await eventually(lambda: _ceilings_are(gateways, 50), 2 * TTL)
    assert dials[gateways.index(leader)].ceiling() == 50


async def _ceilings_are(gateways: list[Gateway], ceiling: int) -> bool:
    return all(g.provider_limits()["static"] == ceiling for g in gateways)


async def test_a_leader_that_stops_hands_over_to_another_pod(pods: DialPods) -> None:
    """A leader shutting down gives the lease up; another pod takes it at its next try
    and its value becomes the pool's."""
    dials = [Dial(3), Dial(6), Dial(9)]
    gateways = [await pods.start_with(d, global_max_in_flight=20) for d in dials]
    leader = await one_leader(gateways)
    await leader.stop()
    rest = [g for g in gateways if g is not leader]
    successor = await one_leader(rest)
    value = dials[gateways.index(successor)].value
    assert await eventually(lambda: limits_are(rest, value), 2 * TTL)
    assert (await pods.audit()).limit == value


async def test_a_silent_leader_is_replaced_once_its_lease_runs_out(pods: DialPods) -> None:
    """A leader that stops talking (crashed, frozen) without giving up its lease: once its
    lease runs out on Redis' clock, another pod leads and its value is the pool's."""
    dials = [Dial(3), Dial(6)]
    gateways = [await pods.start_with(d, global_max_in_flight=20) for d in dials]
    leader = await one_leader(gateways)
    pod = backend(leader)
    pod._running = False
    for task in pod._tasks:
        task.cancel()
    key = PoolKeys(pods.pool).leader
    left_ms = await pods.client.pttl(key)
    assert 0 < left_ms <= TTL * 1000  # it runs out within one TTL of the silence
    (other,) = (g for g in gateways if g is not leader)
    value = dials[gateways.index(other)].value
    assert await eventually(lambda: _leads(other), TTL * 3)
    assert await eventually(lambda: limits_are([other], value), TTL * 2)
    assert await pods.client.get(key) == backend(other).pod


async def _leads(gateway: Gateway) -> bool:
    return backend(gateway).leading


async def test_a_provider_read_on_every_decision_reaches_the_pool_on_the_heartbeat(
    pods: DialPods,
) -> None:
    """A computed provider that announces nothing: the leader sends its value with each
    heartbeat, and every pod enforces it."""
    gauges = [Gauge(5), Gauge(5)]
    gateways = [await pods.start_with(g, global_max_in_flight=20) for g in gauges]
    leader = await one_leader(gateways)
    gauges[gateways.index(leader)].value = 2
    assert await eventually(lambda: limits_are(gateways, 2), 3 * TTL)


class FailingGauge(Gauge):
    """A gauge that raises once ``failing`` is set."""

    failing = False

    def max_in_flight(self) -> int:
        if self.failing:
            raise ConnectionError("metrics endpoint unreachable")
        return self.value


async def test_a_provider_failing_on_the_leader_is_named_in_the_log(
    pods: DialPods, caplog: pytest.LogCaptureFixture
) -> None:
    """Every pod enforces the pool's value and never reads the leader's provider itself,
    so the leader's own read is the only one that sees it fail: it is logged there, by
    name, and the pool keeps the last good value (as a provider failing in process is
    handled). It used to go unseen."""
    gauge = FailingGauge(5)
    gateway = await pods.start_with(gauge, global_max_in_flight=20)
    await one_leader([gateway])
    assert await eventually(lambda: limits_are([gateway], 5), 3 * TTL)
    gauge.failing = True

    async def logged() -> bool:
        return (
            "capacity provider 'dial' from plugin 'DialPlugin-0' (registered by the "
            "application) raised ConnectionError" in caplog.text
        )

    with caplog.at_level(logging.ERROR, logger="obleth"):
        assert await eventually(logged, 3 * TTL), caplog.text
    assert "the pool keeps its last good value, 5" in caplog.text
    assert gateway.snapshot().limit == 5


async def test_a_value_no_pod_computes_any_more_stops_counting(pods: DialPods) -> None:
    """Once no pod computes a provider (its pods gone, the rest without it), its last
    value is dropped after two lease TTLs and the ceiling is the limit again."""
    computing = await pods.start_with(Dial(2), global_max_in_flight=10)
    plain = await pods.start(global_max_in_flight=10)
    assert await eventually(lambda: limits_are([computing, plain], 2), 2 * TTL)
    await computing.stop()
    assert await eventually(lambda: limits_are([plain], 10), 4 * TTL)
    assert (await pods.audit()).limit == 10


async def test_while_redis_is_unreachable_each_pod_computes_its_own(
    own_pods: DialPods, own_redis: RedisServer
) -> None:
    """Redis frozen: a pod's computed providers answer its own values, and its local share
    is its own limit over the pods last seen; once Redis answers, the leader's again."""
    pods = own_pods
    dials = [Dial(8), Dial(4)]
    gateways = [await pods.start_with(d, global_max_in_flight=20) for d in dials]
    leader = await one_leader(gateways)
    follower = next(g for g in gateways if g is not leader)
    own = dials[gateways.index(follower)].value
    pooled = dials[gateways.index(leader)].value
    own_redis.pause()
    try:
        permit = await follower.scheduler.acquire(Ticket("t"))  # waits out the retry budget
        assert backend(follower).mode == "local"
        assert follower.provider_limits()["dial"] == own
        assert status(follower)["capacity"]["computed"]["dial"]["source"] == "own"
        assert backend(follower).local_share == own // 2
    finally:
        own_redis.resume()
    assert await eventually(lambda: _mode_is(follower, "redis"), 3 * TTL)
    assert await eventually(lambda: limits_are([follower], pooled), 3 * TTL)
    assert follower.provider_limits()["dial"] == pooled
    permit.release()


async def _mode_is(gateway: Gateway, mode: str) -> bool:
    return backend(gateway).mode == mode


async def test_in_process_every_gateway_computes_its_own() -> None:
    """Without Redis nothing is shared: the limit is the lowest of the gateway's own
    providers, and the status says the value is its own."""
    dial = Dial(3)
    gateway = Gateway(
        Settings(capacity_providers=("static", "dial"), global_max_in_flight=10),
        plugins=[DialPlugin(dial)],
        entry_points=False,
    )
    assert gateway.capacity.current() == 3
    dial.turn(6)
    assert gateway.capacity.current() == 6
    capacity = status(gateway)["capacity"]
    assert capacity["computed"] == {"dial": {"source": "own", "pod": None, "at": None}}
    assert dial.ceiling() == 10


async def test_after_redis_loses_the_pool_grants_resume_under_the_computed_value(
    own_pods: DialPods, own_redis: RedisServer
) -> None:
    """``FLUSHALL``: the ceiling comes back from the pods, the computed value with the
    leader's re-assertion, and the roll call holds grants until both are there."""
    pods = own_pods
    dials = [Dial(3), Dial(8)]
    gateways = [
        await pods.start_with(d, global_max_in_flight=20, learning_window_s=None) for d in dials
    ]
    leader = await one_leader(gateways)
    follower = next(g for g in gateways if g is not leader)
    value = dials[gateways.index(leader)].value
    with own_redis.sync_client() as client:
        client.flushall()
    tasks = [asyncio.create_task(follower.scheduler.acquire(Ticket("t"))) for _ in range(4)]
    assert await eventually(lambda: _granted(tasks, value), 3 * TTL)
    assert await eventually(lambda: _waiting(pods, 1), TTL)
    found = await pods.audit()
    assert (found.limit, found.inflight) == (value, value)
    assert await pods.client.get(PoolKeys(pods.pool).leader) == backend(leader).pod
    for task in tasks:
        if task.done():
            task.result().release()
        else:
            task.cancel()


async def _granted(tasks: list[asyncio.Task[Any]], n: int) -> bool:
    return sum(task.done() for task in tasks) == n
