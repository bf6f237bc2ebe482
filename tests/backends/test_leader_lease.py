"""The leader lease against a real Redis: one holder at a time, renewed by its holder,
free again on Redis' own clock once the holder stops, and given up on request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.crc import key_slot

from gateway.backends.redis.connect import Client, connect
from gateway.backends.redis.keys import PoolKeys
from gateway.backends.redis.leader import LeaderLease

pytestmark = pytest.mark.anyio

TTL_S = 0.5


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Client]:
    client = connect(redis_url, pool_size=4, timeout_s=5)
    yield client
    await client.aclose()


def lease(client: Client, pool: str, pod: str, ttl_s: float = TTL_S) -> LeaderLease:
    return LeaderLease(client, PoolKeys(pool), pod, ttl_s=ttl_s)


async def test_the_first_pod_to_ask_takes_the_lease_and_the_others_learn_who(
    client: Client, pool_name: str
) -> None:
    """One holder; a pod that finds it taken learns who holds it and for how long yet,
    and does not lead."""
    a, b = lease(client, pool_name, "a"), lease(client, pool_name, "b")
    first = await a.hold()
    second = await b.hold()
    assert first.holder == second.holder == "a"
    assert 0 < second.left_ms <= TTL_S * 1000
    assert a.leading() and not b.leading()
    assert (a.holder, b.holder) == ("a", "a")


async def test_the_holder_renews_its_lease_and_keeps_it(client: Client, pool_name: str) -> None:
    """Asking again renews the holder's lease to a whole TTL on Redis' clock."""
    a, b = lease(client, pool_name, "a"), lease(client, pool_name, "b")
    await a.hold()
    await asyncio.sleep(TTL_S / 2)
    assert (await b.hold()).left_ms <= TTL_S * 500 + 50  # half of it has run out
    renewed = await a.hold()
    assert renewed.holder == "a" and renewed.left_ms > TTL_S * 500 + 50
    assert (await b.hold()).holder == "a"


async def test_a_lease_nobody_renews_is_taken_once_redis_lets_it_run_out(
    client: Client, pool_name: str
) -> None:
    """The holder stops (a crash): the next pod to ask once the remaining time Redis gave
    has passed takes the lease; before that it cannot."""
    a, b = lease(client, pool_name, "a"), lease(client, pool_name, "b")
    await a.hold()
    found = await b.hold()
    assert found.holder == "a"
    await asyncio.sleep(found.left_ms / 1000 + 0.01)
    taken = await b.hold()
    assert taken.holder == "b" and b.leading()
    assert (await a.hold()).holder == "b"  # the old holder, back, finds it taken
    assert not a.leading()


async def test_a_pod_that_keeps_the_lease_takes_it_as_soon_as_it_runs_out(
    client: Client, pool_name: str
) -> None:
    """``keep`` asks again when Redis said the lease would run out, not only at its next
    beat: with a long beat and a short lease, it takes over well before the beat."""
    holder = lease(client, pool_name, "a", ttl_s=0.3)
    await holder.hold()
    gained = asyncio.Event()
    waiting = LeaderLease(client, PoolKeys(pool_name), "b", ttl_s=30.0, on_gained=gained.set)
    running = True
    keeper = asyncio.create_task(waiting.keep(lambda: running))
    try:
        # its beat is 8-10 s; the lease it found runs out within 0.3 s
        await asyncio.wait_for(gained.wait(), 5)
        assert waiting.holder == "b"
    finally:
        running = False
        keeper.cancel()


async def test_a_pod_resigns_only_its_own_lease(client: Client, pool_name: str) -> None:
    """Resigning frees the lease for the next pod at once; a pod that does not hold it
    changes nothing by resigning."""
    a, b = lease(client, pool_name, "a"), lease(client, pool_name, "b")
    await a.hold()
    await b.resign()
    assert (await b.hold()).holder == "a"
    await a.resign()
    assert not a.leading()
    assert (await b.hold()).holder == "b"


async def test_the_lease_lives_in_the_pools_slot(pool_name: str) -> None:
    """Under the pool's hash tag, so Redis Cluster keeps it with the rest of the pool."""
    keys = PoolKeys(pool_name)
    assert keys.leader == f"obleth:{{{pool_name}}}:leader"
    assert key_slot(keys.leader.encode()) == key_slot(keys.key("state").encode())
