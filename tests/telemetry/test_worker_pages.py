"""``WorkerPages`` and ``merge``: the workers' pages of ``obleth serve --workers N`` as one
Prometheus page, each series with its ``worker`` label."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.workers import WorkerPages, merge, page_path, pages_directory
from gateway.types import Message, Receive, Scope, Send

COUNTER = """\
# HELP obleth_requests_total requests by outcome
# TYPE obleth_requests_total counter
obleth_requests_total{outcome="completed"} %d.0
# HELP obleth_queue_wait_seconds time waited
# TYPE obleth_queue_wait_seconds histogram
obleth_queue_wait_seconds_bucket{le="1.0"} 1.0
obleth_queue_wait_seconds_bucket{le="+Inf"} 1.0
obleth_queue_wait_seconds_count 1.0
obleth_queue_wait_seconds_sum 0.5
"""


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_merged_pages_declare_each_family_once_with_every_workers_samples() -> None:
    """Two pages of the same families become one page: one ``TYPE`` per family, every
    sample with its page's ``worker`` label, the values unchanged."""
    text = merge([("0", COUNTER % 3), ("1", COUNTER % 4)]).decode()

    assert text.count("# TYPE obleth_requests_total counter") == 1
    assert text.count("# TYPE obleth_queue_wait_seconds histogram") == 1
    found = samples(text)
    assert found[("obleth_requests_total", (("outcome", "completed"), ("worker", "0")))] == 3
    assert found[("obleth_requests_total", (("outcome", "completed"), ("worker", "1")))] == 4
    assert found[("obleth_queue_wait_seconds_count", (("worker", "1"),))] == 1
    assert len(found) == 2 * 5


def test_a_page_that_does_not_parse_is_left_out_whole() -> None:
    """A broken page costs its own samples only, and the caller is told whose it was."""
    errors: list[str] = []
    text = merge(
        [("0", COUNTER % 3), ("1", "obleth_requests_total{outcome= 2\n")],
        on_error=lambda worker, exc: errors.append(worker),
    ).decode()
    assert errors == ["1"]
    assert {labels for _, labels in samples(text)} <= {
        (("outcome", "completed"), ("worker", "0")),
        (("le", "1.0"), ("worker", "0")),
        (("le", "+Inf"), ("worker", "0")),
        (("worker", "0"),),
    }


def test_a_scrape_shows_its_own_page_fresh_and_the_others_as_published(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Worker 0's scrape: its own count of now, worker 1's as last published; worker 2's
    unreadable file is skipped with one warning, however often it is scraped."""
    count = [1]
    zero = WorkerPages(lambda: (COUNTER % count[0]).encode(), tmp_path, 0)
    one = WorkerPages(lambda: (COUNTER % 7).encode(), tmp_path, 1)
    asyncio.run(one.publish())
    page_path(tmp_path, 2).write_bytes(b"\xff\xfe not text")
    count[0] = 5

    with caplog.at_level(logging.WARNING, logger="obleth.telemetry"):
        first, second = zero.scrape().decode(), zero.scrape().decode()

    assert first == second
    found = samples(first)
    assert found[("obleth_requests_total", (("outcome", "completed"), ("worker", "0")))] == 5
    assert found[("obleth_requests_total", (("outcome", "completed"), ("worker", "1")))] == 7
    assert "worker-2.prom" in caplog.text and caplog.text.count("leaves out") == 1


def test_a_counter_never_goes_back_between_scrapes_answered_by_different_workers(
    tmp_path: Path,
) -> None:
    """Worker 0 answers a scrape with its count of the moment; the next scrape, a second
    later, lands on worker 1 before worker 0 published again. It used to show worker 0's
    older published count, a drop Prometheus reads as a counter reset; what a worker
    serves is now published as it is served."""
    count = [3]
    zero = WorkerPages(lambda: (COUNTER % count[0]).encode(), tmp_path, 0)
    one = WorkerPages(lambda: (COUNTER % 7).encode(), tmp_path, 1)
    asyncio.run(zero.publish())  # its last publication: 3
    count[0] = 5
    on_zero = samples(zero.scrape().decode())
    on_one = samples(one.scrape().decode())
    key = ("obleth_requests_total", (("outcome", "completed"), ("worker", "0")))
    assert on_zero[key] == 5
    assert on_one[key] == 5


def test_a_page_is_replaced_whole_and_only_when_it_changed(tmp_path: Path) -> None:
    """``publish`` writes beside and renames: a reader sees a whole page; an unchanged
    page is not written again."""
    count = [1]
    pages = WorkerPages(lambda: (COUNTER % count[0]).encode(), tmp_path, 3)
    asyncio.run(pages.publish())
    path = page_path(tmp_path, 3)
    inode = path.stat().st_ino
    asyncio.run(pages.publish())
    assert path.stat().st_ino == inode
    count[0] = 2
    asyncio.run(pages.publish())
    assert path.stat().st_ino != inode
    assert path.read_text() == COUNTER % 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-3.prom"]


def test_a_serving_app_publishes_from_startup_and_once_more_at_shutdown(tmp_path: Path) -> None:
    """The page is published once the app's startup completes and again after its
    shutdown, with what was counted until then; the server sees the app's messages."""
    count = [1]
    pages = WorkerPages(lambda: (COUNTER % count[0]).encode(), tmp_path, 0, interval_s=60)
    path = page_path(tmp_path, 0)
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "lifespan.startup"
        await send({"type": "lifespan.startup.complete"})
        for _ in range(500):  # bounded: until the publishing task's first turn
            if path.exists():
                break
            await asyncio.sleep(0.01)
        seen.append(path.read_text())
        count[0] = 9
        assert (await receive())["type"] == "lifespan.shutdown"
        await send({"type": "lifespan.shutdown.complete"})

    async def run() -> list[str]:
        incoming: asyncio.Queue[Message] = asyncio.Queue()
        for kind in ("lifespan.startup", "lifespan.shutdown"):
            incoming.put_nowait({"type": kind})
        sent: list[str] = []

        async def send(message: Message) -> None:
            sent.append(message["type"])

        await pages.serving(app)({"type": "lifespan"}, incoming.get, send)
        return sent

    sent = asyncio.run(run())

    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert seen == [COUNTER % 1]
    assert path.read_text() == COUNTER % 9


def test_a_pages_directory_left_by_a_killed_serve_is_removed_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kill -9`` of ``obleth serve --workers N`` leaves its directory of pages behind;
    the next one removes it (its process is gone), and leaves a running one's and
    anything not named as a pages directory alone. Its own is private (mode 0700)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen(["true"])
    ended.wait()
    orphan = tmp_path / f"obleth-metrics-{ended.pid}-abc123"
    running = tmp_path / f"obleth-metrics-{os.getppid()}-def456"
    unrelated = tmp_path / "obleth-metrics-notes"
    for directory in (orphan, running, unrelated):
        directory.mkdir()
        (directory / "worker-0.prom").write_text(COUNTER % 1)

    made = pages_directory()

    assert not orphan.exists()
    assert running.exists() and unrelated.exists()
    assert made.parent == tmp_path and made.name.startswith(f"obleth-metrics-{os.getpid()}-")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
