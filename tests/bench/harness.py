"""What the HTTP benchmarks share: uvicorn server processes, load runs, CPU accounting, the header.

``overhead.py`` and ``cluster.py`` serve the factories of ``apps.py`` with real uvicorn
processes on 127.0.0.1 and load them with ``loadgen.py`` in a process of its own; the
server's CPU time over the measured window comes from /proc, so a report can give the
server's CPU per request, which does not depend on how much of a core it was given.
Every process started here is stopped by the code that started it (``servers()`` is a
context manager; ``load`` never returns with its load generator still running).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
HOST = "127.0.0.1"

#: What every benchmark request carries: an API client's usual headers, so the
#: classifier takes its ordinary path (tenant = hash of the bearer key).
HEADERS = ("User-Agent: obleth-bench/1", "Accept: */*", "Authorization: Bearer sk-bench-0001")


# -- processes -------------------------------------------------------------------------------


def child_env(extra: Mapping[str, str] | None = None, *, root: Path = ROOT) -> dict[str, str]:
    """The environment of a child process: ours, the ``gateway`` package of ``root`` (this
    repository unless told otherwise) importable first, plus ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def pin(pid: int, cpu: int | None) -> None:
    """Restrict a process to one CPU; ``None`` leaves it to the scheduler."""
    if cpu is not None:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(pid, {cpu})


def stop_process(process: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; reaps the process either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """One uvicorn process serving a factory of ``apps.py`` on a free local port.

    ``env`` is added to the child's environment: it is how a factory, which uvicorn calls
    without arguments, learns run-specific values (a Redis URL, a pool name). ``under``
    is a command the server runs under (``instructions.py`` uses valgrind's cachegrind).
    ``root`` holds the ``gateway`` package the server imports (``overhead.py --against``
    serves another commit's); the apps are always this repository's ``apps.py``.
    """

    def __init__(
        self,
        factory: str,
        *,
        cpu: int | None = None,
        env: Mapping[str, str] | None = None,
        under: Sequence[str] = (),
        root: Path = ROOT,
    ) -> None:
        self.factory = factory
        self.port = free_port()
        command = [
            *under, sys.executable, "-m", "uvicorn", f"apps:{factory}", "--factory",
            "--app-dir", str(HERE), "--host", HOST, "--port", str(self.port),
            "--loop", "uvloop", "--http", "httptools", "--lifespan", "on",
            "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
        self.process = subprocess.Popen(command, cwd=root, env=child_env(env, root=root))
        pin(self.process.pid, cpu)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"uvicorn apps:{self.factory} exited at startup")
            with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), 0.2):
                return
            time.sleep(0.05)
        raise RuntimeError(f"uvicorn apps:{self.factory} not listening after {timeout_s} s")

    def get_json(self, path: str) -> dict[str, Any]:
        connection = http.client.HTTPConnection(HOST, self.port, timeout=5)
        try:
            connection.request("GET", path)
            result: dict[str, Any] = json.loads(connection.getresponse().read())
            return result
        finally:
            connection.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_process(self.process, timeout_s)


@contextlib.contextmanager
def servers(
    factories: list[str], *, cpu: int | None = None, env: Mapping[str, str] | None = None
) -> Iterator[dict[str, Server]]:
    """Start every factory's server, wait until all listen, stop them all on the way out."""
    started: dict[str, Server] = {}
    try:
        for factory in factories:
            started[factory] = Server(factory, cpu=cpu, env=env)
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


