"""The ASGI servers the middleware runs under, each started for real, as a user would start
it, on 127.0.0.1:

- ``uvicorn``: ``uvicorn <target> --lifespan on``;
- ``hypercorn``: ``hypercorn <target>`` (lifespan always; one worker process under a parent),
  and ``hypercorn-w0``: ``hypercorn <target> --workers 0`` (served by the one process);
- ``granian``: ``granian --interface asgi <target>`` (lifespan on; ``asginl`` is off);
- ``gunicorn``: ``gunicorn -w 2 -k uvicorn.workers.UvicornWorker <target>`` (lifespan auto).

``Stage`` is what a test gives its server: a private directory (for the ledger, the gate,
``TMPDIR`` and gunicorn's control socket), the repository's root on ``PYTHONPATH`` (the
``pytest`` script leaves it off ``sys.path``, and so would the workers these servers spawn),
and the ``OBLETH_*`` settings of the test.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.cluster.pods import HOST, REPO_ROOT, UvicornApp
from tests.servers.app import GATE, LEDGER
from tests.servers.ledger import Ledger

APP = "tests.servers.app:app"
"""The gateway built on the server's first event (see ``tests.servers.app``)."""
BUILT_AT_IMPORT = "tests.servers.built_at_import:app"
"""The gateway built while the server imports the app."""

_PY = sys.executable


def _command(server: str, target: str, port: int) -> list[str]:
    if server == "uvicorn":
        return [
            *(_PY, "-m", "uvicorn", target, "--host", HOST, "--port", str(port)),
            *("--lifespan", "on", "--log-level", "warning", "--no-access-log"),
            *("--timeout-graceful-shutdown", "2"),
        ]
    if server in ("hypercorn", "hypercorn-w0"):
        workers = ["--workers", "0"] if server == "hypercorn-w0" else []
        return [
            *(_PY, "-m", "hypercorn", target, "--bind", f"{HOST}:{port}"),
            *("--log-level", "warning", "--graceful-timeout", "2", *workers),
        ]
    if server == "granian":
        return [
            *(_PY, "-m", "granian", "--interface", "asgi", "--host", HOST, "--port", str(port)),
            *("--log-level", "warning", "--workers-kill-timeout", "2", target),
        ]
    if server == "gunicorn":
        return [
            *(_PY, "-m", "gunicorn", target, "--bind", f"{HOST}:{port}"),
            *("--workers", "2", "--worker-class", "uvicorn.workers.UvicornWorker"),
            *("--log-level", "warning", "--graceful-timeout", "2"),
        ]
    raise ValueError(f"no such server: {server!r}")


@dataclass(frozen=True)
class Stage:
    """A test's private directory and what its server's environment holds."""

    root: Path

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.root / "ledger")

    @property
    def gate(self) -> Path:
        """While this file exists, requests sent with ``?gate`` are held."""
        return self.root / "gate"

    def env(self, settings: Mapping[str, str]) -> dict[str, str]:
        path = os.environ.get("PYTHONPATH")
        return {
            **settings,
            LEDGER: str(self.ledger.path),
            GATE: str(self.gate),
            "PYTHONPATH": str(REPO_ROOT) + (os.pathsep + path if path else ""),
            # lock files of the gateway's sibling check, and gunicorn's control socket,
            # never meet those of another test run
            "TMPDIR": str(self.root),
            "XDG_RUNTIME_DIR": str(self.root),
        }


class Server(UvicornApp):
    """``target`` served by ``server`` (one of the names in the module docstring), with the
    ``OBLETH_*`` ``settings``; ready once ``/readyz`` answers 200, that is once the gateway
    has started."""

    def __init__(
        self,
        server: str,
        stage: Stage,
        settings: Mapping[str, str],
        *,
        target: str = APP,
    ) -> None:
        super().__init__(target, health_path="/readyz", env=stage.env(settings), log_dir=stage.root)
        self.name = server
        self.server = server

    def _argv(self, port: int) -> list[str]:
        return _command(self.server, self.target, port)

    def output(self) -> str:
        """What the server printed since it was started (stdout and stderr)."""
        return self._log_since_start()

    def exit_status(self, timeout_s: float = 30.0) -> int:
        """The server's exit status once it has exited by itself; AssertionError, with its
        output, if it still runs after ``timeout_s``."""
        try:
            return self._require_process().wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.server} still runs after {timeout_s} s:\n{self.output()}"
            ) from None


@dataclass(frozen=True)
class Answer:
    status: int
    headers: httpx.Headers
    document: Any


async def get_all(
    url: str, paths: Sequence[str], *, concurrency: int, timeout_s: float = 30.0
) -> list[Answer]:
    """``GET url + path`` for every path, ``concurrency`` at a time, each on a connection of
    its own; bounded by ``timeout_s`` per request (then the test fails)."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(trust_env=False, timeout=timeout_s, limits=limits) as http:

        async def one(path: str) -> Answer:
            async with gate:
                response = await http.get(url + path)
            return Answer(response.status_code, response.headers, response.json())

        return await asyncio.gather(*(one(path) for path in paths))
