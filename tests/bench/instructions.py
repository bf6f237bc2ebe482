"""What ``GatewayMiddleware`` adds to each request in CPU instructions, counted by cachegrind.

    python tests/bench/instructions.py            # about 2 minutes; needs valgrind
    python tests/bench/instructions.py --quick    # about 1 minute

The timed benchmark (``overhead.py``) is the measure the targets are stated in, but on a
shared virtual machine its ratios move by several per cent from one run to the next,
more than a change to the request path is worth. This one counts instead: each variant
of ``apps.py`` is served by a uvicorn process under valgrind's cachegrind and loaded with
a fixed number of requests, twice (a short and a long run, at once); the difference
between the two runs, divided by the difference in requests, is what one request costs,
start-up and shutdown cancelled out. The counts do not depend on the machine's load,
so two commits can be compared by running this twice. Reported per request: instructions
executed, and first-level cache misses for instructions and data (cachegrind's model of
this machine's caches, without prefetching: a relative figure, not a timing).

Nothing is asserted; the exit status is 1 only when a run is invalid (non-200 answers,
errors), 2 when valgrind is missing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import Server, code_version, load, machine, problems_of, software

VARIANTS = {
    "bare": "bare",
    "gateway": "with_gateway",
    "naive semaphore": "with_semaphore",
    "pass-through": "with_passthrough",
}
CONNECTIONS = 32
#: what cachegrind reports, in its order, and the columns printed
EVENTS = ("Ir", "I1mr", "ILmr", "Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw")
STARTUP_S = 300.0  # a server under valgrind starts some 30 times slower


def counted(factory: str, requests: int, out: Path) -> dict[str, int]:
    """Serve ``factory`` under cachegrind, send it ``requests`` requests, stop it; its totals."""
    under = [
        "valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--cachegrind-out-file={out}",
        f"--log-file={out.with_suffix('.log')}",
    ]  # fmt: skip
    server = Server(factory, under=under)
    try:
        server.wait_ready(timeout_s=STARTUP_S)
        result = load(
            server,
            seconds=STARTUP_S,
            connections=CONNECTIONS,
            warmup_s=0.0,
            max_requests=requests,
        )
    finally:
        server.stop(timeout_s=STARTUP_S)
    problems = problems_of(result, f"{factory}, {requests} requests")
    if result["requests"] != requests:
        problems.append(f"{factory}: {result['requests']} of {requests} requests answered")
    if problems:
        raise RuntimeError("; ".join(problems))
    return totals(out)


def totals(path: Path) -> dict[str, int]:
    for line in path.read_text().splitlines():
        if line.startswith("summary:"):
            return dict(zip(EVENTS, (int(n) for n in line.split()[1:]), strict=True))
    raise RuntimeError(f"{path}: cachegrind wrote no summary line")


def per_request(factory: str, short: int, long: int, folder: Path) -> dict[str, float]:
    """The cost of one request: the long run's totals less the short run's, per request."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        runs = [
            pool.submit(counted, factory, n, folder / f"{factory}.{n}.out") for n in (short, long)
        ]
        few, many = (run.result() for run in runs)
    return {event: (many[event] - few[event]) / (long - short) for event in EVENTS}


def report(command: str, short: int, long: int, costs: dict[str, dict[str, float]]) -> None:
    print(f"command: {command}")
    print(f"code: {code_version()}")
    print(f"machine: {machine()}")
    print(f"software: {software()}")
    print(
        f"\nPer request, GET / -> 'hello', {CONNECTIONS} keep-alive connections; runs of "
        f"{short} and {long} requests under cachegrind, the difference per request"
    )
    bare = costs["bare"]
    semaphore = costs["naive semaphore"]["Ir"] - bare["Ir"]
    print(
        f"   {'variant':16} {'instructions':>12} {'added':>8} {'vs semaphore':>13} "
        f"{'I1 misses':>10} {'D1 misses':>10}"
    )
    for name, cost in costs.items():
        added = cost["Ir"] - bare["Ir"]
        against = f"{added / semaphore:.2f}x" if name != "bare" else ""
        misses = cost["D1mr"] + cost["D1mw"]
        print(
            f"   {name:16} {cost['Ir']:12.0f} {added:+8.0f} {against:>13} "
            f"{cost['I1mr']:10.0f} {misses:10.0f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per run")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print(
            "valgrind is not installed: this benchmark counts instructions with its "
            "cachegrind tool (Debian: apt-get install valgrind)",
            file=sys.stderr,
        )
        return 2
    short, long = (500, 2500) if args.quick else (1000, 5000)
    costs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="obleth-cachegrind-") as folder:
        for name, factory in VARIANTS.items():
            print(f"{name} ...", file=sys.stderr, flush=True)
            try:
                costs[name] = per_request(factory, short, long, Path(folder))
            except RuntimeError as exc:
                print(f"invalid run: {exc}", file=sys.stderr)
                return 1
    report(shlex.join(["python", "tests/bench/instructions.py", *sys.argv[1:]]), short, long, costs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
