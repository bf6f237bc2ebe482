"""``Workers``: N processes serving listening sockets their parent bound, supervised by it
(``obleth serve --workers N``); and the binding of those sockets.

The model is uvicorn's ``--workers`` (``uvicorn/supervisors/multiprocess.py``): the parent
binds every socket before any worker starts and passes them to workers started with
``multiprocessing``'s ``spawn`` method (a fresh interpreter each, no state forked from the
parent). Two things differ.

How connections are spread. uvicorn binds one socket that every worker accepts from; the
kernel wakes them all and whichever event loop gets there first accepts every connection
waiting, since asyncio and uvloop both accept in a loop. A burst of new connections (a
load balancer opening its pool) can so land in one worker: in ``tests/bench/workers.py``
all 32 connections went to one of two workers in 1 run of 14. ``worker_sockets`` binds one
socket per worker instead, each with ``SO_REUSEPORT`` (Linux), and the kernel spreads new
connections over them by a hash of their addresses, whichever worker is awake. A
worker's socket outlives it in the parent: connections the kernel queues for it while it
is down wait for its replacement instead of being refused. Elsewhere one socket is
shared, as uvicorn does.

The supervision:

- SIGTERM or SIGINT to the parent: it closes its copies of the listening sockets, and
  every worker is sent SIGTERM and given ``stop_timeout_s`` to finish its requests
  (uvicorn's graceful shutdown, which closes the workers' copies: new connections are
  refused from then on), then killed; a second signal meanwhile kills them at once.
  ``run()`` then returns 0.
- A worker that dies is replaced in its slot, with a warning. More than ``max_restarts``
  deaths within ``restart_window_s`` is a crash loop: the others are stopped and ``run()``
  returns 1 with an error naming the last death. A worker that exits with uvicorn's
  ``STARTUP_FAILURE`` status (3: its app failed to start) stops everything at once, as
  uvicorn does: every replacement would fail the same way; ``run()`` returns 3 then,
  as a single process's failed startup does.
- A worker whose parent dies (``kill -9``) stops itself gracefully, so no worker outlives
  the ``obleth serve`` it belongs to.

POSIX only (signals, ``spawn`` passing descriptors). Messages go to the logger
``obleth.serve``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from gateway.asgi.lifespan import STARTUP_FAILURE

log = logging.getLogger("obleth.serve")


_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_spawn = multiprocessing.get_context("spawn")


BALANCED = sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")
"""Whether ``worker_sockets`` gives each worker a socket of its own (see the module
docstring): Linux balances ``SO_REUSEPORT`` sockets; other systems hand a port's
connections to one of them."""


def worker_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """The sockets of ``count`` workers serving ``host:port``, by worker: one each when
    ``BALANCED``, else the same shared socket ``count`` times. Raises ``OSError`` when the
    port is taken, also by another process's ``SO_REUSEPORT`` sockets (which a socket
    with ``SO_REUSEPORT`` would silently join: two servers would share the port)."""
    listening_socket(host, port).close()  # a plain bind fails on a port taken
    if not BALANCED:
        return [listening_socket(host, port)] * count
    bound: list[socket.socket] = []
    try:
        for _ in range(count):
            bound.append(listening_socket(host, port, reuse_port=True))
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


def listening_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (with ``SO_REUSEPORT`` if ``reuse_port``),
    inheritable, not yet listening: its worker calls ``listen()`` once it serves, so until
    one does, connections go to other workers' sockets or are refused, rather than left
    waiting in a backlog nobody reads. Raises ``OSError`` (port in use).

    The protocol is given as TCP explicitly: asyncio sets ``TCP_NODELAY`` on accepted
    connections only when the listening socket's ``proto`` says TCP, and without it a
    response written in two parts stalls on Nagle's algorithm meeting delayed ACKs.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _worker_main(
    target: Callable[..., None],
    args: tuple[object, ...],
    slot: int,
    sockets: list[socket.socket],
) -> None:
    """What a worker process runs: ``target(*args, slot, sockets)``, having arranged to
    stop itself if its parent dies first."""
    _stop_when_orphaned()
    target(*args, slot, sockets)


def _stop_when_orphaned() -> None:
    """SIGTERM to this process once its parent has exited: a daemon thread waits on the
    pipe the parent holds open for ``spawn`` (``multiprocessing.parent_process().sentinel``),
    which the kernel closes when the parent dies, however it died."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    sentinel = parent.sentinel

    def watch() -> None:
        multiprocessing.connection.wait([sentinel])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="obleth-parent-watch", daemon=True).start()


