"""The admin API's OpenAPI document, ``GET /api/v1/openapi.json``: written from the API's
own constants, encoded once (it cannot change while the process runs)."""

from __future__ import annotations

import functools
import importlib.metadata
import json
from typing import Any

from gateway.admin import schemas
from gateway.admin.contract import (
    CAPACITY_PATH,
    MAX_BODY_BYTES,
    MAX_LIMIT,
    STATUS_PATH,
)
from gateway.admin.dashboard import DASHBOARD_PATH
from gateway.admin.schemas import Schema
from gateway.types import Send

OPENAPI_PATH = "/api/v1/openapi.json"
#: the API's root, relative to the document's URL (``OPENAPI_PATH``'s two directories up)
SERVER_URL = "../.."


_ABOUT = (
    "Reads and changes a running Obleth gateway's limit on requests in flight, and reports "
    "its state. The API is off (every path answers 404) until `admin_token` is set; the "
    "capacity and status endpoints then need `Authorization: Bearer <admin_token>`, while "
    "this document and the dashboard's page hold no state and need no token. HEAD is "
    "answered wherever GET is, with GET's status and headers and no body; any other method "
    "a path does not list is answered 405 with an error body and an `Allow` header. A "
    "request carrying `Authorization` more than once is refused 400 (`code` "
    "`invalid_header`). See docs/operations.md."
)


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the admin API, a fresh dict on every call."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "Obleth admin API", "version": _version(), "description": _ABOUT},
        # relative to this document's own URL (OpenAPI 3, "Server Object"): the API's root
        # two levels up from api/v1/openapi.json, wherever it is served or mounted
        "servers": [
            {
                "url": SERVER_URL,
                "description": "The admin API this document was loaded from (its paths "
                "start two levels above the document's own URL, also under a prefix).",
            }
        ],
        "paths": {
            CAPACITY_PATH: _capacity_path(),
            STATUS_PATH: _status_path(),
            OPENAPI_PATH: _public_path(
                "getOpenapi", "This document.", "application/json", {"type": "object"}
            ),
            DASHBOARD_PATH: _public_path(
                "getDashboard",
                "The operator's page; it polls the status and sets the limit through this API.",
                "text/html",
                {"type": "string"},
            ),
        },
        "components": {
            "securitySchemes": {
                "adminToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The gateway's `admin_token` (`OBLETH_ADMIN_TOKEN`).",
                }
            },
            "schemas": {
                "Capacity": schemas.capacity(maximum=None),
                "CapacityChange": schemas.capacity(maximum=MAX_LIMIT),
                "CapacitySet": schemas.capacity_set(maximum=MAX_LIMIT),
                "Status": schemas.status(),
                "Tenant": schemas.tenant(),
                "Upstream": schemas.upstream(),
                "Routing": schemas.routing(),
                "Cluster": schemas.cluster(),
                "Error": schemas.error(),
            },
            "responses": {
                "TimedOut": {
                    "description": "The client was too slow: a request head not complete "
                    "within `client_header_timeout_s` (`code` `header_timeout`), or a body "
                    "that paused longer than `client_body_timeout_s` (`code` "
                    "`body_timeout`; nothing changed). The connection is closed.",
                    "content": _json(schemas.ref("Error")),
                },
                "HeadersTooLarge": {
                    "description": "The request line and headers are longer than "
                    "`max_header_bytes` (`code` `headers_too_large`), under `obleth serve`; "
                    "the connection is closed and nothing changed.",
                    "content": _json(schemas.ref("Error")),
                },
                "Unauthorized": {
                    "description": "No token, a wrong one, or a scheme other than Bearer.",
                    "headers": {
                        "WWW-Authenticate": {
                            "description": 'The scheme to use: `Bearer realm="obleth"`.',
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    },
                    "content": _json(schemas.ref("Error")),
                },
            },
        },
    }


async def send_document(send: Send) -> None:
    """Send the document: the same bytes every time, encoded on first use."""
    body = _body()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@functools.cache
def _body() -> bytes:
    return json.dumps(document()).encode()


def _version() -> str:
    try:
        return importlib.metadata.version("obleth")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def _json(schema: Schema) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _error_response(description: str) -> dict[str, Any]:
    return {"description": description, "content": _json(schemas.ref("Error"))}


