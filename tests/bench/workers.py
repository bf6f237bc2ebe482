"""Requests per second of ``obleth serve --workers N`` against N, in front of one fleet.

    python tests/bench/workers.py                  # about a minute
    python tests/bench/workers.py --workers 1,2,3 --seconds 5 --rounds 3

The fleet is ``proxy.py``'s: 4 simulated backends (``obleth mock-backend``, a 1 ms decode
step, no prefill time). In front of it, one gateway at a time, in alternation, round after
round:

- ``in-process``: plain ``obleth serve``, one process, its budget in memory (the default);
- ``N=1``, ``N=2``, ...: ``obleth serve --workers N --redis-url ...`` against a real
  ``redis-server`` this script starts, the budget shared by the workers. ``N=1`` is one
  process (``--workers 1`` does not fork), with Redis: the baseline of the ratios, as it
  pays the same trips to Redis as N workers do.

Each gateway gets 32 keep-alive connections sending the same small non-streamed
completion back to back (``loadgen.py``, a process of its own) for ``--seconds`` after a
second of warm-up, with a limit far above the concurrency, so that nothing queues: what
is measured is how fast the gateway forwards. CPU time over the window comes from /proc:
the gateway's (the parent and its workers; the parent only supervises), the backends',
Redis's and the load generator's, each as cores busy and per request. The split of the
workers' CPU (in the most uneven round) shows how evenly the connections were spread.

On a machine with few cores the load generator, the backends and Redis compete with the
workers for them: the gain of a second worker is bounded by what is left over. Printed,
never asserted; exit status 1 when a run is invalid (errors, non-200 answers).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from harness import HOST, ROOT, code_version, free_port, load, machine, software
from proxy import BACKENDS, CONNECTIONS, PLAIN, Process, backend

sys.path.insert(0, str(ROOT))  # tests.redis_procs, from this checkout

from tests.redis_procs import RedisServer

WARMUP_S = 1.0


class Gateway:
    """``obleth serve`` in front of ``fleet``: in process, or with ``workers`` processes
    sharing a pool in Redis."""

    def __init__(self, fleet: list[Process], workers: int | None, redis_url: str) -> None:
        self.name = "in-process" if workers is None else f"N={workers}"
        self.workers = workers or 1
        port = free_port()
        argv = [
            sys.executable, "-m", "gateway", "serve", "--port", str(port),
            "--log-level", "warning", "--max-in-flight", "4096",
        ]  # fmt: skip
        if workers is not None:
            pool = f"bench-workers-{os.getpid()}-{time.monotonic_ns()}"
            argv += ["--workers", str(workers), "--redis-url", redis_url, "--pool", pool]
        for upstream in fleet:
            argv += ["--upstream", f"http://{HOST}:{upstream.port}"]
        self.served = Process(argv, port)
        self.port, self.pid = port, self.served.pid
        deadline = time.monotonic() + 30
        while workers is not None and workers > 1 and len(self.worker_pids()) < workers:
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name}: workers did not all start")
            time.sleep(0.05)
        time.sleep(1.5)  # every worker serving, every upstream polled healthy

    def worker_pids(self) -> list[int]:
        """The worker processes; none with one (``--workers 1`` serves in the process it
        started in, as plain ``obleth serve`` does)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    spawned = b"spawn_main" in cmdline.read()
                if parent == self.pid and spawned:
                    found.append(int(entry))
        return sorted(found)

    def stop(self) -> None:
        self.served.stop()


