"""Real processes for multi-pod tests: a simulated backend, gateway pods, load to drive them.

- ``SimBackend``: ``obleth mock-backend`` in a subprocess. Its ``/sim/stats`` is the ground
  truth of how many requests were in flight at once.
- ``Pod``: one uvicorn process serving ``tests.cluster.podapp`` (gateway + proxy).
- ``Pods``: N pods started together (all spawned, then all awaited) and stopped together.
- ``drive``: bounded async load over a set of pod URLs.

Every process listens on 127.0.0.1 only and logs to a file (``log_tail()`` for assertion
messages). It is killed and reaped whatever happens: on ``stop()``, on leaving its ``with``
block, and otherwise by a finalizer when the object is dropped or the interpreter exits.
Inherited ``OBLETH_*`` variables are not passed on: a process sees exactly the settings
its test gives it.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
import pytest

from gateway.routing.httpclient import KEEPALIVE_EXPIRY_S

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
Stats = dict[str, Any]
T = TypeVar("T")

# How a server's log says that another process took its port between our choosing it and
# the server binding it; the server is then started again on another port.
_PORT_TAKEN = "address already in use"
_PORT_RETRIES = 3


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the kernel's choice, released at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@functools.cache
def _default_log_dir() -> Path:
    """One temporary directory for the logs of this test session, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="obleth-cluster-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _reap(process: subprocess.Popen[bytes]) -> None:
    """Kill and reap ``process`` if it still runs (SIGKILL works on a paused one too)."""
    if process.poll() is None:
        process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


