"""Cross-pod wake-up latency: from ``permit.release()`` on pod A to a waiter on pod B running.

Run as a script (``cluster.py`` starts it in a process of its own, against the
redis-server it started); it prints one JSON object on stdout:

    python tests/bench/crosspod.py --redis-url redis://127.0.0.1:6379/0 --pool p --samples 500

The pods are two ``gateway.Gateway`` objects in this one process, on one event loop
(uvloop when installed), sharing one pool in Redis with limit 1; no HTTP. That is the
whole path of a cross-pod grant (pod A's release goes to Redis in a step call, the script
hands the seat to B's queued waiter and publishes it on B's channel, B's listener reads
the message and resumes the waiter) without the noise of two more processes on a small
machine; the one thing it leaves out is the two pods working in parallel, which only
helps a real deployment. Cases:

- ``publish``: a bare Redis PUBLISH read by a subscriber on another connection, the floor
  of any pub/sub wake-up (one client's round trip plus one delivery).
- ``cross_pod``: one holder, one waiter on the other pod; the holder reads the clock
  just before ``release()``, the waiter right after ``scheduler.acquire()`` returns.
  The pods swap roles on every sample.
- ``same_pod``: holder and waiter on the same pod, for comparison: the grant then comes
  back in the reply to the pod's own call, without pub/sub.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from typing import Any

import redis.asyncio as aioredis
from loadgen import run_on_uvloop  # a sibling script: tests/bench is on sys.path

from gateway import Gateway, Settings
from gateway.backends.redis import RedisBackend
from gateway.core.tickets import Ticket

#: How long one hand-off may take before the run is declared broken (the lease TTL's
#: heartbeat would pick up a lost grant after about 3 s).
STEP_TIMEOUT_S = 5.0


def summary(samples: list[float]) -> dict[str, float]:
    """p50 / p99 / max of samples given in seconds, in milliseconds (nearest rank)."""
    ordered = sorted(samples)
    if not ordered:
        return {"samples": 0, "p50_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan}

    def at(fraction: float) -> float:
        return ordered[max(1, math.ceil(fraction * len(ordered))) - 1] * 1e3

    return {"samples": len(ordered), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0)}


async def publish_floor(redis_url: str, channel: str, samples: int, warmup: int) -> list[float]:
    """PUBLISH on one connection, read on a subscribed one; the time to delivery."""
    client = aioredis.Redis.from_url(redis_url, socket_timeout=STEP_TIMEOUT_S)
    pubsub = client.pubsub()
    latencies: list[float] = []
    try:
        await pubsub.subscribe(channel)
        await pubsub.get_message(timeout=STEP_TIMEOUT_S)  # the subscribe confirmation
        for i in range(warmup + samples):
            sent = time.perf_counter()
            await client.publish(channel, str(i))
            message = await pubsub.get_message(
                ignore_subscribe_messages=True, timeout=STEP_TIMEOUT_S
            )
            received = time.perf_counter()
            if message is None:
                raise RuntimeError("a published message did not arrive")
            if i >= warmup:
                latencies.append(received - sent)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await client.aclose()
    return latencies


def backend_of(gateway: Gateway) -> RedisBackend:
    backend = gateway.backend
    if not isinstance(backend, RedisBackend):
        raise RuntimeError("the pods must run in cluster mode (redis_url set)")
    return backend


async def queued_in_redis(gateway: Gateway) -> None:
    """Return once the pool, as ``gateway`` last heard from Redis, has a waiter."""
    deadline = time.perf_counter() + STEP_TIMEOUT_S
    while gateway.snapshot().queued < 1:
        if time.perf_counter() > deadline:
            raise RuntimeError("the waiter never queued in Redis; the measurement would be wrong")
        await asyncio.sleep(0.0005)


async def hand_offs(pods: list[Gateway], samples: int, warmup: int, cross: bool) -> list[float]:
    """Holder on one pod, waiter on ``pods[1]`` (``cross``) or the holder's pod; one sample
    per hand-off, roles swapped every time so both directions count."""
    ticket = Ticket(tenant="wake")
    latencies: list[float] = []

    async def wait_for_seat(pod: Gateway) -> float:
        permit = await pod.scheduler.acquire(ticket)
        woke = time.perf_counter()
        permit.release()
        return woke

    for i in range(warmup + samples):
        holder_pod = pods[i % 2]
        waiter_pod = pods[(i + 1) % 2] if cross else holder_pod
        held = await asyncio.wait_for(holder_pod.scheduler.acquire(ticket), STEP_TIMEOUT_S)
        waiter = asyncio.create_task(wait_for_seat(waiter_pod))
        try:
            await queued_in_redis(waiter_pod)
            released_at = time.perf_counter()
            held.release()
            woke = await asyncio.wait_for(waiter, STEP_TIMEOUT_S)
        finally:
            held.release()
            waiter.cancel()
        for pod in pods:  # a quiet pool before the next sample
            await asyncio.wait_for(backend_of(pod).settled(), STEP_TIMEOUT_S)
        if i >= warmup:
            latencies.append(woke - released_at)
    return latencies


async def measure(redis_url: str, pool: str, samples: int) -> dict[str, Any]:
    warmup = max(samples // 10, 20)
    settings = Settings(
        global_max_in_flight=1,
        max_queue=16,
        queue_timeout_s=30,
        redis_url=redis_url,
        pool=pool,
        learning_window_s=0,  # a new pool: nobody has leases to re-assert
    )
    pods = [Gateway(settings, entry_points=False) for _ in range(2)]
    result: dict[str, Any] = {}
    for pod in pods:
        await pod.start()
    try:
        result["publish"] = summary(
            await publish_floor(redis_url, f"bench-floor-{pool}", samples, warmup)
        )
        result["cross_pod"] = summary(await hand_offs(pods, samples, warmup, cross=True))
        result["same_pod"] = summary(await hand_offs(pods, samples, warmup, cross=False))
        result["calls"] = sum(backend_of(pod).calls for pod in pods)
        snapshot = pods[0].snapshot()
        result["after"] = {"inflight": snapshot.inflight, "queued": snapshot.queued}
    finally:
        for pod in pods:
            await pod.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--pool", required=True, help="a pool name nobody else uses")
    parser.add_argument("--samples", type=int, default=500)
    args = parser.parse_args()
    result, loop_name = run_on_uvloop(measure(args.redis_url, args.pool, args.samples))
    result["loop"] = loop_name
    print(json.dumps(result))


if __name__ == "__main__":
    main()
