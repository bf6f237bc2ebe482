"""Fixtures of the cluster-mode backend tests: in-process pods sharing a pool, in the
session's Redis or in a Redis of the test's own (which it may pause, restart or flush)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.backends.redis_pods import Pods
from tests.redis_procs import RedisServer


@pytest.fixture
def pods_class() -> type[Pods]:
    """The pods the fixtures below make; a test module overrides it for pods of its own."""
    return Pods


@pytest.fixture
async def pods(redis_url: str, pool_name: str, pods_class: type[Pods]) -> AsyncIterator[Pods]:
    group = pods_class(redis_url, pool_name)
    yield group
    await group.close()


@pytest.fixture
async def own_pods(
    own_redis: RedisServer, pool_name: str, pods_class: type[Pods]
) -> AsyncIterator[Pods]:
    group = pods_class(own_redis.url, pool_name)
    yield group
    await group.close()