def _client_faults() -> dict[str, Any]:
    """The answers any operation may get for how the client sent it, whatever it asked."""
    return {
        "408": {"$ref": "#/components/responses/TimedOut"},
        "431": {"$ref": "#/components/responses/HeadersTooLarge"},
    }


def _unauthorized() -> dict[str, Any]:
    return {"$ref": "#/components/responses/Unauthorized"}


def _twice_authorized() -> dict[str, Any]:
    return _error_response(
        "`Authorization` sent more than once (`code` `invalid_header`, `param` "
        "`authorization`): ambiguous, refused whatever the values hold."
    )


def _guarded() -> list[dict[str, list[str]]]:
    """The security requirement of the endpoints behind the token."""
    return [{"adminToken": []}]


def _capacity_path() -> dict[str, Any]:
    return {
        "description": "The limit on requests in flight. GET, HEAD (GET's status and "
        "headers, no body) and PUT; other methods: 405.",
        "get": {
            "operationId": "getCapacity",
            "summary": "The limit in force",
            "description": "In cluster mode the pool's limit, as this pod last heard it.",
            "security": _guarded(),
            "responses": {
                "200": {
                    "description": "The limit in force.",
                    "content": _json(schemas.ref("Capacity")),
                },
                "400": _twice_authorized(),
                "401": _unauthorized(),
                **_client_faults(),
            },
        },
        "put": {
            "operationId": "setCapacity",
            "summary": "Set the operator's limit, the ceiling, at once",
            "description": "Sets the ceiling: the limit in force is the lowest of it and the "
            "computed capacity providers' values (`kv-pressure`, `adaptive`), so it may stay "
            "below. 0 pauses admissions; running requests finish. In cluster mode the "
            "ceiling of every pod of the pool, within one heartbeat; the answer comes once "
            "Redis has taken it. Logged.",
            "security": _guarded(),
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": schemas.ref("CapacityChange"),
                        "example": {"max_in_flight": 300},
                    }
                },
            },
            "responses": {
                "200": {
                    "description": "The ceiling set, and the limit in force with it (what "
                    "GET answers from now on).",
                    "content": _json(schemas.ref("CapacitySet")),
                },
                "400": _error_response(
                    "Ambiguous input, refused whatever it holds: a body that names a field "
                    "twice (`code` `invalid_body`, `param` the field), or `Authorization` "
                    "sent more than once (`code` `invalid_header`); the limit stays."
                ),
                "401": _unauthorized(),
                **_client_faults(),
                "409": _error_response(
                    "No single capacity provider can take the limit (`code` `not_settable`)."
                ),
                "413": _error_response(
                    f"The body is larger than {MAX_BODY_BYTES} bytes (`code` `invalid_body`)."
                ),
                "422": _error_response(
                    "The body is not a JSON object with only a whole `max_in_flight` from 0 "
                    f"to {MAX_LIMIT}, or a value the provider that takes the limit refuses "
                    "(`code` `invalid_body`, `param` `max_in_flight`); the limit stays."
                ),
                "500": _error_response(
                    "The capacity provider that takes the limit (a plugin's) raised; the "
                    "message names it and its plugin (`code` `provider_failed`)."
                ),
            },
        },
    }


def _status_path() -> dict[str, Any]:
    return {
        "description": "The gateway's state. GET and HEAD (GET's status and headers, no "
        "body); other methods: 405.",
        "get": {
            "operationId": "getStatus",
            "summary": "The gateway's state now",
            "security": _guarded(),
            "responses": {
                "200": {"description": "The state.", "content": _json(schemas.ref("Status"))},
                "400": _twice_authorized(),
                "401": _unauthorized(),
                **_client_faults(),
            },
        },
    }


def _public_path(operation: str, what: str, media_type: str, schema: Schema) -> dict[str, Any]:
    return {
        "description": "No token needed. GET and HEAD; other methods: 405.",
        "get": {
            "operationId": operation,
            "summary": what,
            "security": [],
            "responses": {
                "200": {"description": what, "content": {media_type: {"schema": schema}}},
                **_client_faults(),
            },
        },
    }
