"""Goodput under overload with the limit from each capacity provider: static limits swept
to find the best one, static at 4x that, and the computed providers installed from
``plugins/`` (``kv-pressure``, ``adaptive``).

    pip install -e plugins/obleth-kv-pressure -e plugins/obleth-adaptive
    python tests/bench/capacity.py                 # about eight minutes
    python tests/bench/capacity.py --seconds 15    # quicker, noisier
    python tests/bench/capacity.py --simulated     # in obleth simulate: seconds, no servers

Every process is real: ``--backends`` simulated backends (``obleth mock-backend``) whose
KV cache holds ``SEQS_PER_BACKEND`` sequences of a request's final length, so that more
than that at once preempts, behind one ``obleth serve``; this process sends an open-loop
Poisson load of streamed chat completions at ``--load`` (default 1.5) times the rate the
fleet serves without preemption. The gateway sheds what it cannot serve soon: a request
waits at most ``QUEUE_TIMEOUT_S`` for a seat.

For each configuration the backends restart, a warm-up of a tenth of the run is not
measured, and then the figures are taken over ``--seconds``:

- **goodput**: requests per second that completed with a time to first token within
  ``--slo`` (1.5 s), the figure an LLM service is judged by;
- completed requests per second, the shed ones, preemptions (the backends' own
  ``vllm:num_preemptions_total``), TTFT p50/p99 of the completed ones.

``--simulated`` runs the same configurations in ``obleth simulate`` instead: the same
step model on a virtual clock, the same gateway code (admission, routing, the providers),
no processes and no HTTP. A configuration takes a fraction of a second, and the same
seed gives the same figures: the loop to tune a provider's law in. ``--seed`` draws
the arrivals (both modes). A simulated run also prints what ``adaptive`` reads, which a
client cannot see: the no-load time to first token (limit 1), and for each
configuration the medians of windows of ``WINDOW`` requests of the time from hand-over
to first token (``ttfb_windows_p10_p50_p90_ms``).

The best static limit is the swept value with the highest goodput; the targets (the
capacity issue's): ``kv-pressure`` and ``adaptive``, untuned, within 10 % of its goodput,
at least 2x the goodput of the 4x static limit, and at most a quarter of its
preemptions. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from harness import HOST, code_version, free_port, machine, software, unwind_on_sigterm
from proxy import Process

BLOCK = 16
PROMPT_TOKENS = 384
OUTPUT_TOKENS = 64
SEQS_PER_BACKEND = 12
"""Sequences of ``PROMPT_TOKENS + OUTPUT_TOKENS`` the KV cache of a backend holds."""
STEP_MS = 20.0
STEP_MS_PER_SEQ = 0.5
PREFILL_MS_PER_TOKEN = 0.05
QUEUE_TIMEOUT_S = 1.0
WINDOW = 10
"""Requests per window in the simulated runs' ``ttfb_windows`` column: ``adaptive``'s
default window."""
CHARS_PER_TOKEN = 4


def kv_blocks() -> int:
    return SEQS_PER_BACKEND * -(-(PROMPT_TOKENS + OUTPUT_TOKENS) // BLOCK)


def fleet_rate(backends: int) -> float:
    """Requests per second the fleet serves with ``SEQS_PER_BACKEND`` running each: the
    most it serves without preemption."""
    step_s = (STEP_MS + STEP_MS_PER_SEQ * SEQS_PER_BACKEND) / 1000
    prefill_s = PREFILL_MS_PER_TOKEN * PROMPT_TOKENS / 1000
    per_request_s = OUTPUT_TOKENS * step_s + prefill_s
    return backends * SEQS_PER_BACKEND / per_request_s


def start_backend() -> Process:
    port = free_port()
    argv = [
        sys.executable, "-m", "gateway", "mock-backend", "--host", HOST, "--port", str(port),
        "--log-level", "warning", "--max-num-seqs", "256", "--kv-cache-blocks",
        str(kv_blocks()), "--block-size-tokens", str(BLOCK), "--chars-per-token",
        str(CHARS_PER_TOKEN), "--step-ms", str(STEP_MS), "--step-ms-per-seq",
        str(STEP_MS_PER_SEQ), "--prefill-ms-per-token", str(PREFILL_MS_PER_TOKEN),
        "--prefix-cache-blocks", "0",
    ]  # fmt: skip
    return Process(argv, port)


def start_gateway(backends: list[Process], limit: int, providers: str) -> Process:
    port = free_port()
    argv = [
        sys.executable, "-m", "gateway", "serve", "--port", str(port), "--log-level",
        "warning", "--max-in-flight", str(limit), "--policy", "least-loaded",
    ]  # fmt: skip
    for backend in backends:
        argv += ["--upstream", f"http://{HOST}:{backend.port}"]
    env = {
        "OBLETH_CAPACITY_PROVIDERS": providers,
        "OBLETH_QUEUE_TIMEOUT_S": str(QUEUE_TIMEOUT_S),
        "OBLETH_MAX_QUEUE": "100000",
        "OBLETH_UPSTREAM_POLL_INTERVAL_S": "0.25",
    }
    served = Process(argv, port, env=env)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://{HOST}:{port}/readyz", timeout=1).status_code == 200:
                    return served
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("obleth serve did not become ready")
    except BaseException:  # not ready, or the run stopped meanwhile: not left serving
        served.stop()
        raise


@dataclass
class Run:
    name: str
    limit: int
    ok: int = 0
    shed: int = 0
    failed: int = 0
    ttft: list[float] = field(default_factory=list)
    seconds: float = 0.0
    preemptions: float = 0.0
    ttfb: list[float] = field(default_factory=list)
    """Simulated runs only: each completed request's time from its hand-over to the
    backend to its first token, in the order the first tokens came: what ``adaptive``
    samples."""

    def goodput(self, slo_s: float) -> float:
        return sum(1 for t in self.ttft if t <= slo_s) / self.seconds if self.seconds else 0.0

    def row(self, slo_s: float) -> dict[str, Any]:
        ttft = sorted(self.ttft) or [0.0]
        return {
            "config": self.name,
            "limit": self.limit,
            "goodput": round(self.goodput(slo_s), 2),
            "completed_per_s": round(self.ok / self.seconds, 2) if self.seconds else 0.0,
            "shed": self.shed,
            "failed": self.failed,
            "preemptions": self.preemptions,
            "ttft_p50_ms": round(ttft[len(ttft) // 2] * 1000),
            "ttft_p99_ms": round(ttft[min(len(ttft) - 1, int(len(ttft) * 0.99))] * 1000),
        } | self._windows()

    def _windows(self) -> dict[str, Any]:
        """The medians of ``ttfb`` over windows of ``WINDOW`` requests (as ``adaptive``
        takes them), their 10th, 50th and 90th percentiles in ms; nothing for a real run."""
        medians = sorted(
            statistics.median(self.ttfb[i : i + WINDOW])
            for i in range(0, len(self.ttfb) - WINDOW + 1, WINDOW)
        )
        if not medians:
            return {}
        deciles = [medians[int(len(medians) * share)] for share in (0.1, 0.5, 0.9)]
        return {"ttfb_windows_p10_p50_p90_ms": [round(x * 1000) for x in deciles]}


async def _one(client: httpx.AsyncClient, url: str, prompt: str, run: Run | None) -> None:
    body = {
        "model": "obleth-sim",  # the model `obleth mock-backend` serves by default
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": OUTPUT_TOKENS,
        "stream": True,
    }
    started = time.perf_counter()
    first = None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                if run is not None:
                    run.shed += response.status_code in (429, 503)
                    run.failed += response.status_code not in (429, 503)
                return
            async for chunk in response.aiter_raw():
                if first is None and chunk:
                    first = time.perf_counter()
    except httpx.HTTPError:
        if run is not None:
            run.failed += 1
        return
    if run is not None:
        run.ok += 1
        run.ttft.append((first or time.perf_counter()) - started)


async def drive(
    url: str, rate: float, seconds: float, warmup_s: float, seed: int, run: Run
) -> None:
    rng = random.Random(seed)
    prompt_chars = (PROMPT_TOKENS - 8) * CHARS_PER_TOKEN
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(
        trust_env=False, limits=limits, timeout=httpx.Timeout(300.0)
    ) as client:
        tasks = []
        started = time.perf_counter()
        at = 0.0
        measured_from = started + warmup_s
        while at < warmup_s + seconds:
            at += rng.expovariate(rate)
            delay = started + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            prompt = "".join(rng.choice("abcdefgh ") for _ in range(prompt_chars))
            measured = started + at >= measured_from
            tasks.append(
                asyncio.ensure_future(_one(client, url, prompt, run if measured else None))
            )
        await asyncio.gather(*tasks)
    run.seconds = seconds


def preemptions(backends: list[Process]) -> float:
    total = 0.0
    for backend in backends:
        text = httpx.get(f"http://{HOST}:{backend.port}/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith("vllm:num_preemptions_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def measure(name: str, limit: int, providers: str, args: argparse.Namespace, rate: float) -> Run:
    if args.simulated:
        return simulated(name, limit, providers, args, rate)
    # each process is stopped on the way out however the run ends, a SIGTERM in the
    # middle of stopping another included (an ExitStack runs every callback)
    with contextlib.ExitStack() as started:
        backends: list[Process] = []
        for _ in range(args.backends):
            backends.append(start_backend())
            started.callback(backends[-1].stop)
        gateway = start_gateway(backends, limit, providers)
        started.callback(gateway.stop)
        run = Run(name, limit)
        before = preemptions(backends)
        asyncio.run(
            drive(
                f"http://{HOST}:{gateway.port}",
                rate,
                args.seconds,
                args.seconds / 10,
                args.seed,
                run,
            )
        )
        run.preemptions = preemptions(backends) - before
        return run


def simulated(name: str, limit: int, providers: str, args: argparse.Namespace, rate: float) -> Run:
    """The configuration in ``obleth simulate``: the backends' step model with the flags
    ``start_backend`` gives them, the gateway's settings ``start_gateway`` gives it."""
    from gateway.sim.config import SimConfig
    from gateway.simulate.profiles import Profile
    from gateway.simulate.run import Plan, simulate
    from gateway.simulate.workload import Tokens, Workload

    config = SimConfig(
        model="bench",
        max_num_seqs=256,
        kv_cache_blocks=kv_blocks(),
        block_size_tokens=BLOCK,
        chars_per_token=CHARS_PER_TOKEN,
        prefix_cache_blocks=0,
        step_s=STEP_MS / 1000,
        step_s_per_seq=STEP_MS_PER_SEQ / 1000,
        prefill_s_per_token=PREFILL_MS_PER_TOKEN / 1000,
    )
    warmup_s = args.seconds / 10
    plan = Plan(
        profile=Profile("bench", "tests/bench/capacity.py's backends", config),
        workload=Workload(
            rate,
            round(rate * (warmup_s + args.seconds)),
            Tokens("fixed", PROMPT_TOKENS),
            Tokens("fixed", OUTPUT_TOKENS),
        ),
        num_instances=args.backends,
        seed=args.seed,
        scrape_interval_s=0.25,
        gateway={
            "global_max_in_flight": limit,
            "capacity_providers": tuple(providers.split(",")),
            "queue_timeout_s": QUEUE_TIMEOUT_S,
            "max_queue": 100000,
            "routing_policy": "least-loaded",
        },
    )
    result = simulate(plan)
    run = Run(name, limit, seconds=args.seconds, preemptions=float(result.preemptions))
    handed = []
    for outcome in result.outcomes:
        if outcome.request.arrival_s < warmup_s:
            continue
        sequence = outcome.sequence
        if sequence is None:
            run.shed += 1
        else:
            assert sequence.first_token_at is not None and outcome.handed_at is not None
            run.ok += 1
            run.ttft.append(sequence.first_token_at - outcome.arrived_at)
            handed.append((sequence.first_token_at, sequence.first_token_at - outcome.handed_at))
    run.ttfb = [ttfb for _, ttfb in sorted(handed)]
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backends", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--load", type=float, default=1.5)
    parser.add_argument("--slo", type=float, default=1.5, help="TTFT SLO, seconds")
    parser.add_argument("--sweep", default="0.5,0.75,1,1.25,1.5", help="static limits, in fits")
    parser.add_argument("--seed", type=int, default=7, help="seed of the arrivals")
    parser.add_argument(
        "--simulated", action="store_true", help="run in obleth simulate, not real processes"
    )
    args = parser.parse_args()
    unwind_on_sigterm()  # a killed run stops the servers it started
    fits = args.backends * SEQS_PER_BACKEND
    rate = args.load * fleet_rate(args.backends)
    print(f"# {machine()}\n# {software()}\n# code {code_version()}")
    if args.simulated:
        print("# simulated: obleth simulate's virtual clock, no processes")
    print(
        f"# {args.backends} backends holding {SEQS_PER_BACKEND} sequences each ({fits} in all, "
        f"{fleet_rate(args.backends):.1f} req/s without preemption); load {args.load}x = "
        f"{rate:.1f} req/s for {args.seconds} s; TTFT SLO {args.slo} s\n",
        flush=True,
    )
    if args.simulated:
        alone = simulated("limit 1", 1, "static", args, rate)
        print(
            f"# no-load time to first byte (limit 1, a request at a time): "
            f"{statistics.median(alone.ttfb) * 1000:.0f} ms\n",
            flush=True,
        )
    runs: list[Run] = []
    for share in (float(x) for x in args.sweep.split(",")):
        limit = max(1, round(share * fits))
        runs.append(measure(f"static {limit}", limit, "static", args, rate))
        print(runs[-1].row(args.slo), flush=True)
    best = max(runs, key=lambda run: run.goodput(args.slo))
    four = measure(f"static 4x best ({4 * best.limit})", 4 * best.limit, "static", args, rate)
    print(four.row(args.slo), flush=True)
    computed = []
    for provider, module in (
        ("kv-pressure", "obleth_kv_pressure"),
        ("adaptive", "obleth_adaptive"),
    ):
        if importlib.util.find_spec(module) is None:
            print(f"# {provider}: not installed (pip install -e plugins/obleth-{provider})")
            continue
        run = measure(provider, 4 * best.limit, f"static,{provider}", args, rate)
        computed.append(run)
        print(run.row(args.slo), flush=True)
    print(f"\nbest static: {best.name}, goodput {best.goodput(args.slo):.2f} req/s")
    for run in computed:
        good = run.goodput(args.slo)
        over_four = _times(good, four.goodput(args.slo))
        print(
            f"{run.name}: goodput {good / best.goodput(args.slo):.2f}x best static "
            f"(target >= 0.90), {over_four} static 4x (target >= 2x), preemptions "
            f"{_times(run.preemptions, four.preemptions)} static 4x (target <= 0.25x)"
        )
    median_ttft = statistics.median(best.ttft) if best.ttft else 0.0
    print(f"(best static's TTFT median {median_ttft * 1000:.0f} ms)")


def _times(value: float, baseline: float) -> str:
    """``value`` as a multiple of ``baseline``; a baseline of 0 has no multiple."""
    if baseline <= 0:
        return "inf x" if value > 0 else "0/0 of"
    return f"{value / baseline:.2f}x"


if __name__ == "__main__":
    main()
