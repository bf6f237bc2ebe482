"""Chaos soak: cluster mode under a mix of misbehaving clients and every Redis fault at once.

    python tests/bench/soak.py              # 10 000 requests, about 2 minutes
    python tests/bench/soak.py --quick      # 2 000 requests, a smoke run

Three uvicorn pods (``tests/cluster/podapp.py``: the gateway in front of the streaming
proxy) share one real redis-server and one simulated backend (``obleth mock-backend``),
whose own count of requests in flight is the ground truth. The pods run as an operator
would: ``local`` failure mode, the default learning window (the roll call's fallback), a
lease TTL of 1.5 s.

The requests, drawn from a seeded mix: plain completions; streams the client hangs up on
after the first chunk; uploads cut off half-way; requests abandoned while they wait for a
seat; requests whose app raises (``POST /_pod/raise``); and requests the client gives up
on (a client timeout shorter than the completion). Meanwhile, spread over the run:
``FLUSHALL``, Redis frozen by ``SIGSTOP`` for 2 s, Redis restarted empty, and one pod
killed with ``kill -9``.

It prints: the backend's peak of requests in flight against the limit; admitted against
released per surviving pod; the leases and waiters left in Redis once the load has
stopped and a TTL has passed; and the longest stretch without a single successful
completion, over the run and after each fault. Targets (printed, never asserted): the
peak at or under the limit, no leak, no stall over 1 s. The exit status is 1 only when
the run is invalid (a plain completion that failed for no fault's sake, a pod that did
not start).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the tests helpers and the gateway package, from this checkout

import httpx  # noqa: E402
from harness import code_version, machine, verdict  # noqa: E402

from gateway.backends.redis.audit import PoolAudit, audit_sync  # noqa: E402
from tests.cluster.pods import HOST, Pod, Pods, SimBackend  # noqa: E402
from tests.cluster.steady import longest_gap  # noqa: E402
from tests.redis_procs import RedisServer  # noqa: E402

LIMIT = 6
TTL_S = 1.5
KINDS = {  # kind -> share of the requests
    "complete": 0.62,
    "stream-cut": 0.10,
    "upload-cut": 0.06,
    "queued-cut": 0.08,
    "raise": 0.06,
    "client-timeout": 0.08,
}
TENANTS = ("gold", "silver", "bronze", "free")


@dataclass
class Run:
    """What the load saw, request by request kind."""

    outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    completions: list[float] = field(default_factory=list)
    """When each successful plain completion or stream ended (monotonic)."""
    faults: list[tuple[str, float]] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0

    def count(self, kind: str, outcome: str) -> None:
        self.outcomes.setdefault(kind, Counter())[outcome] += 1

    def answered(self) -> int:
        return sum(sum(outcomes.values()) for outcomes in list(self.outcomes.values()))

    def longest_gap(self, after: float, before: float) -> float:
        return longest_gap(self.completions, after, before)


def settings(url: str) -> dict[str, str]:
    return {
        "OBLETH_REDIS_URL": url,
        "OBLETH_POOL": "soak",
        "OBLETH_GLOBAL_MAX_IN_FLIGHT": str(LIMIT),
        "OBLETH_LEASE_TTL_S": str(TTL_S),
        "OBLETH_REDIS_RETRY_BUDGET_S": "0.5",
        "OBLETH_REDIS_FAILURE_MODE": "local",
        "OBLETH_TENANT_HEADER": "x-tenant",
        "OBLETH_MAX_QUEUE": "4096",
        "OBLETH_QUEUE_TIMEOUT_S": "30",
    }


class Alive:
    """The pods' URLs the load may still use (a killed pod leaves it)."""

    def __init__(self, urls: list[str]) -> None:
        self._urls = list(urls)
        self._lock = threading.Lock()

    def pick(self, n: int) -> str:
        with self._lock:
            return self._urls[n % len(self._urls)]

    def remove(self, url: str) -> None:
        with self._lock:
            self._urls.remove(url)


