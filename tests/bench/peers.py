"""Obleth side by side with the routers people pick instead, in front of one simulated fleet.

    pip install -e ".[bench]"                 # sglang-router and vllm-router, from PyPI
    python tests/bench/peers.py               # about twelve minutes
    python tests/bench/peers.py --rounds 3 --seconds 6

Each router that is installed (``obleth serve`` always; sglang-router and vllm-router
when their packages are) sits in turn in front of the same four ``obleth mock-backend``
servers (as in ``proxy.py``: one decode step of 1 ms, no prefill time) and gets the same
load, in interleaved rounds; the figures are medians over rounds:

- **CPU per request at saturation**: 32 keep-alive connections, non-streamed one-token
  completions back to back; the router process's CPU time (all its threads) per request,
  and the requests per second it reached on this shared two-core machine.
- **Added time to first token at low load**: one client, streamed requests one at a time,
  alternately straight to a backend and through the router (``proxy.py``'s measure).

- **Routing quality**: ``routing.py``'s fleet (prefill-heavy timing, small prefix caches)
  and its ``prefix-heavy`` and ``uniform`` workloads at 80 % load, through each router in
  turn, one run per seed (``--seeds``), the routers interleaved within a seed: the
  backends' prefix-cache hit rate and the TTFT p99, medians over the seeds with their
  range. ``--no-quality`` skips it.

Obleth runs its default profile (``prefix-affinity:5,queue-depth:1``); the peers run their
cache-aware policies (``cache_aware``). Printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import statistics
import sys
from collections.abc import Callable
from importlib.metadata import version

from harness import HOST, ROOT, code_version, free_port, machine, software
from proxy import PLAIN, Process, added_ttft, backend, gateway, saturated

Start = Callable[[list[Process]], Process]


def sglang_argv(urls: list[str], port: int) -> list[str]:
    return [
        sys.executable, "-m", "sglang_router.launch_router", "--host", HOST, "--port",
        str(port), "--policy", "cache_aware", "--prometheus-port", str(free_port()),
        "--log-level", "warn", "--worker-urls", *urls,
    ]  # fmt: skip


def vllm_argv(urls: list[str], port: int) -> list[str]:
    return [
        sys.executable, "-c", "from vllm_router.launch_router import main; main()",
        "--host", HOST, "--port", str(port), "--policy", "cache_aware", "--log-level",
        "warning", "--worker-urls", *urls,
    ]  # fmt: skip


#: each peer: how to start it in front of upstream URLs, and the module it needs
PEERS: dict[str, tuple[Callable[[list[str], int], list[str]], str]] = {
    "sglang-router": (sglang_argv, "sglang_router"),
    "vllm-router": (vllm_argv, "vllm_router"),
}


def installed_peers() -> list[str]:
    return [name for name, (_, module) in PEERS.items() if importlib.util.find_spec(module)]


def start_peer(name: str, urls: list[str]) -> Process:
    """Peer router ``name`` in front of ``urls``, once its health checks let every
    upstream in."""
    port = free_port()
    served = Process(PEERS[name][0](urls, port), port)
    asyncio.run(asyncio.sleep(2.0))
    return served


def _fleet_urls(fleet: list[Process]) -> list[str]:
    return [f"http://{HOST}:{b.port}" for b in fleet]


ROUTERS: dict[str, Start] = {
    "obleth": lambda fleet: gateway(fleet, ROOT),
    **{name: (lambda fleet, name=name: start_peer(name, _fleet_urls(fleet))) for name in PEERS},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--ttft-samples", type=int, default=100)
    parser.add_argument(
        "--quality-seconds", type=float, default=20.0, help="arrivals per routing-quality run"
    )
    parser.add_argument("--seeds", default="11,12,13", help="routing-quality seeds, e.g. 11,12")
    parser.add_argument("--no-quality", action="store_true", help="skip routing quality")
    args = parser.parse_args()
    peers = installed_peers()
    routers = {name: start for name, start in ROUTERS.items() if name == "obleth" or name in peers}
    versions = ", ".join(f"{name} {version(PEERS[name][1].replace('_', '-'))}" for name in peers)
    print(f"# {machine()}\n# {software()}\n# code {code_version()}\n# peers: {versions or 'none'}")
    print(f"# 4 backends, 32 connections, {args.rounds} rounds of {args.seconds} s\n")
    fleet = [backend() for _ in range(4)]
    cpu: dict[str, list[float]] = {name: [] for name in routers}
    rps: dict[str, list[float]] = {name: [] for name in routers}
    ttft: dict[str, list[float]] = {name: [] for name in routers}
    try:
        for _ in range(args.rounds):
            for name, start in routers.items():
                served = start(fleet)
                try:
                    result = saturated(served, PLAIN, args.seconds)
                    cpu[name].append(result["cpu_us_per_request"])
                    rps[name].append(result["rps"])
                    direct, through = asyncio.run(
                        added_ttft(fleet[0].port, served.port, args.ttft_samples)
                    )
                    ttft[name].append(through - direct)
                finally:
                    served.stop()
    finally:
        for process in fleet:
            process.stop()
    print(f"{'router':<15} {'CPU µs/request':>15} {'req/s':>8} {'added TTFT p50 ms':>18}")
    for name in routers:
        print(
            f"{name:<15} {statistics.median(cpu[name]):>15.0f} "
            f"{statistics.median(rps[name]):>8.0f} {statistics.median(ttft[name]):>+18.2f}"
        )
    if not args.no_quality:
        seeds = [int(seed) for seed in args.seeds.split(",")]
        routing_quality(["obleth", *peers], seeds, args.quality_seconds)
    return 0


def routing_quality(routers: list[str], seeds: list[int], seconds: float) -> None:
    """``routing.py``'s workloads at 80 % load, through each router in turn (Obleth with
    its default profile), one run per seed, the routers interleaved within a seed: the
    backends' hit rate and the TTFT p99, medians over the seeds with their range."""
    import routing

    print(f"\n# routing quality: routing.py's fleet, 80 % load, {seconds} s, seeds {seeds}")
    profiles = {name: routing.WEIGHTED if name == "obleth" else name for name in routers}
    with contextlib.ExitStack() as stack:
        backends = routing.fleet(stack)
        for workload in ("prefix-heavy", "uniform"):
            runs: dict[str, list[routing.Result]] = {name: [] for name in routers}
            for seed in seeds:
                for name in routers:
                    run = routing.run_one(
                        backends, None, workload, profiles[name], 1, seconds, 0.8, seed, 0.25
                    )
                    runs[name].append(run)
            head = f"{'hit rate':>9} {'TTFT p99 ms (min to max)':>26} {'failed':>7}"
            print(f"\n{workload:<15} {head}")
            for name, results in runs.items():
                p99 = [r.row()["ttft_p99_ms"] for r in results]
                hits = statistics.median(r.hit_rate for r in results)
                failed = sum(r.row()["failed"] for r in results)
                print(
                    f"{name:<15} {hits:>9.3f} {statistics.median(p99):>8.0f} "
                    f"({min(p99):.0f} to {max(p99):.0f}){failed:>7}"
                )


if __name__ == "__main__":
    sys.exit(main())
