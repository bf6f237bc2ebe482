"""A closed-loop HTTP/1.1 load generator: N keep-alive connections, one request in flight each.

Run as a script, in a process of its own, so that the client's work lands on the other
core and never in the measured server's event loop. It prints one JSON object on stdout,
preceded by ``window-start`` and ``window-end`` lines with ``--marks``:

    python tests/bench/loadgen.py --port 8000 --connections 32 --seconds 3

httpx and the stream API cost more per request than a uvicorn worker spends serving a
trivial endpoint, so the client is an ``asyncio.Protocol`` on uvloop (when installed): a
response is parsed just far enough to know where it ends (status line and
``Content-Length``), and the next request is written from the same callback.

Every run is bounded twice: by time (``--seconds``, plus a grace period for the requests
still in flight) and by a request count (``--max-requests``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import time
from array import array
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

#: How long the last requests of a run may take to come back before they count as errors.
GRACE_S = 10.0


@dataclass
class Run:
    """What all connections of one run share: the clock bounds and the results."""

    measure_from: float
    deadline: float
    max_requests: int
    issued: int = 0
    latencies: array[float] = field(default_factory=lambda: array("d"))
    statuses: dict[int, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    last_done: float = 0.0

    def may_send(self, now: float) -> bool:
        return now < self.deadline and self.issued < self.max_requests

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


class Client(asyncio.Protocol):
    """One keep-alive connection sending the same request back to back."""

    def __init__(self, run: Run, request: bytes, finished: asyncio.Future[None]) -> None:
        self._run = run
        self._request = request
        self._finished = finished
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._response_end = -1  # index in the buffer where the current response ends
        self._status = 0
        self._sent_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they have its methods
        self._transport = cast(asyncio.Transport, transport)
        self._send_next(time.perf_counter())

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        if self._response_end < 0 and not self._parse_head():
            return
        if len(buffer) < self._response_end:
            return
        now = time.perf_counter()
        self._record(now)
        if len(buffer) > self._response_end:
            # one request in flight per connection: nothing may follow its response
            self._fail("unexpected bytes after a response")
            return
        buffer.clear()
        self._response_end = -1
        self._send_next(now)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._response_end >= 0 or self._sent_at:
            self._run.error("connection closed mid-response")
        if not self._finished.done():
            self._finished.set_result(None)

    def _parse_head(self) -> bool:
        """Find where the response in the buffer ends; False while the head is incomplete."""
        buffer = self._buffer
        head_end = buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return False
        head = bytes(buffer[:head_end]).split(b"\r\n")
        self._status = int(head[0].split(b" ", 2)[1])
        length = -1
        for line in head[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
                break
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                # a streamed answer: it ends with the empty last chunk
                end = buffer.find(b"\r\n0\r\n\r\n", head_end)
                if end < 0:
                    return False
                self._response_end = end + 7
                return True
        if length < 0:
            self._fail("response without Content-Length")
            return False
        self._response_end = head_end + 4 + length
        return True

    def _record(self, now: float) -> None:
        run = self._run
        run.last_done = now
        if run.measure_from <= now <= run.deadline:
            run.latencies.append(now - self._sent_at)
            run.statuses[self._status] = run.statuses.get(self._status, 0) + 1
        self._sent_at = 0.0

    def _send_next(self, now: float) -> None:
        assert self._transport is not None
        if not self._run.may_send(now):
            self._transport.close()
            return
        self._run.issued += 1
        self._sent_at = now
        self._transport.write(self._request)

    def _fail(self, what: str) -> None:
        self._run.error(what)
        self._sent_at = 0.0
        self._response_end = -1
        assert self._transport is not None
        self._transport.close()


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list; NaN for an empty one."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


async def drive(
    host: str,
    port: int,
    request: bytes,
    connections: int,
    seconds: float,
    warmup_s: float,
    max_requests: int,
    marks: bool = False,
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    cpu_start = time.process_time()
    start = time.perf_counter()
    run = Run(
        measure_from=start + warmup_s,
        deadline=start + warmup_s + seconds,
        max_requests=max_requests,
    )
    if marks:
        # lets the caller sample the server's CPU time over the measured window only
        loop.call_later(warmup_s, _mark, "window-start")
        loop.call_later(warmup_s + seconds, _mark, "window-end")
    finished: list[asyncio.Future[None]] = []
    for _ in range(connections):
        done: asyncio.Future[None] = loop.create_future()
        finished.append(done)
        try:
            await loop.create_connection(functools.partial(Client, run, request, done), host, port)
        except OSError as exc:
            run.error(f"connect: {exc.strerror or exc}")
            done.set_result(None)
    budget = run.deadline + GRACE_S - time.perf_counter()
    _, late = await asyncio.wait(finished, timeout=max(budget, 0.0))
    if late:
        run.error("no answer within the grace period")
    end = min(run.deadline, run.last_done) if run.last_done else run.deadline
    window = max(end - run.measure_from, 1e-9)
    ordered = sorted(run.latencies)
    return {
        "connections": connections,
        "requests": len(ordered),
        "window_s": window,
        "rps": len(ordered) / window,
        "p50_ms": percentile(ordered, 0.50) * 1e3,
        "p99_ms": percentile(ordered, 0.99) * 1e3,
        "max_ms": (ordered[-1] if ordered else math.nan) * 1e3,
        "statuses": {str(code): count for code, count in sorted(run.statuses.items())},
        "errors": run.errors,
        "client_cpu_s": time.process_time() - cpu_start,
        "wall_s": time.perf_counter() - start,
    }


def _mark(label: str) -> None:
    print(label, flush=True)


def build_request(
    host: str, port: int, path: str, headers: list[str], body: bytes | None = None
) -> bytes:
    """A GET, or with ``body`` a POST of that JSON body."""
    if body is None:
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", *headers, "", ""]
        return "\r\n".join(lines).encode("latin-1")
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        *headers,
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "",
        "",
    ]
    return "\r\n".join(lines).encode("latin-1") + body


def run_on_uvloop(coroutine: Coroutine[Any, Any, dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """Run on uvloop, as the measured servers do; on asyncio's loop where it is missing."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine), "asyncio"
    return uvloop.run(coroutine), "uvloop"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/")
    parser.add_argument("--header", action="append", default=[], help="'Name: value'")
    parser.add_argument("--body", help="send a POST with this JSON body (else a GET)")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds not measured")
    parser.add_argument("--max-requests", type=int, default=2_000_000)
    parser.add_argument(
        "--marks", action="store_true", help="print window-start/window-end lines first"
    )
    args = parser.parse_args()
    body = None if args.body is None else args.body.encode()
    request = build_request(args.host, args.port, args.path, args.header, body)
    coroutine = drive(
        args.host,
        args.port,
        request,
        args.connections,
        args.seconds,
        args.warmup,
        args.max_requests,
        args.marks,
    )
    result, loop_name = run_on_uvloop(coroutine)
    result["loop"] = loop_name
    print(json.dumps(result))


if __name__ == "__main__":
    main()
