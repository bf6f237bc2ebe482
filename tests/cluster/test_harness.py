"""Gateway pods as real processes in front of one simulated backend, driven over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.cluster.pods import Pods, SimBackend, drive

LIMIT = 4
PODS = 3
REQUESTS = 300


def test_pods_without_redis_each_admit_up_to_their_own_limit(
    sim: SimBackend, tmp_path: Path
) -> None:
    """Without redis_url every pod has its own budget: the backend sees at most pods x limit,
    every request gets a 200 or a JSON 503, and every admitted permit is released."""
    sim.reset()
    env = {
        "OBLETH_GLOBAL_MAX_IN_FLIGHT": str(LIMIT),
        # 16 clients per pod against 4 seats and 6 queue places: some are turned away
        "OBLETH_MAX_QUEUE": "6",
        "OBLETH_TENANT_HEADER": "x-tenant",
    }
    with Pods(PODS, sim.url, env=env, log_dir=tmp_path) as pods:
        load = asyncio.run(
            drive(pods.urls, requests=REQUESTS, concurrency=48, stream_every=4, deadline_s=30)
        )
        stats = pods.settled_stats()
        logs = pods.log_tails()
    backend = sim.stats()
    context = f"{load.summary()}\npods: {stats}\nbackend: {backend}\n{logs}"

    assert load.answered == REQUESTS and not load.failures, context
    assert set(load.statuses) <= {200, 503} and not load.malformed, context
    admitted = sum(pod["admitted"] for pod in stats)
    assert admitted == sum(pod["released"] for pod in stats) == load.statuses[200], context
    assert sum(sum(pod["rejected"].values()) for pod in stats) == load.statuses[503], context
    assert all(pod["admitted"] > 0 for pod in stats), context
    assert backend["max_concurrency"] <= PODS * LIMIT, context
    # more than one pod's limit at once: the budgets really are separate
    assert backend["max_concurrency"] > LIMIT, context
    assert backend["concurrency"] == 0 and backend["completed"] == load.statuses[200], context
