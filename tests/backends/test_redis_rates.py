"""The rate budgets of a pool, kept in a real Redis: every pod spends from the same
minute, Redis' script decides as the in-process budgets do, idle tenants leave no key
behind, and ``redis_failure_mode`` decides while Redis cannot be reached."""

from __future__ import annotations

import random

import pytest

from gateway import Rejected
from gateway.backends.redis.keys import PoolKeys
from gateway.core.rates import LocalRates
from gateway.errors import Rejected as RejectedError
from tests.backends.redis_pods import TTL, Pods, backend, eventually
from tests.redis_procs import RedisServer

pytestmark = pytest.mark.anyio


async def test_every_pod_spends_from_the_same_minute(pods: Pods) -> None:
    a = await pods.start(tenant_rpm={"t": 3})
    b = await pods.start(tenant_rpm={"t": 3})
    assert a.rates is not None and b.rates is not None
    assert await a.rates.reserve("t", 0) is None
    assert await b.rates.reserve("t", 0) is None
    assert await a.rates.reserve("t", 0) is None
    refused = await b.rates.reserve("t", 0)
    assert isinstance(refused, RejectedError) and refused.reason == "requests_per_minute"
    assert refused.status == 429 and 19 <= refused.retry_after_s <= 20
    assert await b.rates.reserve("other", 0) is None  # no budget: never refused


async def test_a_refund_is_seen_by_every_pod_and_an_idle_tenant_leaves_no_key(
    pods: Pods,
) -> None:
    a = await pods.start(tenant_tpm={"t": 100})
    b = await pods.start(tenant_tpm={"t": 100})
    assert a.rates is not None and b.rates is not None
    assert await a.rates.reserve("t", 100) is None
    refused = await b.rates.reserve("t", 1)
    assert refused is not None and refused.reason == "tokens_per_minute"
    key = PoolKeys(pods.pool).key("rate:t")
    assert 59_000 < await pods.client.pttl(key) <= 61_000  # gone once earned back
    a.rates.refund("t", 100)
    assert await eventually(lambda: _gone(pods, key), 2)
    assert await b.rates.reserve("t", 100) is None


async def _gone(pods: Pods, key: str) -> bool:
    return not await pods.client.exists(key)


async def test_redis_decides_as_one_process_does(pods: Pods) -> None:
    """The same reservations, in the same order, within a moment: Redis' script and the
    in-process budgets agree on each (both are the same GCRA, on different clocks)."""
    gateway = await pods.start(tenant_rpm={"*": 40}, tenant_tpm={"*": 5000, "big": 20000})
    assert gateway.rates is not None
    alone = LocalRates(gateway.settings.rate_rules())
    rng = random.Random(7)
    shared, local = [], []
    for _ in range(200):
        tenant = rng.choice(["a", "b", "big"])
        tokens = rng.choice([0, 10, 300, 900, 6000])
        refused = await gateway.rates.reserve(tenant, tokens)
        shared.append(None if refused is None else refused.reason)
        over = alone.reserve(tenant, tokens, now=0.0)
        local.append(None if over is None else over.reason)
    assert shared == local
    assert shared.count(None) > 50 and len(set(shared)) == 3  # both budgets refused some


@pytest.mark.parametrize("mode", ["closed", "open", "local"])
async def test_while_redis_cannot_be_reached_the_failure_mode_decides(
    own_pods: Pods, own_redis: RedisServer, mode: str
) -> None:
    gateway = await own_pods.start(tenant_rpm={"t": 2}, redis_failure_mode=mode)
    assert gateway.rates is not None
    assert await gateway.rates.reserve("t", 0) is None  # one spent in Redis
    own_redis.pause()
    try:
        assert await eventually(lambda: _mode_is(own_pods, mode), 5 * TTL)
        outcomes = []
        for _ in range(3):
            try:
                refused = await gateway.rates.reserve("t", 0)
            except Rejected as exc:
                outcomes.append(exc.reason)
            else:
                outcomes.append(None if refused is None else refused.reason)
    finally:
        own_redis.resume()
    expected = {
        "closed": ["unavailable"] * 3,
        "open": [None] * 3,
        # the pod alone with the whole rate, counted afresh: it cannot know what Redis had
        "local": [None, None, "requests_per_minute"],
    }[mode]
    assert outcomes == expected
    # Redis back: the budget there is the one that counts again (one left of the minute)
    assert await eventually(lambda: _mode_is(own_pods, "redis"), 20 * TTL)
    assert await gateway.rates.reserve("t", 0) is None
    refused = await gateway.rates.reserve("t", 0)
    assert refused is not None and refused.reason == "requests_per_minute"


async def _mode_is(pods: Pods, mode: str) -> bool:
    return backend(pods.started[0]).mode == mode
