"""Routing quality: four simulated backends, Poisson load, four routing profiles, 1 and 3 pods.

    python tests/bench/routing.py                  # everything (about 15 minutes)
    python tests/bench/routing.py --seconds 20 --pods 1 --workloads prefix-heavy
    python tests/bench/routing.py --decision-only  # the micro-benchmark alone

Every process is real: four ``obleth mock-backend`` servers, one or three ``obleth serve``
gateway pods in front of them (three pods share a real ``redis-server``, as in
production), and this process as the client. For each workload, profile and pod count the
backends are reset (counters and prefix caches emptied), fresh gateway pods start with the
profile, and one seeded Poisson arrival sequence is replayed through them, spread over the
pods in turn: first a warm-up (``--warmup`` of the arrivals, not measured, so that caches
hold what a running service's hold), then, once it has drained, the measured ``--seconds``.
Every request streams; TTFT is the time to its first token.

The timing model of the backends (``SIM``) stands for a GPU server where prefill is
expensive: a 2 000-token prompt that misses the prefix cache costs 0.2 s of prefill, which
stalls the whole batch for that step. Each backend's prefix cache holds about six of the
sixteen system prompts, so a router that scatters them thrashes every cache.

"About 80 % of the fleet's capacity": ``capacity()`` computes the request rate the fleet
sustains with full batches when every prompt misses the cache (the worst case, so that
every profile could keep up in principle), and the arrivals run at ``--load`` of it.

The hit rate is the backends' own: the change in ``vllm:prefix_cache_hits_total`` over
``vllm:prefix_cache_queries_total`` (tokens) during the run.

The decision micro-benchmark routes in-process over 64 upstreams with fresh readings, the
default weighted profile and a warm prefix index, and prints microseconds per decision
against round-robin over the same upstreams (the baseline) and the 100 µs target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the tests helpers and the gateway package, from this checkout

import httpx  # noqa: E402

from tests.cluster.pods import ServePod, SimBackend  # noqa: E402
from tests.redis_procs import RedisServer  # noqa: E402

BACKENDS = 4
SIM = {
    "max_num_seqs": 8,
    "step_ms": 20.0,
    "step_ms_per_seq": 1.0,
    "prefill_ms_per_token": 0.1,
    "block_size_tokens": 16,
    "chars_per_token": 4,
    "prefix_cache_blocks": 800,
}
MAX_TOKENS = 16
SYSTEM_PROMPTS = 16
SYSTEM_TOKENS = 2000
SUFFIX_TOKENS = 40
PROFILES = {
    "round-robin": ["--policy", "round-robin"],
    "least-loaded": ["--policy", "least-loaded"],
    "queue-depth:1": ["--policy", "weighted", "--scorers", "queue-depth:1"],
    "prefix-affinity:5,queue-depth:1": [
        "--policy",
        "weighted",
        "--scorers",
        "prefix-affinity:5,queue-depth:1",
    ],
}
WEIGHTED = "prefix-affinity:5,queue-depth:1"


def capacity(prompt_tokens: int) -> float:
    """Requests per second the fleet sustains with full batches and every prompt a miss.

    Per backend and second: decoding at a full batch of ``n`` makes ``n / step`` tokens
    per second; every admitted request first stalls the batch for its prefill. So
    ``rate * (MAX_TOKENS + prefill_s * tokens_per_s) = tokens_per_s``.
    """
    n = SIM["max_num_seqs"]
    step_s = (SIM["step_ms"] + n * SIM["step_ms_per_seq"]) / 1000
    tokens_per_s = n / step_s
    prefill_s = prompt_tokens * SIM["prefill_ms_per_token"] / 1000
    return BACKENDS * tokens_per_s / (MAX_TOKENS + prefill_s * tokens_per_s)


# -- workloads ------------------------------------------------------------------------------


def _text(rng: random.Random, tokens: int) -> str:
    """Distinct filler text of ``tokens`` simulator tokens (4 characters each)."""
    words = [f"{rng.getrandbits(40):010x}" for _ in range(tokens * 4 // 11 + 1)]
    return " ".join(words)[: tokens * SIM["chars_per_token"]]


def prefix_heavy(rng: random.Random, count: int) -> list[list[dict[str, str]]]:
    """Chat requests over 16 shared system prompts of ~2 000 tokens, short distinct questions."""
    systems = [_text(rng, SYSTEM_TOKENS) for _ in range(SYSTEM_PROMPTS)]
    return [
        [
            {"role": "system", "content": rng.choice(systems)},
            {"role": "user", "content": _text(rng, SUFFIX_TOKENS)},
        ]
        for _ in range(count)
    ]


def uniform(rng: random.Random, count: int) -> list[list[dict[str, str]]]:
    """Chat requests of the same length with nothing in common."""
    return [
        [{"role": "user", "content": _text(rng, SYSTEM_TOKENS + SUFFIX_TOKENS)}]
        for _ in range(count)
    ]


WORKLOADS = {"prefix-heavy": prefix_heavy, "uniform": uniform}


# -- one run --------------------------------------------------------------------------------


@dataclass
class Result:
    workload: str
    profile: str
    pods: int
    rate: float
    sent: int = 0
    ok: int = 0
    failed: int = 0
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    seconds: float = 0.0
    hit_rate: float = 0.0
    per_backend: list[int] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        ttft = sorted(self.ttft)
        return {
            "workload": self.workload,
            "profile": self.profile,
            "pods": self.pods,
            "rate": round(self.rate, 2),
            "ok": self.ok,
            "failed": self.failed,
            "hit_rate": round(self.hit_rate, 3),
            "ttft_p50_ms": round(_pct(ttft, 0.50) * 1000, 1),
            "ttft_p99_ms": round(_pct(ttft, 0.99) * 1000, 1),
            "e2e_mean_ms": round(statistics.fmean(self.e2e) * 1000, 1) if self.e2e else None,
            "throughput": round(self.ok / self.seconds, 2) if self.seconds else 0.0,
            "per_backend": self.per_backend,
        }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)]


async def _one(
    client: httpx.AsyncClient, url: str, messages: list[dict[str, str]], result: Result
) -> None:
    body = {"model": "obleth-sim", "messages": messages, "max_tokens": MAX_TOKENS, "stream": True}
    started = time.perf_counter()
    first = None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                result.failed += 1
                return
            async for chunk in response.aiter_raw():
                if first is None and chunk:
                    first = time.perf_counter()
    except httpx.HTTPError:
        result.failed += 1
        return
    done = time.perf_counter()
    result.ok += 1
    result.ttft.append((first or done) - started)
    result.e2e.append(done - started)


async def _drive(
    pods: list[str], requests: list[list[dict[str, str]]], rate: float, seed: int, result: Result
) -> None:
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=2048, max_keepalive_connections=256)
    timeout = httpx.Timeout(120.0)
    async with httpx.AsyncClient(trust_env=False, limits=limits, timeout=timeout) as client:
        tasks = []
        started = time.perf_counter()
        at = 0.0
        for index, messages in enumerate(requests):
            at += rng.expovariate(rate)
            delay = started + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            url = pods[index % len(pods)]
            tasks.append(asyncio.ensure_future(_one(client, url, messages, result)))
            result.sent += 1
        await asyncio.gather(*tasks)
        result.seconds = time.perf_counter() - started


def _counters(backend: SimBackend) -> tuple[float, float]:
    text = httpx.get(backend.url + "/metrics", trust_env=False, timeout=5).text
    values = {}
    for line in text.splitlines():
        for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            if line.startswith(name + "{"):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values["vllm:prefix_cache_hits_total"], values["vllm:prefix_cache_queries_total"]


def run_one(
    backends: list[SimBackend],
    redis_url: str | None,
    workload: str,
    profile: str,
    pods: int,
    seconds: float,
    load: float,
    seed: int,
    warmup: float,
) -> Result:
    rate = load * capacity(SYSTEM_TOKENS + SUFFIX_TOKENS)
    count = max(1, round(rate * seconds / (1 - warmup)))
    requests = WORKLOADS[workload](random.Random(seed), count)
    for backend in backends:
        backend.reset()
    args = [*PROFILES[profile], "--max-in-flight", "4096", "--seed", str(seed)]
    if pods > 1:
        assert redis_url is not None
        args += ["--redis-url", redis_url, "--pool", f"bench-{workload}-{pods}-{seed}"]
    result = Result(workload, profile, pods, rate)
    with ExitStack() as stack:
        gateways = [
            stack.enter_context(ServePod([b.url for b in backends], args=args, name=f"pod{i}"))
            for i in range(pods)
        ]
        for gateway in gateways:
            gateway.wait_ready()
        urls = [g.url for g in gateways]
        warm = round(len(requests) * warmup)
        # the warm-up fills the caches as any running service has them; it is not measured
        asyncio.run(
            _drive(urls, requests[:warm], rate, seed + 2, Result(workload, profile, pods, rate))
        )
        before = [_counters(b) for b in backends]
        requests_before = [b.stats()["requests"] for b in backends]
        asyncio.run(_drive(urls, requests[warm:], rate, seed + 1, result))
        after = [_counters(b) for b in backends]
        result.per_backend = [
            b.stats()["requests"] - n for b, n in zip(backends, requests_before, strict=True)
        ]
    hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    queries = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    result.hit_rate = hits / queries if queries else 0.0
    return result


# -- the decision micro-benchmark -------------------------------------------------------------


def decision_benchmark(upstream_count: int = 64, rounds: int = 20000) -> dict[str, float]:
    from gateway.gateway import Gateway
    from gateway.routing.readings import Reading
    from gateway.routing.request import RouteRequest, blocks_of, prompt_text
    from gateway.settings import Settings

    urls = [f"http://10.0.{i // 250}.{i % 250}:8000" for i in range(upstream_count)]
    rng = random.Random(7)
    prompts = [
        prompt_text({"messages": m}) for m in prefix_heavy(rng, 64)
    ]  # 16 system prompts, 64 requests

    def measure(settings: Settings) -> tuple[float, float]:
        gateway = Gateway(settings, entry_points=False)
        router = gateway.router
        assert router is not None
        now = time.monotonic()
        for i, url in enumerate(urls):
            gateway.readings.update(
                Reading(url, healthy=True, running=i % 8, waiting=i % 3, kv_usage=0.5, at=now)
            )
        readings = gateway.readings
        readings.stale_after_s = 3600.0  # the numbers stay fresh for the whole measurement
        blocks = [blocks_of(p, "obleth-sim", settings.prefix_block_bytes) for p in prompts]
        requests = [
            RouteRequest("/v1/chat/completions", "obleth-sim", b, None, "t", router.fleet)
            for b in blocks
        ]
        for request in requests:  # warm the prefix index
            router.route(request).finish()
        started = time.perf_counter()
        for i in range(rounds):
            router.route(requests[i % len(requests)]).finish()
        decide = (time.perf_counter() - started) / rounds
        started = time.perf_counter()
        for i in range(rounds // 10):
            blocks_of(prompts[i % len(prompts)], "obleth-sim", settings.prefix_block_bytes)
        hashing = (time.perf_counter() - started) / (rounds // 10)
        return decide, hashing

    base = Settings(upstreams=urls, routing_seed=1)
    weighted, hashing = measure(base)
    round_robin, _ = measure(base.replace(routing_policy="round-robin"))
    return {
        "upstreams": upstream_count,
        "weighted_us": round(weighted * 1e6, 1),
        "round_robin_us": round(round_robin * 1e6, 1),
        "ratio_to_round_robin": round(weighted / round_robin, 2),
        "prompt_hashing_us": round(hashing * 1e6, 1),
        "prompt_bytes": len(prompts[0]),
    }


# -- main ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="arrivals per run")
    parser.add_argument("--load", type=float, default=0.8, help="share of the fleet's capacity")
    parser.add_argument("--pods", default="1,3", help="gateway pod counts, e.g. 1,3")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-free names: use |")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--warmup", type=float, default=0.25, help="share of arrivals sent first, not measured"
    )
    parser.add_argument("--decision-only", action="store_true")
    args = parser.parse_args()

    decision = decision_benchmark()
    print(json.dumps({"decision": decision}), flush=True)
    if args.decision_only:
        return
    pod_counts = [int(n) for n in args.pods.split(",")]
    workloads = args.workloads.split(",")
    profiles = args.profiles.split("|") if "|" in args.profiles else list(PROFILES)
    results: list[Result] = []
    with ExitStack() as stack:
        backends = []
        for i in range(BACKENDS):
            extra = [f"--{k.replace('_', '-')}={v}" for k, v in SIM.items()]
            backend = stack.enter_context(SimBackend(name=f"sim{i}", extra_args=extra))
            backends.append(backend)
        for backend in backends:
            backend.wait_ready()
        redis_url = None
        if max(pod_counts) > 1:
            redis = stack.enter_context(RedisServer())
            redis_url = redis.url
        for workload in workloads:
            for pods in pod_counts:
                for profile in profiles:
                    result = run_one(
                        backends,
                        redis_url,
                        workload,
                        profile,
                        pods,
                        args.seconds,
                        args.load,
                        args.seed,
                        args.warmup,
                    )
                    results.append(result)
                    print(json.dumps(result.row()), flush=True)
    print(json.dumps({"summary": summarize(results)}, indent=2))


def summarize(results: list[Result]) -> dict[str, Any]:
    """The issue's targets as ratios, for each pod count measured."""
    by = {(r.workload, r.profile, r.pods): r.row() for r in results}
    summary: dict[str, Any] = {}
    for pods in sorted({r.pods for r in results}):
        heavy_w = by.get(("prefix-heavy", WEIGHTED, pods))
        heavy_rr = by.get(("prefix-heavy", "round-robin", pods))
        uni_w = by.get(("uniform", WEIGHTED, pods))
        uni_ll = by.get(("uniform", "least-loaded", pods))
        entry: dict[str, Any] = {}
        if heavy_w and heavy_rr:
            entry["prefix_heavy_hit_rate_x_round_robin"] = _ratio(
                heavy_w["hit_rate"], heavy_rr["hit_rate"]
            )
            entry["prefix_heavy_ttft_p99_round_robin_over_weighted"] = _ratio(
                heavy_rr["ttft_p99_ms"], heavy_w["ttft_p99_ms"]
            )
        if uni_w and uni_ll:
            entry["uniform_ttft_p99_weighted_over_least_loaded"] = _ratio(
                uni_w["ttft_p99_ms"], uni_ll["ttft_p99_ms"]
            )
        summary[f"{pods}_pods"] = entry
    one, three = by.get(("prefix-heavy", WEIGHTED, 1)), by.get(("prefix-heavy", WEIGHTED, 3))
    if one and three:
        summary["hit_rate_3_pods_over_1_pod"] = _ratio(three["hit_rate"], one["hit_rate"])
    return summary


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


if __name__ == "__main__":
    main()
