"""``admin_app(gateway)``: the admin API, an ASGI app of its own.

It is mounted beside the gateway (its paths are exempt from admission, so operators
reach it during overload) or served on a listener of its own. What it offers today:

- ``GET /api/v1/capacity``: ``{"max_in_flight": N}``, the limit in force (in cluster
  mode the pool's, as this pod last heard it from Redis).
- ``PUT /api/v1/capacity`` with ``{"max_in_flight": N}``: sets the operator's limit, the
  *ceiling*, at once (in cluster mode for every pod, within one heartbeat); ``0`` pauses
  admissions. It answers ``{"max_in_flight": L, "ceiling": N}``: ``L`` is what ``GET``
  answers from then on, the limit in force, which is the lowest of ``N`` and the computed
  capacity providers' values (``kv-pressure``, ``adaptive``), so it may be below ``N``.
- ``GET /api/v1/status``: the gateway's state (``status.py``): the limit and each
  provider's value, requests in flight and queued (by class, by tenant, bounded), the
  upstreams, the cluster.
- ``GET /api/v1/openapi.json``: this API's OpenAPI document (``openapi.py``).
- ``GET /dashboard``: one page that polls the status and sets the limit
  (``dashboard.py``); it holds no data of its own.

``HEAD`` is answered wherever ``GET`` is, with the same status and headers (the server
leaves the body out); any other method a path does not take gets 405 with ``Allow``.
Ambiguous input is refused 400 rather than read one way: a request carrying
``Authorization`` more than once, a JSON body naming a field twice.

The capacity and status calls need ``Authorization: Bearer <admin_token>``; the OpenAPI
document and the dashboard's page hold no state and need none. Without ``admin_token``
the whole API is off and answers 404, so that a gateway nobody configured exposes nothing.

Mounted under a prefix (Starlette's ``Mount("/admin", admin_app(gateway))``), its paths are
read below the prefix, from the scope's ``root_path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
from decimal import Decimal
from typing import Any

from gateway.admin import dashboard, openapi
from gateway.admin.contract import CAPACITY_PATH, MAX_BODY_BYTES, MAX_LIMIT, STATUS_PATH
from gateway.admin.status import status
from gateway.asgi.body import BodyTooLarge, RequestBody, declared_length
from gateway.asgi.responses import (
    error_document,
    refuse_websocket,
    send_json,
    send_json_error,
    send_not_allowed,
)
from gateway.capacity import is_computed
from gateway.core.exemptions import route_path
from gateway.errors import Disconnected, PluginError
from gateway.gateway import Gateway
from gateway.types import ASGIApp, Receive, Scope, Send

#: on the answers that read live values: a cache must not answer with an old one
NO_STORE = (b"cache-control", b"no-store")

log = logging.getLogger("obleth.admin")

#: what the API answers without a token (while it is on): documents, no state
PUBLIC_PATHS = {
    openapi.OPENAPI_PATH: openapi.send_document,
    dashboard.DASHBOARD_PATH: dashboard.send_page,
}
#: every path of the admin API, for the gateway's default ``exempt_paths``
PATHS = (CAPACITY_PATH, STATUS_PATH, *PUBLIC_PATHS)

#: the admin API's answer to a WebSocket handshake (``501 websocket_not_supported``)
WEBSOCKET_REFUSED = "the admin API takes no WebSocket connections; send HTTP requests"

_SHAPE = '{"max_in_flight": N}'


def admin_app(gateway: Gateway) -> ASGIApp:
    """The admin API over ``gateway`` (see the module docstring)."""
    return _Admin(gateway)


class _Admin:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        token = gateway.settings.admin_token
        self._token = token.encode() if token is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":  # else lifespan: nothing to do
                await refuse_websocket(scope, receive, send, WEBSOCKET_REFUSED)
            return
        path = route_path(scope)
        if self._token is None or path not in PATHS:
            await send_json_error(send, 404, "no such admin endpoint", code="not_found")
            return
        method = scope["method"]
        public = PUBLIC_PATHS.get(path)
        if public is not None:
            if method in ("GET", "HEAD"):
                await public(send)
            else:
                await send_not_allowed(send, method, ("GET", "HEAD"))
            return
        try:
            presented = _bearer(scope)
        except _Repeated as exc:
            await _ambiguous(send, exc, code="invalid_header")
            return
        if presented is None or not hmac.compare_digest(presented, self._token):
            await _unauthorized(send)
            return
        if path == STATUS_PATH:
            if method in ("GET", "HEAD"):
                await send_json(send, 200, status(self.gateway), [NO_STORE])
            else:
                await send_not_allowed(send, method, ("GET", "HEAD"))
        elif method in ("GET", "HEAD"):
            await self._capacity(send)
        elif method == "PUT":
            await self._set_capacity(scope, receive, send, presented)
        else:
            await send_not_allowed(send, method, ("GET", "HEAD", "PUT"))

    async def _capacity(self, send: Send) -> None:
        await send_json(send, 200, {"max_in_flight": self.gateway.snapshot().limit}, [NO_STORE])

    async def _set_capacity(self, scope: Scope, receive: Receive, send: Send, token: bytes) -> None:
        # a Content-Length over the bound is refused before the body is taken in
        reading = RequestBody(receive, MAX_BODY_BYTES, declared_length(scope))
        try:
            body = await reading.read()
        except BodyTooLarge as exc:
            larger = f"the body is larger than {MAX_BODY_BYTES} bytes; send {_SHAPE}"
            await send_json_error(
                send, 413, larger, code="invalid_body", param="max_in_flight", close=exc.close
            )
            return
        except Disconnected:
            return  # nobody to answer (or, cut off for pausing, ``BodyTimeout`` answers 408)
        try:
            limit, problem = _limit_of(body)
        except _Repeated as exc:
            await _ambiguous(send, exc, code="invalid_body")
            return
        if problem is not None:
            await send_json_error(send, 422, problem, code="invalid_body", param="max_in_flight")
            return
        assert limit is not None
        gateway = self.gateway
        old = _ceiling(gateway)
        try:
            gateway.set_capacity(limit)
        except RuntimeError as exc:  # no capacity provider here can be set
            await send_json_error(send, 409, str(exc), code="not_settable")
            return
        except ValueError as exc:  # the provider that can be set refuses the value
            await send_json_error(
                send, 422, f"refused: {exc}", code="invalid_body", param="max_in_flight"
            )
            return
        except PluginError as exc:  # the provider that can be set raised
            log.error("PUT /api/v1/capacity: %s", exc, exc_info=exc.__cause__)
            await send_json_error(send, 500, str(exc), code="provider_failed")
            return
        await _heard(gateway)
        in_force = gateway.snapshot().limit
        client = scope.get("client")
        log.warning(
            "capacity changed through the admin API: ceiling %d -> %d (limit in force %d), "
            "by %s (token sha256 %s)",
            old,
            limit,
            in_force,
            f"{client[0]}:{client[1]}" if client else "an unknown client",
            hashlib.sha256(token).hexdigest()[:8],
        )
        await send_json(send, 200, {"max_in_flight": in_force, "ceiling": limit}, [NO_STORE])


def _ceiling(gateway: Gateway) -> int:
    """The operator's limit before a change, for the log: the value of the provider that
    can be set as the limit uses it (its last good one, should it fail to answer)."""
    values = gateway.provider_limits()
    providers = gateway.providers
    settable = [v for name, v in values.items() if not is_computed(providers.get(name))]
    return min(settable, default=gateway.settings.global_max_in_flight)


async def _heard(gateway: Gateway) -> None:
    """Return once the pool has heard a new ceiling (``CounterBackend.settled``): the Redis
    backend sends it at once and keeps the pool's limit from Redis' reply, so that the
    PUT's answer, and a GET on this pod after it, are the pool's limit with the new
    ceiling. Bounded by ``redis_retry_budget_s``: under steady traffic the pod may never
    fall quiet (the ceiling went out with the first call, answered long before), and a pod
    that cannot reach Redis degrades and answers its own limit. In process the limit has
    changed already."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(gateway.settings.redis_retry_budget_s):
            await gateway.backend.settled()


