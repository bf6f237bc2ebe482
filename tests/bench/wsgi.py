"""What ``WSGIGatewayMiddleware`` adds to a WSGI request, against the bare app, in one run.

    python tests/bench/wsgi.py            # about 20 seconds
    python tests/bench/wsgi.py --quick    # a smoke run

Worker threads call the WSGI callable straight (no server: nothing but the request path is
measured), as a threaded server's workers do, each request reading a small JSON body and
closing its response. The app is trivial and seats are always free, so what is left is
the gateway's own cost: the hand-over to its event loop thread and back. Measured with 1
and with 8 threads; the bare app and the gated one alternate over the rounds. Printed:
wall time and process CPU time per request (all threads, the loop's included), medians of
the rounds, and the gated-to-bare difference. Never asserted; the figures go to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import threading
import time
from collections.abc import Iterable
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from harness import code_version, machine, software

from gateway import Settings
from gateway.wsgi import WSGIGatewayMiddleware

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hello"}]}'


def trivial(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
    start_response("200 OK", [("content-type", "application/json")])
    return [b"{}"]


def environ_of() -> WSGIEnvironment:
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/v1/chat/completions",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(BODY)),
        "HTTP_AUTHORIZATION": "Bearer sk-bench-0001",
        "HTTP_USER_AGENT": "obleth-bench/1",
        "wsgi.input": io.BytesIO(BODY),
        "wsgi.url_scheme": "http",
    }


def _start_response(status: str, headers: list[tuple[str, str]], exc_info: object = None) -> None:
    pass


def run(app: WSGIApplication, threads: int, requests: int) -> tuple[float, float]:
    """Wall and CPU seconds per request for ``requests`` spread over ``threads``."""
    each = requests // threads

    def work() -> None:
        for _ in range(each):
            result = app(environ_of(), _start_response)  # type: ignore[arg-type]
            for _chunk in result:
                pass
            close = getattr(result, "close", None)
            if close is not None:
                close()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    wall, cpu = time.perf_counter(), time.process_time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    done = each * threads
    return (time.perf_counter() - wall) / done, (time.process_time() - cpu) / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 2_000, 2
    gated = WSGIGatewayMiddleware(trivial, settings=Settings(global_max_in_flight=64))
    apps: dict[str, WSGIApplication] = {"bare": trivial, "gated": gated}
    run(gated, 1, 200)  # starts the gateway and its loop
    print(f"# WSGIGatewayMiddleware against the bare app; {machine()}; {code_version()}")
    print(f"# {software()}")
    print(f"# {args.requests} requests per run, {args.rounds} rounds, medians")
    print("threads | bare wall µs | gated wall µs | bare CPU µs | gated CPU µs | added CPU µs")
    for threads in (1, 8):
        wall: dict[str, list[float]] = {name: [] for name in apps}
        cpu: dict[str, list[float]] = {name: [] for name in apps}
        for _ in range(args.rounds):
            for name, app in apps.items():
                seconds, cpu_seconds = run(app, threads, args.requests)
                wall[name].append(seconds * 1e6)
                cpu[name].append(cpu_seconds * 1e6)
        w = {name: statistics.median(values) for name, values in wall.items()}
        c = {name: statistics.median(values) for name, values in cpu.items()}
        print(
            f"{threads:7} | {w['bare']:12.1f} | {w['gated']:13.1f} | {c['bare']:11.1f} | "
            f"{c['gated']:12.1f} | {c['gated'] - c['bare']:12.1f}"
        )
    gated.close()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
