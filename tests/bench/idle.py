"""What an idle ``obleth serve`` costs in CPU, and how fresh its readings are when load comes.

    python tests/bench/idle.py                     # this checkout: 4 and 16 upstreams
    python tests/bench/idle.py --against HEAD      # and the gateway as at HEAD, alternating
    python tests/bench/idle.py --quick             # 1 round of 5 s, 4 trials: a smoke run

Real processes on 127.0.0.1: up to 16 ``obleth mock-backend`` processes, and one
``obleth serve`` at a time in front of the first N of them, with the default polling
settings and nothing else configured.

1. **Idle cost.** No request at all. After the serve process has been up for
   ``SETTLE_S`` (long enough for the idle pace to set in), its CPU time is read over a
   window of ``--window`` seconds: ms of CPU per second, and that divided by N. Next to
   the gateway as it is (and at ``--against REV``): the same with one pace
   (``OBLETH_UPSTREAM_IDLE_POLL_FACTOR=1``: what the cheaper scrape alone gives), and with
   polling all but off (``OBLETH_UPSTREAM_POLL_INTERVAL_S=3600``: what the process costs
   without its poller, uvicorn's own ticks). "Polling, per upstream" is a variant's CPU
   minus the polling-off one's in the same round, divided by N: what the poller costs.
   The backends' CPU says what answering the polls costs the upstreams (they are this
   checkout's for every variant). Each variant is started afresh for each measurement,
   the order reversed from one round to the next; medians of the rounds. Target: at
   most 2 ms/s per upstream.
2. **Load comes.** Four upstreams, the gateway idle for 2 to 3 s (a random spell, so
   that the burst falls anywhere between two polls), then a burst of 8 concurrent
   completions of 64 tokens (about 0.7 s each on the backends). The admin API's
   ``GET /api/v1/status`` is read every 5 ms from the burst's first request on. Per
   trial: how old the oldest reading was when the burst began; how long after the first
   request the first poll ran (the reading's time is the sample's time minus its
   ``reading_age_s``); how long until a reading showed the burst (``running + waiting``
   above 0 on some upstream); and the oldest reading seen while the requests ran.
   Freshness must not be worse than the baseline's.
3. **A real engine's page.** The CPU one reading of a ``/metrics`` page takes in this
   process (decoding and parsing): the simulator's, and one shaped like vLLM's.

CPU time comes from the kernel's per-process CPU clock (``clock_gettime`` on the
process's clock id), in nanoseconds. ``/proc/<pid>/stat`` counts in ticks of 10 ms, too
coarse for a process that wakes for a few hundred microseconds at a time: over a 10 s
window it reads 0, 10 or 20 ms where the truth is 12. The machine is shared; expect the
idle figures to move by a ms/s or so from run to run, the order between the variants
much less. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the tests helpers and the gateway package, from this checkout

from harness import (  # noqa: E402
    HOST,
    child_env,
    code_version,
    free_port,
    machine,
    stop_process,
    verdict,
)

from gateway.routing.metricnames import reading_from_text  # noqa: E402
from tests.cluster.pods import SimBackend  # noqa: E402

SETTLE_S = 3.0
TARGET_MS_PER_UPSTREAM = 2.0
ADMIN_TOKEN = "bench-admin-token-0001"
BURST = 8
BURST_TOKENS = 64
SAMPLE_EVERY_S = 0.005
#: what the serve process's environment adds to the defaults (nothing, for a gateway)
NO_POLLING = {"OBLETH_UPSTREAM_POLL_INTERVAL_S": "3600"}
ONE_PACE = {"OBLETH_UPSTREAM_IDLE_POLL_FACTOR": "1"}
ONE_PACE_NAME = "this checkout, one pace (idle factor 1)"
POLLING_OFF = "this checkout, polling off"


def cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid`` so far (all its threads), from its CPU clock, to the
    nanosecond: Linux's clock id of another process's CPU time is ``~pid << 3 | 2``."""
    return time.clock_gettime((~pid << 3) | 2)


# -- processes -------------------------------------------------------------------------------


