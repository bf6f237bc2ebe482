"""``obleth serve --workers N``: N real worker processes sharing one budget through Redis,
in front of a real ``obleth mock-backend``, supervised by their parent."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli import main
from gateway.server.workers import Workers
from tests.cli.processes import (
    alive,
    connections_by_holder,
    descendants,
    exit_with,
    holder,
)
from tests.cli.serve_workers import LIMIT, WAIT_S, ServeWorkers
from tests.cluster.pods import HOST, SimBackend

PER_WORKER = 6
"""Connections each worker serves in the load test: each worker alone gets more requests
at once than the budget, so two budgets of their own would show at the backend."""
REQUESTS = 8
"""Requests sent one after the other on each connection."""


def completions(connection: http.client.HTTPConnection, count: int) -> list[int]:
    """``count`` completions, one after the other on ``connection``; their statuses."""
    statuses = []
    body = json.dumps({"prompt": "Say something.", "max_tokens": 8})
    for _ in range(count):
        connection.request(
            "POST", "/v1/completions", body=body, headers={"content-type": "application/json"}
        )
        answer = connection.getresponse()
        answer.read()
        statuses.append(answer.status)
    return statuses


def completed_by_worker(connection: http.client.HTTPConnection) -> dict[str, float]:
    """Requests completed by each worker (its ``worker`` label), as ``/metrics`` of the
    worker holding ``connection`` counts them: its own now, the others' as last published
    (see ``gateway.telemetry.workers``)."""
    connection.request("GET", "/metrics")
    answer = connection.getresponse()
    text = answer.read().decode()
    by_worker: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "obleth_requests_total" and sample.labels["outcome"] == "completed":
                worker = sample.labels["worker"]
                by_worker[worker] = by_worker.get(worker, 0.0) + sample.value
    return by_worker


def wait_until_gone(pids: set[int], timeout_s: float = WAIT_S) -> set[int]:
    """The processes of ``pids`` still alive after ``timeout_s`` (empty once all exit)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = {pid for pid in pids if alive(pid)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_two_workers_serve_one_budget_the_backend_never_exceeds(
    serve: ServeWorkers, sim: SimBackend
) -> None:
    """Each worker serves connections of its own, more at once than the whole budget;
    the backend's own peak concurrency stays within the budget, both workers complete
    their requests, and the Redis pool counts them as two pods."""
    workers = serve.wait_for_workers()
    assert serve.port is not None
    held = connections_by_holder(HOST, serve.port, workers, each=PER_WORKER)
    try:
        assert all(len(c) == PER_WORKER for c in held.values()), (
            f"connections per worker: { {p: len(c) for p, c in held.items()} }"
        )
        sim.reset()
        connections = [c for per_worker in held.values() for c in per_worker]
        with concurrent.futures.ThreadPoolExecutor(len(connections)) as pool:
            runs = [pool.submit(completions, c, REQUESTS) for c in connections]
            statuses = [s for run in runs for s in run.result(timeout=120)]
        # every worker's page shows both; the other's figures as of its last publication
        each = dict.fromkeys(("0", "1"), float(PER_WORKER * REQUESTS))
        deadline = time.monotonic() + WAIT_S
        while (completed := [completed_by_worker(c[0]) for c in held.values()]) != [each] * 2:
            assert time.monotonic() < deadline, completed
            time.sleep(0.05)
    finally:
        for per_worker in held.values():
            for connection in per_worker:
                connection.close()
    stats = sim.stats()

    assert statuses == [200] * (len(workers) * PER_WORKER * REQUESTS)
    assert stats["completed"] == len(statuses)
    assert stats["max_concurrency"] <= LIMIT, stats
    assert serve.live_pods() == 2


def test_new_connections_are_spread_over_the_workers_even_while_one_is_busy(
    serve: ServeWorkers,
) -> None:
    """32 connections opened while one worker is stalled (SIGSTOP, as a long pause of its
    event loop): once it runs again it serves its share of them. Each worker has a socket
    of its own and the kernel spreads connections over them; with one shared socket the
    worker awake would have taken them all."""
    workers = serve.wait_for_workers()
    assert serve.port is not None
    stalled = min(workers)
    burst = [http.client.HTTPConnection(HOST, serve.port, timeout=30) for _ in range(32)]
    try:
        os.kill(stalled, signal.SIGSTOP)
        try:
            for connection in burst:
                connection.connect()  # the kernel completes the handshake for either
            # whatever the worker awake can accept, it accepts meanwhile
            for _ in range(50):
                if all(holder(c.sock, workers) for c in burst if c.sock is not None):
                    break
                time.sleep(0.01)
        finally:
            os.kill(stalled, signal.SIGCONT)
        holders = []
        for connection in burst:
            connection.request("GET", "/healthz")
            connection.getresponse().read()
            assert connection.sock is not None
            holders.append(holder(connection.sock, workers))
    finally:
        for connection in burst:
            connection.close()

    assert set(holders) == workers, holders


def test_sigterm_stops_every_worker_and_serve_exits_0(serve: ServeWorkers) -> None:
    """SIGTERM to ``obleth serve``: the workers shut down gracefully, the parent exits with
    status 0, and no process of its tree is left running."""
    workers = serve.wait_for_workers()
    assert serve.pid is not None
    tree = descendants(serve.pid)
    assert workers <= tree

    os.kill(serve.pid, signal.SIGTERM)

    assert serve.wait() == 0, serve.log_tail()
    assert wait_until_gone(tree) == set()


def test_after_sigterm_new_connections_are_refused_while_requests_finish(
    serve: ServeWorkers,
) -> None:
    """While the workers finish their requests, a new connection is refused at once, as
    by a single ``obleth serve``, so that a load balancer tries another pod. The parent
    kept its copies of the listening sockets open: the kernel went on accepting
    connections that no worker would ever answer, reset when the parent exited."""
    serve.wait_for_workers()
    assert serve.port is not None
    body = json.dumps({"prompt": "Count.", "max_tokens": 10_000, "stream": True})
    stream = http.client.HTTPConnection(HOST, serve.port, timeout=WAIT_S)
    refused = False
    try:
        stream.request("POST", "/v1/completions", body, {"content-type": "application/json"})
        answer = stream.getresponse()
        assert answer.status == 200 and answer.read1(64)  # tokens flow: a request runs
        os.kill(serve.pid, signal.SIGTERM)  # type: ignore[arg-type]
        deadline = time.monotonic() + 10.0
        while not refused and time.monotonic() < deadline:
            try:
                socket.create_connection((HOST, serve.port), timeout=1).close()
                time.sleep(0.05)
            except ConnectionRefusedError:
                refused = True
        draining = serve.running
    finally:
        stream.close()
    assert serve.wait() == 0, serve.log_tail()
    assert refused, serve.log_tail()
    assert draining  # refused while the stream was still being served, not after


def test_a_killed_worker_is_replaced_and_its_death_logged(serve: ServeWorkers) -> None:
    """``kill -9`` of a worker: the parent says so and starts another in its place; the
    pool counts two pods again and the gateway goes on answering."""
    first = serve.wait_for_workers()
    victim = min(first)
    os.kill(victim, signal.SIGKILL)

    now = serve.wait_for_workers(besides={victim})
    assert len(now & first) == 1
    assert f"(pid {victim}) was killed by SIGKILL" in serve.log_tail()
    assert httpx.get(f"{serve.url}/readyz", timeout=5).status_code == 200


def test_workers_stop_when_their_parent_is_killed(serve: ServeWorkers) -> None:
    """``kill -9`` of ``obleth serve`` itself: no worker outlives it (each notices and
    stops gracefully)."""
    workers = serve.wait_for_workers()
    assert serve.pid is not None
    tree = descendants(serve.pid)
    assert workers <= tree

    serve.kill()

    assert wait_until_gone(tree) == set()


# -- at startup ------------------------------------------------------------------------------


def test_more_than_one_worker_without_redis_stops_naming_the_fix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--workers 2`` with an in-process budget would split it: one line naming
    ``--workers`` and ``--redis-url``, status 2, nothing served."""
    assert main(["serve", "--upstream", "http://127.0.0.1:9", "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("obleth: --workers=2: ") and err.count("\n") == 1
    assert "--redis-url (or OBLETH_REDIS_URL)" in err and "2 x 64 = 128" in err


@pytest.mark.parametrize("count", ["0", "-1", "two"])
def test_a_worker_count_below_one_is_refused(
    count: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse refuses it against the flag, status 2."""
    with pytest.raises(SystemExit) as stopped:
        main(["serve", "--upstream", "http://127.0.0.1:9", "--workers", count])
    assert stopped.value.code == 2
    assert "argument --workers" in capsys.readouterr().err


def test_a_port_in_use_stops_serve_before_any_worker_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The parent binds the port itself: taken, it says so and starts no worker."""
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(
            [
                *("serve", "--upstream", "http://127.0.0.1:9", "--host", HOST),
                *("--port", str(port), "--workers", "2", "--redis-url", "redis://127.0.0.1:9"),
            ]
        )
    assert code == 3
    assert f"cannot listen on {HOST}:{port}: Address already in use" in capsys.readouterr().err


@pytest.fixture
def spawnable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes started by ``spawn`` import their target, a function of this test
    package, with this process's ``sys.path`` (multiprocessing hands it over): the
    repository's root goes on it, since ``pytest`` run as a script does not put it there,
    and a child that cannot import its target dies with status 1, which must not pass
    for the death a test scripted."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))


@pytest.mark.usefixtures("spawnable")
def test_workers_that_keep_dying_stop_the_supervisor(caplog: pytest.LogCaptureFixture) -> None:
    """Real worker processes that crash at once are replaced up to ``max_restarts`` times
    within the window; the next death stops it all with an error, status 1."""
    supervisor = Workers(exit_with, (1,), [[], []], stop_timeout_s=5, max_restarts=3)
    with caplog.at_level(logging.WARNING, logger="obleth.serve"):
        assert supervisor.run() == 1
    replaced = [r for r in caplog.records if "serves in its place" in r.getMessage()]
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(replaced) == 3
    assert "exited with status 1: 4 worker deaths within 60 s, more than the 3 replaced" in (
        error.getMessage()
    )
    assert not [pid for pid in supervisor.pids if alive(pid)]


@pytest.mark.usefixtures("spawnable")
def test_a_worker_that_fails_to_start_stops_the_supervisor_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Exit status 3 is uvicorn's failed startup: a replacement would fail alike, so
    nothing is replaced, and the supervisor exits with 3 too, as one process would."""
    supervisor = Workers(exit_with, (3,), [[], []], stop_timeout_s=5)
    with caplog.at_level(logging.WARNING, logger="obleth.serve"):
        assert supervisor.run() == 3
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "serves in its place" in m]
    assert any("failed to start (exit status 3" in m for m in messages), messages
