"""The schemas of the admin API's OpenAPI document (``openapi.py``): what the capacity
and status endpoints answer and take, written from the API's own constants."""

from __future__ import annotations

from typing import Any, get_args, get_type_hints

from gateway.admin.contract import FROM_OWN, FROM_POOL
from gateway.core.tickets import PRIORITIES
from gateway.routing.decisions import REROUTED, ROUTED
from gateway.settings import Settings

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def integer(description: str, **bounds: int) -> Schema:
    return {"type": "integer", "description": description, **bounds}


def fixed(properties: dict[str, Schema], description: str) -> Schema:
    """An object with exactly ``properties``, all of them present."""
    return {
        "type": "object",
        "description": description,
        "required": list(properties),
        "properties": properties,
        "additionalProperties": False,
    }


def capacity(*, maximum: int | None) -> Schema:
    limit = integer("The limit on requests in flight; 0 pauses admissions.", minimum=0)
    if maximum is not None:
        limit["maximum"] = maximum
    what = "The limit in force." if maximum is None else "A limit to set (the ceiling)."
    return fixed({"max_in_flight": limit}, what)


def capacity_set(*, maximum: int) -> Schema:
    """What ``PUT /api/v1/capacity`` answers: the limit in force, as ``GET`` answers it
    from then on, and the ceiling the request set."""
    return fixed(
        {
            "max_in_flight": integer(
                "The limit in force now, as GET answers it: the lowest of the ceiling and "
                "the computed capacity providers' values, so it may be below the ceiling.",
                minimum=0,
            ),
            "ceiling": integer(
                "The operator's limit this request set: the limit in force whenever no "
                "computed capacity provider is lower. 0 pauses admissions.",
                minimum=0,
                maximum=maximum,
            ),
        },
        "The ceiling set, and the limit in force with it.",
    )


def status() -> Schema:
    """What ``status.status()`` returns."""
    providers = {
        "type": "object",
        "description": "Each capacity provider's value, by name, as the limit uses it (in "
        "cluster mode a computed provider's is the pool's); while it fails to answer a "
        "whole number, its last good one, which the limit keeps using.",
        "additionalProperties": {"type": "integer", "minimum": 0},
    }
    computed = {
        "type": "object",
        "description": "Each computed capacity provider (every one that cannot be set), by "
        "name: where the value in use comes from.",
        "additionalProperties": fixed(
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
    other = fixed(
        {
            "tenants": integer("How many tenants are not listed."),
            "in_flight": integer("Seats they hold."),
            "waiting": integer("Requests of theirs waiting."),
        },
        "The tenants not listed, summed up.",
    )
    tenants = fixed(
        {
            "listed": {
                "type": "object",
                "description": "The most active tenants (seats held plus requests waiting), "
                "by name, at most `telemetry_tenants`.",
                "additionalProperties": ref("Tenant"),
            },
            "other": other,
        },
        "Tenants, bounded: the most active by name, the rest summed up.",
    )
    return fixed(
        {
            "capacity": fixed(
                {
                    "max_in_flight": integer("The limit in force.", minimum=0),
                    "providers": providers,
                    "computed": computed,
                },
                "The limit and where it comes from.",
            ),
            "in_flight": integer("Seats held."),
            "tokens_in_flight": {
                "description": "The token estimates of the requests in flight; null without "
                "`global_max_tokens_in_flight`.",
                "anyOf": [{"type": "integer"}, {"type": "null"}],
            },
            "max_tokens_in_flight": {
                "description": "`global_max_tokens_in_flight`; null when unset.",
                "anyOf": [{"type": "integer"}, {"type": "null"}],
            },
            "queued": integer("Requests waiting in the fair queue."),
            "max_queue": integer("The fair queue's bound."),
            "queued_by_class": by_class,
            "tenants": tenants,
            "upstreams": {
                "type": "object",
                "description": "Each upstream, by URL.",
                "additionalProperties": ref("Upstream"),
            },
            "routing": {
                "description": "null without upstreams; else how requests are routed.",
                "anyOf": [ref("Routing"), {"type": "null"}],
            },
            "cluster": {
                "description": "null in process; the pool as this pod last heard it from Redis "
                "in cluster mode.",
                "anyOf": [ref("Cluster"), {"type": "null"}],
            },
            "started": {"type": "boolean", "description": "Whether the gateway has started."},
        },
        "The gateway's state at one instant.",
    )


def tenant() -> Schema:
    return fixed(
        {
            "in_flight": integer("Seats held."),
            "waiting": integer("Requests waiting."),
            "weight": {"type": "number", "description": "Its weight in the fair queue."},
            "share": {"type": "number", "description": "Its share of the seats in flight."},
        },
        "One tenant's activity.",
    )


def upstream() -> Schema:
    def reading(description: str) -> Schema:
        return {"type": ["number", "null"], "description": description}

    return fixed(
        {
            "healthy": {"type": "boolean", "description": "The health check's verdict."},
            "in_flight": integer("This gateway's requests there (the pool's in cluster mode)."),
            "routed": integer("Requests sent there."),
            "rerouted": integer("Requests sent there after another upstream failed them."),
            "running": reading("Requests in its running batch, as last read."),
            "waiting": reading("Requests queued inside it, as last read."),
            "kv_usage": reading("KV-cache usage, 0.0 to 1.0, as last read."),
            "reading_age_s": reading("Seconds since the last reading; null if never read."),
        },
        "One upstream: the gateway's requests there and its latest reading.",
    )


def routing() -> Schema:
    choice = fixed(
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
    return fixed(
        {
            "policy": {"type": "string", "enum": choices("routing_policy")},
            "recent": {
                "type": "array",
                "description": "The latest choices, newest first.",
                "items": choice,
            },
        },
        "How requests are routed.",
    )


def cluster() -> Schema:
    failure_modes = choices("redis_failure_mode")
    return fixed(
        {
            "pool": {"type": "string", "description": "The pool's name."},
            "pod": {"type": "string", "description": "This pod's id in the pool."},
            "leader": {
                "type": ["string", "null"],
                "description": "The pod holding the leader lease, which computes the "
                "computed capacity providers for the pool, as this pod last asked; null "
                "when none holds it, or no computed provider is selected here.",
            },
            "live_pods": integer("Pods of the pool alive."),
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


def choices(setting: str) -> list[str]:
    """The values a ``Literal`` setting takes."""
    return list(get_args(get_type_hints(Settings)[setting]))


def error() -> Schema:
    """What ``responses.error_document`` builds."""
    detail = fixed(
        {
            "message": {"type": "string", "description": "What happened and what to do."},
            "type": {
                "type": "string",
                "description": "The class of error, following the status: "
                "`authentication_error` (401), `invalid_request_error` (any other 4xx), "
                "`server_error` (5xx).",
            },
            "param": {"type": ["string", "null"], "description": "The field at fault."},
            "code": {"type": ["string", "null"], "description": "The reason, for programs."},
        },
        "The error.",
    )
    return fixed({"error": detail}, "An OpenAI-style error.")