class _Server:
    """A child process serving HTTP on 127.0.0.1; subclasses say how it is started."""

    health_path = "/"

    def __init__(
        self, name: str, *, env: Mapping[str, str] | None = None, log_dir: Path | None = None
    ) -> None:
        self.name = name
        self.port: int | None = None
        self.paused = False
        self._env = dict(env or {})
        fd, path = tempfile.mkstemp(
            prefix=f"{name}-", suffix=".log", dir=log_dir or _default_log_dir()
        )
        os.close(fd)
        self.log_path = Path(path)
        self._log_start = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], None] | None = None

    def _argv(self, port: int) -> list[str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``; fixed once the server has started."""
        if self.port is None:
            raise RuntimeError(f"{self.name} has not been started")
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        """The process exists and has not exited (a paused process is running)."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Spawn the process and return at once; ``wait_ready()`` waits for it.

        A server started again after ``kill()`` or ``stop()`` asks for its old port.
        """
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self._spawn(self.port or free_port())

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Return once ``health_path`` answers 200; raise RuntimeError, with the log's tail,
        if the process exits first or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        retries = 0
        with httpx.Client(trust_env=False, timeout=1.0) as http:
            while True:
                code = self._require_process().poll()
                if code is not None:
                    if retries < _PORT_RETRIES and _PORT_TAKEN in self._log_since_start().lower():
                        retries += 1
                        self._spawn(free_port())
                        continue
                    raise RuntimeError(self._describe(f"exited with code {code} while starting"))
                with contextlib.suppress(httpx.TransportError):
                    if http.get(self.url + self.health_path).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(self._describe(f"was not ready within {timeout_s} s"))
                time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL, as a crashing pod or ``kill -9``; returns once the process is reaped."""
        process = self._require_process()
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP: the process stops answering but keeps its sockets (a hung pod)."""
        self._require_process().send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause()``."""
        self._require_process().send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM (graceful shutdown), then SIGKILL after ``timeout_s``; always reaps.

        Safe to call at any time, also when never started or already gone.
        """
        self._request_stop()
        self._await_stop(timeout_s)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the process's output (stdout and stderr)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _get(self, path: str) -> Stats:
        response = httpx.get(self.url + path, trust_env=False, timeout=5.0)
        response.raise_for_status()
        result: Stats = response.json()
        return result

    def _post(self, path: str) -> Stats:
        response = httpx.post(self.url + path, trust_env=False, timeout=5.0)
        response.raise_for_status()
        result: Stats = response.json()
        return result

    def _spawn(self, port: int) -> None:
        self.port = port
        environ = {k: v for k, v in os.environ.items() if not k.startswith("OBLETH_")}
        environ.update(self._env)
        with self.log_path.open("ab") as log:
            log.write(f"--- {self.name}: starting on port {port}\n".encode())
            log.flush()
            self._log_start = log.tell()
            # the child keeps its own copy of the log's descriptor; ours closes here
            process = subprocess.Popen(
                self._argv(port),
                cwd=REPO_ROOT,
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._process = process
        self.paused = False
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _reap, process)

    def _request_stop(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        if self.paused:
            # a stopped process acts on SIGTERM only once it runs again
            process.send_signal(signal.SIGCONT)

    def _await_stop(self, timeout_s: float) -> None:
        process = self._process
        if process is None:
            return
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        self.paused = False
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def _require_process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError(f"{self.name} has not been started")
        return self._process

    def _log_since_start(self) -> str:
        with contextlib.suppress(FileNotFoundError), self.log_path.open("rb") as log:
            log.seek(self._log_start)
            return log.read().decode(errors="replace")
        return ""

    def _describe(self, what: str) -> str:
        return f"{self.name} on port {self.port} {what}; {self.log_path}:\n{self.log_tail()}"


class SimBackend(_Server):
    """``obleth mock-backend`` on a free port, tuned to never queue and to answer quickly.

    The defaults give it far more batch slots than any test sends requests, and 2 ms steps
    without per-sequence or prefill cost, so that every request a gateway lets through runs
    at once: ``max_concurrency`` then measures the gateway, not the simulator.
    """

    health_path = "/health"

    def __init__(
        self,
        *,
        max_num_seqs: int = 1024,
        step_ms: float = 2.0,
        extra_args: Sequence[str] = (),
        name: str = "sim",
        log_dir: Path | None = None,
    ) -> None:
        super().__init__(name, log_dir=log_dir)
        self.max_num_seqs = max_num_seqs
        self.step_ms = step_ms
        self.extra_args = tuple(extra_args)

    def _argv(self, port: int) -> list[str]:
        # `python -m gateway` is the `obleth` command, from this checkout whatever is installed
        return [
            sys.executable,
            *("-m", "gateway", "mock-backend", "--host", HOST, "--port", str(port)),
            *("--log-level", "warning", "--max-num-seqs", str(self.max_num_seqs)),
            *("--step-ms", str(self.step_ms), "--step-ms-per-seq", "0"),
            *("--prefill-ms-per-token", "0"),
            *self.extra_args,
        ]

    def stats(self) -> Stats:
        """``GET /sim/stats``: ``concurrency`` (in flight now), ``max_concurrency`` (peak since
        start or reset), ``requests``, ``completed``, ``failed``, ``disconnected``, ..."""
        return self._get("/sim/stats")

    def reset(self) -> Stats:
        """``POST /sim/reset``: zero the counters; the peak restarts from the current count."""
        return self._post("/sim/reset")


class Pod(_Server):
    """One gateway pod: ``tests.cluster.podapp`` under uvicorn, proxying to ``upstream``.

    ``env`` holds the pod's ``OBLETH_*`` settings; ``POD_UPSTREAM`` is set from
    ``upstream``.
    """

    health_path = "/healthz"

    def __init__(
        self,
        upstream: str,
        *,
        env: Mapping[str, str] | None = None,
        name: str = "pod",
        log_dir: Path | None = None,
    ) -> None:
        super().__init__(name, env={**(env or {}), "POD_UPSTREAM": upstream}, log_dir=log_dir)
        self.upstream = upstream

    def _argv(self, port: int) -> list[str]:
        return [
            sys.executable,
            *("-m", "uvicorn", "tests.cluster.podapp:create_app", "--factory"),
            *("--host", HOST, "--port", str(port), "--lifespan", "on"),
            *("--log-level", "warning", "--no-access-log"),
            # bounded, so that stop() is not held up by a stream left open
            *("--timeout-graceful-shutdown", "2"),
        ]

    def stats(self) -> Stats:
        """``GET /_pod/stats``: ``admitted``, ``released``, ``rejected`` (by reason),
        ``limit``, ``inflight``, ``queued`` and ``pid``."""
        return self._get("/_pod/stats")


def wait_for(check: Callable[[], bool], within_s: float, what: str) -> None:
    """Poll ``check`` until it holds; a bounded wait, not a measurement."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {within_s} s")
        time.sleep(0.02)


def set_limit(pod: Pod, limit: int) -> None:
    """What ``PUT /api/v1/capacity`` does: ``Gateway.set_capacity`` on one pod."""
    answer = httpx.put(pod.url + "/_pod/capacity", params={"limit": limit}, trust_env=False)
    answer.raise_for_status()


class UvicornApp(_Server):
    """``uvicorn <target>`` from the repository's root, as a user would run an app of
    theirs; ``env`` holds its ``OBLETH_*`` settings."""

    def __init__(
        self,
        target: str,
        *,
        health_path: str = "/",
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
    ) -> None:
        super().__init__(target.partition(":")[0], env=env, log_dir=log_dir)
        self.target = target
        self.health_path = health_path

    def _argv(self, port: int) -> list[str]:
        return [
            sys.executable,
            *("-m", "uvicorn", self.target, "--host", HOST, "--port", str(port)),
            *("--log-level", "warning", "--no-access-log", "--timeout-graceful-shutdown", "2"),
        ]


