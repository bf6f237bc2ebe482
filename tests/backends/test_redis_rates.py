"""The rate budgets of a pool, kept in a real Redis: every pod spends from the same
minute, Redis' script decides as the in-process budgets do, a reservation goes back
where it was taken, idle tenants leave no key behind, and ``redis_failure_mode`` decides
only once Redis cannot be reached within the retry budget."""

from __future__ import annotations

import asyncio
import random

import pytest

from gateway import Gateway, Rejected
from gateway.backends.redis.keys import PoolKeys
from gateway.core.rates import LocalRates
from gateway.rates.budgets import RateBudgets, Refund
from tests.backends.redis_pods import TTL, Pods, backend, eventually
from tests.redis_procs import RedisServer

pytestmark = pytest.mark.anyio


def budgets(gateway: Gateway) -> RateBudgets:
    assert gateway.rates is not None
    return gateway.rates


async def outcome(gateway: Gateway, tenant: str = "t", tokens: int = 0) -> str:
    """``ok`` or the reason of the refusal."""
    answer = await budgets(gateway).reserve(tenant, tokens)
    return answer.reason if isinstance(answer, Rejected) else "ok"


async def taken(gateway: Gateway, tenant: str = "t", tokens: int = 0) -> Refund:
    answer = await budgets(gateway).reserve(tenant, tokens)
    assert not isinstance(answer, Rejected), answer
    return answer


async def test_every_pod_spends_from_the_same_minute(pods: Pods) -> None:
    a = await pods.start(tenant_rpm={"t": 3})
    b = await pods.start(tenant_rpm={"t": 3})
    assert [await outcome(g) for g in (a, b, a)] == ["ok"] * 3
    refused = await budgets(b).reserve("t", 0)
    assert isinstance(refused, Rejected) and refused.reason == "requests_per_minute"
    assert refused.status == 429 and 19 <= refused.retry_after_s <= 20
    assert await outcome(b, "other") == "ok"  # no budget: never refused


async def test_a_refund_is_seen_by_every_pod_and_an_idle_tenant_leaves_no_key(
    pods: Pods,
) -> None:
    a = await pods.start(tenant_tpm={"t": 100})
    b = await pods.start(tenant_tpm={"t": 100})
    refund = await taken(a, tokens=100)
    assert await outcome(b, tokens=1) == "tokens_per_minute"
    key = PoolKeys(pods.pool).key("rate:t")
    assert 59_000 < await pods.client.pttl(key) <= 61_000  # gone once earned back
    refund()
    assert await eventually(lambda: _gone(pods, key), 2)
    assert await outcome(b, tokens=100) == "ok"


async def test_a_served_request_is_settled_at_the_tokens_it_used_on_every_pod(
    pods: Pods,
) -> None:
    """Fewer than estimated: the rest comes back, the request stays counted; more: the
    excess is taken whatever the room, and the next reservation waits for it."""
    a = await pods.start(tenant_rpm={"t": 2}, tenant_tpm={"t": 100})
    b = await pods.start(tenant_rpm={"t": 2}, tenant_tpm={"t": 100})
    settle = await taken(a, tokens=80)
    settle(30)
    assert await eventually(lambda: _outcome_is(b, "ok", tokens=70), 2)
    assert await outcome(b, tokens=0) == "requests_per_minute"  # both requests count
    other = await pods.start(tenant_tpm={"u": 100})
    (await taken(other, "u", tokens=10))(130)  # 10 reserved, 130 used
    key = PoolKeys(pods.pool).key("rate:u")
    assert await eventually(lambda: _owes_more_than_a_minute(pods, key), 2)
    refused = await budgets(other).reserve("u", 1)
    assert isinstance(refused, Rejected) and refused.reason == "tokens_per_minute"
    assert 6 <= refused.retry_after_s <= 7  # 10 + 100 (a minute's at most) + 1 of 100


async def _owes_more_than_a_minute(pods: Pods, key: str) -> bool:
    return float(await pods.client.hget(key, "t") or 0) > 60_000  # 110 tokens of 100


async def _gone(pods: Pods, key: str) -> bool:
    return not await pods.client.exists(key)


async def test_redis_decides_as_one_process_does(pods: Pods) -> None:
    """The same reservations, in the same order, within a moment: Redis' script and the
    in-process budgets agree on each (both are the same GCRA, on different clocks), and
    a refusal names the budget that keeps it waiting longest in both."""
    gateway = await pods.start(tenant_rpm={"*": 40}, tenant_tpm={"*": 5000, "big": 20000})
    alone = LocalRates(gateway.settings.rate_rules())
    rng = random.Random(7)
    shared, local = [], []
    for _ in range(200):
        tenant = rng.choice(["a", "b", "big"])
        tokens = rng.choice([0, 10, 300, 900, 6000])
        shared.append(await outcome(gateway, tenant, tokens))
        over = alone.reserve(tenant, tokens, now=0.0)
        local.append("ok" if over is None else over.reason)
    assert shared == local
    assert shared.count("ok") > 50 and len(set(shared)) == 3  # both budgets refused some


