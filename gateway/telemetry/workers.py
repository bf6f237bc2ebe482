"""``WorkerPages``: the ``/metrics`` page of ``obleth serve --workers N``, every worker's
series on whichever worker a scrape lands, each with a ``worker`` label.

The kernel hands a scrape to one worker at random. Were each worker to answer with its own
counters only, ``obleth_requests_total`` would jump between the workers' values and
Prometheus would read every drop as a counter reset. Instead every worker publishes its
own page to ``<directory>/worker-<slot>.prom`` about once a second, and the worker that is
scraped answers with its own page rendered fresh plus the other workers' latest files:

- every sample gains ``worker="<slot>"``: the worker's slot in ``Workers`` (0 to N-1),
  which a replacement of a dead worker takes over, so series stay ``worker="0"`` and
  ``worker="1"`` however often workers die. A replacement counts from zero again, which
  Prometheus takes as a reset of that worker's series, as it is. The files of a dead
  worker stay (its last figures) until its replacement overwrites them.
- families are merged by name, one ``HELP``/``TYPE`` each: pages concatenated would be an
  exposition Prometheus refuses (a family's samples must be together, its ``TYPE`` once).
- the other workers' figures are up to ``PUBLISH_INTERVAL_S`` (plus the time of one
  publication) older than the scrape; the answering worker's own are of the moment, and
  published as they are served: a later scrape that another worker answers shows them
  or newer ones, so a counter never seems to go back however often Prometheus scrapes.
- a file that cannot be read or parsed (a worker that never published yet has none: that
  is not a fault) is left out of the scrape, with a warning at most once a minute per
  file; a scrape never fails over another worker's page.

The directory is private to one ``obleth serve`` (the parent makes it, mode 0700, with
``pages_directory`` and removes it when it exits; the one a ``kill -9`` of ``obleth
serve`` leaves, a few kilobytes, is removed by the next ``obleth serve --workers`` of the
same user). Files are replaced atomically (written beside, then
``os.replace``), so a reader sees a whole page, old or new, never half of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.complaints import Complaints
from gateway.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("obleth.telemetry")

WORKER_LABEL = "worker"
"""The label that tells the workers' series apart: the worker's slot, ``"0"`` to ``"N-1"``."""

PUBLISH_INTERVAL_S = 1.0
"""How often a worker publishes its page (when it changed): the other workers' figures on
a scrape are at most about this old."""

_PAGE = re.compile(r"worker-(\d+)\.prom")


_DIRECTORY = re.compile(r"obleth-metrics-(\d+)-.+")
"""The name of a pages directory: the pid of the ``obleth serve`` that made it first."""


def pages_directory() -> Path:
    """A new private directory (mode 0700) in the temporary directory for the pages of
    one ``obleth serve --workers N``, named for the process that makes it. The directories
    of earlier ones that could not remove theirs (killed with ``kill -9``) are removed
    first: those of this user whose process is gone."""
    root = Path(tempfile.gettempdir())
    _remove_orphans(root)
    return Path(tempfile.mkdtemp(prefix=f"obleth-metrics-{os.getpid()}-", dir=root))


def _remove_orphans(root: Path) -> None:
    try:
        entries = list(os.scandir(root))
    except OSError:
        return  # nothing to tidy that can be seen: the new directory is made all the same
    for entry in entries:
        found = _DIRECTORY.fullmatch(entry.name)
        if found is None or _alive(int(found[1])):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue  # another user's: not ours to judge
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a reused pid counts: its directory then stays)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or no pid at all: leave the directory
    return True


def page_path(directory: Path, slot: int) -> Path:
    """Where the worker in ``slot`` publishes its page."""
    return directory / f"worker-{slot}.prom"


class WorkerPages:
    """The worker in ``slot`` of those publishing to ``directory``: ``publish()`` writes its
    page (``render()``, its own registry's text) for the others, ``scrape()`` is what its
    ``/metrics`` answers. ``serving(app)`` publishes while ``app``'s lifespan runs.

    ``scrape`` is called on the event loop, as ``Probes`` calls a page: it renders this
    worker's page and reads the other N-1 files, a few kilobytes each in a private
    directory (the page cache, in practice). Parsing and rendering them again is most of
    what a scrape costs: with two workers in cluster mode (a 13 KB page) a scrape took
    4 ms end to end, against 1 ms for one worker's page as it is.
    """

    def __init__(
        self,
        render: Callable[[], bytes],
        directory: Path,
        slot: int,
        *,
        interval_s: float = PUBLISH_INTERVAL_S,
    ) -> None:
        self.render = render
        self.directory = directory
        self.slot = slot
        self.interval_s = interval_s
        self._published: bytes | None = None
        self._complaints = Complaints()
        # writes come from the loop (scrapes) and from a thread (publish): the page on
        # disk is only ever replaced by one rendered later than it
        self._lock = threading.Lock()
        self._rendered = 0
        self._written = 0

    def scrape(self) -> bytes:
        """Every worker's series, each with its ``worker`` label, as Prometheus text: this
        worker's of this moment (published at once), the others' as last published."""
        generation, own = self._render()
        try:
            self._write(generation, own)
        except OSError as exc:  # served all the same; the publisher tries again
            self._complain(page_path(self.directory, self.slot), exc)
        pages = [(str(self.slot), own.decode())]
        for slot, path in self._others():
            try:
                pages.append((str(slot), path.read_text(encoding="utf-8")))
            except FileNotFoundError:
                continue  # gone between listing and reading: nothing to show yet
            except (OSError, UnicodeDecodeError) as exc:
                self._complain(path, exc)
        return merge(pages, on_error=self._complain_slot)

    async def publish(self) -> None:
        """Write this worker's page for the others, if it changed since the last time
        (atomically: a temporary file beside it, then ``os.replace``). A failure is logged,
        at most once a minute, and tried again next time."""
        generation, body = self._render()  # on the loop: the callbacks read the gateway
        if body == self._published:
            return
        try:
            await asyncio.to_thread(self._write, generation, body)
        except OSError as exc:
            if self._complaints.may("publish"):
                log.warning(
                    "worker %d could not publish its metrics to %s (%s); the other workers' "
                    "scrapes show its last page meanwhile",
                    self.slot,
                    self.directory,
                    exc,
                )
            return

    def serving(self, app: ASGIApp) -> ASGIApp:
        """``app``, publishing this worker's page every ``interval_s`` from its lifespan's
        startup to its shutdown, and once more after that (the last requests counted)."""
        return _Publishing(app, self)

    async def publishing(self, stop: asyncio.Event) -> None:
        """Publish now and every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.publish()
            except Exception:  # the page could not even be rendered: try again later
                if self._complaints.may("render"):
                    log.exception("worker %d could not render its metrics", self.slot)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)

    def _render(self) -> tuple[int, bytes]:
        self._rendered += 1
        return self._rendered, self.render()

    def _write(self, generation: int, body: bytes) -> None:
        """Put ``body`` on disk unless a page rendered after it is there already; what is
        on disk is then ``_published``."""
        with self._lock:
            if generation <= self._written:
                return
            path = page_path(self.directory, self.slot)
            scratch = path.with_name(f".{path.name}.tmp")  # not a page: ``_others`` skips it
            scratch.write_bytes(body)
            os.replace(scratch, path)
            self._written = generation
            self._published = body

    def _others(self) -> Iterator[tuple[int, Path]]:
        """The other workers' pages, by slot."""
        try:
            names = sorted(os.listdir(self.directory))
        except OSError as exc:
            self._complain(self.directory, exc)
            return
        found = [(int(m[1]), name) for name in names if (m := _PAGE.fullmatch(name))]
        for slot, name in sorted(found):
            if slot != self.slot:
                yield slot, self.directory / name

    def _complain_slot(self, worker: str, exc: Exception) -> None:
        self._complain(page_path(self.directory, int(worker)), exc)

    def _complain(self, path: Path, exc: Exception) -> None:
        if self._complaints.may(str(path)):
            log.warning(
                "/metrics leaves out %s, which cannot be read as Prometheus text (%s: %s); "
                "the scrape shows the other workers",
                path,
                type(exc).__name__,
                exc,
            )