class _Repeated(Exception):
    """Input that names ``what`` more than once, which readers resolve differently (the
    first, the last, both joined): answered 400, never read one way or the other."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


def _bearer(scope: Scope) -> bytes | None:
    """The bearer token the request presents, None without one; raises ``_Repeated`` for
    a request carrying ``Authorization`` twice (a proxy on the way may have added one)."""
    found = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            if found is not None:
                raise _Repeated(
                    "authorization",
                    "the request carries the Authorization header more than once; "
                    "send it once: Authorization: Bearer <admin_token>",
                )
            found = value
    if found is None:
        return None
    scheme, _, token = found.partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else None


async def _ambiguous(send: Send, error: _Repeated, *, code: str) -> None:
    await send_json_error(send, 400, str(error), code=code, param=error.what)


async def _unauthorized(send: Send) -> None:
    message = "a valid admin token is required: Authorization: Bearer <admin_token>"
    document = error_document(401, message, code="unauthorized")
    await send_json(send, 401, document, [(b"www-authenticate", b'Bearer realm="obleth"')])


def _limit_of(body: bytes) -> tuple[int | None, str | None]:
    """The limit a PUT body asks for, or the problem with the body; raises ``_Repeated``
    for an object that names a field twice."""
    try:
        # a number with a fraction or an exponent as written (Decimal), not as a float
        # rounds it: 1e-400 is no 0, 999999999.99999999 no 1e9
        document: Any = json.loads(body, object_pairs_hook=_object_once, parse_float=Decimal)
    except _Repeated:
        raise
    except ArithmeticError:  # an exponent past what Decimal holds: 1e99999999999999999999
        return None, f"max_in_flight: a number outside 0 to {MAX_LIMIT}; send {_SHAPE}"
    except (ValueError, RecursionError):
        return None, f"the body is no JSON; send {_SHAPE}"
    if not isinstance(document, dict):
        return None, f"the body is no JSON object; send {_SHAPE}"
    unknown = sorted(set(document) - {"max_in_flight"})
    if unknown:
        return None, f"unknown field {unknown[0]!r}; the only field is max_in_flight"
    if "max_in_flight" not in document:
        return None, f"max_in_flight is missing; send {_SHAPE}"
    value = document["max_in_flight"]
    shown = str(value) if isinstance(value, Decimal) else repr(value)
    # 300.0 is the number 300 in JSON, and an integer to JSON Schema (the OpenAPI document)
    whole = isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value()
    if not whole and (isinstance(value, bool) or not isinstance(value, int)):
        return None, f"max_in_flight: {shown} is no whole number"
    # compared before any int() is made of it: 1e999999999 would take gigabytes
    if not 0 <= value <= MAX_LIMIT:
        return None, f"max_in_flight: {shown} is outside 0 to {MAX_LIMIT} (0 pauses admissions)"
    return int(value), None


def _object_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as ``json.loads`` builds it, unless it names a field twice: RFC 8259
    (section 4) leaves what that means to each reader, and Python's keeps the last."""
    document = dict(pairs)
    if len(document) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                message = f"the body names the field {key!r} twice; send it once: {_SHAPE}"
                raise _Repeated(key, message)
            seen.add(key)
    return document