async def test_the_wait_is_the_longer_one_of_both_budgets(pods: Pods) -> None:
    """Told to retry after the request budget's wait, a client would find the token
    budget still short: it is told the longer wait."""
    gateway = await pods.start(tenant_rpm={"t": 3}, tenant_tpm={"t": 1000})
    for _ in range(3):
        await taken(gateway, tokens=300)
    # 900 tokens of 1000 spent: 300 more fit in 12 s, a 4th request in 20 s
    refused = await budgets(gateway).reserve("t", 300)
    assert isinstance(refused, Rejected) and refused.reason == "requests_per_minute"
    assert 19 <= refused.retry_after_s <= 20
    # 900 more fit in 48 s: longer than the request's 20
    bigger = await budgets(gateway).reserve("t", 900)
    assert isinstance(bigger, Rejected) and bigger.reason == "tokens_per_minute"
    assert 47 <= bigger.retry_after_s <= 48


async def test_a_connection_lost_once_is_retried_not_taken_for_an_outage(
    own_pods: Pods, own_redis: RedisServer
) -> None:
    """Under ``closed``, one dropped connection used to answer a healthy pod's request
    503; the call is retried within ``redis_retry_budget_s`` as the seats' calls are."""
    gateway = await own_pods.start(tenant_rpm={"t": 2}, redis_failure_mode="closed")
    assert [await outcome(gateway) for _ in range(2)] == ["ok", "ok"]
    await own_pods.client.client_kill_filter(_type="normal", skipme=True)
    assert await outcome(gateway) == "requests_per_minute"
    assert backend(gateway).mode == "redis"


async def test_a_caller_that_leaves_mid_call_has_its_reservation_given_back(
    pods: Pods,
) -> None:
    gateway = await pods.start(tenant_rpm={"t": 1})
    leaving = asyncio.create_task(budgets(gateway).reserve("t", 0))
    await asyncio.sleep(0)  # the call is on its way
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert await eventually(lambda: _outcome_is(gateway, "ok"), 2)


async def _outcome_is(gateway: Gateway, expected: str, *, tokens: int = 0) -> bool:
    found = await outcome(gateway, tokens=tokens)
    if found == "ok":
        return expected == "ok"
    return found == expected


async def test_refunds_made_before_the_gateway_stops_reach_redis(pods: Pods) -> None:
    gateway = await pods.start(tenant_rpm={"t": 1})
    refund = await taken(gateway)
    refund()
    await gateway.stop()
    assert not await pods.client.exists(PoolKeys(pods.pool).key("rate:t"))


@pytest.mark.parametrize("mode", ["closed", "open", "local"])
async def test_while_redis_cannot_be_reached_the_failure_mode_decides(
    own_pods: Pods, own_redis: RedisServer, mode: str
) -> None:
    gateway = await own_pods.start(tenant_rpm={"t": 2}, redis_failure_mode=mode)
    in_redis = await taken(gateway)  # one spent in Redis
    own_redis.pause()
    try:
        assert await eventually(lambda: _mode_is(own_pods, mode), 5 * TTL)
        outcomes = [await outcome(gateway) for _ in range(3)]
        # a refund goes where its reservation was taken: Redis' does not make room in
        # this pod's own budget
        in_redis()
        outcomes.append(await outcome(gateway))
    finally:
        own_redis.resume()
    expected = {
        "closed": ["unavailable"] * 4,
        "open": ["ok"] * 4,
        # the pod alone with the whole rate, counted afresh: it cannot know what Redis had
        "local": ["ok", "ok", "requests_per_minute", "requests_per_minute"],
    }[mode]
    assert outcomes == expected
    # Redis back: its budget counts again, the refund sent to it meanwhile given back
    # (Redis ran it when it woke) or dropped: one or two left of the minute
    assert await eventually(lambda: _mode_is(own_pods, "redis"), 20 * TTL)
    after = [await outcome(gateway) for _ in range(3)]
    assert after[0] == "ok" and after[-1] == "requests_per_minute"
    assert after.count("ok") in (1, 2)


async def test_a_reservation_taken_in_an_outage_is_not_given_back_to_redis(
    own_pods: Pods, own_redis: RedisServer
) -> None:
    """A request let through while Redis was away, refunded once it is back (it timed out
    in the queue, say), must not credit Redis with a reservation it never held; and the
    next outage starts a budget of its own."""
    gateway = await own_pods.start(tenant_rpm={"t": 2}, redis_failure_mode="local")
    own_redis.pause()
    try:
        assert await eventually(lambda: _mode_is(own_pods, "local"), 5 * TTL)
        during = await taken(gateway)
        await taken(gateway)
        assert await outcome(gateway) == "requests_per_minute"
    finally:
        own_redis.resume()
    assert await eventually(lambda: _mode_is(own_pods, "redis"), 20 * TTL)
    assert [await outcome(gateway) for _ in range(2)] == ["ok", "ok"]
    during()
    await asyncio.sleep(0.2)
    assert await outcome(gateway) == "requests_per_minute"
    own_redis.pause()
    try:
        assert await eventually(lambda: _mode_is(own_pods, "local"), 5 * TTL)
        assert [await outcome(gateway) for _ in range(2)] == ["ok", "ok"]  # afresh
    finally:
        own_redis.resume()


async def _mode_is(pods: Pods, mode: str) -> bool:
    return backend(pods.started[0]).mode == mode