def merge(
    pages: Iterable[tuple[str, str]],
    *,
    on_error: Callable[[str, Exception], None] | None = None,
) -> bytes:
    """One Prometheus text page of ``pages`` (``(worker, text)`` pairs): every sample with
    ``worker`` added to its labels, the families of the same name merged into one (with
    the first page's ``HELP`` and ``TYPE``). A page that does not parse is left out whole
    and ``on_error(worker, exc)`` told; a family whose type differs from the first page's
    is left out of the later page."""
    families: dict[str, Metric] = {}
    for worker, text in pages:
        try:
            parsed = list(text_string_to_metric_families(text))
        except Exception as exc:  # the parser raises ValueError, and worse on odd input
            if on_error is not None:
                on_error(worker, exc)
            continue
        for family in parsed:
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            elif merged.type != family.type:
                continue
            merged.samples.extend(
                sample._replace(labels={**sample.labels, WORKER_LABEL: worker})
                for sample in family.samples
            )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families:
    """A collector of families parsed already (for ``generate_latest``)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class _Publishing:
    """``app``, with ``pages`` published from the moment its lifespan startup completes
    until its shutdown completes, and once more then. Startup that fails publishes
    nothing: the worker serves nothing either."""

    def __init__(self, app: ASGIApp, pages: WorkerPages) -> None:
        self.app = app
        self.pages = pages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        stop = asyncio.Event()
        task: asyncio.Task[None] | None = None

        async def sending(message: Message) -> None:
            nonlocal task
            kind = message["type"]
            if kind == "lifespan.startup.complete":
                task = asyncio.create_task(self.pages.publishing(stop), name="obleth-publish")
            elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                await _stopped(task, stop)
                task = None
                await self.pages.publish()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            await _stopped(task, stop)


async def _stopped(task: asyncio.Task[None] | None, stop: asyncio.Event) -> None:
    """Once ``task`` (publishing until ``stop``) has ended."""
    stop.set()
    if task is not None:
        await task
