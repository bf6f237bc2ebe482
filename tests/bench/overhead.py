"""What ``GatewayMiddleware`` costs a uvicorn server, measured against baselines in one run.

    python tests/bench/overhead.py            # full run, under 3 minutes
    python tests/bench/overhead.py --quick    # smoke run, about 20 seconds

Three measurements, each next to a baseline taken in the same run:

1. Overhead on a trivial endpoint: the bare Starlette app, the app behind the gateway and
   the app behind a naive ``asyncio.Semaphore`` middleware, loaded in alternation for
   several rounds; req/s and latency are medians over rounds, ratios are taken within a
   round.
2. Queue throughput: a 50 ms endpoint, limit 64, 256 clients, against the ideal
   64 / 0.05 s = 1 280 req/s; the server's own counters show the limit was never exceeded.
3. Local wake-up after release, in process (``wakeup.py``).

Servers are real uvicorn processes (uvloop, httptools, one worker); the load generator
(``loadgen.py``) is a process of its own. Neither is pinned to a CPU unless ``--pin`` is
given: on a shared two-core machine, pinning the server puts it on a core it may have to
share with whatever else runs there. The server's CPU use over each measured window is
read from /proc, so the report also gives the server CPU time per request, which does not
depend on how much of a core the server was given.

Targets are printed, never asserted: the exit status is 1 only when a run is invalid
(HTTP errors, the limit exceeded, counters that do not add up).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
HOST = "127.0.0.1"

#: What every benchmark request carries: an API client's usual headers, so the
#: classifier takes its ordinary path (tenant = hash of the bearer key).
HEADERS = ("User-Agent: obleth-bench/1", "Accept: */*", "Authorization: Bearer sk-bench-0001")

TRIVIAL_VARIANTS = {"bare": "bare", "gateway": "with_gateway", "naive semaphore": "with_semaphore"}
RATIO_TARGET = 0.92
QUEUE_TARGET = 0.97
WAKEUP_TARGET_US = 1000.0
QUEUE_LIMIT = 64  # as in apps.py, which this script does not import (it imports gateway)
QUEUE_CLIENTS = 256
QUEUE_IDEAL = QUEUE_LIMIT / 0.05


@dataclass(frozen=True)
class Plan:
    rounds: int
    seconds: float
    connections: int
    warmup_s: float
    queue_seconds: float
    reference_seconds: float
    wakeup_samples: int
    pin: bool


def plan_from(args: argparse.Namespace) -> Plan:
    quick = args.quick
    return Plan(
        rounds=args.rounds or (2 if quick else 5),
        seconds=args.seconds or (1.0 if quick else 3.0),
        connections=args.connections,
        warmup_s=0.3 if quick else 0.5,
        queue_seconds=3.0 if quick else 10.0,
        reference_seconds=1.5 if quick else 5.0,
        wakeup_samples=1000 if quick else 5000,
        pin=args.pin and (os.cpu_count() or 1) >= 2,
    )


# -- processes -------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def pin(pid: int, cpu: int, plan: Plan) -> None:
    if plan.pin:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(pid, {cpu})


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """One uvicorn process serving a factory of ``apps.py`` on a free local port."""

    def __init__(self, factory: str, plan: Plan) -> None:
        self.factory = factory
        self.port = free_port()
        command = [
            sys.executable, "-m", "uvicorn", f"apps:{factory}", "--factory",
            "--app-dir", str(HERE), "--host", HOST, "--port", str(self.port),
            "--loop", "uvloop", "--http", "httptools", "--lifespan", "on",
            "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
        self.process = subprocess.Popen(command, cwd=ROOT, env=child_env())
        pin(self.process.pid, 0, plan)

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

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@contextlib.contextmanager
def servers(factories: list[str], plan: Plan) -> Iterator[dict[str, Server]]:
    started: dict[str, Server] = {}
    try:
        for factory in factories:
            started[factory] = Server(factory, plan)
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


def load(
    server: Server, plan: Plan, *, seconds: float, connections: int, path: str = "/"
) -> dict[str, Any]:
    """One load generator run; adds the server's CPU use over the measured window."""
    command = [
        sys.executable, str(HERE / "loadgen.py"), "--host", HOST, "--port", str(server.port),
        "--path", path, "--connections", str(connections), "--seconds", str(seconds),
        "--warmup", str(plan.warmup_s), "--marks",
    ]  # fmt: skip
    for header in HEADERS:
        command += ["--header", header]
    client = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=child_env())
    pin(client.pid, 1, plan)
    assert client.stdout is not None
    marks: dict[str, tuple[float, float]] = {}
    result: dict[str, Any] | None = None
    for line in client.stdout:  # ends when the load generator exits; it bounds itself
        line = line.strip()
        if line in ("window-start", "window-end"):
            marks[line] = (time.perf_counter(), cpu_seconds(server.process.pid))
        elif line.startswith("{"):
            result = json.loads(line)
    client.wait(timeout=30)
    if result is None:
        raise RuntimeError(f"the load generator failed (exit status {client.returncode})")
    if len(marks) == 2:
        (wall0, cpu0), (wall1, cpu1) = marks["window-start"], marks["window-end"]
        result["server_cpu"] = (cpu1 - cpu0) / (wall1 - wall0)
        result["cpu_us_per_request"] = (cpu1 - cpu0) / max(result["requests"], 1) * 1e6
    result["client_cpu"] = result["client_cpu_s"] / result["wall_s"]
    return result