class Serve:
    """``obleth serve`` from ``root`` (this checkout or another commit's tree) in front of
    ``upstreams``, with ``env`` added to its environment and, if ``admin``, the admin API
    on a port of its own; stopped by ``stop()``."""

    def __init__(
        self, root: Path, upstreams: Sequence[str], env: dict[str, str], *, admin: bool
    ) -> None:
        self.port = free_port()
        self.admin_port = free_port()
        flags = [flag for url in upstreams for flag in ("--upstream", url)]
        command = [
            sys.executable, "-m", "gateway", "serve", "--host", HOST, "--port", str(self.port),
            "--admin-port", str(self.admin_port), "--log-level", "warning", *flags,
        ]  # fmt: skip
        environ = {k: v for k, v in child_env(root=root).items() if not k.startswith("OBLETH_")}
        # the admin API is a second uvicorn server, whose own ticks an idle measure leaves out
        environ.update({"OBLETH_ADMIN_TOKEN": ADMIN_TOKEN} if admin else {})
        environ.update(env)
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 -- closed by stop()
        self.process = subprocess.Popen(
            command, cwd=root, env=environ, stdout=self.log, stderr=subprocess.STDOUT
        )

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(trust_env=False, timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"obleth serve exited at startup:\n{self.log_text()}")
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"{self.url}/readyz").status_code == 200:
                        return
                time.sleep(0.05)
        raise RuntimeError(f"obleth serve not ready after {timeout_s} s:\n{self.log_text()}")

    def log_text(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def stop(self) -> None:
        stop_process(self.process)
        self.log.close()


@contextlib.contextmanager
def serving(
    root: Path, upstreams: Sequence[str], env: dict[str, str], *, admin: bool = False
) -> Iterator[Serve]:
    serve = Serve(root, upstreams, env, admin=admin)
    try:
        serve.wait_ready()
        yield serve
    finally:
        serve.stop()


def gateway_at(revision: str, tree: Path) -> Path:
    """``tree``, holding the ``gateway`` package as at commit ``revision``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "gateway"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


# -- 1. idle cost ----------------------------------------------------------------------------


@dataclass
class IdleRuns:
    serve_ms: list[float] = field(default_factory=list)
    backends_ms: list[float] = field(default_factory=list)


def idle_once(
    root: Path, sims: Sequence[SimBackend], env: dict[str, str], window_s: float
) -> tuple[float, float]:
    """The serve process's CPU in ms per second over the window, and the backends' (each)."""
    with serving(root, [sim.url for sim in sims], env) as serve:
        time.sleep(SETTLE_S)
        pids = [serve.process.pid, *(sim.pid for sim in sims if sim.pid is not None)]
        before = [cpu_seconds(pid) for pid in pids]
        start = time.monotonic()
        time.sleep(window_s)
        after = [cpu_seconds(pid) for pid in pids]
        elapsed = time.monotonic() - start
    used = [(b - a) / elapsed * 1000 for a, b in zip(before, after, strict=True)]
    return used[0], statistics.mean(used[1:])


# -- 2. load comes ---------------------------------------------------------------------------


@dataclass
class Trial:
    oldest_at_start_s: float
    first_poll_after_s: float | None
    load_seen_after_s: float | None
    oldest_while_busy_s: float


async def status(client: httpx.AsyncClient, serve: Serve) -> dict[str, Any]:
    """Every upstream's entry in the admin API's status; a reading never taken is infinitely
    old."""
    response = await client.get(
        f"http://{HOST}:{serve.admin_port}/api/v1/status",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    response.raise_for_status()
    upstreams: dict[str, Any] = response.json()["upstreams"]
    for reading in upstreams.values():
        if reading["reading_age_s"] is None:
            reading["reading_age_s"] = float("inf")
    return upstreams


async def trial(serve: Serve, rng: random.Random) -> Trial:
    """One idle spell, then one burst, watched through the admin API."""
    await asyncio.sleep(rng.uniform(2.0, 3.0))
    limits = httpx.Limits(max_connections=BURST + 2)
    async with httpx.AsyncClient(trust_env=False, timeout=30.0, limits=limits) as client:
        before = await status(client, serve)
        oldest_at_start = max(u["reading_age_s"] for u in before.values())
        body = {"prompt": "Tell me about routers.", "max_tokens": BURST_TOKENS}
        started = time.monotonic()
        burst = [
            asyncio.create_task(client.post(f"{serve.url}/v1/completions", json=body))
            for _ in range(BURST)
        ]
        first_poll: float | None = None
        load_seen: float | None = None
        refreshed = False
        oldest_while_busy = 0.0
        while not all(task.done() for task in burst):
            sent = time.monotonic()
            upstreams = await status(client, serve)
            # the ages were read somewhere between sending and receiving: take the middle
            now = (sent + time.monotonic()) / 2 - started
            ages = [reading["reading_age_s"] for reading in upstreams.values()]
            polls = [now - age for age in ages if now - age >= 0]
            if polls and (first_poll is None or min(polls) < first_poll):
                first_poll = min(polls)
            if load_seen is None and any(
                (reading["running"] or 0) + (reading["waiting"] or 0)
                for reading in upstreams.values()
            ):
                load_seen = now
            # from the first sample in which every reading is younger than the burst
            refreshed = refreshed or len(polls) == len(ages)
            if refreshed:
                oldest_while_busy = max(oldest_while_busy, *ages)
            await asyncio.sleep(SAMPLE_EVERY_S)
        answers = await asyncio.gather(*burst)
    failed = [r.status_code for r in answers if r.status_code != 200]
    if failed:
        raise RuntimeError(f"burst answered {failed}")
    return Trial(oldest_at_start, first_poll, load_seen, oldest_while_busy)


def load_comes(root: Path, sims: Sequence[SimBackend], trials: int, seed: int) -> list[Trial]:
    rng = random.Random(seed)
    with serving(root, [sim.url for sim in sims], {}, admin=True) as serve:

        async def run() -> list[Trial]:
            return [await trial(serve, rng) for _ in range(trials)]

        return asyncio.run(run())


# -- 3. a real engine's page ------------------------------------------------------------------


def vllm_page() -> str:
    """A ``/metrics`` page shaped like vLLM's (V1, one model): its gauges and counters,
    fourteen histograms of 23 buckets, the Python and process metrics of
    prometheus_client, and the HTTP histograms of its API server per route."""
    lines: list[str] = []

    def family(name: str, kind: str, samples: list[str]) -> None:
        lines.extend([f"# HELP {name} What {name} measures.", f"# TYPE {name} {kind}", *samples])

    for name in ("python_gc_objects_collected_total", "python_gc_collections_total"):
        family(name, "counter", [f'{name}{{generation="{g}"}} {g * 123}.0' for g in range(3)])
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"):
        family(name, "gauge", [f"{name} 1.234e+09"])
    labels = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        family(f"vllm:{name}", "gauge", [f"vllm:{name}{{{labels}}} 0.0"])
    for name in ("prompt_tokens", "generation_tokens", "prefix_cache_queries", "num_preemptions"):
        family(f"vllm:{name}_total", "counter", [f"vllm:{name}_total{{{labels}}} 12345.0"])
    buckets = [f"{0.001 * 2**i:g}" for i in range(22)] + ["+Inf"]
    for name in (
        "time_to_first_token_seconds", "time_per_output_token_seconds",
        "inter_token_latency_seconds", "e2e_request_latency_seconds",
        "request_queue_time_seconds", "request_inference_time_seconds",
        "request_prefill_time_seconds", "request_decode_time_seconds", "request_prompt_tokens",
        "request_generation_tokens", "iteration_tokens_total",
        "request_max_num_generation_tokens", "request_params_n", "request_params_max_tokens",
    ):  # fmt: skip
        samples = [
            f'vllm:{name}_bucket{{{labels},le="{le}"}} {i}.0' for i, le in enumerate(buckets)
        ]
        family(f"vllm:{name}", "histogram", [*samples, f"vllm:{name}_count{{{labels}}} 22.0"])
    for route in ("/v1/completions", "/v1/chat/completions", "/health", "/metrics", "/v1/models"):
        for name in ("http_request_duration_seconds", "http_response_size_bytes"):
            where = f'handler="{route}",method="GET"'
            samples = [f'{name}_bucket{{{where},le="{le}"}} 5.0' for le in buckets[:14]]
            family(name, "histogram", [*samples, f"{name}_count{{{where}}} 5.0"])
    return "\n".join(lines) + "\n"


def parse_cost(page: bytes) -> float:
    """The µs one reading of ``page`` takes, decoding included (the median of 7 runs)."""
    timings = []
    for _ in range(7):
        started = time.perf_counter()
        for _ in range(100):
            reading_from_text("u", page.decode("utf-8", errors="replace"), 1.0, True)
        timings.append((time.perf_counter() - started) / 100)
    return statistics.median(timings) * 1e6


# -- the report ------------------------------------------------------------------------------


def ms(value: float | None) -> str:
    return "never" if value is None else f"{value * 1000:.0f} ms"


def spread(values: Sequence[float | None]) -> str:
    """Median and maximum, in ms; a trial where it never happened counts as the worst."""
    seen = [v for v in values if v is not None]
    if not seen:
        return "never"
    worst = "never" if len(seen) < len(values) else ms(max(seen))
    return f"{ms(statistics.median(seen))} / {worst}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="REV", help="also measure the gateway at REV")
    parser.add_argument("--upstreams", default="4,16", help="upstream counts, e.g. 4,16")
    parser.add_argument("--window", type=float, default=8.0, help="seconds measured, idle")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=8, help="bursts per gateway")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="1 round of 5 s, 4 trials")
    args = parser.parse_args()
    if args.quick:
        args.window, args.rounds, args.trials = 5.0, 1, 4
    counts = [int(n) for n in args.upstreams.split(",")]
    shown = " ".join(sys.argv[1:])
    print(f"$ python tests/bench/idle.py{' ' + shown if shown else ''}")
    print(f"code: {code_version()}; machine: {machine()}")
    print(
        f"idle: {args.rounds} round(s) of {args.window:g} s per gateway and upstream count, "
        f"medians; load comes: {args.trials} bursts of {BURST} per gateway\n"
    )
    with contextlib.ExitStack() as stack:
        variants = {"this checkout": ROOT}
        if args.against:
            tree = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="obleth-idle-")))
            variants[f"at {args.against}"] = gateway_at(args.against, tree)
        sims = [
            stack.enter_context(SimBackend(name=f"sim{i}", step_ms=10.0))
            for i in range(max(counts))
        ]
        plan: list[tuple[str, Path, dict[str, str]]] = [
            *((name, root, {}) for name, root in variants.items()),
            (ONE_PACE_NAME, ROOT, ONE_PACE),
            (POLLING_OFF, ROOT, NO_POLLING),
        ]
        runs: dict[tuple[int, str], IdleRuns] = {}
        for round_number in range(args.rounds):
            for n in counts:
                # alternate who goes first
                for name, root, env in plan[:: -1 if round_number % 2 else 1]:
                    serve_ms, backends_ms = idle_once(root, sims[:n], env, args.window)
                    result = runs.setdefault((n, name), IdleRuns())
                    result.serve_ms.append(serve_ms)
                    result.backends_ms.append(backends_ms)

        print(
            "| upstreams | gateway | serve CPU | per upstream | polling, per upstream | "
            "each backend |"
        )
        print("| ---: | --- | ---: | ---: | ---: | ---: |")
        verdicts = []
        names = [name for name, _, _ in plan]
        for (n, name), result in sorted(
            runs.items(), key=lambda i: (i[0][0], names.index(i[0][1]))
        ):
            serve_ms = statistics.median(result.serve_ms)
            backend_ms = statistics.median(result.backends_ms)
            # what polling adds to the same process, polling off, measured in the same round
            off = runs[(n, POLLING_OFF)].serve_ms
            polling_ms = statistics.median(v - o for v, o in zip(result.serve_ms, off, strict=True))
            shown = "" if name == POLLING_OFF else f"{polling_ms / n:.2f} ms/s"
            print(
                f"| {n} | {name} | {serve_ms:.1f} ms/s | {serve_ms / n:.2f} ms/s | {shown} | "
                f"{backend_ms:.1f} ms/s |"
            )
            if name == "this checkout":
                verdicts.append(
                    f"{n} upstreams: polling {polling_ms / n:.2f} ms/s per upstream, "
                    f"{verdict(polling_ms / n <= TARGET_MS_PER_UPSTREAM)}; the whole process "
                    f"{serve_ms / n:.2f} ms/s per upstream, "
                    f"{verdict(serve_ms / n <= TARGET_MS_PER_UPSTREAM)}"
                )
        target = TARGET_MS_PER_UPSTREAM
        print(f"\nthis checkout, idle, at most {target:g} ms/s of CPU per upstream:")
        for line in verdicts:
            print(f"- {line}")
        raw = {f"{n} upstreams, {name}": r.serve_ms for (n, name), r in runs.items()}
        print("serve CPU of each round, ms/s:", json.dumps(raw, separators=(", ", ": ")))

        n = min(4, max(counts))
        print(f"\nload comes ({n} upstreams), median / max over the bursts:\n")
        print(
            "| gateway | oldest reading when the burst began | first poll after the first "
            "request | load seen after | oldest reading while busy |"
        )
        print("| --- | ---: | ---: | ---: | ---: |")
        for name, root in sorted(variants.items()):
            trials = load_comes(root, sims[:n], args.trials, args.seed)
            print(
                f"| {name} | {spread([t.oldest_at_start_s for t in trials])} | "
                f"{spread([t.first_poll_after_s for t in trials])} | "
                f"{spread([t.load_seen_after_s for t in trials])} | "
                f"{spread([t.oldest_while_busy_s for t in trials])} |"
            )
        simulated = httpx.get(f"{sims[0].url}/metrics", trust_env=False).content
    print("\nreading one /metrics page (µs of CPU per scrape, in this process):\n")
    print("| page | size | lines | per scrape |")
    print("| --- | ---: | ---: | ---: |")
    for name, page in (
        ("the simulator's", simulated),
        ("shaped like vLLM's", vllm_page().encode()),
    ):
        lines = page.count(b"\n")
        print(f"| {name} | {len(page) / 1024:.1f} KB | {lines} | {parse_cost(page):.0f} µs |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
