"""What the WSGI tests share: ``HeldApp``, a WSGI app that holds its requests until the
test lets them go, and how the tests call it and read what the gateway counted."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.types import StartResponse, WSGIEnvironment

import httpx

from gateway import Settings
from gateway.wsgi import WSGIGatewayMiddleware

CHAT = "/v1/chat/completions"
WAIT_S = 10.0


class HeldApp:
    """A WSGI app that counts the requests it serves at once and holds each until the test
    lets it go (``release``); ``/healthz`` answers at once. It answers with what it saw:
    the gateway's record and the body it read."""

    def __init__(self, *, stream: bool = False, fail: str | None = None) -> None:
        self.stream = stream
        # "call": raise before answering; "start": answer an iterable whose iter() raises
        # (a lazy body that fails to start); "iterate": raise in the middle of the stream
        self.fail = fail
        self._lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ["PATH_INFO"] == "/healthz":
            start_response("200 OK", [("content-type", "text/plain")])
            return [b"ok"]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        record = {key: value for key, value in environ["obleth"].items() if key != "route"}
        seen = {"record": record, "body": body.decode("latin-1")}
        self._enter()
        if self.fail == "call":
            self._leave()
            raise RuntimeError("the app failed")
        if self.fail == "start":
            self._leave()
            start_response("200 OK", [("content-type", "text/plain")])
            return _FailsToStart()
        if not self.stream:
            try:
                self.release.wait(WAIT_S)
            finally:
                self._leave()
            start_response("200 OK", [("content-type", "application/json")])
            return [json.dumps(seen).encode()]
        start_response("200 OK", [("content-type", "text/plain")])
        return self._chunks(seen)

    def _chunks(self, seen: dict[str, Any]) -> Iterator[bytes]:
        try:
            yield b"first\n"
            self.release.wait(WAIT_S)
            if self.fail == "iterate":
                raise RuntimeError("the stream failed")
            yield json.dumps(seen).encode()
        finally:
            self._leave()

    def _enter(self) -> None:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        self.entered.release()

    def _leave(self) -> None:
        with self._lock:
            self.now -= 1

    def wait_entered(self, count: int) -> None:
        for _ in range(count):
            assert self.entered.acquire(timeout=WAIT_S), "the app was never called"


class _FailsToStart:
    """A response body whose ``iter()`` raises."""

    def __iter__(self) -> Iterator[bytes]:
        raise RuntimeError("the body failed to start")


def gated(app: HeldApp, **settings: Any) -> WSGIGatewayMiddleware:
    return WSGIGatewayMiddleware(app, settings=Settings(**settings))


def post(url: str, **options: Any) -> httpx.Response:
    if "content" not in options:
        options.setdefault("json", {"messages": []})
    return httpx.post(url + CHAT, trust_env=False, timeout=WAIT_S, **options)


def outcomes(middleware: WSGIGatewayMiddleware) -> Counter[str]:
    counted: Counter[str] = Counter()
    for (_, _, outcome, reason), count in middleware.gateway.tallies.totals().items():
        counted[f"{outcome}:{reason}" if reason else outcome] += count
    return counted


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