async def one(
    http: httpx.AsyncClient, run: Run, url: str, kind: str, tenant: str, rng: random.Random
) -> None:
    headers = {"x-tenant": tenant}
    endpoint = url + "/v1/completions"
    try:
        if kind == "complete":
            body = {"prompt": f"soak {rng.random()}", "max_tokens": rng.randint(4, 40)}
            answer = await http.post(endpoint, json=body, headers=headers)
            if answer.status_code == 200:
                run.completions.append(time.monotonic())
            run.count(kind, str(answer.status_code))
        elif kind == "stream-cut":
            body = {"prompt": "cut me", "max_tokens": 300, "stream": True}
            async with http.stream("POST", endpoint, json=body, headers=headers) as answer:
                async for _ in answer.aiter_bytes():
                    break  # leaving the block mid-stream closes the connection
            run.count(kind, str(answer.status_code))
        elif kind == "upload-cut":
            await cut_upload(url, tenant)
            run.count(kind, "sent half")
        elif kind == "queued-cut":
            body = {"prompt": "gone soon", "max_tokens": 10}
            try:
                async with asyncio.timeout(rng.uniform(0.002, 0.03)):
                    answer = await http.post(endpoint, json=body, headers=headers)
                run.count(kind, str(answer.status_code))
            except TimeoutError:
                run.count(kind, "abandoned")
        elif kind == "raise":
            answer = await http.post(url + "/_pod/raise", json={}, headers=headers)
            run.count(kind, str(answer.status_code))
        else:
            body = {"prompt": "too slow for me", "max_tokens": 400}
            answer = await http.post(endpoint, json=body, headers=headers, timeout=0.2)
            run.count(kind, str(answer.status_code))
    except httpx.TimeoutException:
        run.count(kind, "client timeout")
    except httpx.HTTPError as exc:
        run.count(kind, type(exc).__name__)


async def cut_upload(url: str, tenant: str) -> None:
    """A POST announcing 20 000 bytes of body that sends 200 of them and hangs up."""
    port = int(url.rsplit(":", 1)[1])
    _, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n"
            b"x-tenant: " + tenant.encode() + b"\r\ncontent-length: 20000\r\n\r\n"
            b'{"prompt": "' + b"x" * 188
        )
        await writer.drain()
        await asyncio.sleep(0.02)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def load(alive: Alive, run: Run, requests: int, concurrency: int, seed: int) -> None:
    rng = random.Random(seed)
    kinds = rng.choices(list(KINDS), weights=list(KINDS.values()), k=requests)
    plan = iter(enumerate(kinds))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(trust_env=False, timeout=30, limits=limits) as http:

        async def worker() -> None:
            for i, kind in plan:
                await one(http, run, alive.pick(i), kind, TENANTS[i % len(TENANTS)], rng)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def faults(
    run: Run, redis: RedisServer, pods: Pods, alive: Alive, requests: int, stop: threading.Event
) -> None:
    """FLUSHALL, a 2 s SIGSTOP, a restart and a kill -9, once a fifth, two fifths, three
    fifths and four fifths of the requests have been answered."""
    steps = [
        ("FLUSHALL", lambda: _flushall(redis)),
        ("SIGSTOP Redis 2 s", lambda: _freeze(redis, 2.0)),
        ("Redis restart", redis.restart_empty),
        ("kill -9 pod2", lambda: _kill(pods, alive)),
    ]
    for n, (name, act) in enumerate(steps, start=1):
        while run.answered() < requests * n / 5:
            if stop.wait(0.05):
                return
        run.faults.append((name, time.monotonic()))
        act()


def _flushall(redis: RedisServer) -> None:
    with redis.sync_client() as client:
        client.flushall()


def _freeze(redis: RedisServer, seconds: float) -> None:
    redis.pause()
    try:
        time.sleep(seconds)
    finally:
        redis.resume()


