"""What metrics and tracing add to the CPU of a request through ``GatewayMiddleware``,
against both off, measured in one run.

    python tests/bench/telemetry.py            # about a minute
    python tests/bench/telemetry.py --quick    # a smoke run, a few seconds

Each configuration runs in a process of its own (OpenTelemetry's global providers can be
set once per process), in alternation over several rounds; each process sends
``--requests`` requests straight through the middleware (ASGI calls, no server, so
nothing but the request path is measured) to a trivial app, with free seats, and reads
its own CPU time (all threads: the span processor's included). Configurations:

- ``off``: no OpenTelemetry SDK (the API's no-op providers): the tallies are still kept.
- ``metrics``: the SDK's meter provider with the Prometheus reader, exactly as
  ``obleth serve`` installs it, scraped (rendered) once every ``SCRAPE_EVERY`` requests.
- ``tracing``: the SDK's tracer provider, every request sampled, a batch span processor
  and an exporter that drops what it is sent (the cost of making and batching spans).
- ``both``: metrics and tracing.
- ``both, 1 % sampled``: tracing with ``TraceIdRatioBased(0.01)``, as a busy service runs.

Next to them, the floor tracing cannot go below: the SDK alone starting and ending one
bare span per request (``span alone``), sampled and 1 % sampled, in the same processes'
way, without the gateway.

The target (issue 22): at most 2 µs per request added by metrics and tracing. Printed,
never asserted. The figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import code_version, machine, software
from pieces import receive, sent, trivial_app

CONFIGURATIONS = {
    "off": (),
    "metrics": ("metrics",),
    "tracing": ("tracing",),
    "both": ("metrics", "tracing"),
    "both, 1 % sampled": ("metrics", "tracing", "sampled"),
    "span alone": ("tracing", "alone"),
    "span alone, 1 % sampled": ("tracing", "sampled", "alone"),
}
#: a scrape every this many requests: at 1 000 requests/s, one each 10 s (Prometheus
#: scrapes every 15 to 60 s)
SCRAPE_EVERY = 10_000
TARGET_US = 2.0

HEADERS = [(b"host", b"127.0.0.1"), (b"authorization", b"Bearer sk-bench-0001")]


def install(parts: Sequence[str]) -> Any:
    """Set up the SDK parts of a configuration; returns the Prometheus export or None."""
    export = None
    if "metrics" in parts:
        from gateway.telemetry.sdk import install_prometheus_export

        export = install_prometheus_export()
    if "tracing" in parts:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        class Dropped(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        sampler = ParentBased(TraceIdRatioBased(0.01)) if "sampled" in parts else None
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(Dropped()))
        trace.set_tracer_provider(provider)
    return export


async def requests(parts: Sequence[str], n: int) -> float:
    """CPU seconds per request for ``n`` requests in configuration ``parts``."""
    export = install(parts)
    if "alone" in parts:
        return spans_alone(n)
    from gateway import GatewayMiddleware, Settings

    middleware = GatewayMiddleware(
        trivial_app, Settings(global_max_in_flight=64, tenant_header="authorization")
    )
    await middleware.gateway.start()
    scope = {"type": "http", "method": "GET", "path": "/v1/chat", "headers": HEADERS}
    for _ in range(2_000):  # warm up: memos, the first collection
        await middleware({**scope, "state": {}}, receive, sent)
    start = time.process_time()
    for i in range(n):
        await middleware({**scope, "state": {}}, receive, sent)
        if export is not None and i % SCRAPE_EVERY == 0:
            export.render()
    if export is not None:
        export.render()
    used = time.process_time() - start
    await middleware.gateway.stop()
    return used / n


def spans_alone(n: int) -> float:
    """CPU seconds per span for ``n`` bare spans of the tracer provider installed."""
    from opentelemetry import trace

    tracer = trace.get_tracer("bench")
    for _ in range(2_000):
        tracer.start_span("bare").end()
    start = time.process_time()
    for _ in range(n):
        tracer.start_span("bare").end()
    return (time.process_time() - start) / n


def measure(name: str, n: int) -> float:
    """Run configuration ``name`` in a process of its own; µs per request."""
    command = [sys.executable, __file__, "--run", name, "--requests", str(n)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return float(json.loads(done.stdout)["us"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        used = asyncio.run(requests(CONFIGURATIONS[args.run], args.requests))
        print(json.dumps({"us": used * 1e6}))
        return 0
    rounds, n = (2, 20_000) if args.quick else (args.rounds, args.requests)
    print(f"# {machine()}\n# {software()}\n# code {code_version()}")
    print(f"# {rounds} rounds of {n} requests per configuration, in alternation\n")
    found: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    for _ in range(rounds):
        for name in CONFIGURATIONS:
            found[name].append(measure(name, n))
    off = statistics.median(found["off"])
    print(f"{'configuration':<24} {'µs/request':>11} {'added µs':>9} {'ratio':>6}")
    for name, values in found.items():
        median = statistics.median(values)
        if "alone" in CONFIGURATIONS[name]:
            print(f"{name:<24} {median:>11.2f}")
        else:
            print(f"{name:<24} {median:>11.2f} {median - off:>+9.2f} {median / off:>6.2f}")
    print()
    for name in ("metrics", "both", "both, 1 % sampled"):
        added = statistics.median(found[name]) - off
        verdict = "met" if added <= TARGET_US else "MISSED"
        print(f"{name}: {added:+.2f} µs per request, target ≤ {TARGET_US} µs {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
