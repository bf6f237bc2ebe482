"""Routing a request on an exempt path: no seat, no queue, no tally, only a destination.

Exempt paths (``exempt_paths``) skip admission. An app that forwards every request it gets
to the upstream the router chose, as ``ProxyApp`` does, still needs that choice for them:
without it, it has nowhere to send the request. ``GatewayMiddleware(...,
route_exempt=True)`` (what ``obleth serve`` builds) hands such requests here.
"""

from __future__ import annotations

from collections.abc import Awaitable
from types import MappingProxyType

from gateway.asgi.body import RequestBody, declared_length, has_json_body
from gateway.asgi.plan import FlightPlan, keep_record, naming_upstream, routed_keys
from gateway.asgi.responses import send_bad_request
from gateway.errors import BadRequest, Disconnected, Unroutable
from gateway.types import Message, Receive, Scope, Send


async def pass_routed(plan: FlightPlan, scope: Scope, receive: Receive, send: Send) -> None:
    """Route the exempt request of ``scope`` and run the app with the choice in
    ``scope["state"]["obleth"]`` (``upstream``, ``scores`` and ``route``, as an admitted
    request's record has them; no tenant, priority or wait: it was never classified).

    What the caller may rely on: the model of a JSON body is read (bounded by
    ``max_body_bytes``, and replayed to the app byte for byte) so that a fleet where each
    upstream serves its own models sends the request to one that serves it; the upstream
    counts the request in flight until its last chunk, once; with no healthy upstream the
    client gets the 503 an admitted request would. Without upstreams the app runs at once.
    """
    router, reader = plan.router, plan.reader
    if router is None or reader is None:
        await plan.app(scope, receive, send)
        return
    refused = plan.refuse_target(scope) if plan.refuse_target is not None else None
    if refused:  # as for an admitted request: never routed, nor forwarded
        await send_bad_request(send, BadRequest(refused, code="invalid_path"))
        return
    body = None
    payload = None
    if has_json_body(scope, plan.max_body):
        body = RequestBody(receive, plan.max_body, declared_length(scope))
        try:
            payload = await body.read()
        except BadRequest as exc:
            await send_bad_request(send, exc)
            return
        except Disconnected:  # gone, or answered 408 by ``BodyTimeout``
            return
    request = reader.read(scope["path"], scope["headers"], payload, plan.default.tenant, None)
    try:
        decision = router.route(request)
    except Unroutable as exc:
        await plan.answer_unroutable(send, exc)
        return
    keep_record(scope, MappingProxyType(routed_keys(decision)))
    names_upstream = plan.names_upstream

    def sending(message: Message) -> Awaitable[None]:
        kind = message["type"]
        if kind == "http.response.body" and not message.get("more_body", False):
            decision.finish()
        elif kind == "http.response.start" and names_upstream:
            message = naming_upstream(message, decision)
        return send(message)

    try:
        await plan.app(scope, receive if body is None else body.replay, sending)
    finally:
        decision.finish()
