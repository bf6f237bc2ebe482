"""One budget per process: what a user sees when an in-process gateway runs under a server
with several worker processes (``uvicorn --workers``, gunicorn), started for real."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.backends.workerapp import READY
from tests.cluster.pods import HOST, UvicornApp

APP = "tests.backends.workerapp:app"
SPLIT = "with an in-process budget of its own"
"""What the error about a budget split across processes says."""


class UvicornWorkers(UvicornApp):
    """``uvicorn <app> --workers N``: the parent binds the socket, the workers share it."""

    def __init__(self, workers: int, **options: Any) -> None:
        super().__init__(APP, **options)
        self.workers = workers

    def _argv(self, port: int) -> list[str]:
        return [*super()._argv(port), "--workers", str(self.workers)]


class GunicornWorkers(UvicornApp):
    """``gunicorn -w 2 -k uvicorn.workers.UvicornWorker <app>``."""

    def _argv(self, port: int) -> list[str]:
        return [
            *(sys.executable, "-m", "gunicorn", self.target, "--bind", f"{HOST}:{port}"),
            *("--workers", "2", "--worker-class", "uvicorn.workers.UvicornWorker"),
            *("--log-level", "warning", "--graceful-timeout", "2"),
        ]


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory of the test's own for the servers (which inherit TMPDIR), so
    that lock files of other test runs never meet these."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def this_run(server: UvicornApp) -> str:
    """The server's output since its last start."""
    return server.log_path.read_text(errors="replace").rpartition("\n--- ")[2]


def wait_for_workers(server: UvicornApp, count: int, timeout_s: float = 30.0) -> list[int]:
    """The pids of the server's ``count`` workers, once each has started (its gateway too)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = [int(pid) for pid in re.findall(re.escape(READY) + r"(\d+)", this_run(server))]
        if len(pids) >= count:
            return pids
        assert time.monotonic() < deadline, (
            f"{len(pids)} of {count} workers started within {timeout_s} s:\n{server.log_tail()}"
        )
        time.sleep(0.05)


def split_errors(server: UvicornApp) -> list[str]:
    return [line for line in this_run(server).splitlines() if SPLIT in line]


def pids_named(error: str) -> set[int]:
    """The other worker and the worker itself, as an error about a split budget names them."""
    match = re.search(r"pid (\d+) and this process \(pid (\d+)\)", error)
    assert match is not None, error
    return {int(match[1]), int(match[2])}


def who_answers(server: UvicornApp) -> dict[str, Any]:
    answer = httpx.get(server.url + "/", trust_env=False, timeout=5.0)
    answer.raise_for_status()
    result: dict[str, Any] = answer.json()
    return result


def test_two_uvicorn_workers_in_process_log_an_error_naming_redis_url() -> None:
    """Under ``uvicorn --workers 2`` without redis_url, a worker says the budget is split."""
    env = {"OBLETH_GLOBAL_MAX_IN_FLIGHT": "2"}
    with UvicornWorkers(2, env=env) as server:
        workers = set(wait_for_workers(server, 2))
        errors = split_errors(server)
        answer = who_answers(server)

    # the later of the two to start names the earlier (both, if they start together)
    assert len(errors) in (1, 2), this_run(server)
    for error in errors:
        assert pids_named(error) == workers
        assert "2 x 2 = 4" in error and "redis_url (OBLETH_REDIS_URL)" in error, error
    # each worker sees the other now, whichever answered
    assert {answer["pid"], *answer["shared_with"]} == workers


def test_a_single_uvicorn_process_does_not_warn() -> None:
    """``uvicorn app`` binds after startup: one process, one budget, no error."""
    with UvicornApp(APP) as server:
        [pid] = wait_for_workers(server, 1)
        answer = who_answers(server)

    assert split_errors(server) == []
    assert answer == {"pid": pid, "shared_with": []}


def test_two_uvicorn_workers_sharing_redis_do_not_warn(redis_url: str, pool_name: str) -> None:
    """With redis_url, the workers share one budget: nothing to warn about."""
    env = {"OBLETH_REDIS_URL": redis_url, "OBLETH_POOL": pool_name}
    with UvicornWorkers(2, env=env) as server:
        wait_for_workers(server, 2)
        answer = who_answers(server)

    assert split_errors(server) == []
    assert answer["shared_with"] is None  # the Redis backend counts for every worker


def test_two_gunicorn_uvicorn_workers_in_process_log_an_error_naming_redis_url() -> None:
    """gunicorn forks workers that share its socket: one of them says the budget is split."""
    env = {"OBLETH_GLOBAL_MAX_IN_FLIGHT": "2"}
    with GunicornWorkers(APP, env=env) as server:
        workers = set(wait_for_workers(server, 2))
        errors = split_errors(server)

    assert len(errors) in (1, 2), this_run(server)
    for error in errors:
        assert pids_named(error) == workers
        assert "2 x 2 = 4" in error and "redis_url (OBLETH_REDIS_URL)" in error, error
