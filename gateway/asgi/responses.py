"""Answers the gateway gives itself: OpenAI-style JSON errors, never tracebacks."""

from __future__ import annotations

import json
import logging
import math

from gateway.complaints import Complaints
from gateway.errors import BadRequest, Rejected
from gateway.types import Message, Receive, Scope, Send

log = logging.getLogger("obleth")

#: the error ``type`` of a status, as OpenAI-style clients sort errors: the request's
#: fault, the credentials', too many requests, or the server's; a status not listed takes
#: its class's (``invalid_request_error`` for 4xx, ``server_error`` for 5xx)
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_exceeded",
    503: "server_overloaded",
}


async def send_json(
    send: Send, status: int, payload: object, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A complete JSON response: ``payload`` encoded, with its length."""
    body = json.dumps(payload).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})


async def send_not_allowed(send: Send, method: str, allowed: tuple[str, ...]) -> None:
    """405 ``bad_method`` for ``method``, with the ``Allow`` header RFC 9110 (section
    15.5.6) requires of it; ``allowed`` holds at least two methods."""
    *first, last = allowed
    message = f"{method} is not allowed here; use {', '.join(first)} or {last}"
    document = error_document(405, message, code="bad_method")
    await send_json(send, 405, document, [(b"allow", ", ".join(allowed).encode())])


def error_document(
    status: int, message: str, *, code: str | None, param: str | None = None
) -> dict[str, object]:
    """The OpenAI-style error body every answer of the gateway's own carries, as a dict:
    ``{"error": {"message", "type", "param", "code"}}``, ``type`` following ``status``
    (``error_type``)."""
    error = {
        "message": message,
        "type": error_type(status),
        "param": param,
        "code": code,
    }
    return {"error": error}


def error_type(status: int) -> str:
    """The error ``type`` an error body with ``status`` carries: ``authentication_error``
    (401), ``permission_error`` (403), ``rate_limit_exceeded`` (429), ``server_overloaded``
    (503), else ``invalid_request_error`` for any other 4xx and ``server_error`` for 5xx."""
    found = _ERROR_TYPES.get(status)
    if found is not None:
        return found
    return "server_error" if status >= 500 else "invalid_request_error"


async def send_json_error(
    send: Send,
    status: int,
    message: str,
    *,
    code: str | None,
    param: str | None = None,
    retry_after_s: float | None = None,
    close: bool = False,
) -> None:
    """A complete OpenAI-style JSON error; with ``close``, the server is told to close the
    connection after it (``Connection: close``)."""
    headers = []
    if retry_after_s is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(retry_after_s))).encode()))
    if close:
        headers.append((b"connection", b"close"))
    await send_json(send, status, error_document(status, message, code=code, param=param), headers)


async def send_rejection(send: Send, rejected: Rejected) -> None:
    """503 (service full) or 429 (tenant over its cap), with ``Retry-After``; ``code``
    names the reason."""
    await send_json_error(
        send,
        rejected.status,
        str(rejected),
        code=rejected.reason,
        retry_after_s=rejected.retry_after_s,
    )


async def send_bad_request(send: Send, error: BadRequest) -> None:
    await send_json_error(
        send, error.status, str(error), code=error.code, param=error.param, close=error.close
    )


async def answer_not_started(
    send: Send, error: Exception, complaints: Complaints, retry_after_s: float
) -> None:
    """503 for a request that found the gateway unable to start (no lifespan told the
    server); the reason goes to the log, at most once a minute."""
    if complaints.may("start"):
        log.error("the gateway could not start, so it admits nothing: %s", error)
    await send_json_error(
        send,
        503,
        "the gateway could not start, so it admits no request; the server's log says why",
        code="gateway_not_started",
        retry_after_s=retry_after_s,
    )


async def refuse_websocket(scope: Scope, receive: Receive, send: Send, message: str) -> None:
    """Refuse a WebSocket handshake: ``501 websocket_not_supported``, an OpenAI-style JSON
    error saying ``message``, where the server lets an app answer a handshake over HTTP
    (the ASGI ``websocket.http.response`` extension, as uvicorn's WebSocket protocols
    offer); else the server's own refusal, a bare 403."""
    await receive()  # websocket.connect
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1000})  # closed before accepted: 403
        return

    async def over_handshake(answer: Message) -> None:
        await send({**answer, "type": "websocket." + answer["type"]})

    await send_json_error(over_handshake, 501, message, code="websocket_not_supported")
