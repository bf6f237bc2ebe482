"""``WSGIGatewayMiddleware`` under gunicorn's threaded workers (``gthread``), real
processes: several workers share one budget through Redis (counted at the app, across
the workers), without Redis each worker says its budget is its own, and a bad setting
stops gunicorn."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.cluster.pods import HOST, REPO_ROOT, UvicornApp

APP = "tests.wsgi.gunicornapp:application"
PRELOADED = "tests.wsgi.preloadapp:application"
CONFIG = Path(__file__).with_name("gunicorn_conf.py")
SPLIT = "with an in-process budget of its own"
"""What the error about a budget split across processes says."""


class Gunicorn(UvicornApp):
    """``gunicorn --worker-class gthread --threads 8 --workers N <app>``; with ``preload``,
    ``--preload`` (the app is imported before the workers fork)."""

    def __init__(
        self,
        workers: int,
        *,
        config: Path | None = None,
        app: str = APP,
        preload: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(app, health_path="/healthz", **options)
        self.workers = workers
        self.config = config
        self.preload = preload

    def _argv(self, port: int) -> list[str]:
        return [
            *(sys.executable, "-m", "gunicorn", self.target, "--bind", f"{HOST}:{port}"),
            *("--worker-class", "gthread", "--threads", "8", "--workers", str(self.workers)),
            *("--log-level", "warning", "--graceful-timeout", "2"),
            *(() if self.config is None else ("--config", str(self.config))),
            *(("--preload",) if self.preload else ()),
        ]


async def _burst(url: str, count: int) -> list[httpx.Response]:
    return await asyncio.gather(*(_fresh_post(url) for _ in range(count)))


async def _fresh_post(url: str) -> httpx.Response:
    """A request on a connection of its own, so that any worker may accept it."""
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=30) as http:
        return await http.post("/v1/chat/completions", json={"messages": []})


def test_two_gthread_workers_share_one_budget_through_redis(redis_url: str, pool_name: str) -> None:
    counts = redis.Redis.from_url(redis_url)
    env = {
        "OBLETH_REDIS_URL": redis_url,
        "OBLETH_POOL": pool_name,
        "OBLETH_GLOBAL_MAX_IN_FLIGHT": "3",
        "COUNT_REDIS_URL": redis_url,
        "COUNT_KEY": f"{pool_name}:app",
    }
    answers: list[httpx.Response] = []
    with Gunicorn(2, env=env) as server:
        # which worker accepts a connection is the kernel's choice: burst until a burst
        # is served by both at once
        for _ in range(10):
            burst = asyncio.run(_burst(server.url, 14))
            answers += burst
            if len({answer.json()["pid"] for answer in burst}) == 2:
                break
        log = server.log_tail(200)
    peak = int(counts.get(f"{pool_name}:app:peak") or 0)

    assert {answer.status_code for answer in answers} == {200}, log
    served_by = Counter(answer.json()["pid"] for answer in answers)
    assert len(served_by) == 2, served_by  # both workers served
    assert peak == 3, f"the app served {peak} at once; the budget is 3"
    assert any(answer.json()["record"]["waited_s"] > 0 for answer in answers)
    assert SPLIT not in log


def test_two_gthread_workers_without_redis_say_their_budgets_are_split() -> None:
    """The process-model rule: an in-process budget per worker admits workers x limit. With
    the documented ``post_worker_init`` hook each worker's gateway starts as the worker
    boots, finds the other on the listening socket and says so, before any request."""
    env = {"OBLETH_GLOBAL_MAX_IN_FLIGHT": "2"}
    with Gunicorn(2, env=env, config=CONFIG) as server:
        log = server.log_tail(200)
        deadline = time.monotonic() + 30
        while not [line for line in log.splitlines() if SPLIT in line]:
            assert time.monotonic() < deadline, log
            time.sleep(0.05)
            log = server.log_tail(200)

    errors = [line for line in log.splitlines() if SPLIT in line]
    assert all("2 x 2 = 4" in e and "redis_url (OBLETH_REDIS_URL)" in e for e in errors), errors


def test_a_worker_forked_after_start_serves_with_a_fresh_gateway_of_its_own() -> None:
    """``start()`` at import under ``--preload``, with a request admitted before the fork
    and never closed: the worker builds a gateway of its own from the same settings, on
    its own loop. Its requests queue there and are served (none fails on the first
    process's loop), and the seat taken before the fork is not the worker's."""
    env = {"OBLETH_GLOBAL_MAX_IN_FLIGHT": "1", "HOLD_AT_FORK": "1"}
    with Gunicorn(1, env=env, app=PRELOADED, preload=True) as server:
        answers = asyncio.run(_burst(server.url, 4))
        log = server.log_tail(200)

    assert [answer.status_code for answer in answers] == [200] * 4, log
    assert len({answer.json()["pid"] for answer in answers}) == 1
    # one seat: the others queued for it, in the worker's own queue
    assert any(answer.json()["record"]["waited_s"] > 0 for answer in answers)
    assert "Traceback" not in log, log


def test_a_gateway_handed_over_and_started_before_the_fork_is_refused_in_the_worker() -> None:
    """A ready gateway (``gateway=``) cannot be built again in the worker: its requests
    fail with an error that says why and what to pass instead."""
    env = {"PRELOAD_GATEWAY": "given"}
    with Gunicorn(1, env=env, app=PRELOADED, preload=True) as server:
        answer = httpx.post(server.url + "/v1/chat/completions", json={}, trust_env=False)
        log = server.log_tail(200)

    assert answer.status_code == 500
    assert "that gateway was started in process" in log, log
    assert "Pass settings= and plugins= instead of gateway=" in log


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("OBLETH_GLOBAL_MAX_IN_FLIGHT", "-3", "expected a whole number of at least 1"),
        ("OBLETH_OVERFLOW_POLICY", "nope", "no overflow policy by that name"),
    ],
)
def test_a_bad_setting_stops_gunicorn_with_its_message(name: str, value: str, says: str) -> None:
    env = {"PATH": "/usr/bin:/bin", name: value}
    finished = subprocess.run(
        [sys.executable, "-m", "gunicorn", APP, "--worker-class", "gthread", "--bind", f"{HOST}:0"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert finished.returncode == 3, finished.stderr  # gunicorn: "Worker failed to boot"
    lines = finished.stderr.splitlines()
    assert any(line.startswith(f"{name}=") and says in line for line in lines), finished.stderr