def load(
    server: Server,
    *,
    seconds: float,
    connections: int,
    warmup_s: float,
    path: str = "/",
    cpu: int | None = None,
    max_requests: int | None = None,
    watch: Mapping[str, int] | None = None,
    body: str | None = None,
) -> dict[str, Any]:
    """One load generator run; adds the server's CPU use over the measured window.

    ``watch`` names other processes (a redis-server) whose CPU use over the same window
    is added as ``cpu_of[name]`` (fraction of one CPU) and ``us_per_request_of[name]``.
    """
    command = [
        sys.executable, str(HERE / "loadgen.py"), "--host", HOST, "--port", str(server.port),
        "--path", path, "--connections", str(connections), "--seconds", str(seconds),
        "--warmup", str(warmup_s), "--marks",
    ]  # fmt: skip
    if max_requests is not None:
        command += ["--max-requests", str(max_requests)]
    if body is not None:
        command += ["--body", body]
    for header in HEADERS:
        command += ["--header", header]
    pids = {"server": server.pid, **(watch or {})}
    client = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        pin(client.pid, cpu)
        assert client.stdout is not None
        marks: dict[str, tuple[float, dict[str, float]]] = {}
        result: dict[str, Any] | None = None
        for line in client.stdout:  # ends when the load generator exits; it bounds itself
            line = line.strip()
            if line in ("window-start", "window-end"):
                marks[line] = (time.perf_counter(), {n: cpu_seconds(p) for n, p in pids.items()})
            elif line.startswith("{"):
                result = json.loads(line)
        client.wait(timeout=30)
    finally:
        if client.poll() is None:  # interrupted: the load generator must not outlive us
            client.kill()
            client.wait(timeout=10)
    if result is None:
        raise RuntimeError(f"the load generator failed (exit status {client.returncode})")
    if len(marks) == 2:
        (wall0, cpu0), (wall1, cpu1) = marks["window-start"], marks["window-end"]
        used = {name: cpu1[name] - cpu0[name] for name in pids}
        requests = max(result["requests"], 1)
        result["server_cpu"] = used["server"] / (wall1 - wall0)
        result["cpu_us_per_request"] = used["server"] / requests * 1e6
        result["cpu_of"] = {name: used[name] / (wall1 - wall0) for name in watch or {}}
        result["us_per_request_of"] = {name: used[name] / requests * 1e6 for name in watch or {}}
    result["client_cpu"] = result["client_cpu_s"] / result["wall_s"]
    return result


def problems_of(result: dict[str, Any], what: str) -> list[str]:
    """Why a load run is invalid: transport errors, non-200 answers, nothing completed."""
    found = [f"{what}: {error} ({count} times)" for error, count in result["errors"].items()]
    found += [
        f"{what}: {count} responses with status {status}"
        for status, count in result["statuses"].items()
        if status != "200"
    ]
    if not result["requests"]:
        found.append(f"{what}: no request completed")
    return found


# -- the report header -----------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}"


def code_version() -> str:
    """The commit measured, and whether gateway/ differs from it (read-only git calls)."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "--no-optional-locks", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )

    try:
        head = git("rev-parse", "--short", "HEAD")
        # git diff compares contents; diff-index alone also reports files only touched
        changed = git("diff", "--quiet", "HEAD", "--", "gateway")
        untracked = git("ls-files", "--others", "--exclude-standard", "--", "gateway")
    except (OSError, subprocess.SubprocessError):
        return "unknown (git unavailable)"
    if head.returncode != 0:
        return "unknown (no commit)"
    dirty = changed.returncode != 0 or bool(untracked.stdout.strip())
    return f"git {head.stdout.strip()}" + (" + uncommitted changes in gateway/" if dirty else "")


def installed(distribution: str) -> str:
    """A distribution's version, or "not installed"."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def software() -> str:
    """The server stack every HTTP benchmark runs on."""
    return (
        f"Python {platform.python_version()}, uvicorn {installed('uvicorn')} "
        f"(uvloop {installed('uvloop')}, httptools {installed('httptools')}), "
        f"starlette {installed('starlette')}"
    )


def unwind_on_sigterm() -> None:
    """Make SIGTERM unwind the benchmark as Ctrl-C does, so that every ``finally`` stops
    the servers it started (killed outright, a run left them serving)."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
