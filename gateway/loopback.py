"""Run an ASGI app under a real uvicorn server on 127.0.0.1, inside this process.

Used by ``obleth demo``, by the tests and by plugin authors' tests.

Two forms with the same contract:

- ``with serve_in_thread(app) as server:`` runs uvicorn on its own event loop in a
  background thread; use it from sync tests, or from async tests that should not share
  the server's loop (the realistic setup: client and server are independent).
- ``async with serve_in_task(app) as server:`` runs uvicorn as a task on the caller's
  running asyncio loop; use it when the test wants to touch the app's objects (an engine,
  a Gateway) directly from the same loop.

Both bind a fresh ephemeral port before the server starts (so there is no race for a
"free" port), return once the server has run the app's lifespan startup and accepts
connections, and on exit shut the server down (running lifespan shutdown) and close the
socket. A server that fails to start raises RuntimeError instead of hanging.

``with mock_backend_process(*flags) as url:`` runs ``obleth mock-backend`` in a process
of its own instead, for tests whose timing must not share this process's CPU.

``server.url`` is the base URL. Build httpx clients with ``trust_env=False`` so proxy
environment variables never route 127.0.0.1 traffic elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import uvicorn

from gateway.types import ASGIApp

LifespanMode = Literal["auto", "on", "off"]

#: Where every server of this module listens: loopback only.
HOST = "127.0.0.1"


@dataclass(frozen=True)
class RunningServer:
    """A started server: where to reach it and the uvicorn object behind it."""

    host: str
    port: int
    server: uvicorn.Server

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``."""
        return f"http://{self.host}:{self.port}"


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to pytest."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn installs SIGINT/SIGTERM handlers when run on the main thread, which
        # would swallow Ctrl-C in the test session; the test owns shutdown instead.
        yield


def _bind(host: str) -> socket.socket:
    # proto must say TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only
    # when sock.proto == IPPROTO_TCP, and without it every response written in two parts
    # (headers, then body) stalls ~40 ms on Nagle's algorithm meeting delayed ACKs.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _make_server(app: ASGIApp, lifespan: LifespanMode, options: dict[str, Any]) -> _QuietServer:
    settings: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        # Bounded, so a test that leaves a stream open cannot hang the session.
        "timeout_graceful_shutdown": 2,
        **options,
    }
    return _QuietServer(uvicorn.Config(app, lifespan=lifespan, **settings))


async def _serve(server: _QuietServer, sock: socket.socket) -> None:
    # uvicorn exits the process when lifespan startup fails; in a test that must be a
    # failure of this server only, which the side waiting for startup reports.
    with contextlib.suppress(SystemExit):
        await server.serve(sockets=[sock])


@contextlib.contextmanager
def serve_in_thread(
    app: ASGIApp,
    *,
    host: str = HOST,
    lifespan: LifespanMode = "auto",
    startup_timeout_s: float = 10.0,
    **uvicorn_options: Any,
) -> Iterator[RunningServer]:
    """Serve `app` with uvicorn on a background thread's own event loop.

    `uvicorn_options` go to `uvicorn.Config` (e.g. ``http="h11"``).
    """
    sock = _bind(host)
    server = _make_server(app, lifespan, uvicorn_options)
    thread = threading.Thread(
        target=lambda: asyncio.run(_serve(server, sock)), name="uvicorn-test-server", daemon=True
    )
    try:
        thread.start()
        _wait_started(server, thread, startup_timeout_s)
        yield RunningServer(host, sock.getsockname()[1], server)
    finally:
        server.should_exit = True
        thread.join(timeout=10.0)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout=5.0)
        sock.close()


def _wait_started(server: uvicorn.Server, thread: threading.Thread, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the test server stopped during startup; see the log above")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the test server did not start within {timeout_s} s")
        time.sleep(0.005)


@contextlib.asynccontextmanager
async def serve_in_task(
    app: ASGIApp,
    *,
    host: str = HOST,
    lifespan: LifespanMode = "auto",
    startup_timeout_s: float = 10.0,
    **uvicorn_options: Any,
) -> AsyncIterator[RunningServer]:
    """Serve `app` with uvicorn as a task on the running asyncio loop.

    `uvicorn_options` go to `uvicorn.Config` (e.g. ``http="h11"``).
    """
    sock = _bind(host)
    server = _make_server(app, lifespan, uvicorn_options)
    task = asyncio.create_task(_serve(server, sock), name="uvicorn-test-server")
    try:
        deadline = asyncio.get_running_loop().time() + startup_timeout_s
        while not server.started:
            if task.done():
                raise RuntimeError("the test server stopped during startup; see the log above")
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the test server did not start within {startup_timeout_s} s")
            await asyncio.sleep(0.005)
        yield RunningServer(host, sock.getsockname()[1], server)
    finally:
        server.should_exit = True
        try:
            async with asyncio.timeout(10.0):
                await asyncio.shield(task)
        except TimeoutError:
            server.force_exit = True
            await task
        sock.close()


@contextlib.contextmanager
def mock_backend_process(*flags: str, startup_timeout_s: float = 20.0) -> Iterator[str]:
    """``obleth mock-backend FLAGS`` in a process of its own on 127.0.0.1 (its CPU is not
    the caller's: what it times is not slowed by the test); yields its base URL once
    ``/health`` answers, and stops it on exit. ``RuntimeError`` when it exits or does not
    answer within ``startup_timeout_s``."""
    with socket.socket() as probe:  # a free port; the backend binds it a moment later
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
    argv = [sys.executable, "-m", "gateway", "mock-backend", "--host", HOST, "--port", str(port)]
    process = subprocess.Popen(  # noqa: S603 -- this interpreter, our own command
        [*argv, "--log-level", "warning", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/health", timeout=1, trust_env=False).status_code == 200:
                    break
            if process.poll() is not None:
                raise RuntimeError(f"obleth mock-backend {' '.join(flags)} exited at startup")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"obleth mock-backend did not answer within {startup_timeout_s} s"
                )
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)
