"""The WSGI app of the gunicorn tests, behind ``WSGIGatewayMiddleware`` (settings from
``OBLETH_*``): it holds each request ``HOLD_S`` seconds and answers with the pid of the
worker that served it and the gateway's record.

With ``COUNT_REDIS_URL`` and ``COUNT_KEY`` set, it counts the requests it serves at once in
Redis, across every worker process: ``<COUNT_KEY>:now`` and the most at once,
``<COUNT_KEY>:peak``. That count is the app's, not the gateway's: the ground truth of the
shared budget.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from wsgiref.types import StartResponse, WSGIEnvironment

import redis

from gateway.wsgi import WSGIGatewayMiddleware

HOLD_S = 0.1
_ENTER = """
local now = redis.call('INCR', KEYS[1])
if now > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], now) end
return now
"""

_url = os.environ.get("COUNT_REDIS_URL")
_key = os.environ.get("COUNT_KEY", "count")
_counts = None if _url is None else redis.Redis.from_url(_url)
_enter = None if _counts is None else _counts.register_script(_ENTER)


def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    if environ["PATH_INFO"] == "/healthz":
        start_response("200 OK", [("content-type", "text/plain")])
        return [b"ok"]
    if _counts is not None and _enter is not None:
        _enter(keys=[f"{_key}:now", f"{_key}:peak"])
    try:
        time.sleep(HOLD_S)
    finally:
        if _counts is not None:
            _counts.decr(f"{_key}:now")
    body = json.dumps({"pid": os.getpid(), "record": dict(environ["obleth"])}).encode()
    start_response("200 OK", [("content-type", "application/json")])
    return [body]


application = WSGIGatewayMiddleware(app)