class Workers:
    """One process per entry of ``slots``, each running ``target(*args, slot, sockets)``
    with the entry's index and sockets, supervised; see the module docstring for what
    ``run()`` does on signals and deaths. A replacement runs in the slot of the worker it
    replaces, with the same index: what a worker keeps by slot (its page of metrics,
    ``gateway.telemetry.workers``) is taken over, not left beside a new one.

    ``target`` must be importable by name (a module-level function) and ``args``
    picklable: each worker is a fresh interpreter. The sockets stay open in the parent
    while it supervises, so a replacement worker gets the very same listeners as the one
    it replaces; ``run()`` closes them when it starts stopping the workers.
    """

    def __init__(
        self,
        target: Callable[..., None],
        args: tuple[object, ...],
        slots: Sequence[Sequence[socket.socket]],
        *,
        stop_timeout_s: float,
        max_restarts: int = 5,
        restart_window_s: float = 60.0,
    ) -> None:
        if not slots:
            raise ValueError("no slots: at least one worker")
        self._target = target
        self._args = args
        self._sockets = [list(sockets) for sockets in slots]
        self._slots: list[BaseProcess | None] = [None] * len(slots)
        self._stop_timeout_s = stop_timeout_s
        self._max_restarts = max_restarts
        self._restart_window_s = restart_window_s
        self._deaths: list[float] = []
        self._signals: list[int] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    @property
    def pids(self) -> list[int]:
        """The pid of each slot's latest worker (running, or exited once ``run()`` has
        returned), by slot."""
        return [p.pid for p in self._slots if p is not None and p.pid is not None]

    def run(self) -> int:
        """Start the workers and supervise them until a signal (then 0), a crash loop (then
        1) or a worker's failed startup (then ``STARTUP_FAILURE``, 3); every worker has
        exited when it returns."""
        previous = self._install_signal_handlers()
        try:
            for slot in range(len(self._slots)):
                self._start(slot)
            status = self._supervise()
            self._stop()
            return status
        finally:
            self._kill_all()
            self._restore_signal_handlers(previous)
            self._wake_r.close()
            self._wake_w.close()

    # -- supervision -------------------------------------------------------------------------

    def _start(self, slot: int) -> BaseProcess:
        process = _spawn.Process(
            target=_worker_main,
            args=(self._target, self._args, slot, self._sockets[slot]),
            name=f"obleth-worker-{slot + 1}",
        )
        process.start()
        self._slots[slot] = process
        return process

    def _supervise(self) -> int:
        """Wait for a signal (then 0) or a death that must stop the rest (then the exit
        status ``run()`` returns); replace the other dead."""
        while not self._signals:
            # every slot holds a live worker here (or one whose death is not handled
            # yet, whose sentinel is ready at once): no death goes unnoticed
            self._wait([p for p in self._slots if p is not None], None)
            if self._signals:
                break
            for slot, process in enumerate(self._slots):
                if process is None or process.is_alive():
                    continue
                process.join()
                status = self._replace(slot, process)
                if status is not None:
                    return status
        return 0

    def _replace(self, slot: int, process: BaseProcess) -> int | None:
        """Start another worker in ``slot`` after ``process`` died; the exit status to stop
        with instead when that would only repeat a failed startup or feed a crash loop."""
        what = f"worker {slot + 1} of {len(self._slots)} (pid {process.pid})"
        code = process.exitcode
        if code == STARTUP_FAILURE:
            log.error(
                "obleth serve: %s failed to start (exit status %d; its log says why); "
                "stopping the other workers, as a replacement would fail alike",
                what,
                code,
            )
            return STARTUP_FAILURE
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < self._restart_window_s] + [now]
        deaths = f"{len(self._deaths)} worker deaths within {self._restart_window_s:g} s"
        if len(self._deaths) > self._max_restarts:
            log.error(
                "obleth serve: %s %s: %s, more than the %d replaced; stopping the other "
                "workers (something kills every worker: see the log above)",
                what,
                _death(code),
                deaths,
                self._max_restarts,
            )
            return 1
        replacement = self._start(slot)
        log.warning(
            "obleth serve: %s %s; pid %s serves in its place (%s; at most %d are replaced)",
            what,
            _death(code),
            replacement.pid,
            deaths,
            self._max_restarts,
        )
        return None

    def _stop(self) -> None:
        """SIGTERM to every worker, then up to ``stop_timeout_s`` for all to exit; a new
        signal meanwhile ends the wait (the rest are killed on the way out of ``run``)."""
        handled = len(self._signals)
        running = self._running()
        for sockets in self._sockets:
            for sock in sockets:
                # the listeners stay open only in the workers, which close theirs as they
                # stop: new connections are then refused, not queued for no one to accept
                sock.close()
        for process in running:
            process.terminate()  # SIGTERM: uvicorn's graceful shutdown
        deadline = time.monotonic() + self._stop_timeout_s
        while running and len(self._signals) == handled:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning(
                    "obleth serve: workers %s still running %g s after SIGTERM; killing them",
                    ", ".join(str(p.pid) for p in running),
                    self._stop_timeout_s,
                )
                return
            self._wait(running, left)
            running = [p for p in running if p.is_alive()]

    def _kill_all(self) -> None:
        for process in self._slots:
            if process is None:
                continue
            if process.is_alive():
                process.kill()
            process.join(timeout=10)

    def _running(self) -> list[BaseProcess]:
        return [p for p in self._slots if p is not None and p.is_alive()]

    def _wait(self, processes: list[BaseProcess], timeout_s: float | None) -> None:
        """Until one of ``processes`` has exited, a signal arrives or ``timeout_s`` passes."""
        sentinels: list[int | socket.socket] = [p.sentinel for p in processes]
        multiprocessing.connection.wait([*sentinels, self._wake_r], timeout_s)
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(512):
                pass

    # -- signals ------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> tuple[int, dict[signal.Signals, Any]]:
        def handle(signum: int, frame: FrameType | None) -> None:
            self._signals.append(signum)

        # the handler runs between bytecodes; the byte the C-level handler writes to the
        # wake-up socket is what interrupts a wait in select()
        fd = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        handlers = {sig: signal.signal(sig, handle) for sig in _SIGNALS}
        return fd, handlers

    def _restore_signal_handlers(self, previous: tuple[int, dict[signal.Signals, Any]]) -> None:
        fd, handlers = previous
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(fd)


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"