def problems_of(result: dict[str, Any], what: str) -> list[str]:
    found = [f"{what}: {error} ({count} times)" for error, count in result["errors"].items()]
    found += [
        f"{what}: {count} responses with status {status}"
        for status, count in result["statuses"].items()
        if status != "200"
    ]
    if not result["requests"]:
        found.append(f"{what}: no request completed")
    return found


# -- the three measurements ------------------------------------------------------------------


def overhead(plan: Plan, problems: list[str]) -> dict[str, Any]:
    names = list(TRIVIAL_VARIANTS)
    with servers(list(TRIVIAL_VARIANTS.values()), plan) as running:
        by_name = {name: running[factory] for name, factory in TRIVIAL_VARIANTS.items()}
        for name in names:  # warm-up, not reported
            load(by_name[name], plan, seconds=1.0, connections=plan.connections)
        rounds: list[dict[str, dict[str, Any]]] = []
        for index in range(plan.rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            this_round = {}
            for name in order:
                result = load(
                    by_name[name], plan, seconds=plan.seconds, connections=plan.connections
                )
                problems += problems_of(result, f"{name}, round {index + 1}")
                this_round[name] = result
            rounds.append(this_round)
    table = {}
    for name in names:
        runs = [r[name] for r in rounds]
        table[name] = {
            "rps": statistics.median(r["rps"] for r in runs),
            "p50_ms": statistics.median(r["p50_ms"] for r in runs),
            "p99_ms": statistics.median(r["p99_ms"] for r in runs),
            "ratio": statistics.median(r[name]["rps"] / r["bare"]["rps"] for r in rounds),
            "server_cpu": statistics.median(r.get("server_cpu", math.nan) for r in runs),
            "cpu_us": statistics.median(r.get("cpu_us_per_request", math.nan) for r in runs),
            "client_cpu": statistics.median(r["client_cpu"] for r in runs),
            "per_round": [r["rps"] for r in runs],
        }
    return table


def queue_throughput(plan: Plan, problems: list[str]) -> dict[str, Any]:
    runs = {
        # name: (factory, clients, seconds)
        "gateway": ("slow_with_gateway", QUEUE_CLIENTS, plan.queue_seconds),
        "naive semaphore": ("slow_with_semaphore", QUEUE_CLIENTS, plan.reference_seconds),
        "no limiter, 64 clients": ("slow_bare", QUEUE_LIMIT, plan.reference_seconds),
    }
    table: dict[str, Any] = {}
    with servers([factory for factory, _, _ in runs.values()], plan) as running:
        for name, (factory, clients, seconds) in runs.items():
            server = running[factory]
            result = load(server, plan, seconds=seconds, connections=clients, path="/work")
            problems += problems_of(result, f"queue, {name}")
            stats = server.get_json("/stats")
            result["stats"] = stats
            result["share"] = result["rps"] / QUEUE_IDEAL
            table[name] = result
            if factory != "slow_bare" and stats["max_running"] > QUEUE_LIMIT:
                problems.append(
                    f"queue, {name}: {stats['max_running']} requests ran at once; "
                    f"the limit is {QUEUE_LIMIT}"
                )
    stats = table["gateway"]["stats"]
    if stats["admitted"] != stats["released"] or stats["inflight"] or stats["queued"]:
        problems.append(f"queue, gateway: counters do not add up after the run: {stats}")
    if stats["rejected"]:
        problems.append(f"queue, gateway: requests were rejected: {stats['rejected']}")
    return table


def wakeup(plan: Plan) -> dict[str, Any]:
    command = [sys.executable, str(HERE / "wakeup.py"), "--samples", str(plan.wakeup_samples)]
    done = subprocess.run(command, capture_output=True, text=True, env=child_env(), timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"wakeup.py failed (exit status {done.returncode}):\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# -- the report ------------------------------------------------------------------------------


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
        changed = git("diff-index", "--quiet", "HEAD", "--", "gateway")
        untracked = git("ls-files", "--others", "--exclude-standard", "--", "gateway")
    except (OSError, subprocess.SubprocessError):
        return "unknown (git unavailable)"
    if head.returncode != 0:
        return "unknown (no commit)"
    dirty = changed.returncode != 0 or bool(untracked.stdout.strip())
    return f"git {head.stdout.strip()}" + (" + uncommitted changes in gateway/" if dirty else "")


def report(
    command: str,
    plan: Plan,
    trivial: dict[str, Any],
    queue: dict[str, Any],
    wake: dict[str, Any],
    problems: list[str],
) -> None:
    out: list[str] = []
    add = out.append
    add(f"command: {command}")
    add(f"code: {code_version()}")
    add(f"machine: {machine()}")
    add(
        f"software: Python {platform.python_version()}, uvicorn {version('uvicorn')} "
        f"(uvloop {version('uvloop')}, httptools {version('httptools')}), "
        f"starlette {version('starlette')}"
    )
    add(
        "placement: server on CPU 0, load generator on CPU 1"
        if plan.pin
        else "placement: processes not pinned (--pin to pin them)"
    )
    add("")
    add(
        f"1. Trivial endpoint: GET / -> 'hello', {plan.connections} keep-alive connections, "
        f"{plan.rounds} rounds x {plan.seconds:g} s in alternation; medians of rounds"
    )
    add(
        f"   {'variant':<16}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'ratio':>8}"
        f"{'srv CPU':>9}{'CPU us/req':>11}{'cli CPU':>9}   target"
    )
    for name, row in trivial.items():
        if name == "bare":
            target = "baseline"
        elif name == "gateway":
            target = f">= {RATIO_TARGET:.2f}x  {verdict(row['ratio'] >= RATIO_TARGET)}"
        else:
            target = "reference peer"
        add(
            f"   {name:<16}{row['rps']:>8.0f}{row['p50_ms']:>8.2f}{row['p99_ms']:>8.2f}"
            f"{row['ratio']:>7.3f}x{row['server_cpu']:>9.0%}{row['cpu_us']:>11.1f}"
            f"{row['client_cpu']:>9.0%}   {target}"
        )
    base_us = trivial["bare"]["cpu_us"]
    add(
        "   server CPU added per request: "
        + ", ".join(
            f"{name} +{row['cpu_us'] - base_us:.1f} us ({base_us / row['cpu_us']:.3f}x)"
            for name, row in trivial.items()
            if name != "bare"
        )
    )
    add("   req/s per round: " + "; ".join(
        f"{name} " + " ".join(f"{rps:.0f}" for rps in row["per_round"])
        for name, row in trivial.items()
    ))  # fmt: skip
    add("")
    add(
        f"2. Queue throughput: GET /work (sleeps 50 ms), limit {QUEUE_LIMIT}; "
        f"ideal {QUEUE_LIMIT} / 0.05 s = {QUEUE_IDEAL:.0f} req/s"
    )
    add(
        f"   {'variant':<24}{'clients':>8}{'req/s':>9}{'of ideal':>10}{'p50 ms':>9}"
        f"{'p99 ms':>9}{'max ran':>9}   target"
    )
    for name, row in queue.items():
        if name == "gateway":
            target = f">= {QUEUE_TARGET:.0%}  {verdict(row['share'] >= QUEUE_TARGET)}"
        elif name == "naive semaphore":
            target = "reference peer"
        else:
            target = "ceiling (no queue)"
        add(
            f"   {name:<24}{row['connections']:>8}{row['rps']:>9.0f}{row['share']:>10.1%}"
            f"{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}{row['stats']['max_running']:>9}"
            f"   {target}"
        )
    ceiling = queue["no limiter, 64 clients"]["rps"]
    add(
        "   against the ceiling: "
        + ", ".join(
            f"{name} {row['rps'] / ceiling:.1%}"
            for name, row in queue.items()
            if name != "no limiter, 64 clients"
        )
    )
    stats = queue["gateway"]["stats"]
    add(
        f"   gateway counters after the run: admitted {stats['admitted']}, released "
        f"{stats['released']}, rejected {sum(stats['rejected'].values())}, in flight "
        f"{stats['inflight']}, queued {stats['queued']}, most running at once "
        f"{stats['max_running']} (limit {stats['limit']})"
    )
    add("")
    add(f"3. Local wake-up after release, in process ({wake['loop']}), microseconds")
    add(f"   {'case':<44}{'samples':>8}{'p50':>8}{'p99':>8}{'max':>8}   target")
    cases = {
        "semaphore": "asyncio.Semaphore(1) hand-off (floor)",
        "idle": "gateway, limit 1, one waiter",
        "loaded": "gateway, limit 16, ~200 waiters churning",
    }
    for key, label in cases.items():
        row = wake[key]
        target = "reference peer" if key == "semaphore" else (
            f"p99 <= {WAKEUP_TARGET_US:.0f}  {verdict(row['p99_us'] <= WAKEUP_TARGET_US)}"
        )  # fmt: skip
        add(
            f"   {label:<44}{row['samples']:>8}{row['p50_us']:>8.1f}{row['p99_us']:>8.1f}"
            f"{row['max_us']:>8.1f}   {target}"
        )
    add("")
    add("run validity: " + ("ok" if not problems else "INVALID"))
    out += [f"   {problem}" for problem in problems]
    print("\n".join(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="short runs, for a smoke test")
    parser.add_argument("--rounds", type=int, help="alternation rounds (default 5; quick 2)")
    parser.add_argument("--seconds", type=float, help="seconds per round (default 3; quick 1)")
    parser.add_argument("--connections", type=int, default=32, help="for the trivial endpoint")
    parser.add_argument(
        "--pin", action="store_true", help="server on CPU 0, load generator on CPU 1"
    )
    args = parser.parse_args()
    plan = plan_from(args)
    command = shlex.join(["python", "tests/bench/overhead.py", *sys.argv[1:]])
    started = time.monotonic()
    problems: list[str] = []
    print("1/3 trivial endpoint ...", file=sys.stderr, flush=True)
    trivial = overhead(plan, problems)
    print("2/3 queue throughput ...", file=sys.stderr, flush=True)
    queue = queue_throughput(plan, problems)
    print("3/3 wake-up latency ...", file=sys.stderr, flush=True)
    wake = wakeup(plan)
    print(f"done in {time.monotonic() - started:.0f} s\n", file=sys.stderr, flush=True)
    report(command, plan, trivial, queue, wake, problems)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