class ServePod(_Server):
    """``obleth serve`` in a subprocess: the standalone gateway routing to ``upstreams``.

    ``args`` are extra flags (``--policy``, ``--scorers``, ``--redis-url``, ...); ``env``
    extra ``OBLETH_*`` settings.
    """

    health_path = "/healthz"

    def __init__(
        self,
        upstreams: Sequence[str],
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        name: str = "serve",
        log_dir: Path | None = None,
    ) -> None:
        super().__init__(name, env=env, log_dir=log_dir)
        self.upstreams = tuple(upstreams)
        self.args = tuple(args)

    def wait_all_healthy(self, wait_s: float = 10.0) -> None:
        """Return once ``/readyz`` lists every upstream healthy (round-robin turns among
        the healthy ones only, so a test that counts turns waits for this); fail the test
        after ``wait_s``."""
        last = ""
        for _ in range(int(wait_s / 0.02)):
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.get(f"{self.url}/readyz", trust_env=False, timeout=1.0)
                last = answer.text
                healthy = answer.json().get("healthy_upstreams", ()) if answer.is_success else ()
                if len(healthy) == len(self.upstreams):
                    return
            time.sleep(0.02)
        pytest.fail(f"{self.name} never saw all {len(self.upstreams)} upstreams healthy: {last}")

    def _argv(self, port: int) -> list[str]:
        upstream_flags = [flag for url in self.upstreams for flag in ("--upstream", url)]
        return [
            sys.executable,
            *("-m", "gateway", "serve", "--host", HOST, "--port", str(port)),
            *("--log-level", "warning", *upstream_flags, *self.args),
        ]


class Pods:
    """``count`` pods in front of one upstream, started together and stopped together.

    ``with Pods(3, sim.url, env={...}) as pods:`` returns once every pod is ready; leaving
    the block stops them all, also when the test failed.
    """

    def __init__(
        self,
        count: int,
        upstream: str,
        *,
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        ready_timeout_s: float = 30.0,
    ) -> None:
        self.pods = [Pod(upstream, env=env, name=f"pod{i}", log_dir=log_dir) for i in range(count)]
        self.ready_timeout_s = ready_timeout_s

    @property
    def urls(self) -> list[str]:
        return [pod.url for pod in self.pods]

    def __len__(self) -> int:
        return len(self.pods)

    def __iter__(self) -> Iterator[Pod]:
        return iter(self.pods)

    def __getitem__(self, index: int) -> Pod:
        return self.pods[index]

    def start(self) -> None:
        """Spawn every pod, then wait for each; if one fails, stop all and raise."""
        try:
            for pod in self.pods:
                pod.start()
            deadline = time.monotonic() + self.ready_timeout_s
            for pod in self.pods:
                pod.wait_ready(max(deadline - time.monotonic(), 1.0))
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM every pod at once, then wait for each (SIGKILL after ``timeout_s``)."""
        for pod in self.pods:
            pod._request_stop()
        for pod in self.pods:
            pod._await_stop(timeout_s)

    def stats(self) -> list[Stats]:
        """Every pod's ``/_pod/stats``, in pod order."""
        return [pod.stats() for pod in self.pods]

    def settled_stats(self, timeout_s: float = 5.0) -> list[Stats]:
        """The pods' stats once each is idle: nothing in flight or queued, and every
        admitted permit released. After ``timeout_s`` the last reading, settled or not (the
        caller's assertions say what is wrong)."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.stats()
            idle = all(
                s["inflight"] == 0 and s["queued"] == 0 and s["admitted"] == s["released"]
                for s in stats
            )
            if idle or time.monotonic() > deadline:
                return stats
            time.sleep(0.02)

    def log_tails(self, lines: int = 20) -> str:
        """Every pod's last log lines, for assertion messages."""
        return "\n".join(f"--- {pod.name}:\n{pod.log_tail(lines)}" for pod in self.pods)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


# -- load -------------------------------------------------------------------------------


