"""Waiting for room in a full queue (``block``) in cluster mode, with several gateways
("pods") in one process sharing a real Redis: the lobby is one for the whole pool, first
come first served across pods, and survives what the queue survives (a pod that goes
silent, Redis losing the pool). After each step the pool's invariants are checked in
Redis, the lobby's included: nobody waits for room while the queue has room.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway import Gateway
from gateway.backends.redis.keys import PoolKeys
from gateway.core.tickets import Ticket
from gateway.protocols import Permit
from tests.backends.redis_pods import TTL, Pods, backend, eventually

pytestmark = pytest.mark.anyio

MAX_QUEUE = 1
#: the pods here: under block, with a queue of one and one seat
BLOCK_POOL = {"global_max_in_flight": 1, "max_queue": MAX_QUEUE, "overflow_policy": "block"}


@pytest.fixture
async def pods(redis_url: str, pool_name: str) -> AsyncIterator[Pods]:
    group = Pods(redis_url, pool_name, settings=BLOCK_POOL, max_queue=MAX_QUEUE)
    yield group
    await group.close()


async def arrive(pods: Pods, gateway: Gateway, tenant: str) -> asyncio.Task[Permit]:
    """One acquire, known to Redis before the caller goes on."""
    before = (await pods.audit()).waiters
    task = asyncio.create_task(gateway.scheduler.acquire(Ticket(tenant)))

    async def known() -> bool:
        return (await pods.audit()).waiters == before + 1

    assert await eventually(known, 2)
    return task


async def test_waiters_for_room_on_every_pod_get_seats_in_arrival_order(pods: Pods) -> None:
    """One lobby for the pool: requests arriving on two pods while the queue is full are
    admitted in the order they arrived, whichever pod they came through."""
    a, b = await pods.start(), await pods.start()
    holder = await a.scheduler.acquire(Ticket("x"))
    tasks = [await arrive(pods, pod, tenant) for pod, tenant in ((a, "a1"), (b, "b1"), (a, "a2"))]
    tasks.append(await arrive(pods, b, "b2"))
    found = await pods.audit()
    assert (found.waiters, found.lobby) == (4, 3)
    holder.release()
    served = []
    for task in tasks:
        permit = await asyncio.wait_for(task, 3)
        served.append(permit.ticket.tenant)
        assert not any(t.done() for t in tasks[len(served) :]), "a later arrival ran first"
        await pods.audit()
        permit.release()
    assert served == ["a1", "b1", "a2", "b2"]
    assert all(not gateway.scheduler.rejected for gateway in (a, b))
    assert await pods.drained()


async def test_a_silent_pods_waiter_for_room_does_not_hold_up_the_next(pods: Pods) -> None:
    """A pod that stops talking while its request waits for room: once its liveness has
    passed, that request is dropped when it reaches the queue's head, and the seats go to
    the requests behind it on pods that are alive."""
    a, silent = await pods.start(), await pods.start()
    holder = await a.scheduler.acquire(Ticket("x"))
    first = await arrive(pods, a, "a1")
    lost = await arrive(pods, silent, "s1")
    after = await arrive(pods, a, "a2")
    for task in backend(silent)._tasks:  # no more heartbeats: as if it crashed
        task.cancel()
    backend(silent)._running = False
    pod_key = PoolKeys(pods.pool).key("pods")
    silent_id = backend(silent).pod

    async def liveness_passed() -> bool:
        seconds, micros = await pods.client.time()
        alive_until = await pods.client.zscore(pod_key, silent_id)
        return alive_until is None or alive_until < seconds * 1000 + micros // 1000

    assert await eventually(liveness_passed, TTL * 4)
    holder.release()
    permit = await asyncio.wait_for(first, 3)
    permit.release()
    permit = await asyncio.wait_for(after, 3)
    assert permit.ticket == Ticket("a2")
    permit.release()
    assert not lost.done()  # its pod never heard back: nothing runs on a dead pod
    assert await pods.drained()
    lost.cancel()


async def test_waiters_for_room_wait_on_when_redis_loses_the_pool(pods: Pods) -> None:
    """Redis forgets the pool (a restart without persistence) while requests wait for
    room: the pod queues them again and every one of them gets its seat, none a 503;
    a request arriving after that waits behind them."""
    gateway = await pods.start()
    holder = await gateway.scheduler.acquire(Ticket("x"))
    waiting = [await arrive(pods, gateway, tenant) for tenant in ("t1", "t2", "t3")]
    assert (await pods.audit()).lobby == 2
    await pods.client.delete(*await pods.client.keys(PoolKeys(pods.pool).prefix + "*"))
    pod = backend(gateway)
    pod._batch.heartbeat = True  # the next call finds the pool lost
    pod._kick()

    async def queued_again() -> bool:
        return (await pods.audit()).waiters == 3

    assert await eventually(queued_again, 3)
    late = await arrive(pods, gateway, "t4")
    assert (await pods.audit()).lobby == 1
    holder.release()
    served = []
    for task in [*waiting, late]:
        permit = await asyncio.wait_for(task, 3)
        served.append(permit.ticket.tenant)
        permit.release()
    assert sorted(served[:3]) == ["t1", "t2", "t3"] and served[3] == "t4"
    assert not gateway.scheduler.rejected
    assert await pods.drained()
