"""``global_max_tokens_in_flight`` and ``fairness_cost="tokens"``, on both backends: a
request runs when a seat and its tokens are both free, one larger than the whole budget
runs alone, and fair by tokens the next seat goes to the tenant with the fewest tokens in
flight per unit of weight. In Redis the tokens are counted in the pool, audited, and
re-asserted after Redis loses the pool."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.backends.redis.audit import audit
from gateway.backends.redis.keys import PoolKeys
from gateway.core.tickets import Ticket
from tests.backends.redis_pods import TTL, Pods, backend, eventually
from tests.backends.test_contract import Make, assert_drained, make, settle, state, waiting
from tests.redis_procs import RedisServer

__all__ = ["make"]  # the fixture, run on both backends

pytestmark = pytest.mark.anyio


async def test_a_request_waits_until_its_tokens_are_free(make: Make) -> None:
    gateway = await make(global_max_in_flight=10, global_max_tokens_in_flight=100)
    first = await gateway.scheduler.acquire(Ticket("a", tokens=60))
    big, small = await waiting(gateway, Ticket("b", tokens=50), Ticket("c", tokens=30))
    # 30 more would fit, but nobody barges past the waiter ahead (FIFO within a class)
    assert not big.done() and not small.done()
    assert gateway.snapshot().tokens_inflight == 60
    pool = await state(gateway)  # in Redis, the pool's own count
    assert (pool.tokens_inflight, pool.max_tokens) == (60, 100)
    first.release()
    permits = [await asyncio.wait_for(task, 2) for task in (big, small)]
    await settle(gateway)
    assert gateway.snapshot().tokens_inflight == 80
    for permit in permits:
        permit.release()
    await settle(gateway)
    assert gateway.snapshot().tokens_inflight == 0
    await assert_drained(gateway)


async def test_a_request_larger_than_the_whole_budget_runs_alone(make: Make) -> None:
    """Rather than never: it waits until no tokens are in flight, then runs, and the
    others wait for it."""
    gateway = await make(global_max_in_flight=10, global_max_tokens_in_flight=100)
    holder = await gateway.scheduler.acquire(Ticket("a", tokens=1))
    [huge] = await waiting(gateway, Ticket("b", tokens=500))
    assert not huge.done()
    holder.release()
    running = await asyncio.wait_for(huge, 2)
    [after] = await waiting(gateway, Ticket("c", tokens=1))
    assert not after.done()
    running.release()
    (await asyncio.wait_for(after, 2)).release()
    await assert_drained(gateway)


@pytest.mark.parametrize(("cost", "first"), [("requests", "a"), ("tokens", "b")])
async def test_fair_by_tokens_counts_what_each_tenant_runs_in_tokens(
    make: Make, cost: str, first: str
) -> None:
    """a runs one long request, b two short ones. By requests a holds less and goes
    first; by tokens b does."""
    gateway = await make(global_max_in_flight=4, fairness_cost=cost)
    held = [
        await gateway.scheduler.acquire(ticket)
        for ticket in (Ticket("a", tokens=1000), Ticket("b", tokens=10), Ticket("b", tokens=10))
    ]
    filler = await gateway.scheduler.acquire(Ticket("z"))
    a, b = await waiting(gateway, Ticket("a", tokens=10), Ticket("b", tokens=10))
    filler.release()
    await settle(gateway)
    granted = [t for t, task in (("a", a), ("b", b)) if task.done()]
    assert granted == [first]
    for permit in held:
        permit.release()
    for task in (a, b):
        (await asyncio.wait_for(task, 2)).release()
    await assert_drained(gateway)


async def test_the_pool_counts_tokens_and_they_come_back_after_redis_loses_it(
    own_pods: Pods,
) -> None:
    pods = own_pods
    # a roll call: nothing is granted until both pods have written their leases back
    settings = {"global_max_tokens_in_flight": 100, "fairness_cost": "tokens"}
    a = await pods.start(learning_window_s=3, **settings)
    b = await pods.start(learning_window_s=3, **settings)
    held = [
        await a.scheduler.acquire(Ticket("t", tokens=40)),
        await b.scheduler.acquire(Ticket("u", tokens=50)),
    ]
    assert (await pods.audit()).ok  # tokens and tenant tokens agree with the leases
    [waiter] = await waiting(b, Ticket("u", tokens=20))
    assert not waiter.done()
    await pods.client.flushall()
    # the pods write their leases back, tokens and all: the waiter still does not fit
    assert await eventually(lambda: _tokens_are(pods, 90), 10 * TTL)
    assert not waiter.done()
    held[0].release()
    (await asyncio.wait_for(waiter, 5)).release()
    held[1].release()
    assert (await pods.wait_empty(3)).empty


async def _tokens_are(pods: Pods, tokens: int) -> bool:
    found = await pods.audit()
    state = await pods.client.hget(f"obleth:{{{pods.pool}}}:state", "tokens")
    return found.ok and state is not None and int(state) == tokens


async def test_in_local_failure_mode_a_pod_keeps_its_part_of_the_token_budget(
    own_pods: Pods, own_redis: RedisServer
) -> None:
    """Cut off from Redis, each pod admits its share of the seats and of the tokens: two
    live pods, a budget of 100, 50 each; the tokens it already runs count."""
    pods = own_pods
    settings = {"global_max_tokens_in_flight": 100, "redis_failure_mode": "local"}
    a = await pods.start(**settings)
    await pods.start(**settings)
    assert await eventually(lambda: _live_pods_seen(a, 2), 10 * TTL)
    holder = await a.scheduler.acquire(Ticket("t", tokens=30))
    own_redis.pause()
    try:
        assert await eventually(lambda: _mode_is(a, "local"), 10 * TTL)
        [over] = await waiting(a, Ticket("t", tokens=30))  # 30 + 30 > 50
        assert not over.done()
        holder.release()
        (await asyncio.wait_for(over, 2)).release()
    finally:
        own_redis.resume()


async def _live_pods_seen(gateway: Any, n: int) -> bool:
    await settle(gateway)
    return bool(gateway.backend._state.live_pods == n)


async def _mode_is(gateway: Any, mode: str) -> bool:
    return bool(gateway.backend.mode == mode)


async def test_a_grant_on_arrival_lets_the_waiter_that_is_first_in_line_now_run(
    make: Make,
) -> None:
    """Found by a fuzz of both backends: a critical request granted at once moves its
    tenant behind the other in the fair order, and the other's waiter, which fits, ran
    at once in Redis but waited in process until the next release."""
    gateway = await make(global_max_in_flight=5, global_max_tokens_in_flight=100)
    first = await gateway.scheduler.acquire(Ticket("b", tokens=60))
    too_big, fits = await waiting(gateway, Ticket("a", tokens=50), Ticket("b", tokens=10))
    assert not too_big.done() and not fits.done()
    critical = await gateway.scheduler.acquire(Ticket("a", "critical", tokens=20))
    await settle(gateway)
    # a holds 1 and b holds 1: b was served least recently, its head fits (90 <= 100)
    assert fits.done() and not too_big.done()
    for permit in (first, critical, fits.result()):
        permit.release()
    (await asyncio.wait_for(too_big, 2)).release()
    await assert_drained(gateway)


async def test_fair_by_tokens_a_large_request_is_not_starved_by_a_backlog(make: Make) -> None:
    """Found by a review: with its own estimate in its key, a's request of 95 tokens
    lost to b every time one of b's 30-token requests ended (b's key fell back below 95)
    and timed out, budget or not. Now a's key is what it holds, 0: it is first in line
    while b holds anything, and nobody goes past it. When b holds nothing they tie, and b,
    served longer ago, may take one turn; then a's turn comes."""
    gateway = await make(
        global_max_in_flight=10, global_max_tokens_in_flight=100, fairness_cost="tokens"
    )
    held = [await gateway.scheduler.acquire(Ticket("b", tokens=30)) for _ in range(3)]
    [large] = await waiting(gateway, Ticket("a", tokens=95))
    backlog = await waiting(gateway, *[Ticket("b", tokens=30)] * 3)
    for permit in held[:2]:
        permit.release()
        await settle(gateway)
        assert not large.done() and not any(task.done() for task in backlog)
    held[2].release()
    await settle(gateway)
    turn = [task for task in backlog if task.done()]
    assert len(turn) <= 1  # the tie's one turn, at most
    for task in turn:
        task.result().release()
    running = await asyncio.wait_for(large, 2)
    await settle(gateway)
    assert sum(task.done() for task in backlog) == len(turn)  # the rest wait behind a
    running.release()
    for task in backlog:
        (await asyncio.wait_for(task, 2)).release()
    await assert_drained(gateway)