@dataclass
class LoadResult:
    """What ``drive`` saw. Every request sent lands in exactly one of ``statuses``,
    ``failures`` and ``unfinished``."""

    statuses: Counter[int] = field(default_factory=Counter)
    """HTTP answers by status."""
    by_tenant: dict[str, Counter[int]] = field(default_factory=dict)
    """HTTP answers by tenant, then status."""
    error_codes: Counter[str] = field(default_factory=Counter)
    """``error.code`` of the OpenAI-style JSON error answers (``queue_full``, ...)."""
    failures: Counter[str] = field(default_factory=Counter)
    """Requests that got no HTTP answer, by exception class (``ReadTimeout``, ...)."""
    malformed: list[str] = field(default_factory=list)
    """Answers that were neither a whole completion nor an OpenAI-style JSON error."""
    unfinished: int = 0
    """Requests still running at the deadline, and cancelled there."""
    elapsed_s: float = 0.0

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())

    def summary(self) -> str:
        """One paragraph for assertion messages."""
        return (
            f"{self.answered} answered in {self.elapsed_s:.2f} s: {dict(self.statuses)}; "
            f"by tenant { ({t: dict(c) for t, c in self.by_tenant.items()}) }; "
            f"error codes {dict(self.error_codes)}; failures {dict(self.failures)}; "
            f"unfinished {self.unfinished}; malformed {self.malformed[:3]}"
        )

    def _record(self, tenant: str, status: int, content: bytes, streamed: bool) -> None:
        self.statuses[status] += 1
        self.by_tenant.setdefault(tenant, Counter())[status] += 1
        if status == 200:
            whole = _is_whole_stream(content) if streamed else _is_completion(content)
            if not whole:
                self.malformed.append(f"200 with an incomplete body: {content[:200]!r}")
            return
        code = error_code(content)
        if code is None:
            self.malformed.append(f"{status} without an OpenAI-style error: {content[:200]!r}")
        else:
            self.error_codes[code] += 1


def _is_whole_stream(content: bytes) -> bool:
    return content.rstrip().endswith(b"data: [DONE]")


def _is_completion(content: bytes) -> bool:
    with contextlib.suppress(ValueError):
        document = json.loads(content)
        return isinstance(document, dict) and bool(document.get("choices"))
    return False


def error_code(content: bytes) -> str | None:
    """The ``code`` of an OpenAI-style error body (``"None"`` when null); None if not one."""
    try:
        document = json.loads(content)
    except ValueError:
        return None
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None
    return str(error.get("code"))


def background(coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Run a load coroutine on its own event loop in a thread, while the test makes faults."""
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = executor.submit(asyncio.run, coroutine)
    executor.shutdown(wait=False)
    return future


async def drive(
    urls: Sequence[str],
    *,
    requests: int = 300,
    concurrency: int = 32,
    tenants: Sequence[str] = ("gold", "silver", "bronze"),
    tenant_header: str = "x-tenant",
    max_tokens: int = 4,
    stream_every: int = 0,
    path: str = "/v1/completions",
    request_timeout_s: float = 30.0,
    deadline_s: float = 60.0,
    issue_for_s: float | None = None,
) -> LoadResult:
    """Send ``requests`` OpenAI-style completions, ``concurrency`` at a time, then return.

    Request ``i`` goes to ``urls[i % len(urls)]`` for tenant
    ``tenants[(i // len(urls)) % len(tenants)]``, so every pod sees every tenant; every
    ``stream_every``-th request streams (0: none do). Bounded twice: each request by
    ``request_timeout_s`` (then counted in ``failures``), the whole run by ``deadline_s``
    (then the rest is cancelled and counted in ``unfinished``).

    ``issue_for_s``: no request is sent after that many seconds; those in flight then
    finish. A load window that ends this way aborts nothing, so the backend's own count
    never includes a request whose client has left but which it has not noticed yet (a
    ``deadline_s`` that cancels requests mid-flight hands their seats over while the
    backend still counts them).
    """
    if not urls or not tenants:
        raise ValueError("drive needs at least one URL and one tenant")
    result = LoadResult()
    if requests <= 0:
        return result
    started = time.monotonic()
    indices = iter(range(requests))
    limits = httpx.Limits(
        max_connections=concurrency,
        max_keepalive_connections=concurrency,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,  # before the pods close an idle connection
    )
    async with httpx.AsyncClient(trust_env=False, timeout=request_timeout_s, limits=limits) as http:

        async def one(i: int) -> None:
            url = urls[i % len(urls)]
            tenant = tenants[(i // len(urls)) % len(tenants)]
            streamed = stream_every > 0 and i % stream_every == 0
            body = {
                "prompt": f"Request {i} from {tenant}: say something.",
                "max_tokens": max_tokens,
                "stream": streamed,
            }
            headers = {tenant_header: tenant}
            try:
                async with http.stream("POST", url + path, json=body, headers=headers) as answer:
                    content = await answer.aread()
            except httpx.HTTPError as exc:
                result.failures[type(exc).__name__] += 1
                return
            result._record(tenant, answer.status_code, content, streamed)

        stop_at = math.inf if issue_for_s is None else started + issue_for_s

        async def worker() -> None:
            for i in indices:  # shared by all workers: each index is sent once
                if time.monotonic() >= stop_at:
                    return
                await one(i)

        workers = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, requests))]
        done, late = await asyncio.wait(workers, timeout=deadline_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        for task in done:
            task.result()  # a bug in the load generator itself fails the test
    result.unfinished = requests - result.answered - sum(result.failures.values())
    result.elapsed_s = time.monotonic() - started
    return result
