"""Running uvicorn servers on an event loop of our own: uvloop's when installed, every
server on one loop, all of them stopping when one does. ``obleth serve`` runs its gateway
and admin API this way, in one process or in each worker of ``--workers``.

SIGINT and SIGTERM both stop the servers gracefully (uvicorn's ``timeout_graceful_shutdown``
for the requests in progress) and ``serve`` then returns, so that the process exits with
status 0 whichever of the two came, as the parent of ``--workers`` does. A request still
running when that timeout ends is cut off with one warning in the log, not a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

import uvicorn

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)

CUT_OFF = (
    "a request still running when the graceful shutdown's time was up was cut off "
    "(its client sees the connection close)"
)


class Server(uvicorn.Server):
    """A uvicorn server that leaves SIGINT and SIGTERM to ``serve``, which stops every
    server it runs at once. A uvicorn server installs handlers of its own while it serves:
    with two servers in one process (the gateway and the admin API) the second one's would
    take the signal alone, and the first would go on taking requests until the second had
    drained, then start its own graceful shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(servers: list[Server], sockets: Sequence[socket.socket] | None = None) -> None:
    """Serve ``servers`` until a signal stops them (or one of them stops); ``sockets``,
    one per server, are listeners bound already, else each binds its own."""
    with (
        _signals_stop(servers),
        _cut_off_quietly(servers),
        asyncio.Runner(loop_factory=_loop_factory()) as runner,
    ):
        runner.run(_serve_all(servers, sockets))


@contextlib.contextmanager
def _signals_stop(servers: list[Server]) -> Iterator[None]:
    """While serving, SIGINT and SIGTERM stop every server gracefully, as uvicorn's own
    handler stops one (``Server`` installs none); a second SIGINT ends the graceful
    shutdown at once. ``serve`` then returns, whichever signal came: uvicorn's way of
    raising the signal again once stopped would kill the process (SIGTERM, status 143)
    or raise ``KeyboardInterrupt``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        for server in servers:
            if server.should_exit and signum == signal.SIGINT:
                server.force_exit = True
            else:
                server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in STOPPING_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _CutOff(logging.Filter):
    """uvicorn logs a request that its graceful shutdown cancelled (it outlasted the
    timeout) as an error with the ``CancelledError``'s traceback, which reads like a bug
    of the app. This turns that record into one warning that says what happened; a
    ``CancelledError`` out of an app while no server is stopping stays as it was."""

    def __init__(self, servers: list[Server]) -> None:
        super().__init__()
        self.servers = servers

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        stopping = any(server.should_exit for server in self.servers)
        if stopping and isinstance(error, asyncio.CancelledError):
            record.msg, record.args = CUT_OFF, ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


@contextlib.contextmanager
def _cut_off_quietly(servers: list[Server]) -> Iterator[None]:
    logger = logging.getLogger("uvicorn.error")
    cut_off = _CutOff(servers)
    logger.addFilter(cut_off)
    try:
        yield
    finally:
        logger.removeFilter(cut_off)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (``uvicorn[standard]`` brings it), as
    uvicorn itself would choose: the servers run on a loop of ours, not one uvicorn sets
    up. None: asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _serve_all(servers: list[Server], sockets: Sequence[socket.socket] | None = None) -> None:
    """Serve every server on this loop until a signal stops them; if one stops (it could
    not bind its port), the others are told to stop too. ``sockets``, one per server, are
    listeners bound already (by the parent of ``--workers``); without, each binds its own."""
    tasks = [
        asyncio.create_task(server.serve(None if sockets is None else [sockets[i]]))
        for i, server in enumerate(servers)
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        task.result()  # a server's own error, if it had one
