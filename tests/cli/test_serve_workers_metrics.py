"""``/metrics`` of ``obleth serve --workers 2`` (real worker processes, a real Redis): every
scrape, whichever worker answers, shows every worker's series with a ``worker`` label."""

from __future__ import annotations

import collections
import http.client
import json
import os
import signal
import time

from prometheus_client.parser import text_string_to_metric_families

from tests.cli.processes import holder
from tests.cli.serve_workers import WAIT_S, ServeWorkers
from tests.cluster.pods import HOST, ServePod, SimBackend

SENT = 12
"""Requests sent, each on a connection of its own, so both workers serve some."""


def complete(port: int) -> int:
    """One completion on a new connection; its status."""
    connection = http.client.HTTPConnection(HOST, port, timeout=30)
    try:
        body = json.dumps({"prompt": "Say something.", "max_tokens": 4})
        connection.request(
            "POST", "/v1/completions", body=body, headers={"content-type": "application/json"}
        )
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def scrape(port: int, workers: set[int] | None = None) -> tuple[str, int | None]:
    """``/metrics`` on a new connection, and which of ``workers`` (pids) answered it."""
    connection = http.client.HTTPConnection(HOST, port, timeout=30)
    try:
        connection.request("GET", "/metrics")
        answer = connection.getresponse()
        text = answer.read().decode()
        assert answer.status == 200, text
        assert connection.sock is not None
        return text, holder(connection.sock, workers) if workers else None
    finally:
        connection.close()


def completed(text: str) -> dict[str, float]:
    """``obleth_requests_total{outcome="completed"}`` summed by ``worker`` label."""
    by_worker: dict[str, float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "obleth_requests_total" and sample.labels["outcome"] == "completed":
                by_worker[sample.labels["worker"]] += sample.value
    return dict(by_worker)


def worker_labels(text: str) -> set[str | None]:
    """The ``worker`` label of every sample (None for a sample without one)."""
    return {
        sample.labels.get("worker")
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def one_type_each(text: str) -> bool:
    """Every family declared once: a second ``# TYPE`` line makes Prometheus refuse it."""
    declared = collections.Counter(line for line in text.splitlines() if line.startswith("# TYPE"))
    return bool(declared) and max(declared.values()) == 1


def test_every_scrape_of_two_workers_counts_the_requests_of_both(serve: ServeWorkers) -> None:
    """Whichever worker a scrape lands on, it shows both workers' series, labelled
    ``worker="0"`` and ``worker="1"``, in one valid exposition; their requests never sum
    to more than were sent and, once both have published, to exactly that: so
    ``sum without (worker) (rate(...))`` is right whichever worker Prometheus reaches."""
    workers = serve.wait_for_workers()
    assert serve.port is not None
    assert [complete(serve.port) for _ in range(SENT)] == [200] * SENT

    answered_in_full: set[int] = set()
    scrapes = 0
    deadline = time.monotonic() + WAIT_S
    while answered_in_full != workers or scrapes < 40:
        assert time.monotonic() < deadline, f"{scrapes} scrapes, full: {answered_in_full}"
        text, pid = scrape(serve.port, workers)
        scrapes += 1
        assert one_type_each(text), text
        assert worker_labels(text) == {"0", "1"}, text
        total = sum(completed(text).values())
        assert total <= SENT, text
        if total == SENT and pid is not None:
            answered_in_full.add(pid)


def test_a_replaced_worker_reports_in_its_slot(serve: ServeWorkers) -> None:
    """``kill -9`` of a worker: its replacement takes over its ``worker`` label (the slot),
    no third worker appears on the page."""
    first = serve.wait_for_workers()
    assert serve.port is not None
    os.kill(min(first), signal.SIGKILL)
    now = serve.wait_for_workers(besides={min(first)})
    assert complete(serve.port) == 200

    answered: set[int] = set()
    deadline = time.monotonic() + WAIT_S
    while answered != now:
        assert time.monotonic() < deadline, f"answered by {answered} of {now}"
        text, pid = scrape(serve.port, now)
        assert worker_labels(text) == {"0", "1"}, text
        if pid is not None:
            answered.add(pid)


def test_one_worker_shows_its_series_without_a_worker_label(sim: SimBackend) -> None:
    """``--workers 1`` (the default) serves its page as ever: no ``worker`` label."""
    with ServePod([sim.url], name="serve-one") as pod:
        assert pod.port is not None
        assert complete(pod.port) == 200
        text, _ = scrape(pod.port)
    assert completed_without_label(text) == 1.0
    assert worker_labels(text) == {None}


def completed_without_label(text: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "obleth_requests_total" and sample.labels["outcome"] == "completed"
    )
