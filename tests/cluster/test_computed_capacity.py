"""One computed limit for the pool, on real parts: three uvicorn pods sharing one real
Redis, each computing another value for the same provider (``pod-dial``: the pod's own
``POD_DIAL``), in front of one simulated backend whose count of concurrent requests is the
ground truth. The pod holding the leader lease computes; every pod enforces its value; its
``kill -9`` hands the lease to another pod, whose value becomes the pool's; a ceiling set
on a follower is every pod's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from gateway.backends.redis.keys import PoolKeys
from tests.cluster.pods import Pod, SimBackend, drive, set_limit, wait_for
from tests.redis_procs import RedisServer

CEILING = 20
TTL = 1.5  # heartbeats and lease asks every 0.5 s
#: each pod's own opinion, the first pod's (the leader's) between the others'
DIALS = (6, 4, 9)


def env(url: str, pool: str, dial: int) -> dict[str, str]:
    return {
        "OBLETH_REDIS_URL": url,
        "OBLETH_POOL": pool,
        "OBLETH_GLOBAL_MAX_IN_FLIGHT": str(CEILING),
        "OBLETH_CAPACITY_PROVIDERS": "static,pod-dial",
        "OBLETH_LEASE_TTL_S": str(TTL),
        "OBLETH_REDIS_RETRY_BUDGET_S": "0.5",
        "OBLETH_LEARNING_WINDOW_S": "0",
        "OBLETH_TENANT_HEADER": "x-tenant",
        "OBLETH_MAX_QUEUE": "5000",
        "OBLETH_QUEUE_TIMEOUT_S": "30",
        "POD_PLUGINS": "tests.cluster.dialplugin",
        "POD_DIAL": str(dial),
    }


@contextmanager
def cluster(sim: SimBackend, redis: RedisServer, pool: str, logs: Path) -> Iterator[list[Pod]]:
    """Three pods with ``DIALS``; the first is started alone and leads before the others
    start, so that the test knows whose value must win."""
    pods = [
        Pod(sim.url, env=env(redis.url, pool, dial), name=f"pod{i}", log_dir=logs)
        for i, dial in enumerate(DIALS)
    ]
    with ExitStack() as stack:
        stack.enter_context(pods[0])
        wait_for(lambda: status(pods[0])["cluster"]["leader"] == pod_id(pods[0]), 5, "leads")
        for pod in pods[1:]:
            pod.start()
            stack.callback(pod.stop)
        for pod in pods[1:]:
            pod.wait_ready()
        yield pods


def status(pod: Pod) -> dict[str, Any]:
    answer = httpx.get(pod.url + "/_pod/status", trust_env=False, timeout=5.0)
    answer.raise_for_status()
    document: dict[str, Any] = answer.json()
    return document


def pod_id(pod: Pod) -> str:
    return str(status(pod)["cluster"]["pod"])


def enforce(pods: list[Pod], limit: int, leader: str | None = None) -> Callable[[], bool]:
    """Every pod's limit is ``limit``; with ``leader``, every pod names it, and the
    computed value in use is the one it wrote."""

    def check() -> bool:
        for pod in pods:
            found = status(pod)
            capacity = found["capacity"]
            if capacity["max_in_flight"] != limit:
                return False
            if leader is not None:
                where = capacity["computed"]["pod-dial"]
                if found["cluster"]["leader"] != leader or where["pod"] != leader:
                    return False
        return True

    return check


def peak_under_load(sim: SimBackend, pods: list[Pod]) -> int:
    """The backend's peak of concurrent requests under load spread over ``pods``."""
    sim.reset()
    result = asyncio.run(drive([p.url for p in pods], requests=300, concurrency=48, max_tokens=10))
    assert result.statuses == {200: 300}, result.summary()
    return int(sim.stats()["max_concurrency"])


def test_every_pod_enforces_the_leaders_value_and_names_the_leader(
    sim: SimBackend, redis_server: RedisServer, pool_name: str, logs: Path
) -> None:
    """Three opinions (6, 4, 9); the leader's, 6, is every pod's limit and what the
    backend sees at most, and each pod's status names the leader as the value's author."""
    with cluster(sim, redis_server, pool_name, logs) as pods:
        leader = pod_id(pods[0])
        wait_for(enforce(pods, DIALS[0], leader), 3 * TTL, "the leader's value everywhere")
        assert peak_under_load(sim, pods) == DIALS[0]
        for pod in pods:
            found = status(pod)["capacity"]
            assert found["providers"] == {"static": CEILING, "pod-dial": DIALS[0]}
            assert found["computed"]["pod-dial"]["source"] == "pool"


def test_kill_9_of_the_leader_hands_its_job_to_another_pod(
    sim: SimBackend, redis_server: RedisServer, pool_name: str, logs: Path
) -> None:
    """The leader dies without a word: once its lease runs out on Redis' clock another pod
    takes it, and that pod's value is the pool's limit and what the backend sees."""
    with cluster(sim, redis_server, pool_name, logs) as pods:
        wait_for(enforce(pods, DIALS[0], pod_id(pods[0])), 3 * TTL, "the first leader's value")
        dead, ids = pod_id(pods[0]), {pod_id(pod): i for i, pod in enumerate(pods)}
        pods[0].kill()
        rest = pods[1:]

        def taken() -> bool:
            return holder(redis_server, pool_name) not in (None, dead)

        wait_for(taken, 3 * TTL, "another pod takes the lease")
        successor = holder(redis_server, pool_name)
        assert successor is not None
        value = DIALS[ids[successor]]
        wait_for(enforce(rest, value, successor), 3 * TTL, "the new leader's value")
        assert peak_under_load(sim, rest) == value


def holder(redis: RedisServer, pool: str) -> str | None:
    """The pod holding the pool's leader lease, read from Redis."""
    with redis.sync_client() as client:
        value = client.get(PoolKeys(pool).leader)
    return None if value is None else value.decode()


def test_a_ceiling_set_on_a_follower_holds_for_every_pod(
    sim: SimBackend, redis_server: RedisServer, pool_name: str, logs: Path
) -> None:
    """``PUT`` on a follower below the computed value: every pod's limit, and the backend
    never sees more; raised past it, the leader's value is the limit again."""
    with cluster(sim, redis_server, pool_name, logs) as pods:
        wait_for(enforce(pods, DIALS[0]), 3 * TTL, "the leader's value")
        set_limit(pods[2], 3)
        wait_for(enforce(pods, 3), 3 * TTL, "the ceiling everywhere")
        assert peak_under_load(sim, pods) == 3
        assert all(status(pod)["capacity"]["providers"]["static"] == 3 for pod in pods)
        set_limit(pods[1], 50)
        wait_for(enforce(pods, DIALS[0]), 3 * TTL, "the leader's value again")
        assert all(status(pod)["capacity"]["providers"]["static"] == 50 for pod in pods)