async def test_tokens_left_by_a_lease_an_older_pod_freed_mend_themselves(pods: Pods) -> None:
    """A pod of the version before tokens reaps an expired lease of a newer pod as
    tenant|seats|pod: it frees the seats and leaves the tokens counted. The next call of
    a newer pod's next heartbeat finds the tenant holding nothing and drops its tokens."""
    gateway = await pods.start(global_max_tokens_in_flight=100)
    keeps = await gateway.scheduler.acquire(Ticket("x", tokens=10))  # the pool is not empty
    permit = await gateway.scheduler.acquire(Ticket("t", tokens=50))
    keys = PoolKeys(pods.pool)
    lease = next(lid for lid, held in backend(gateway)._state.held.items() if held.tenant == "t")
    # what the older step.lua's free_lease does: seats only
    await pods.client.eval(
        """
        redis.call('ZREM', KEYS[1], ARGV[1]); redis.call('HDEL', KEYS[2], ARGV[1])
        redis.call('HINCRBY', KEYS[3], 'inflight', -1); redis.call('HDEL', KEYS[4], 't')
        """,
        4,
        keys.key("leases"),
        keys.key("lmeta"),
        keys.key("state"),
        keys.key("tin"),
        lease,
    )
    del backend(gateway)._state.held[lease]  # the lease is gone for this pod too
    permit.owner = None
    assert not await _consistent(pods)  # 50 tokens counted, no lease holds them
    assert await eventually(lambda: _consistent(pods), 5 * TTL)
    # 10 + 60 fit; with t's 50 still counted they would not
    other = await asyncio.wait_for(gateway.scheduler.acquire(Ticket("u", tokens=60)), 2)
    other.release()
    keeps.release()


async def _consistent(pods: Pods) -> bool:
    """The tokens agree with the leases (this test's stand-in for an older pod's reaping
    leaves the tenant's turn as it is, which the audit names too)."""
    problems = (await audit(pods.client, pods.pool)).problems
    return not [problem for problem in problems if "token" in problem]
