"""Obleth side by side with the routers people pick instead, in front of one simulated fleet.

    pip install -e ".[bench]"                 # sglang-router and vllm-router, from PyPI
    python tests/bench/peers.py               # about three minutes
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

Obleth runs its default profile (``prefix-affinity:5,queue-depth:1``); the peers run their
cache-aware policies (``cache_aware``). Routing quality (hit rate, TTFT p99 under
prefix-heavy and uniform load) is ``routing.py``'s. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
from collections.abc import Callable
from importlib.metadata import version

from harness import HOST, ROOT, code_version, free_port, machine, software
from proxy import PLAIN, Process, added_ttft, backend, gateway, saturated

Start = Callable[[list[Process]], Process]


def obleth(fleet: list[Process]) -> Process:
    return gateway(fleet, ROOT)


def sglang(fleet: list[Process]) -> Process:
    port = free_port()
    argv = [
        sys.executable, "-m", "sglang_router.launch_router", "--host", HOST, "--port",
        str(port), "--policy", "cache_aware", "--prometheus-port", str(free_port()),
        "--log-level", "warn", "--worker-urls", *(f"http://{HOST}:{b.port}" for b in fleet),
    ]  # fmt: skip
    return _started(argv, port)


def vllm(fleet: list[Process]) -> Process:
    port = free_port()
    argv = [
        sys.executable, "-c", "from vllm_router.launch_router import main; main()",
        "--host", HOST, "--port", str(port), "--policy", "cache_aware", "--log-level",
        "warning", "--worker-urls", *(f"http://{HOST}:{b.port}" for b in fleet),
    ]  # fmt: skip
    return _started(argv, port)


def _started(argv: list[str], port: int) -> Process:
    served = Process(argv, port)
    asyncio.run(asyncio.sleep(2.0))  # its health checks pass, every worker is in
    return served


ROUTERS: dict[str, tuple[Start, str | None]] = {
    "obleth": (obleth, None),
    "sglang-router": (sglang, "sglang_router"),
    "vllm-router": (vllm, "vllm_router"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--ttft-samples", type=int, default=100)
    args = parser.parse_args()
    routers = {
        name: start
        for name, (start, module) in ROUTERS.items()
        if module is None or importlib.util.find_spec(module) is not None
    }
    versions = ", ".join(
        f"{name} {version(module.replace('_', '-'))}"
        for name, (_, module) in ROUTERS.items()
        if name in routers and module is not None
    )
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