def measure(
    gateway: Gateway, fleet: list[Process], redis_pid: int, seconds: float
) -> dict[str, Any]:
    workers = gateway.worker_pids()
    watch = {f"worker{i}": pid for i, pid in enumerate(workers)}
    watch |= {f"backend{i}": p.pid for i, p in enumerate(fleet)}
    watch["redis"] = redis_pid
    result = load(
        gateway,  # type: ignore[arg-type]  # has port and pid, all load() reads
        seconds=seconds,
        connections=CONNECTIONS,
        warmup_s=WARMUP_S,
        path="/v1/completions",
        body=PLAIN,
        watch=watch,
    )
    bad = {k: v for k, v in result["statuses"].items() if k != "200"}
    if result["errors"] or bad or not result["requests"]:
        raise SystemExit(f"{gateway.name}: invalid run: {result['errors']} {result['statuses']}")
    cores, per_request = result["cpu_of"], result["us_per_request_of"]
    split = [cores[f"worker{i}"] for i in range(len(workers))]
    return {
        "rps": result["rps"],
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "gateway_cores": result["server_cpu"] + sum(split),
        "gateway_us": result["cpu_us_per_request"]
        + sum(per_request[f"worker{i}"] for i in range(len(workers))),
        "split": [share / sum(split) for share in split] if sum(split) else [],
        "backend_cores": sum(cores[f"backend{i}"] for i in range(len(fleet))),
        "redis_cores": cores["redis"],
        "client_cores": result["client_cpu"],
    }


@contextlib.contextmanager
def fleet_of(count: int) -> Iterator[list[Process]]:
    started: list[Process] = []
    try:
        for _ in range(count):
            started.append(backend())
        yield started
    finally:
        for process in started:
            process.stop()


def report(runs: dict[str, list[dict[str, Any]]], baseline: str) -> None:
    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    base_rps, base_us = median(baseline, "rps"), median(baseline, "gateway_us")
    print(
        f"{'gateway':<11} {'req/s':>7} {'x ' + baseline:>7} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'gw µs/req':>9} {'x ' + baseline:>7} {'gw cores':>8} {'backends':>8} "
        f"{'redis':>6} {'loadgen':>7}  worker CPU split (most uneven round)"
    )
    for name in runs:
        rps, us = median(name, "rps"), median(name, "gateway_us")
        # the most uneven round: how far from even the kernel's spread went
        worst = max((run["split"] for run in runs[name]), key=lambda split: max(split, default=0))
        split = "/".join(f"{share:.0%}" for share in worst) if len(worst) > 1 else "-"
        print(
            f"{name:<11} {rps:>7.0f} {rps / base_rps:>7.2f} {median(name, 'p50_ms'):>7.1f} "
            f"{median(name, 'p99_ms'):>7.1f} {us:>9.0f} {us / base_us:>7.2f} "
            f"{median(name, 'gateway_cores'):>8.2f} {median(name, 'backend_cores'):>8.2f} "
            f"{median(name, 'redis_cores'):>6.2f} {median(name, 'client_cores'):>7.2f}  {split}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workers", default="1,2", help="worker counts, e.g. 1,2")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-in-process", action="store_true", help="skip plain obleth serve")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    command = shlex.join(["python", "tests/bench/workers.py", *sys.argv[1:]])
    print(f"# {command}\n# {machine()}\n# {software()}\n# code {code_version()}")
    print(
        f"# {BACKENDS} backends, {CONNECTIONS} connections, {args.rounds} rounds of "
        f"{args.seconds:g} s, medians; load average {os.getloadavg()[0]:.2f} at start\n",
        flush=True,
    )
    variants: list[int | None] = ([] if args.no_in_process else [None]) + list(counts)
    runs: dict[str, list[dict[str, Any]]] = {}
    with RedisServer() as redis, fleet_of(BACKENDS) as fleet:
        for round_number in range(args.rounds):
            # the order rotates, so that no variant always runs first (or last) in a round
            turn = round_number % len(variants)
            for workers in variants[turn:] + variants[:turn]:
                gateway = Gateway(fleet, workers, redis.url)
                try:
                    runs.setdefault(gateway.name, []).append(
                        measure(gateway, fleet, redis.pid, args.seconds)
                    )
                finally:
                    gateway.stop()
                print(f"  round {round_number + 1}: {gateway.name} done", file=sys.stderr)
    ordered = {name: runs[name] for name in sorted(runs, key=lambda n: (n != "in-process", n))}
    report(ordered, baseline=f"N={counts[0]}")
    print(f"\n# load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
