"""What ``obleth serve`` costs per proxied request, and what it adds to time to first token.

    python tests/bench/proxy.py                    # about a minute
    python tests/bench/proxy.py --against REV      # also obleth serve as at commit REV

A fleet of 4 simulated backends (``obleth mock-backend``, one decode step of 1 ms, no
prefill time, so the backends are never what limits) behind one ``obleth serve`` with the
default routing profile. Two measurements:

1. **CPU per request at saturation**: 32 keep-alive connections send the same small
   completion request back to back, non-streamed (a one-token answer with a
   Content-Length) and streamed (server-sent events, 4 tokens), for ``--seconds``; the
   gateway process's CPU time over the window, per request. With ``--against REV``, the
   gateway at commit REV (from a temporary worktree) is measured the same way, in
   alternation, and the ratio printed. Target (issue 23): 0.5 ms or less, streamed or not.
2. **Added time to first token at low load**: one client sends streamed requests one at a
   time, alternately straight to a backend and through the gateway; the difference of the
   medians of the time to the first body byte. Target: 1.5 ms or less.

Printed, never asserted; exit status 1 when a run is invalid (errors, non-200 answers).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from harness import (
    HOST,
    ROOT,
    child_env,
    code_version,
    free_port,
    load,
    machine,
    software,
    stop_process,
)

BACKENDS = 4
CONNECTIONS = 32
PROMPT = "Hello there, how are you today? Tell me about routers."
PLAIN = json.dumps({"model": "obleth-sim", "prompt": PROMPT, "max_tokens": 1})
STREAMED = json.dumps({"model": "obleth-sim", "prompt": PROMPT, "max_tokens": 4, "stream": True})
TARGET_CPU_US = 500.0
TARGET_TTFT_MS = 1.5


class Process:
    """A child process serving HTTP on ``port``; ``pid`` for its CPU time."""

    def __init__(
        self,
        argv: list[str],
        port: int,
        root: Path = ROOT,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port
        self.process = subprocess.Popen(
            argv, cwd=root, env=child_env(env, root=root), stdout=subprocess.DEVNULL
        )
        self.pid = self.process.pid
        try:
            self._wait_listening(argv, port)
        except BaseException:  # not started, or the run stopped meanwhile: none left behind
            self.stop()
            raise

    def _wait_listening(self, argv: list[str], port: int) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{argv[2:4]} exited at startup")
            with contextlib.suppress(OSError), socket.create_connection((HOST, port), 0.2):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{argv[2:4]} not listening after 20 s")

    def stop(self) -> None:
        stop_process(self.process)


def backend() -> Process:
    port = free_port()
    argv = [
        sys.executable, "-m", "gateway", "mock-backend", "--port", str(port),
        "--log-level", "warning", "--step-ms", "1", "--prefill-ms-per-token", "0",
        "--max-num-seqs", "256",
    ]  # fmt: skip
    return Process(argv, port)


def gateway(upstreams: list[Process], root: Path) -> Process:
    port = free_port()
    argv = [
        sys.executable, "-m", "gateway", "serve", "--port", str(port), "--log-level",
        "warning", "--max-in-flight", "256",
    ]  # fmt: skip
    for upstream in upstreams:
        argv += ["--upstream", f"http://{HOST}:{upstream.port}"]
    served = Process(argv, port, root)
    time.sleep(1.0)  # a few polls: every upstream healthy
    return served


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="obleth-proxy-bench-"))
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(folder), rev], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], check=False)
        shutil.rmtree(folder, ignore_errors=True)


def saturated(server: Process, body: str, seconds: float) -> dict[str, Any]:
    result = load(
        server,  # type: ignore[arg-type]  # has port and pid, all load() reads
        seconds=seconds,
        connections=CONNECTIONS,
        warmup_s=1.0,
        path="/v1/completions",
        body=body,
    )
    bad = {k: v for k, v in result["statuses"].items() if k != "200"}
    if result["errors"] or bad or not result["requests"]:
        raise SystemExit(f"invalid run: {result['errors']} {result['statuses']}")
    return result


async def first_byte_ms(port: int, request: bytes) -> float:
    """Milliseconds from writing ``request`` on a fresh connection to its first body byte."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        started = time.perf_counter()
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"invalid answer: {head[:100]!r}")
        await reader.readexactly(1)
        return (time.perf_counter() - started) * 1e3
    finally:
        writer.close()


def streamed_request(port: int) -> bytes:
    body = STREAMED.encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


async def added_ttft(direct: int, through: int, samples: int) -> tuple[float, float]:
    """Median time to first byte straight to a backend and through the gateway, in ms."""
    found: dict[int, list[float]] = {direct: [], through: []}
    for _ in range(samples):
        for port in (direct, through):
            found[port].append(await first_byte_ms(port, streamed_request(port)))
    return statistics.median(found[direct]), statistics.median(found[through])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--against", metavar="REV", help="also measure commit REV")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"# {machine()}\n# {software()}\n# code {code_version()}")
    print(f"# {BACKENDS} backends, {CONNECTIONS} connections, {args.rounds} rounds\n")
    fleet = [backend() for _ in range(BACKENDS)]
    try:
        with contextlib.ExitStack() as stack:
            roots = {"this code": ROOT}
            if args.against:
                roots[args.against] = stack.enter_context(worktree(args.against))
            cpu: dict[tuple[str, str], list[float]] = {}
            rps: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.rounds):
                for name, root in roots.items():
                    served = gateway(fleet, root)
                    try:
                        for kind, body in (("non-streamed", PLAIN), ("streamed", STREAMED)):
                            result = saturated(served, body, args.seconds)
                            cpu.setdefault((name, kind), []).append(result["cpu_us_per_request"])
                            rps.setdefault((name, kind), []).append(result["rps"])
                    finally:
                        served.stop()
            print(f"{'gateway':<14} {'requests':<13} {'CPU µs/request':>15} {'req/s':>8}")
            for (name, kind), values in cpu.items():
                median = statistics.median(values)
                rate = statistics.median(rps[(name, kind)])
                print(f"{name:<14} {kind:<13} {median:>15.0f} {rate:>8.0f}")
            if args.against:
                for kind in ("non-streamed", "streamed"):
                    now = statistics.median(cpu[("this code", kind)])
                    then = statistics.median(cpu[(args.against, kind)])
                    print(f"{kind}: {then / now:.1f}x less CPU per request than {args.against}")
            for kind in ("non-streamed", "streamed"):
                now = statistics.median(cpu[("this code", kind)])
                verdict = "met" if now <= TARGET_CPU_US else "MISSED"
                print(f"{kind}: {now:.0f} µs per request, target ≤ {TARGET_CPU_US:.0f} {verdict}")
            served = gateway(fleet, ROOT)
            try:
                direct, through = asyncio.run(added_ttft(fleet[0].port, served.port, 200))
            finally:
                served.stop()
            added = through - direct
            verdict = "met" if added <= TARGET_TTFT_MS else "MISSED"
            print(
                f"\ntime to first byte at low load, p50: {direct:.2f} ms straight to a backend, "
                f"{through:.2f} ms through the gateway: +{added:.2f} ms "
                f"(target ≤ {TARGET_TTFT_MS} ms {verdict})"
            )
    finally:
        for process in fleet:
            process.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
