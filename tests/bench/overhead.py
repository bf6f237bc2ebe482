"""What ``GatewayMiddleware`` costs a uvicorn server, measured against baselines in one run.

    python tests/bench/overhead.py                  # full run, about 130 s
    python tests/bench/overhead.py --quick          # smoke run, about 20 seconds
    python tests/bench/overhead.py --against REV    # also the gateway as at commit REV

Three measurements, each next to a baseline taken in the same run:

1. Overhead on a trivial endpoint: the bare Starlette app, the app behind the gateway,
   behind a naive ``asyncio.Semaphore`` middleware, behind a middleware that does nothing
   (the floor of any middleware), and the bare app again in a second server (how far two
   identical servers measure apart: the run's noise), loaded in alternation for several
   rounds; req/s and latency are medians over rounds, ratios are taken within a round.
   The guard: the server CPU the gateway adds per request stays within 1.5 times what
   the naive semaphore adds (the median over rounds of the two additions' ratio). With
   ``--against REV``, the gateway's ``gateway/`` as at commit REV is served too, in the
   same alternation: how a change to the request path compares, through the VM's drift.
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
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    HERE,
    ROOT,
    Server,
    child_env,
    code_version,
    load,
    machine,
    problems_of,
    servers,
    software,
    verdict,
)

TRIVIAL_VARIANTS = {
    "bare": "bare",
    "gateway": "with_gateway",
    "naive semaphore": "with_semaphore",
    "pass-through": "with_passthrough",
    "bare, again": "bare_again",
}
RATIO_TARGET = 0.92
#: the guard: the server CPU the gateway adds, at most this many times the semaphore's
ADDED_CPU_GUARD = 1.5
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
    #: a commit whose gateway is served next to this one's (``--against``), or None
    against: str | None

    @property
    def server_cpu(self) -> int | None:
        """Where ``--pin`` puts the servers (CPU 0); None leaves them to the scheduler."""
        return 0 if self.pin else None

    @property
    def client_cpu(self) -> int | None:
        """Where ``--pin`` puts the load generator (CPU 1)."""
        return 1 if self.pin else None


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
        against=args.against,
    )


# -- the three measurements ------------------------------------------------------------------


def overhead(plan: Plan, problems: list[str]) -> dict[str, Any]:
    variants = {name: (factory, ROOT) for name, factory in TRIVIAL_VARIANTS.items()}
    with contextlib.ExitStack() as stack:
        if plan.against is not None:
            tree = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="obleth-")))
            variants[f"gateway at {plan.against}"] = (
                "with_gateway",
                gateway_at(plan.against, tree),
            )
        names = list(variants)
        by_name = {}
        for name, (factory, root) in variants.items():
            by_name[name] = Server(factory, cpu=plan.server_cpu, root=root)
            stack.callback(by_name[name].stop)
        for server in by_name.values():
            server.wait_ready()
        for name in names:  # warm-up, not reported
            load(
                by_name[name],
                seconds=1.0,
                connections=plan.connections,
                warmup_s=plan.warmup_s,
                cpu=plan.client_cpu,
            )
        rounds: list[dict[str, dict[str, Any]]] = []
        for index in range(plan.rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            this_round = {}
            for name in order:
                result = load(
                    by_name[name],
                    seconds=plan.seconds,
                    connections=plan.connections,
                    warmup_s=plan.warmup_s,
                    cpu=plan.client_cpu,
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
            "past_layer": statistics.median(
                r[name]["rps"] / r["pass-through"]["rps"] for r in rounds
            ),
            "server_cpu": statistics.median(r.get("server_cpu", math.nan) for r in runs),
            "cpu_us": statistics.median(r.get("cpu_us_per_request", math.nan) for r in runs),
            "client_cpu": statistics.median(r["client_cpu"] for r in runs),
            "per_round": [r["rps"] for r in runs],
            # what this variant adds to bare's server CPU per request, against what the
            # semaphore adds, in the same round
            "added_vs_semaphore": statistics.median(
                added(r, name) / added(r, "naive semaphore") for r in rounds
            ),
        }
    return table


def added(this_round: dict[str, dict[str, Any]], name: str) -> float:
    """The server CPU per request ``name`` adds to bare's, in one round (µs)."""
    bare = this_round["bare"].get("cpu_us_per_request", math.nan)
    cpu_us: float = this_round[name].get("cpu_us_per_request", math.nan) - bare
    return cpu_us


