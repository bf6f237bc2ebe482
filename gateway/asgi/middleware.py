"""``GatewayMiddleware``: admission control in front of any ASGI app.

Per request: classify (tenant, priority), admit through the one gate (or answer 503/429),
run the app, release the seats exactly once when the app returns, however it returns.
The app returns only after its last body chunk is sent, so a streamed response keeps its
seats until its last token. Lifespan is wrapped, websockets and other scopes pass through,
exempt paths (health, metrics, admin) are never queued.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, cast

from gateway.asgi.body import RequestBody
from gateway.asgi.lifespan import run_lifespan
from gateway.asgi.responses import send_bad_request, send_json_error, send_rejection
from gateway.builtin.classifier import reader_for
from gateway.core.tickets import Ticket
from gateway.core.tickets import ticket as make_ticket
from gateway.errors import BadRequest, Disconnected, OblethError, Rejected, Unroutable
from gateway.gateway import Gateway
from gateway.protocols import Classification, Permit, RequestInfo
from gateway.routing.request import RouteRequest, blocks_of, model_of, parse_body, prompt_text
from gateway.routing.router import Decision
from gateway.settings import Settings
from gateway.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("obleth")

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

#: ``scope["state"]["obleth"]``: read-only, so one record can serve many requests
Record = Mapping[str, object]

#: How many distinct paths (and tickets) the request path remembers before it starts over.
_REMEMBERED = 1024


class GatewayMiddleware:
    """Admission control for an ASGI app.

    ``GatewayMiddleware(app)`` reads ``OBLETH_*`` settings from the environment;
    ``settings=`` or a ready ``gateway=`` may be given instead. Configuration and plugin
    errors are raised here, when the middleware is built, not on a request; except when it
    is built while the event loop already runs, as Starlette builds its middleware on the
    first lifespan event: then the error fails the server's startup through lifespan
    (``lifespan.startup.failed``, with the message), since an exception there would let a
    server with ``lifespan="auto"`` serve without the gateway; and, for a server without
    lifespan, every request that is not exempt is answered 503 ``gateway_not_started``.

    What the app can rely on: ``scope["state"]["obleth"]``, a read-only mapping, holds
    ``tenant``, ``priority`` and ``waited_s`` of the admitted request; the body it
    receives is the one the client sent, byte for byte. When upstreams are configured
    the record also holds ``upstream`` (the base URL chosen), ``scores`` (why) and
    ``route`` (the router's ``Decision``, whose ``upstream`` follows a retry on another
    upstream); the request counts against its upstream until its last chunk is sent.
    """

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings | None = None,
        *,
        gateway: Gateway | None = None,
        plugins: Iterable[object] = (),
    ) -> None:
        if gateway is not None and (settings is not None or plugins):
            raise TypeError("pass either gateway= or settings=/plugins=, not both")
        self.app = app
        self._retry_after_s = Settings.retry_after_s
        self._start_complaint = -3600.0
        try:
            self.gateway = gateway if gateway is not None else Gateway(settings, plugins=plugins)
        except OblethError as exc:
            if not _loop_running():
                raise
            self._fail_at_start(exc, settings)
            return
        config = self.gateway.settings
        self._exempt_paths(config.exempt_paths)
        #: the state record of each recent ticket admitted without waiting, built once and
        #: shared by its requests (records are read-only)
        self._at_once: dict[Ticket, Record] = {}
        self._max_body = config.max_body_bytes
        self._default = Classification(config.default_tenant, config.default_priority)
        self._plugins = self.gateway.plugins
        self._header_reader = self._plugins.header_reader
        self._scheduler = self.gateway.scheduler
        self._observes = self._plugins.observes
        self._router = self.gateway.router
        self._reads_body = self._plugins.wants_body or self._router is not None
        # with nobody to tell, nothing to route and the built-in classifier reading headers
        # alone, a free seat is taken and given back without a Permit: the try/finally
        # around the app is the one release
        fast = not self._observes and not self._reads_body and self._header_reader is not None
        self._fast_seats = self._scheduler.free_seats if fast else None
        #: the built-in classifier (``_header_reader`` itself when that is set), read
        #: directly while ``_fast_seats`` is set
        self._fast_reader = reader_for(config)
        self._session_header = config.session_header.encode("latin-1")
        self._block_bytes = config.prefix_block_bytes
        self._upstream_header = config.upstream_header
        self._poll_interval_s = config.upstream_poll_interval_s
        self._retry_after_s = config.retry_after_s

    def _exempt_paths(self, paths: tuple[str, ...]) -> None:
        self._exempt = frozenset(paths)
        self._exempt_prefixes = tuple(path + "/" for path in paths if path != "/")
        #: whether each recently seen path is exempt: one dict lookup per request
        self._exempt_by_path: dict[str, bool] = {}

    def _fail_at_start(self, error: OblethError, settings: Settings | None) -> None:
        """Serve as a gateway that cannot start: lifespan reports ``error`` to the server,
        requests are answered 503 (see the class docstring), but for exempt paths: the
        health checks and metrics that tell operators so still reach the app (the paths
        of ``settings`` when they were given, else the default ones)."""
        self.gateway = cast(Gateway, _Unassembled(error))
        self._exempt_paths(settings.exempt_paths if settings is not None else Settings.exempt_paths)
        self._fast_seats = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await run_lifespan(self.gateway, self.app, scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        try:
            exempt = self._exempt_by_path[scope["path"]]
        except KeyError:
            exempt = self._learn_exempt(scope["path"])
        if exempt:
            await self.app(scope, receive, send)
            return
        seats = self._fast_seats
        if seats is None:
            await self._admit(scope, receive, send, None)
            return
        # the fast path: classified from headers alone, a seat free and nobody waiting
        try:
            ticket = self._fast_reader.ticket(scope["headers"])
        except BadRequest as exc:
            await send_bad_request(send, exc)
            return
        if not seats.take(ticket):
            await self._admit(scope, receive, send, ticket)
            return
        # the seat comes back once: when the app hands the server the response's last
        # chunk (see _ending_at_last_byte), or when the app returns without having sent it
        held = True

        def send_then_give_back(message: Message) -> Awaitable[None]:
            nonlocal held
            if (
                message["type"] == "http.response.body"
                and not message.get("more_body", False)
                and held
            ):
                held = False
                seats.give_back(ticket)
            return send(message)

        try:
            try:
                scope["state"]["obleth"] = self._at_once[ticket]
            except (KeyError, TypeError):
                self._record_at_once(scope, ticket)
            await self.app(scope, receive, send_then_give_back)
        finally:
            if held:
                held = False
                seats.give_back(ticket)

    def _learn_exempt(self, path: str) -> bool:
        """Whether ``path`` is exempt. A path with a ``.`` or ``..`` segment never is: the
        app or an upstream may resolve ``/healthz/../v1/completions`` to a path that is not
        exempt, and admission must not be skipped for it."""
        segments = path.split("/")
        exempt = (
            (path in self._exempt or path.startswith(self._exempt_prefixes))
            and "." not in segments
            and ".." not in segments
        )
        if len(self._exempt_by_path) >= _REMEMBERED:
            self._exempt_by_path.clear()
        self._exempt_by_path[path] = exempt
        return exempt

    def _record_at_once(self, scope: Scope, ticket: Ticket) -> None:
        """The fast path's record when its one-line store failed: the ticket is new, or
        the server gave the scope no ``state`` or None (then the record may well be
        remembered)."""
        record = self._at_once.get(ticket)
        if record is None:
            if len(self._at_once) >= _REMEMBERED:
                self._at_once.clear()
            record = self._at_once[ticket] = _record_of(ticket, 0.0)
        _state(scope)["obleth"] = record

    async def _admit(
        self, scope: Scope, receive: Receive, send: Send, ticket: Ticket | None
    ) -> None:
        """Every request the fast path did not take: classify (unless ``ticket`` is
        known), read the body when needed, wait for seats or answer 503/429, then run.

        A gateway that was never started (no lifespan) or was stopped starts here: its
        free seats stay closed until then."""
        if not self.gateway.started:
            try:
                await self.gateway.start()
            except Exception as exc:
                await self._answer_not_started(send, exc)
                return
        plugins = self._plugins
        body: RequestBody | None = None
        payload = None
        classification = None
        try:
            if self._reads_body and _has_json_body(scope):
                body = RequestBody(receive, self._max_body)
                payload = await body.read()
            if ticket is None:
                if self._header_reader is not None:
                    ticket = self._header_reader.ticket(scope["headers"])
                else:
                    classification = plugins.classify(scope, payload) or self._default
                    ticket = make_ticket(classification.tenant, classification.priority)
        except BadRequest as exc:
            await send_bad_request(send, exc)
            return
        except Disconnected:
            return
        permit = self._scheduler.try_acquire(ticket)
        if permit is None:
            if body is None:
                body = RequestBody(receive, self._max_body)
            permit = await self._wait_for_seat(ticket, scope, body, send)
            if permit is None:
                return
        elif self._observes:
            plugins.admitted(_info(ticket, scope), 0.0)
        if self._router is not None:
            await self._run_routed(scope, receive, send, body, payload, classification, permit)
            return
        send = _ending_at_last_byte(send, permit.release)
        await self._run(scope, receive, send, body, permit, _record_of(ticket, permit.waited_s))

    async def _answer_not_started(self, send: Send, error: Exception) -> None:
        """503 for a request that found the gateway unable to start (no lifespan told the
        server); the reason goes to the log, at most once a minute."""
        now = time.monotonic()
        if now - self._start_complaint >= 60.0:
            self._start_complaint = now
            log.error("the gateway could not start, so it admits nothing: %s", error)
        await send_json_error(
            send,
            503,
            "the gateway could not start, so it admits no request; the server's log says why",
            code="gateway_not_started",
            retry_after_s=self._retry_after_s,
        )

    async def _wait_for_seat(
        self, ticket: Ticket, scope: Scope, body: RequestBody, send: Send
    ) -> Permit | None:
        """The full path: queue, or answer 503/429; None when nobody is left to serve.

        While it waits, the client is watched for a disconnect (see
        ``RequestBody.watch_disconnect``); not a client that sent ``Expect: 100-continue``
        and no body yet: reading would tell the server to ask for the body, which such a
        client sends only to a server that will take it."""
        watch = None if not body.complete and _expects_continue(scope) else body.watch_disconnect
        try:
            permit = await self._scheduler.acquire(ticket, disconnected=watch)
        except Rejected as exc:
            if self._observes:
                self._plugins.rejected(_info(ticket, scope), exc.reason)
            await send_rejection(send, exc)
            return None
        except Disconnected:
            return None
        if self._observes:
            self._plugins.admitted(_info(ticket, scope), permit.waited_s)
        return permit

    async def _run(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        body: RequestBody | None,
        permit: Permit,
        record: Record,
    ) -> None:
        """Run the app with ``record`` in its scope, telling observers (if any) how the
        request ended: completed, error or cancelled. ``send`` gives the seats back at the
        last chunk; the ``finally`` here does if it did not."""
        if not self._observes:
            try:
                _state(scope)["obleth"] = record
                await self.app(scope, receive if body is None else body.replay, send)
            finally:
                permit.release()
            return
        if body is None:
            body = RequestBody(receive, self._max_body)
        started = time.monotonic()
        outcome = "error"
        try:
            _state(scope)["obleth"] = record
            await self.app(scope, body.replay, send)
            # the seats came back at the response's last chunk: the response is complete,
            # whatever the app read afterwards (a server answers receive() with a
            # disconnect once the response is done, and streaming responses listen)
            outcome = "cancelled" if body.disconnected and not permit.released else "completed"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            permit.release()
            self._plugins.finished(_info(permit.ticket, scope), time.monotonic() - started, outcome)

    async def _run_routed(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        body: RequestBody | None,
        payload: bytes | None,
        classification: Classification | None,
        permit: Permit,
    ) -> None:
        """Choose the upstream, then run the app; the choice counts until the response's
        last chunk (or until the app returns without it).

        The seats come back however routing ends, an unexpected error included."""
        try:
            decision = self._route(scope, payload, classification, permit.ticket)
        except Unroutable as exc:
            permit.release()
            if self._observes:
                self._plugins.finished(_info(permit.ticket, scope), 0.0, "error")
            # a 503 (no healthy upstream) may be retried after the next health check
            retry = self._poll_interval_s if exc.status == 503 else None
            await send_json_error(send, exc.status, str(exc), code=exc.code, retry_after_s=retry)
            return
        except BaseException:
            permit.release()
            raise

        def end() -> None:
            decision.finish()
            permit.release()

        try:
            record = _record_of(
                permit.ticket,
                permit.waited_s,
                upstream=decision.upstream,
                scores=decision.scores,
                route=decision,
            )
            if self._plugins.observes_routing:
                self._plugins.routed(
                    _info(permit.ticket, scope), decision.upstream, decision.scores
                )
            send = _ending_at_last_byte(send, end, decision if self._upstream_header else None)
            await self._run(scope, receive, send, body, permit, record)
        finally:
            end()

    def _route(
        self,
        scope: Scope,
        payload: bytes | None,
        classification: Classification | None,
        ticket: Ticket,
    ) -> Decision:
        """``classification`` is None when the built-in classifier, which gives no routing
        hints, classified the request."""
        assert self._router is not None
        parsed = parse_body(payload)
        model = model_of(parsed)
        text = classification.routing_key if classification is not None else None
        if text is None:
            text = prompt_text(parsed)
        session = classification.session_id if classification is not None else None
        if session is None:
            wanted = self._session_header
            for name, value in scope["headers"]:
                if name == wanted:
                    session = value.decode("latin-1").strip() or None
                    break
        request = RouteRequest(
            path=scope["path"],
            model=model,
            blocks=blocks_of(text, model, self._block_bytes) if text else (),
            session_id=session,
            tenant=ticket.tenant,
            fleet=self._router.fleet,
        )
        return self._router.route(request)


def _ending_at_last_byte(
    send: Send, end: Callable[[], object], named: Decision | None = None
) -> Send:
    """``send`` that calls ``end()`` (which gives the seats back, and ends the routing
    decision) when the app hands the server the response's last chunk, and with ``named``
    adds ``x-obleth-upstream``: the decision's upstream when the response starts, which
    after a retry is the one that answered.

    An app may take more event-loop turns to return after that (a proxy closing its
    upstream connection, a streaming response tearing down, background tasks), and the
    server may already be reading the client's next request on the same connection: it
    must not find the previous request's seat still taken. The work the seat stood for is
    done once the last chunk exists; whoever gets the seat next runs when this task next
    yields, at the earliest while that chunk is being written. ``end`` must count once
    however often it is called: the ``finally`` around the app calls it again as the
    backstop. A plain function returning ``send``'s awaitable, not a coroutine of its own:
    it runs twice per request.
    """

    def send_and_end(message: Message) -> Awaitable[None]:
        kind = message["type"]
        if kind == "http.response.start":
            if named is not None:
                headers = list(message.get("headers", []))
                headers.append((b"x-obleth-upstream", named.upstream.encode("latin-1")))
                message = {**message, "headers": headers}
        elif kind == "http.response.body" and not message.get("more_body", False):
            end()
        return send(message)

    return send_and_end


class _Unassembled:
    """What ``GatewayMiddleware.gateway`` holds when the gateway could not be assembled
    while the server ran: a gateway that never starts, whose ``start()`` raises the
    assembly error each time it is asked."""

    started = False

    def __init__(self, error: OblethError) -> None:
        self.error = error

    async def start(self) -> None:
        raise self.error.with_traceback(None)

    async def stop(self) -> None:
        pass


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _record_of(ticket: Ticket, waited_s: float, **routing: object) -> Record:
    """What the app can read about its admitted request, in ``scope["state"]["obleth"]``."""
    record = {"tenant": ticket.tenant, "priority": ticket.priority, "waited_s": waited_s}
    return MappingProxyType(record | routing)


def _state(scope: Scope) -> dict[str, Any]:
    state: dict[str, Any] | None = scope.get("state")
    if state is None:
        state = scope["state"] = {}
    return state


def _info(ticket: Ticket, scope: Scope) -> RequestInfo:
    return RequestInfo(ticket.tenant, ticket.priority, scope["method"], scope["path"])


def _expects_continue(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"expect":
            return bool(value.strip().lower() == b"100-continue")
    return False


def _has_json_body(scope: Scope) -> bool:
    """JSON bodies are read for classifiers and the router; anything else streams to the app."""
    if scope["method"] not in _BODY_METHODS:
        return False
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bool(value.lower().startswith(b"application/json"))
    return False
