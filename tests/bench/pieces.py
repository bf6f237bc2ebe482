"""Where the gateway's instructions per request go, piece by piece, counted by cachegrind.

    python tests/bench/pieces.py        # about 2 minutes; needs valgrind

``instructions.py`` counts what a whole request costs a uvicorn server; this counts the
pieces of the request path in one process, each next to the naive semaphore middleware
and to a bare coroutine call, so that what the gateway adds can be read against what any
admission control must do (classify the request, take and give back a seat) and what the
request path's shape costs (one object per request, its coroutine, the ``send`` wrapper).
Each piece runs twice under cachegrind (a short and a long loop); the difference per
iteration, less an empty loop's, is its cost. Counts do not depend on the machine's load.

Nothing is asserted; the exit status is 2 when valgrind is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from harness import HEADERS, code_version, machine, software

SHORT, LONG = 2_000, 12_000

#: the bench's request headers, as an ASGI server hands them to the app
RAW_HEADERS = [(b"host", b"127.0.0.1")] + [
    (name.lower().encode(), value.strip().encode())
    for name, value in (header.split(":", 1) for header in HEADERS)
]

PIECES = {
    "the whole request: GatewayMiddleware": "gateway",
    "the whole request: naive semaphore": "semaphore",
    "  classify (built-in, from the headers)": "classify",
    "  take and give back a free seat": "seats",
    "  one Flight (the per-request object)": "flight",
    "  one coroutine, created and awaited": "coroutine",
}


async def trivial_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def sent(message: dict[str, Any]) -> None:
    pass


def scope() -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": "/", "headers": RAW_HEADERS, "state": {}}


async def behind_semaphore(semaphore: asyncio.Semaphore, request: dict[str, Any]) -> None:
    """The naive semaphore middleware's work for one request."""
    async with semaphore:
        await trivial_app(request, receive, sent)


async def nothing() -> None:
    pass


async def loop_of(piece: str, n: int) -> None:
    """Run ``piece`` ``n`` times (``empty``: the loop alone)."""
    from gateway import GatewayMiddleware, Settings
    from gateway.asgi.flight import Flight

    middleware = GatewayMiddleware(trivial_app, Settings(global_max_in_flight=64))
    await middleware.gateway.start()
    plan = middleware._plan
    assert plan is not None
    ticket = plan.header_ticket
    assert ticket is not None
    seats = plan.free_seats
    assert seats is not None
    semaphore = asyncio.Semaphore(64)
    one = ticket(RAW_HEADERS)
    request = scope()
    awaited: dict[str, Callable[[], Awaitable[None]]] = {
        "gateway": lambda: middleware(scope(), receive, sent),
        "semaphore": lambda: behind_semaphore(semaphore, scope()),
        "bare": lambda: trivial_app(scope(), receive, sent),
        "coroutine": nothing,
    }
    called: dict[str, Callable[[], object]] = {
        "classify": lambda: ticket(RAW_HEADERS),
        "seats": lambda: seats.take(one) and seats.give_back(one),
        "flight": lambda: Flight(plan, request, receive, sent),
        "empty": lambda: None,
    }
    if piece in awaited:
        run = awaited[piece]
        for _ in range(n):
            await run()
    else:
        call = called[piece]
        for _ in range(n):
            call()
    await middleware.gateway.stop()


def counted(piece: str, n: int, folder: Path) -> int:
    """Instructions of a whole process running ``piece`` ``n`` times."""
    out = folder / f"{piece}.{n}.out"
    command = [
        "valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
        f"--log-file={out.with_suffix('.log')}", sys.executable, __file__, "--run", piece,
        str(n),
    ]  # fmt: skip
    subprocess.run(command, check=True, cwd=Path(__file__).parent)
    for line in out.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"{out}: cachegrind wrote no summary line")


def per_iteration(piece: str, folder: Path) -> float:
    return (counted(piece, LONG, folder) - counted(piece, SHORT, folder)) / (LONG - SHORT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--run", nargs=2, metavar=("PIECE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        asyncio.run(loop_of(args.run[0], int(args.run[1])))
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: this benchmark counts instructions with it")
        return 2
    with tempfile.TemporaryDirectory(prefix="obleth-pieces-") as folder:
        empty = per_iteration("empty", Path(folder))
        bare = per_iteration("bare", Path(folder)) - empty
        costs = {name: per_iteration(piece, Path(folder)) - empty for name, piece in PIECES.items()}
    print(f"command: {shlex.join(['python', 'tests/bench/pieces.py'])}")
    print(f"code: {code_version()}")
    print(f"machine: {machine()}")
    print(f"software: {software()}")
    print(
        f"\nInstructions per iteration, in one process (loops of {SHORT} and {LONG} under "
        "cachegrind, the difference, less an empty loop's); a whole request is counted "
        f"past the bare app's {bare:.0f}"
    )
    semaphore = costs["the whole request: naive semaphore"] - bare
    print(f"   {'piece':42}{'instructions':>14}{'vs semaphore':>14}")
    for name, cost in costs.items():
        whole = name.startswith("the whole request")
        shown = cost - bare if whole else cost
        print(f"   {name:42}{shown:>14.0f}{shown / semaphore:>13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
