"""The admin API's OpenAPI document, ``GET /api/v1/openapi.json``: written from the API's
own constants, encoded once (it cannot change while the process runs)."""

from __future__ import annotations

import functools
import importlib.metadata
import json
from typing import Any, get_args, get_type_hints

from gateway.admin.contract import (
    CAPACITY_PATH,
    FROM_OWN,
    FROM_POOL,
    MAX_BODY_BYTES,
    MAX_LIMIT,
    STATUS_PATH,
)
from gateway.admin.dashboard import DASHBOARD_PATH
from gateway.core.tickets import PRIORITIES
from gateway.routing.decisions import REROUTED, ROUTED
from gateway.settings import Settings
from gateway.types import Send

OPENAPI_PATH = "/api/v1/openapi.json"

Schema = dict[str, Any]

_ABOUT = (
    "Reads and changes a running Obleth gateway's limit on requests in flight, and reports "
    "its state. The API is off (every path answers 404) until `admin_token` is set; the "
    "capacity and status endpoints then need `Authorization: Bearer <admin_token>`, while "
    "this document and the dashboard's page hold no state and need no token. A method a "
    "path does not list is answered 405 with an error body. See docs/operations.md."
)


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the admin API, a fresh dict on every call."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "Obleth admin API", "version": _version(), "description": _ABOUT},
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
                "Capacity": _capacity(maximum=None),
                "CapacityChange": _capacity(maximum=MAX_LIMIT),
                "Status": _status(),
                "Tenant": _tenant(),
                "Upstream": _upstream(),
                "Routing": _routing(),
                "Cluster": _cluster(),
                "Error": _error(),
            },
            "responses": {
                "Unauthorized": {
                    "description": "No token, a wrong one, or a scheme other than Bearer.",
                    "headers": {
                        "WWW-Authenticate": {
                            "description": 'The scheme to use: `Bearer realm="obleth"`.',
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    },
                    "content": _json(_ref("Error")),
                }
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


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: Schema) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _error_response(description: str) -> dict[str, Any]:
    return {"description": description, "content": _json(_ref("Error"))}


def _unauthorized() -> dict[str, Any]:
    return {"$ref": "#/components/responses/Unauthorized"}


def _guarded() -> list[dict[str, list[str]]]:
    """The security requirement of the endpoints behind the token."""
    return [{"adminToken": []}]


def _capacity_path() -> dict[str, Any]:
    return {
        "description": "The limit on requests in flight. Other methods: 405.",
        "get": {
            "operationId": "getCapacity",
            "summary": "The limit in force",
            "description": "In cluster mode the pool's limit, as this pod last heard it.",
            "security": _guarded(),
            "responses": {
                "200": {"description": "The limit in force.", "content": _json(_ref("Capacity"))},
                "401": _unauthorized(),
            },
        },
        "put": {
            "operationId": "setCapacity",
            "summary": "Change the limit at once",
            "description": "0 pauses admissions; running requests finish. In cluster mode "
            "the limit of every pod of the pool, within one heartbeat. Logged.",
            "security": _guarded(),
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": _ref("CapacityChange"),
                        "example": {"max_in_flight": 300},
                    }
                },
            },
            "responses": {
                "200": {
                    "description": "The new limit, in force.",
                    "content": _json(_ref("CapacityChange")),
                },
                "401": _unauthorized(),
                "409": _error_response(
                    "No single capacity provider can take the limit (`code` `not_settable`)."
                ),
                "413": _error_response(
                    f"The body is larger than {MAX_BODY_BYTES} bytes (`code` `invalid_body`)."
                ),
                "422": _error_response(
                    "The body is not a JSON object with only a whole `max_in_flight` from 0 "
                    f"to {MAX_LIMIT} (`code` `invalid_body`, `param` `max_in_flight`); the "
                    "limit stays."
                ),
            },
        },
    }


def _status_path() -> dict[str, Any]:
    return {
        "description": "The gateway's state. Other methods: 405.",
        "get": {
            "operationId": "getStatus",
            "summary": "The gateway's state now",
            "security": _guarded(),
            "responses": {
                "200": {"description": "The state.", "content": _json(_ref("Status"))},
                "401": _unauthorized(),
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
                "200": {"description": what, "content": {media_type: {"schema": schema}}}
            },
        },
    }


def _integer(description: str, **bounds: int) -> Schema:
    return {"type": "integer", "description": description, **bounds}


def _fixed(properties: dict[str, Schema], description: str) -> Schema:
    """An object with exactly ``properties``, all of them present."""
    return {
        "type": "object",
        "description": description,
        "required": list(properties),
        "properties": properties,
        "additionalProperties": False,
    }


def _capacity(*, maximum: int | None) -> Schema:
    limit = _integer("The limit on requests in flight; 0 pauses admissions.", minimum=0)
    if maximum is not None:
        limit["maximum"] = maximum
    what = "The limit in force." if maximum is None else "A limit to set."
    return _fixed({"max_in_flight": limit}, what)


