"""``WSGIGatewayMiddleware``: admission control in front of a WSGI app (Flask, Django,
anything PEP 3333), on the same core as the ASGI middleware.

Each request that is not exempt goes through the same ``Flight`` an ASGI request goes
through, run on the gateway's event loop (``loopthread.py``) while the server's worker
thread waits for its turn (``passage.py``). So the two middlewares share one scheduler,
one fair queue, the classifier plugins, the router, the tallies and the spans; in cluster
mode, one budget in Redis with every other pod, ASGI or WSGI.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Iterable
from typing import Any
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from gateway.core.exemptions import ExemptPaths
from gateway.gateway import Gateway
from gateway.settings import Settings
from gateway.wsgi.environ import body_ahead, classified_headers, path_of, scope_of
from gateway.wsgi.loopthread import LoopThread
from gateway.wsgi.passage import Passage, hold, run_app
from gateway.wsgi.processplan import ProcessPlan
from gateway.wsgi.watch import ResponseWatch

#: where the app finds the gateway's record of its request
ENVIRON_KEY = "obleth"


class WSGIGatewayMiddleware:
    """Admission control for a WSGI app: ``app.wsgi_app = WSGIGatewayMiddleware(app.wsgi_app)``
    (Flask), or around ``get_wsgi_application()`` (Django).

    Settings come from ``OBLETH_*`` variables unless ``settings=`` (or a ready
    ``gateway=``) is given. A bad setting or a broken plugin raises here, when the app is
    built: the server fails to load the app, with the message naming the setting.

    What the app can rely on:

    - ``environ["obleth"]`` is the same read-only record an ASGI app finds in
      ``scope["state"]["obleth"]``: ``tenant``, ``priority``, ``waited_s``, and with
      upstreams ``upstream``, ``scores`` and ``route``.
    - The request's seats are held until the server closes the response iterable (PEP
      3333 says it must, after the last chunk or when the client goes away), so a
      streamed response holds its seat until its last chunk is sent; they are given
      back exactly once, also when the app raises.
    - The body it reads is the one the client sent, byte for byte (a JSON body is read
      ahead, bounded by ``max_body_bytes``, for classification and routing).
    - Rejections are the ASGI middleware's: 503/429 with ``Retry-After`` and an
      OpenAI-style JSON body; 400/413 for a body the gateway cannot read.

    The gateway starts at the first request of each process, on an event loop thread of
    its own (WSGI has no startup event); ``start()`` starts it earlier, for instance in
    gunicorn's ``post_worker_init`` hook. A process forked from the one that built the
    middleware gets a fresh gateway, built from the same settings and plugins (a ready
    ``gateway=`` cannot be built again: start it after the fork). It stops when the
    process exits, or at ``close()``. While a request waits for a seat it holds its
    worker thread: give the server more threads than ``global_max_in_flight`` if waiting
    requests should not block exempt ones. A client that leaves while its request waits
    is not noticed (WSGI does not tell); its request is admitted, and ends as soon as the
    app writes to it.
    """

    def __init__(
        self,
        app: WSGIApplication,
        settings: Settings | None = None,
        *,
        gateway: Gateway | None = None,
        plugins: Iterable[object] = (),
    ) -> None:
        self.app = app
        self._plans = ProcessPlan(run_app, settings, gateway, plugins)
        self._exempt = ExemptPaths(self.gateway.settings.exempt_paths)
        self._unfold = classified_headers(self.gateway.settings)
        self._loop = LoopThread("obleth-gateway")
        atexit.register(_close_at_exit, weakref.ref(self))

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        raw_path, path = path_of(environ)
        if self._exempt.covers(path):
            return self.app(environ, start_response)
        plan = self._plans.current()
        scope = scope_of(environ, raw_path, path, self._unfold)
        ahead = None
        if plan.reads_body and plan.reads(scope):
            ahead = body_ahead(environ, plan.max_body)
        loop = self._loop.loop()
        passage = Passage(loop)
        self._loop.submit(passage.fly(plan, scope, ahead)).add_done_callback(passage.unflown)
        answer = passage.verdict.result()
        if answer is not None:
            return answer.write(start_response)
        record = scope["state"]["obleth"]
        environ[ENVIRON_KEY] = record
        if plan.names_upstream and "upstream" in record:
            start_response = _naming(start_response, record["route"])
        watch = None
        settle = passage.settle_usage() if plan.meters_usage else None
        if plan.latency is not None or settle is not None:
            watch = ResponseWatch(loop, plan.latency, settle)
            start_response = watch.noting(start_response)
        try:
            result = self.app(environ, start_response)
        except BaseException as exc:
            passage.finish("failed", exc)
            raise
        return hold(result, passage, watch)

    @property
    def gateway(self) -> Gateway:
        """The gateway of this process: in a process forked from the one that built the
        middleware, a fresh one built from the same settings and plugins (see
        ``ProcessPlan``)."""
        return self._plans.current().gateway

    def start(self) -> None:
        """Start the gateway in this process now rather than at its first request;
        raises what stops it from starting (a ``PluginError`` naming the plugin whose
        capacity provider failed to start, ...).

        In cluster mode, Redis out of reach does not stop it: the gateway starts in its
        ``redis_failure_mode`` and keeps trying (with ``closed``, requests are answered
        503 ``unavailable`` until Redis answers), as an app must be able to start while
        Redis is down. Starting before the server forks is safe: each forked process
        builds and starts a gateway of its own.
        """
        gateway = self._plans.current().gateway
        self._loop.submit(gateway.start()).result()

    def close(self) -> None:
        """Stop the gateway (waiters still queued are answered 503, leases in Redis are
        given back) and its loop. Responses still streaming go on; their seats are given
        back now, and closing them later does nothing more. A later request starts the
        gateway and its loop again."""
        self._loop.close(self._stop)

    async def _stop(self) -> None:
        plan = self._plans.here()  # none when this process never used its gateway
        if plan is not None:
            await plan.gateway.stop()


def _naming(start_response: StartResponse, route: Any) -> StartResponse:
    """``start_response`` adding ``x-obleth-upstream``: the upstream that answered."""

    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        headers = [*headers, ("x-obleth-upstream", route.upstream)]
        return start_response(status, headers, exc_info)

    return start


def _close_at_exit(ref: weakref.ref[WSGIGatewayMiddleware]) -> None:
    middleware = ref()
    if middleware is not None:
        middleware.close()
