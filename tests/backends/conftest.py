"""Fixtures of the cluster-mode backend tests: in-process pods sharing a pool, in the
session's Redis or in a Redis of the test's own (which it may pause, restart or flush)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.backends.redis_pods import Pods
from tests.redis_procs import RedisServer


@pytest.fixture
async def pods(redis_url: str, pool_name: str) -> AsyncIterator[Pods]:
    group = Pods(redis_url, pool_name)
    yield group
    await group.close()


@pytest.fixture
async def own_pods(own_redis: RedisServer, pool_name: str) -> AsyncIterator[Pods]:
    group = Pods(own_redis.url, pool_name)
    yield group
    await group.close()