def gateway_at(revision: str, tree: Path) -> Path:
    """``tree``, holding the ``gateway`` package as at commit ``revision``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "gateway"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def queue_throughput(plan: Plan, problems: list[str]) -> dict[str, Any]:
    runs = {
        # name: (factory, clients, seconds)
        "gateway": ("slow_with_gateway", QUEUE_CLIENTS, plan.queue_seconds),
        "naive semaphore": ("slow_with_semaphore", QUEUE_CLIENTS, plan.reference_seconds),
        "no limiter, 64 clients": ("slow_bare", QUEUE_LIMIT, plan.reference_seconds),
    }
    table: dict[str, Any] = {}
    with servers([factory for factory, _, _ in runs.values()], cpu=plan.server_cpu) as running:
        for name, (factory, clients, seconds) in runs.items():
            server = running[factory]
            result = load(
                server,
                seconds=seconds,
                connections=clients,
                warmup_s=plan.warmup_s,
                path="/work",
                cpu=plan.client_cpu,
            )
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
    add(f"software: {software()}")
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
        f"   {'variant':<20}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'ratio':>8}"
        f"{'srv CPU':>9}{'CPU us/req':>11}{'cli CPU':>9}   target"
    )
    for name, row in trivial.items():
        if name == "bare":
            target = "baseline"
        elif name == "gateway":
            target = f">= {RATIO_TARGET:.2f}x  {verdict(row['ratio'] >= RATIO_TARGET)}"
        elif name == "pass-through":
            target = "floor (a middleware doing nothing)"
        elif name == "bare, again":
            target = "noise (the same app, another server)"
        elif name.startswith("gateway at "):
            target = "the gateway as at that commit"
        else:
            target = "reference peer"
        add(
            f"   {name:<20}{row['rps']:>8.0f}{row['p50_ms']:>8.2f}{row['p99_ms']:>8.2f}"
            f"{row['ratio']:>7.3f}x{row['server_cpu']:>9.0%}{row['cpu_us']:>11.1f}"
            f"{row['client_cpu']:>9.0%}   {target}"
        )
    base_us = trivial["bare"]["cpu_us"]
    add(
        "   server CPU added per request: "
        + ", ".join(
            f"{name} {row['cpu_us'] - base_us:+.1f} us ({base_us / row['cpu_us']:.3f}x)"
            for name, row in trivial.items()
            if name != "bare"
        )
    )
    add(
        "   against the pass-through, in the same round (the work inside the middleware): "
        + ", ".join(
            f"{name} {row['past_layer']:.3f}x"
            for name, row in trivial.items()
            if name in ("gateway", "naive semaphore")
        )
    )
    guard = trivial["gateway"]["added_vs_semaphore"]
    add(
        "   server CPU added, against the naive semaphore's in the same round (median of "
        f"rounds): gateway {guard:.2f}x (<= {ADDED_CPU_GUARD:.1f}x  "
        f"{verdict(guard <= ADDED_CPU_GUARD)})"
        + "".join(
            f", {name} {row['added_vs_semaphore']:.2f}x"
            for name, row in trivial.items()
            if name.startswith("gateway at ")
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
        f"{'p99 ms':>9}{'max ran':>9}{'CPU us/req':>11}   target"
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
            f"{row['cpu_us_per_request']:>11.0f}   {target}"
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
    add(
        "   the endpoint's 50 ms sleep took on average: "
        + "; ".join(f"{name} {row['stats']['mean_sleep_ms']:.2f} ms" for name, row in queue.items())
    )
    add(
        "   the 64 seats' time spent asleep in the endpoint (req/s x mean sleep / 64): "
        + "; ".join(
            f"{name} {row['rps'] * row['stats']['mean_sleep_ms'] / 1e3 / QUEUE_LIMIT:.1%}"
            for name, row in queue.items()
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
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also serve the gateway as at this commit, in the same alternation",
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
