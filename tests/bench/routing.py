"""Routing quality: four simulated backends, Poisson load, four routing profiles, 1 and 3 pods.

    python tests/bench/routing.py                  # everything (about 25 minutes)
    python tests/bench/routing.py --seconds 20 --pods 1 --workloads prefix-heavy
    python tests/bench/routing.py --seconds 20 --pods 1 --workloads uniform \
        --load 0.5,0.8,0.95 --profiles 'round-robin|prefix-affinity:5,queue-depth:1'
    python tests/bench/routing.py --decision-only  # the micro-benchmark alone

Workloads: ``uniform`` (prompts of ~2 040 tokens with nothing in common), ``prefix-heavy``
(one of 16 system prompts of ~2 000 tokens, then a ~40-token question) and
``shared-system-prompt`` (one system prompt of ~2 000 tokens for every request, then its
own ~40-token user turn: the traffic that sends a prefix router's whole load to one
backend).

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
``vllm:prefix_cache_queries_total`` (tokens) during the run. For ``shared-system-prompt``
the best achievable hit rate is printed beside it (``best_hit_rate``): every measured
request hitting every full simulator block (16 tokens) its prompt shares with the others
(the system prompt and its chat header), as with the prompt cached on every backend,
which the warm-up has had the time to do; the last prompt token is always computed, as
the simulator and vLLM do. This counts no first miss per backend inside the measured
window, so it is an upper bound (counting four first misses lowers it by 4 / requests,
about 1.6 % of it at 80 % load and 20 s). ``load_share`` is the busiest backend's requests
over the mean per backend (1.0: even); the target is at most 1.5.

``--load`` takes several shares (``0.5,0.8,0.95``); the summary then gives, per load,
the weighted profile's TTFT p99 over round-robin's on ``uniform`` against the 1.10 target.

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
from harness import HOST  # noqa: E402
from peers import PEERS, start_peer  # noqa: E402

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


def shared_system_prompt(rng: random.Random, count: int) -> list[list[dict[str, str]]]:
    """Chat requests that all start with one system prompt of ~2 000 tokens, then each its
    own user turn of ~40 tokens."""
    system = _text(rng, SYSTEM_TOKENS)
    return [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": _text(rng, SUFFIX_TOKENS)},
        ]
        for _ in range(count)
    ]


WORKLOADS = {
    "prefix-heavy": prefix_heavy,
    "uniform": uniform,
    "shared-system-prompt": shared_system_prompt,
}


def best_hit_rate(requests: list[list[dict[str, str]]]) -> float:
    """The hit rate if every request hit every simulator block its prompt shares with all
    the others (see the module docstring): prompts tokenized as the simulator does."""
    from gateway.sim.tokens import chat_prompt_text, tokenize

    prompts = [
        tokenize(
            chat_prompt_text([(m["role"], m["content"]) for m in messages]),
            chars_per_token=SIM["chars_per_token"],
            block_size_tokens=SIM["block_size_tokens"],
        )
        for messages in requests
    ]
    if not prompts:
        return 0.0
    first = prompts[0].block_hashes
    shared = len(first)
    for prompt in prompts:
        other = prompt.block_hashes
        same = 0
        while same < min(shared, len(other)) and other[same] == first[same]:
            same += 1
        shared = same
    block = SIM["block_size_tokens"]
    hits = sum(min(shared * block, p.num_tokens - 1) for p in prompts)
    return hits / sum(p.num_tokens for p in prompts)


# -- one run --------------------------------------------------------------------------------


@dataclass
class Result:
    workload: str
    profile: str
    pods: int
    rate: float
    load: float = 0.0
    sent: int = 0
    ok: int = 0
    failed: int = 0
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    seconds: float = 0.0
    hit_rate: float = 0.0
    best_hit_rate: float | None = None
    per_backend: list[int] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        ttft = sorted(self.ttft)
        mean = statistics.fmean(self.per_backend) if self.per_backend else 0.0
        extra: dict[str, Any] = {}
        if self.best_hit_rate is not None:
            extra["best_hit_rate"] = round(self.best_hit_rate, 3)
            extra["hit_rate_of_best"] = _ratio(self.hit_rate, self.best_hit_rate)
        return {
            "workload": self.workload,
            "profile": self.profile,
            "pods": self.pods,
            "load": self.load,
            "rate": round(self.rate, 2),
            "ok": self.ok,
            "failed": self.failed,
            "hit_rate": round(self.hit_rate, 3),
            "ttft_p50_ms": round(_pct(ttft, 0.50) * 1000, 1),
            "ttft_p99_ms": round(_pct(ttft, 0.99) * 1000, 1),
            "e2e_mean_ms": round(statistics.fmean(self.e2e) * 1000, 1) if self.e2e else None,
            "throughput": round(self.ok / self.seconds, 2) if self.seconds else 0.0,
            "per_backend": self.per_backend,
            "load_share": round(max(self.per_backend) / mean, 3) if mean else None,
            **extra,
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


def fleet(stack: ExitStack) -> list[SimBackend]:
    """The ``BACKENDS`` simulated backends with the ``SIM`` timing, ready, stopped with
    ``stack``."""
    extra = [f"--{k.replace('_', '-')}={v}" for k, v in SIM.items()]
    backends = [
        stack.enter_context(SimBackend(name=f"sim{i}", extra_args=extra)) for i in range(BACKENDS)
    ]
    for backend in backends:
        backend.wait_ready()
    return backends


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
    result = Result(workload, profile, pods, rate, load)
    with ExitStack() as stack:
        if profile in PEERS:  # another router, as peers.py runs it: one process
            peer = start_peer(profile, [b.url for b in backends])
            stack.callback(peer.stop)
            urls = [f"http://{HOST}:{peer.port}"]
        else:
            args = [*PROFILES[profile], "--max-in-flight", "4096", "--seed", str(seed)]
            if pods > 1:
                assert redis_url is not None
                args += ["--redis-url", redis_url, "--pool", f"bench-{workload}-{pods}-{seed}"]
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
    if workload == "shared-system-prompt":
        result.best_hit_rate = best_hit_rate(requests[warm:])
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
    parser.add_argument(
        "--load", default="0.8", help="shares of the fleet's capacity, e.g. 0.5,0.8,0.95"
    )
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
    loads = [float(x) for x in args.load.split(",")]
    workloads = args.workloads.split(",")
    profiles = args.profiles.split("|") if "|" in args.profiles else list(PROFILES)
    results: list[Result] = []
    with ExitStack() as stack:
        backends = fleet(stack)
        redis_url = None
        if max(pod_counts) > 1:
            redis = stack.enter_context(RedisServer())
            redis_url = redis.url
        for workload in workloads:
            for load in loads:
                for pods in pod_counts:
                    for profile in profiles:
                        result = run_one(
                            backends,
                            redis_url,
                            workload,
                            profile,
                            pods,
                            args.seconds,
                            load,
                            args.seed,
                            args.warmup,
                        )
                        results.append(result)
                        print(json.dumps(result.row()), flush=True)
    print(json.dumps({"summary": summarize(results)}, indent=2))


def summarize(results: list[Result]) -> dict[str, Any]:
    """The issue's targets as ratios, for each pod count and load measured."""
    by = {(r.workload, r.profile, r.pods, r.load): r.row() for r in results}
    summary: dict[str, Any] = {}
    for pods in sorted({r.pods for r in results}):
        for load in sorted({r.load for r in results}):
            entry: dict[str, Any] = {}
            heavy_w = by.get(("prefix-heavy", WEIGHTED, pods, load))
            heavy_rr = by.get(("prefix-heavy", "round-robin", pods, load))
            uni_w = by.get(("uniform", WEIGHTED, pods, load))
            uni_rr = by.get(("uniform", "round-robin", pods, load))
            shared_w = by.get(("shared-system-prompt", WEIGHTED, pods, load))
            if heavy_w and heavy_rr:
                entry["prefix_heavy_hit_rate_x_round_robin"] = _ratio(
                    heavy_w["hit_rate"], heavy_rr["hit_rate"]
                )
                entry["prefix_heavy_ttft_p99_round_robin_over_weighted"] = _ratio(
                    heavy_rr["ttft_p99_ms"], heavy_w["ttft_p99_ms"]
                )
            if uni_w and uni_rr:
                ratio = _ratio(uni_w["ttft_p99_ms"], uni_rr["ttft_p99_ms"])
                entry["uniform_ttft_p99_weighted_over_round_robin"] = ratio
                entry["uniform_target"] = 1.10
                entry["uniform_met"] = ratio is not None and ratio <= 1.10
            if shared_w:
                entry["shared_load_share_max_over_mean"] = shared_w["load_share"]
                entry["shared_load_share_target"] = 1.5
                entry["shared_hit_rate_of_best"] = shared_w.get("hit_rate_of_best")
                entry["shared_hit_rate_target"] = 0.9
            if entry:
                summary[f"{pods}_pods_load_{load}"] = entry
    for load in sorted({r.load for r in results}):
        one = by.get(("prefix-heavy", WEIGHTED, 1, load))
        three = by.get(("prefix-heavy", WEIGHTED, 3, load))
        if one and three:
            summary[f"hit_rate_3_pods_over_1_pod_load_{load}"] = _ratio(
                three["hit_rate"], one["hit_rate"]
            )
    return summary


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


if __name__ == "__main__":
    main()