def _status() -> Schema:
    """What ``status.status()`` returns."""
    providers = {
        "type": "object",
        "description": "Each capacity provider's value, by name, as the limit uses it (in "
        "cluster mode a computed provider's is the pool's); null while it fails to answer "
        "(the gateway keeps its last good one).",
        "additionalProperties": {"type": ["integer", "null"]},
    }
    computed = {
        "type": "object",
        "description": "Each computed capacity provider (every one that cannot be set), by "
        "name: where the value in use comes from.",
        "additionalProperties": _fixed(
            {
                "source": {
                    "type": "string",
                    "enum": [FROM_POOL, FROM_OWN],
                    "description": "`pool`: the value the pod holding the leader lease wrote "
                    "to Redis; `own`: this process computed it (in process, before the pod "
                    "heard the pool's, or while Redis cannot be reached).",
                },
                "pod": {
                    "type": ["string", "null"],
                    "description": "The pod that computed it (as `cluster.pod` names pods); "
                    "null in process.",
                },
                "at": {
                    "type": ["number", "null"],
                    "description": "When that pod last wrote it, in Unix time on Redis' clock; "
                    "null for `own`.",
                },
            },
            "Where one computed provider's value comes from.",
        ),
    }
    by_class = {
        "type": "object",
        "description": "Requests waiting, per priority class.",
        "required": list(PRIORITIES),
        "properties": {name: {"type": "integer"} for name in PRIORITIES},
        "additionalProperties": {"type": "integer"},
    }
    other = _fixed(
        {
            "tenants": _integer("How many tenants are not listed."),
            "in_flight": _integer("Seats they hold."),
            "waiting": _integer("Requests of theirs waiting."),
        },
        "The tenants not listed, summed up.",
    )
    tenants = _fixed(
        {
            "listed": {
                "type": "object",
                "description": "The most active tenants (seats held plus requests waiting), "
                "by name, at most `telemetry_tenants`.",
                "additionalProperties": _ref("Tenant"),
            },
            "other": other,
        },
        "Tenants, bounded: the most active by name, the rest summed up.",
    )
    return _fixed(
        {
            "capacity": _fixed(
                {
                    "max_in_flight": _integer("The limit in force.", minimum=0),
                    "providers": providers,
                    "computed": computed,
                },
                "The limit and where it comes from.",
            ),
            "in_flight": _integer("Seats held."),
            "queued": _integer("Requests waiting in the fair queue."),
            "max_queue": _integer("The fair queue's bound."),
            "queued_by_class": by_class,
            "tenants": tenants,
            "upstreams": {
                "type": "object",
                "description": "Each upstream, by URL.",
                "additionalProperties": _ref("Upstream"),
            },
            "routing": {
                "description": "null without upstreams; else how requests are routed.",
                "anyOf": [_ref("Routing"), {"type": "null"}],
            },
            "cluster": {
                "description": "null in process; the pool as this pod last heard it from Redis "
                "in cluster mode.",
                "anyOf": [_ref("Cluster"), {"type": "null"}],
            },
            "started": {"type": "boolean", "description": "Whether the gateway has started."},
        },
        "The gateway's state at one instant.",
    )


def _tenant() -> Schema:
    return _fixed(
        {
            "in_flight": _integer("Seats held."),
            "waiting": _integer("Requests waiting."),
            "weight": {"type": "number", "description": "Its weight in the fair queue."},
            "share": {"type": "number", "description": "Its share of the seats in flight."},
        },
        "One tenant's activity.",
    )


def _upstream() -> Schema:
    def reading(description: str) -> Schema:
        return {"type": ["number", "null"], "description": description}

    return _fixed(
        {
            "healthy": {"type": "boolean", "description": "The health check's verdict."},
            "in_flight": _integer("This gateway's requests there (the pool's in cluster mode)."),
            "routed": _integer("Requests sent there."),
            "rerouted": _integer("Requests sent there after another upstream failed them."),
            "running": reading("Requests in its running batch, as last read."),
            "waiting": reading("Requests queued inside it, as last read."),
            "kv_usage": reading("KV-cache usage, 0.0 to 1.0, as last read."),
            "reading_age_s": reading("Seconds since the last reading; null if never read."),
        },
        "One upstream: the gateway's requests there and its latest reading.",
    )


def _routing() -> Schema:
    choice = _fixed(
        {
            "at": {"type": "number", "description": "When, in Unix time."},
            "upstream": {"type": "string", "description": "The upstream chosen."},
            "kind": {"type": "string", "enum": [ROUTED, REROUTED]},
            "scores": {
                "type": "object",
                "description": "Each scorer's score of the upstream chosen.",
                "additionalProperties": {"type": "number"},
            },
        },
        "One choice of an upstream.",
    )
    return _fixed(
        {
            "policy": {"type": "string", "enum": _choices("routing_policy")},
            "recent": {
                "type": "array",
                "description": "The latest choices, newest first.",
                "items": choice,
            },
        },
        "How requests are routed.",
    )


def _cluster() -> Schema:
    failure_modes = _choices("redis_failure_mode")
    return _fixed(
        {
            "pool": {"type": "string", "description": "The pool's name."},
            "pod": {"type": "string", "description": "This pod's id in the pool."},
            "leader": {
                "type": ["string", "null"],
                "description": "The pod holding the leader lease, which computes the "
                "computed capacity providers for the pool, as this pod last asked; null "
                "when none holds it, or no computed provider is selected here.",
            },
            "live_pods": _integer("Pods of the pool alive."),
            "mode": {
                "type": "string",
                "enum": ["redis", *failure_modes],
                "description": "`redis`, or the failure mode in force.",
            },
            "degraded": {"type": "boolean", "description": "Whether Redis cannot be reached."},
            "failure_mode": {
                "type": "string",
                "enum": failure_modes,
                "description": "What the pod does while Redis cannot be reached.",
            },
        },
        "The pool in cluster mode.",
    )


def _choices(setting: str) -> list[str]:
    """The values a ``Literal`` setting takes."""
    return list(get_args(get_type_hints(Settings)[setting]))


def _error() -> Schema:
    """What ``responses.error_document`` builds."""
    detail = _fixed(
        {
            "message": {"type": "string", "description": "What happened and what to do."},
            "type": {"type": "string", "description": "The class of error, following the status."},
            "param": {"type": ["string", "null"], "description": "The field at fault."},
            "code": {"type": ["string", "null"], "description": "The reason, for programs."},
        },
        "The error.",
    )
    return _fixed({"error": detail}, "An OpenAI-style error.")
