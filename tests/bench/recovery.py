"""Cluster mode when Redis loses the pool or goes away: how long admissions stall, and
whether the backend ever sees more than the limit.

    python tests/bench/recovery.py            # 20 trials per loss, 5 runs per outage
    python tests/bench/recovery.py --quick    # 3 trials, 1 run: a smoke run

Three uvicorn pods (``tests/cluster/podapp.py``) share a real redis-server in front of one
simulated backend, whose own count of requests in flight is the ground truth.

1. **Losing the pool**, with the defaults a new user has (lease TTL 10 s, retry budget
   1 s, the default learning window as the roll call's fallback), under steady load:
   a brand-new pool (the first request after the pods are up), ``FLUSHALL``, a restart
   without persistence, and a failover to a replica that missed the last writes (the
   pods reach Redis through a TCP proxy that is pointed at the promoted replica). For
   each trial: the stall, i.e. the longest time without a successful answer after the
   fault (for a new pool: how long the first request took). Target: p99 under 1 s.
2. **Outages longer than the lease TTL** (TTL 1.5 s): Redis frozen by ``SIGSTOP`` for
   4 s and 5 s, and refusing writes at ``maxmemory 1`` for 4 s, in ``local`` and
   ``closed`` failure modes, under steady load. For each run: the backend's peak of
   requests in flight against the limit. Target: never over it.

Targets are printed, never asserted; the exit status is 1 only when a run is invalid
(a pod or Redis that did not start, requests that failed without an answer).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the tests helpers and the gateway package, from this checkout

from harness import code_version, machine, verdict  # noqa: E402

from tests.cluster.faults import (  # noqa: E402
    Outage,
    PoolLoss,
    first_completion,
    lose_pool,
    outage,
    start_replica,
)
from tests.cluster.pods import Pods, SimBackend, background  # noqa: E402
from tests.cluster.steady import Timeline, steady  # noqa: E402
from tests.redis_procs import RedisServer, TcpProxy  # noqa: E402

LIMIT = 6
SPACING_S = 1.5  # between two faults of a series


def env(url: str, pool: str, **extra: object) -> dict[str, str]:
    values = {
        "OBLETH_REDIS_URL": url,
        "OBLETH_POOL": pool,
        "OBLETH_GLOBAL_MAX_IN_FLIGHT": str(LIMIT),
        "OBLETH_TENANT_HEADER": "x-tenant",
        "OBLETH_MAX_QUEUE": "5000",
        "OBLETH_QUEUE_TIMEOUT_S": "30",
    }
    values.update({f"OBLETH_{k.upper()}": str(v) for k, v in extra.items()})
    return values


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


# -- 1. losing the pool ------------------------------------------------------------------


def new_pool_trials(sim: SimBackend, redis: RedisServer, trials: int) -> list[float]:
    """Seconds the first request took on a pool no pod had used, with the pods just up."""
    waits = []
    for _ in range(trials):
        with Pods(3, sim.url, env=env(redis.url, f"new-{uuid.uuid4().hex[:8]}")) as pods:
            waited, answer = first_completion(pods[0].url)
            waits.append(waited)
            if answer.status_code != 200:
                raise SystemExit(f"INVALID: the first request got {answer.status_code}")
    return waits


def loss_trials(sim: SimBackend, fault: PoolLoss, trials: int) -> tuple[list[float], int, Timeline]:
    """``trials`` faults of one kind, ``SPACING_S`` apart, under one steady load; the stall
    after each, the backend's peak over the series, and the load's timeline."""
    with ExitStack() as stack:
        master = stack.enter_context(RedisServer())
        proxy = stack.enter_context(TcpProxy.to(master))
        replicas: list[RedisServer] = []
        if fault == "failover":
            replicas.append(stack.enter_context(start_replica(master)))
        url = proxy.url if fault == "failover" else master.url
        pods = stack.enter_context(Pods(3, sim.url, env=env(url, "loss")))
        sim.reset()
        duration = SPACING_S * (trials + 1)
        load = background(steady(pods.urls, duration_s=duration, concurrency=24))
        times = []
        for _ in range(trials):
            time.sleep(SPACING_S)
            times.append(time.monotonic())
            if fault == "failover":
                promoted = replicas[-1]
                lose_pool(fault, master, proxy, promoted)
                master = promoted  # the next replica follows the new master
                replicas.append(stack.enter_context(start_replica(promoted)))
            else:
                lose_pool(fault, master)
        timeline = load.result()
        peak = int(sim.stats()["max_concurrency"])
    ends = [*times[1:], timeline.ended]
    stalls = [
        timeline.longest_gap(after=at, before=end) for at, end in zip(times, ends, strict=True)
    ]
    return stalls, peak, timeline


# -- 2. outages longer than the TTL --------------------------------------------------------


def outage_runs(sim: SimBackend, mode: str, kind: Outage, seconds: float, runs: int) -> list[int]:
    """The backend's peak in each run of one outage, in one failure mode."""
    peaks = []
    with RedisServer() as redis:
        settings = env(redis.url, "outage", redis_failure_mode=mode, lease_ttl_s=1.5)
        settings["OBLETH_REDIS_RETRY_BUDGET_S"] = "0.5"
        with Pods(3, sim.url, env=settings) as pods:
            for _ in range(runs):
                sim.reset()
                load = background(
                    steady(pods.urls, duration_s=seconds + 3.5, concurrency=24, max_tokens=20)
                )
                time.sleep(1.5)
                outage(redis, kind, seconds)
                timeline = load.result()
                if timeline.failures:
                    raise SystemExit(f"INVALID: {timeline.summary()}")
                peaks.append(int(sim.stats()["max_concurrency"]))
                time.sleep(2.0)  # every pod back in Redis before the next run
    return peaks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    trials, runs = (3, 1) if args.quick else (20, 5)
    print(f"$ python tests/bench/recovery.py{' --quick' if args.quick else ''}")
    print(f"code: {code_version()}; machine: {machine()}")
    print(f"3 pods, limit {LIMIT}; {trials} trials per loss, {runs} run(s) per outage\n")

    print("| Redis loses the pool | trials | stall p50 | stall p99 | max | backend peak |")
    print("| --- | --- | --- | --- | --- | --- |")
    all_met = True
    with SimBackend(step_ms=2.0) as sim:
        with RedisServer() as redis:
            waits = new_pool_trials(sim, redis, trials)
        rows = [("new pool (first request)", waits, None)]
        faults: tuple[PoolLoss, ...] = ("flushall", "restart", "failover")
        for fault in faults:
            stalls, peak, _ = loss_trials(sim, fault, trials)
            rows.append((fault, stalls, peak))
        for name, values, peak in rows:
            met = p99(values) < 1.0 and (peak is None or peak <= LIMIT)
            all_met &= met
            shown = "n/a" if peak is None else f"{peak} / {LIMIT}"
            print(
                f"| {name} | {len(values)} | {statistics.median(values) * 1000:.0f} ms | "
                f"{p99(values) * 1000:.0f} ms | {max(values) * 1000:.0f} ms | {shown} |"
            )
        print(f"\nstall p99 under 1 s and never over the limit: {verdict(all_met)}\n")

        print("| outage (TTL 1.5 s) | mode | runs | backend peak per run | over the limit |")
        print("| --- | --- | --- | --- | --- |")
        over = 0
        outages: tuple[tuple[Outage, float], ...] = (
            ("sigstop", 4.0),
            ("sigstop", 5.0),
            ("oom", 4.0),
        )
        for kind, seconds in outages:
            for mode in ("local", "closed"):
                peaks = outage_runs(sim, mode, kind, seconds, runs)
                over += sum(1 for p in peaks if p > LIMIT)
                name = f"{'SIGSTOP' if kind == 'sigstop' else 'maxmemory 1'} {seconds:g} s"
                print(
                    f"| {name} | {mode} | {len(peaks)} | {', '.join(map(str, peaks))} | "
                    f"{sum(1 for p in peaks if p > LIMIT)} |"
                )
        print(f"\nthe backend at or under the limit {LIMIT} in every run: {verdict(over == 0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
