"""Local wake-up latency: from ``permit.release()`` to the next waiter running, in process.

Run as a script (the overhead benchmark starts it in a process of its own); it prints one
JSON object on stdout. No HTTP is involved: this is the gate's hand-off alone, on the same
event loop as the server's (uvloop when installed).

- ``semaphore``: the same hand-off through an ``asyncio.Semaphore(1)``, the floor any
  asyncio limiter pays (one trip through the loop's ready queue).
- ``idle``: limit 1, one holder, one waiter; the holder reads the clock just before
  ``release()``, the waiter right after ``acquire()`` returns.
- ``loaded``: limit 16, 216 tasks cycling acquire / hold 1-5 ms / release, so about 200
  wait at any time; every wake-up is paired with the release that granted it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from loadgen import run_on_uvloop  # a sibling script: tests/bench is on sys.path

from gateway import Gateway, Settings
from gateway.core.tickets import Ticket

TICKET = Ticket(tenant="t")


def summary(samples: list[float]) -> dict[str, float]:
    """p50 / p99 / max of samples given in seconds, in microseconds (nearest rank)."""
    ordered = sorted(samples)
    if not ordered:
        return {"samples": 0, "p50_us": math.nan, "p99_us": math.nan, "max_us": math.nan}

    def at(fraction: float) -> float:
        return ordered[max(1, math.ceil(fraction * len(ordered))) - 1] * 1e6

    return {"samples": len(ordered), "p50_us": at(0.5), "p99_us": at(0.99), "max_us": at(1.0)}


async def ping_pong(
    acquire: Callable[[], Awaitable[Callable[[], object]]],
    queued: Callable[[], int],
    samples: int,
    warmup: int,
) -> list[float]:
    """Holder and waiter take turns; one sample per hand-off."""
    latencies: list[float] = []

    async def wait_for_turn() -> float:
        release = await acquire()
        woke = time.perf_counter()
        release()
        return woke

    for i in range(warmup + samples):
        release_held = await acquire()
        waiter = asyncio.create_task(wait_for_turn())
        for _ in range(100):  # bounded: the waiter queues on its first step
            await asyncio.sleep(0)
            if queued() == 1:
                break
        else:
            raise RuntimeError("the waiter never queued; the measurement would be wrong")
        released_at = time.perf_counter()
        release_held()
        woke = await waiter
        if i >= warmup:
            latencies.append(woke - released_at)
    return latencies


async def semaphore_hand_off(samples: int, warmup: int) -> list[float]:
    semaphore = asyncio.Semaphore(1)
    waiting = 0

    async def acquire() -> Callable[[], object]:
        nonlocal waiting
        waiting += 1
        try:
            await semaphore.acquire()
        finally:
            waiting -= 1
        return semaphore.release

    return await ping_pong(acquire, lambda: waiting, samples, warmup)


async def gateway_idle(samples: int, warmup: int) -> list[float]:
    gateway = Gateway(Settings(global_max_in_flight=1, max_queue=16, queue_timeout_s=30))
    await gateway.start()

    async def acquire() -> Callable[[], object]:
        permit = await gateway.scheduler.acquire(TICKET)
        return permit.release

    try:
        return await ping_pong(acquire, lambda: gateway.snapshot().queued, samples, warmup)
    finally:
        await gateway.stop()


async def gateway_loaded(
    samples: int, warmup: int, max_seconds: float, limit: int = 16, waiters: int = 200
) -> list[float]:
    gateway = Gateway(Settings(global_max_in_flight=limit, max_queue=4096, queue_timeout_s=60))
    await gateway.start()
    scheduler = gateway.scheduler
    rng = random.Random(7)
    # The gate's state mirrored here, updated in the same synchronous steps as the gate
    # (one tenant, one seat each, a fixed limit): a release grants exactly one waiter
    # whenever one waits, and granted waiters resume in the order they were granted.
    holding = 0
    waiting = 0
    grant_times: deque[float] = deque()
    latencies: list[float] = []
    stop = False
    enough = asyncio.Event()

    async def worker() -> None:
        nonlocal holding, waiting
        while not stop:
            queued = holding >= limit or waiting > 0
            if queued:
                waiting += 1
            else:
                holding += 1
            permit = await scheduler.acquire(TICKET)
            if queued:
                latencies.append(time.perf_counter() - grant_times.popleft())
                if len(latencies) >= warmup + samples:
                    enough.set()
            await asyncio.sleep(rng.uniform(0.001, 0.005))
            if waiting:
                waiting -= 1  # the seat passes straight to the head of the queue
                grant_times.append(time.perf_counter())
            else:
                holding -= 1
            permit.release()

    tasks = [asyncio.create_task(worker()) for _ in range(limit + waiters)]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(enough.wait(), max_seconds)
    stop = True
    _, late = await asyncio.wait(tasks, timeout=10)
    if late:
        raise RuntimeError(f"{len(late)} workers did not finish after stop")
    snapshot = gateway.snapshot()
    if grant_times or snapshot.inflight or snapshot.queued or holding or waiting:
        raise RuntimeError(f"hand-offs were not paired one to one: {snapshot}")
    await gateway.stop()
    return latencies[warmup : warmup + samples]


async def measure(samples: int, max_seconds: float) -> dict[str, Any]:
    warmup = max(samples // 10, 50)
    return {
        "semaphore": summary(await semaphore_hand_off(samples, warmup)),
        "idle": summary(await gateway_idle(samples, warmup)),
        "loaded": summary(await gateway_loaded(samples, warmup, max_seconds)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--max-seconds", type=float, default=20.0, help="bound of the loaded run")
    args = parser.parse_args()
    coroutine = measure(args.samples, args.max_seconds)
    result, loop_name = run_on_uvloop(coroutine)
    result["loop"] = loop_name
    print(json.dumps(result))


if __name__ == "__main__":
    main()
