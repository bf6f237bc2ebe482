"""A client that leaves mid-stream, or gives up on an answer that is not streamed before
it comes: its seat goes to the next request only once the upstream has dropped the
abandoned one, so the backend never counts one request more than the limit. Real
processes: a uvicorn pod (gateway + streaming proxy, in-process budget) in front of the
simulated backend, whose own count is the ground truth."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cluster.pods import Pods, SimBackend

LIMIT = 4


@pytest.fixture(scope="module")
def sim() -> Iterator[SimBackend]:
    with SimBackend() as backend:
        yield backend


async def mixed_load(
    urls: list[str], requests: int, concurrency: int, left: str = "stream"
) -> Counter[str]:
    """Half plain completions, half left by their clients: streams abandoned after their
    first chunk, or (``left="unanswered"``) completions given up after 50 ms, while the
    upstream still computes them."""
    outcomes: Counter[str] = Counter()
    numbers = iter(range(requests))
    async with httpx.AsyncClient(trust_env=False, timeout=30) as http:

        async def worker() -> None:
            for i in numbers:
                url = urls[i % len(urls)] + "/v1/completions"
                if i % 2 and left == "unanswered":
                    body = {"prompt": f"left {i}", "max_tokens": 200}
                    try:
                        answer = await http.post(url, json=body, timeout=0.05)
                        outcomes[f"answered {answer.status_code}"] += 1
                    except httpx.TimeoutException:
                        outcomes["given up"] += 1
                elif i % 2:
                    body = {"prompt": f"left {i}", "max_tokens": 200, "stream": True}
                    async with http.stream("POST", url, json=body) as answer:
                        async for _ in answer.aiter_bytes():
                            break  # leaving the block mid-stream closes the connection
                    outcomes[f"cut {answer.status_code}"] += 1
                else:
                    answer = await http.post(url, json={"prompt": f"p {i}", "max_tokens": 8})
                    outcomes[f"whole {answer.status_code}"] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes


@pytest.mark.parametrize("left", ["stream", "unanswered"])
@pytest.mark.parametrize("budget", ["memory", "redis"])
def test_a_seat_left_by_its_client_is_handed_on_only_after_the_upstream_dropped_it(
    sim: SimBackend, redis_url: str, pool_name: str, tmp_path: Path, budget: str, left: str
) -> None:
    """600 requests, 24 at a time against a limit of 4 over three pods, every other one
    left by its client (a stream after its first chunk, or a completion before its
    answer): the backend never counts more than 4. A seat handed on when the proxy
    merely closed its connection reached the backend before the backend had dropped the
    abandoned request; for a completion not yet answered, that is what the proxy did."""
    sim.reset()
    env = {"OBLETH_GLOBAL_MAX_IN_FLIGHT": str(LIMIT), "OBLETH_MAX_QUEUE": "1000"}
    if budget == "redis":
        env |= {"OBLETH_REDIS_URL": redis_url, "OBLETH_POOL": pool_name}
    with Pods(3 if budget == "redis" else 1, sim.url, env=env, log_dir=tmp_path) as pods:
        outcomes = asyncio.run(mixed_load(pods.urls, 600, 24, left))
        stats = pods.settled_stats()
    assert outcomes["whole 200"] == 300, outcomes
    if left == "stream":
        assert outcomes["cut 200"] == 300, outcomes
    else:
        assert outcomes["given up"] > 0, outcomes
    admitted = sum(s["admitted"] for s in stats)
    assert admitted == sum(s["released"] for s in stats)
    # a request given up while it waited for a seat never had one
    assert admitted == 600 if left == "stream" else admitted > 300, stats
    assert sim.stats()["max_concurrency"] <= LIMIT, sim.stats()
