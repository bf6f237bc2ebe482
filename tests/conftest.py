"""Fixtures shared by every test."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.redis_procs import RedisClusterProcs, RedisServer


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Obleth is asyncio code: run anyio-marked tests on asyncio only, not on trio too."""
    return "asyncio"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server for the whole run; tests keep apart by their own pool name.

    Do not pause, restart or FLUSHALL it: tests that need faults take `own_redis`.
    """
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterProcs]:
    """A real 3-master Redis Cluster, started on first use and shared by the run."""
    with RedisClusterProcs(masters=3) as cluster:
        yield cluster


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of the session's redis-server, as ``OBLETH_REDIS_URL`` takes it."""
    return redis_server.url


@pytest.fixture
def pool_name() -> str:
    """A pool name no other test uses, so tests share one Redis without flushing it."""
    return f"t-{secrets.token_hex(6)}"


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A fresh redis-server for one test, which may pause, restart or flush it."""
    with RedisServer() as server:
        yield server