def _kill(pods: Pods, alive: Alive) -> None:
    alive.remove(pods[2].url)
    pods[2].kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=48)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="2 000 requests: a smoke run")
    args = parser.parse_args()
    requests = 2_000 if args.quick else args.requests
    print(f"$ python tests/bench/soak.py{' --quick' if args.quick else ''}")
    print(f"code: {code_version()}; machine: {machine()}")
    print(
        f"3 pods, limit {LIMIT}, lease TTL {TTL_S} s, local failure mode, default learning "
        f"window; {requests} requests, {args.concurrency} at a time, seed {args.seed}"
    )

    run = Run()
    with (
        SimBackend(step_ms=2.0) as sim,
        RedisServer() as redis,
        Pods(3, sim.url, env=settings(redis.url)) as pods,
    ):
        alive = Alive(pods.urls)
        sim.reset()
        stop = threading.Event()
        chaos = threading.Thread(
            target=faults, args=(run, redis, pods, alive, requests, stop), daemon=True
        )
        run.started = time.monotonic()
        chaos.start()
        asyncio.run(load(alive, run, requests, args.concurrency, args.seed))
        run.ended = time.monotonic()
        stop.set()
        chaos.join()
        peak = int(sim.stats()["max_concurrency"])
        survivors = [pods[0], pods[1]]
        stats = _settled(survivors)
        time.sleep(TTL_S + 0.5)  # the killed pod's leases expire
        with redis.sync_client() as client:
            pool = audit_sync(client, "soak")

    return report(run, peak, stats, pool)


def _settled(survivors: list[Pod]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while True:
        stats = [pod.stats() for pod in survivors]
        idle = all(s["admitted"] == s["released"] and s["inflight"] == 0 for s in stats)
        if idle or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def report(run: Run, peak: int, stats: list[dict[str, Any]], pool: PoolAudit) -> int:
    print(f"\nran {run.ended - run.started:.1f} s")
    print("\n| request kind | outcomes |\n| --- | --- |")
    for kind in KINDS:
        outcomes = ", ".join(f"{k}: {v}" for k, v in sorted(run.outcomes.get(kind, {}).items()))
        print(f"| {kind} | {outcomes} |")
    stalls = [("whole run", run.started + 0.5, run.ended - 0.2)]
    for i, (name, at) in enumerate(run.faults):
        until = run.faults[i + 1][1] if i + 1 < len(run.faults) else run.ended - 0.2
        stalls.append((f"after {name}", at, until))
    print("\n| window | longest stall (no successful completion) |\n| --- | --- |")
    worst = 0.0
    for name, after, before in stalls:
        gap = run.longest_gap(after, before)
        worst = max(worst, gap)
        print(f"| {name} | {gap * 1000:.0f} ms |")
    leaked = [s for s in stats if s["admitted"] != s["released"]]
    print("\n| pod | admitted | released |\n| --- | --- | --- |")
    for i, s in enumerate(stats):
        print(f"| pod{i} | {s['admitted']} | {s['released']} |")
    print("| pod2 | (killed with kill -9) | |")
    print(
        f"\nbackend peak {peak} against the limit {LIMIT}: {verdict(peak <= LIMIT)}\n"
        f"leases left after the drain {pool.leases}, waiters {pool.waiters}, seats counted "
        f"{pool.inflight}; pool consistent: {pool.ok}: "
        f"{verdict(pool.empty and pool.ok and not leaked)}\n"
        f"longest stall {worst * 1000:.0f} ms (target 1000 ms): {verdict(worst <= 1.0)}"
    )
    # a plain completion may only fail by the killed pod's hand (its connection dropped)
    plain = run.outcomes.get("complete", Counter())
    refused = {k: v for k, v in plain.items() if k.isdigit() and k != "200"}
    if refused:
        print(f"INVALID: plain completions answered {refused}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
