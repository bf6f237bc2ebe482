"""Running uvicorn servers on an event loop of our own: uvloop's when installed, every
server on one loop, all of them stopping when one does. ``obleth serve`` runs its gateway
and admin API this way, in one process or in each worker of ``--workers``."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Sequence

import uvicorn


def serve(servers: list[uvicorn.Server], sockets: Sequence[socket.socket] | None = None) -> None:
    """Serve ``servers`` until a signal stops them (or one of them stops); ``sockets``,
    one per server, are listeners bound already, else each binds its own."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve_all(servers, sockets))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (``uvicorn[standard]`` brings it), as
    uvicorn itself would choose: the servers run on a loop of ours, not one uvicorn sets
    up. None: asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _serve_all(
    servers: list[uvicorn.Server], sockets: Sequence[socket.socket] | None = None
) -> None:
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
