"""The gateway under each ASGI server, started for real: it starts with the server
(lifespan), the app never holds more requests than the limit, and a request past the
queue gets the gateway's 503; under gunicorn, two worker processes share one limit through
Redis."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cli.processes import children, connections_by_holder
from tests.cluster.pods import HOST
from tests.servers.servers import Answer, Server, Stage, get_all

LIMIT = 2
BURST = 40


@pytest.fixture
def stage(tmp_path: Path) -> Stage:
    return Stage(tmp_path)


def readiness(url: str) -> dict[str, Any]:
    answer = httpx.get(url + "/readyz", trust_env=False, timeout=5.0)
    document: dict[str, Any] = answer.json()
    return document


def wait_queued(url: str, count: int, timeout_s: float = 20.0) -> None:
    """Return once ``/readyz`` says ``count`` requests wait in the gateway's queue."""
    deadline = time.monotonic() + timeout_s
    while readiness(url)["queued"] != count:
        assert time.monotonic() < deadline, f"{count} requests did not queue in {timeout_s} s"
        time.sleep(0.01)


async def past_a_full_queue(server: Server, stage: Stage) -> tuple[list[Answer], Answer]:
    """With the gate shut: ``LIMIT`` requests held by the app, ``LIMIT`` waiting in the
    queue (``max_queue``), then one more request; the gate opens once it is answered."""
    stage.gate.touch()
    waiting = asyncio.ensure_future(
        get_all(server.url, ["/hold?gate"] * (2 * LIMIT), concurrency=2 * LIMIT)
    )
    await asyncio.to_thread(stage.ledger.wait_holding, LIMIT)
    await asyncio.to_thread(wait_queued, server.url, LIMIT)
    [refused] = await get_all(server.url, ["/hold"], concurrency=1)
    stage.gate.unlink()
    return await waiting, refused


@pytest.mark.parametrize("server_name", ["uvicorn", "hypercorn", "granian"])
def test_the_app_never_holds_more_than_the_limit_and_a_request_past_the_queue_gets_503(
    server_name: str, stage: Stage
) -> None:
    """The gateway has started with the server, before any request; with two requests
    held and two queued, one more is answered 503 ``queue_full`` with ``Retry-After`` and
    never reaches the app; through a burst of 40 requests, 10 at a time, the app never
    holds more than the limit, and every request is either served or refused so."""
    settings = {
        "OBLETH_GLOBAL_MAX_IN_FLIGHT": str(LIMIT),
        "OBLETH_OVERFLOW_POLICY": "drop-newest",
        "OBLETH_MAX_QUEUE": str(LIMIT),
    }
    with Server(server_name, stage, settings) as server:
        ready = readiness(server.url)
        served, refused = asyncio.run(past_a_full_queue(server, stage))
        burst = asyncio.run(get_all(server.url, ["/hold?ms=20"] * BURST, concurrency=10))

    assert ready == {"healthy_upstreams": [], "queued": 0}, server.output()
    assert [a.status for a in served] == [200] * (2 * LIMIT)
    assert all(a.document["tenant"] is not None for a in served)  # admitted by the gateway
    assert refused.status == 503
    assert refused.headers["content-type"] == "application/json"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.document["error"]["code"] == "queue_full"
    assert {a.status for a in burst} <= {200, 503}
    rejections = [a for a in burst if a.status == 503]
    assert {a.document["error"]["code"] for a in rejections} <= {"queue_full"}
    assert all("retry-after" in a.headers for a in rejections)
    ledger = stage.ledger
    assert ledger.peak() == LIMIT, server.output()
    assert ledger.holding() == 0
    assert ledger.held() == len(served) + (BURST - len(rejections))


def ask(connection: http.client.HTTPConnection, path: str) -> tuple[int, Any]:
    connection.request("GET", path)
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def wait_for_workers(master: int, count: int, timeout_s: float = 30.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while len(workers := children(master)) != count:
        assert time.monotonic() < deadline, f"gunicorn has {len(workers)} workers, not {count}"
        time.sleep(0.05)
    return workers


def test_two_gunicorn_workers_sharing_redis_never_hold_more_than_the_limit_together(
    stage: Stage, redis_url: str, pool_name: str
) -> None:
    """gunicorn with two uvicorn workers and ``OBLETH_REDIS_URL``: four requests held on
    each worker's connections while the gate is shut, and the app, counted across both
    processes, holds 3 (the limit) while the other 5 wait in the shared queue, never
    more; once the gate opens all eight are answered 200, by both workers."""
    limit, each = 3, 4
    settings = {
        "OBLETH_GLOBAL_MAX_IN_FLIGHT": str(limit),
        "OBLETH_REDIS_URL": redis_url,
        "OBLETH_POOL": pool_name,
    }
    with Server("gunicorn", stage, settings) as server:
        assert server.pid is not None and server.port is not None
        workers = wait_for_workers(server.pid, 2)
        # one more connection per worker, to ask it how many wait in the pool's queue
        held = connections_by_holder(HOST, server.port, workers, each=each + 1)
        assert {pid: len(c) for pid, c in held.items()} == dict.fromkeys(workers, each + 1)
        stage.gate.touch()
        with ThreadPoolExecutor(max_workers=2 * each) as threads:
            asked = [
                threads.submit(ask, connection, "/hold?gate")
                for connections in held.values()
                for connection in connections[:each]
            ]
            stage.ledger.wait_holding(limit)
            deadline = time.monotonic() + 20
            while max(ask(c[each], "/readyz")[1]["queued"] for c in held.values()) != 5:
                assert time.monotonic() < deadline, "5 requests did not queue in 20 s"
                time.sleep(0.01)
            holding = stage.ledger.holding()
            stage.gate.unlink()
            answers = [future.result(timeout=60) for future in asked]
        for connections in held.values():
            for connection in connections:
                connection.close()

    assert holding == limit
    assert [status for status, _ in answers] == [200] * (2 * each)
    assert {document["pid"] for _, document in answers} == workers
    assert stage.ledger.peak() == limit, server.output()
    assert stage.ledger.pids() == workers
