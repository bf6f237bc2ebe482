"""`obleth serve`: the standalone gateway, admission control and routing in front of the
streaming proxy, for users without an ASGI app of their own."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import uvicorn

from gateway.asgi.middleware import GatewayMiddleware
from gateway.asgi.responses import send_json
from gateway.cli.server_flags import add_server_flags
from gateway.errors import ConfigError
from gateway.gateway import Gateway
from gateway.proxy import ProxyApp
from gateway.settings import Settings
from gateway.types import ASGIApp, Receive, Scope, Send

HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"

# flag -> setting; a flag left out keeps the OBLETH_* value or the default
_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--policy", "routing_policy", str, "weighted, round-robin or least-loaded"),
    (
        "--scorers",
        "routing_scorers",
        str,
        'weighted scorers, e.g. "prefix-affinity:5,queue-depth:1"',
    ),
    ("--max-in-flight", "global_max_in_flight", int, "requests in flight at most (all upstreams)"),
    ("--overflow-policy", "overflow_policy", str, "block, drop-newest or drop-oldest"),
    ("--redis-url", "redis_url", str, "share the budget and in-flight counts with other pods"),
    ("--pool", "pool", str, "name of the shared budget in Redis"),
    ("--seed", "routing_seed", int, "seed of the random choice between tied upstreams"),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `serve` command."""
    parser = sub.add_parser(
        "serve",
        help="run the standalone gateway: admission control and routing to upstreams",
        description=(
            "Serve an OpenAI-compatible gateway: every request is admitted through the "
            "fair queue, routed to one of the upstreams and streamed back. Settings come "
            "from OBLETH_* variables; flags given here win over them. The gateway answers "
            f"{HEALTH_PATH} (alive) and {READY_PATH} (an upstream is healthy and the queue is "
            "below 80 % of its bound) itself."
        ),
    )
    parser.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="URL",
        help="an inference server's base URL, optionally URL=model|model; repeat for more "
        "(default: OBLETH_UPSTREAMS)",
    )
    add_server_flags(parser, port=8000)
    for flag, _, kind, help_text in _FLAGS:
        parser.add_argument(flag, type=kind, default=None, help=help_text)
    parser.add_argument(
        "--upstream-header",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add X-Obleth-Upstream to every response",
    )
    parser.set_defaults(run=run)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags given set; they win over ``OBLETH_*`` variables."""
    overrides: dict[str, Any] = {}
    if args.upstream:
        overrides["upstreams"] = tuple(args.upstream)
    for flag, setting, _, _ in _FLAGS:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value is not None:
            overrides[setting] = value
    if args.upstream_header is not None:
        overrides["upstream_header"] = args.upstream_header
    return overrides


_FLAG_OF = {setting: flag for flag, setting, _, _ in _FLAGS} | {"upstreams": "--upstream"}


@contextlib.contextmanager
def _naming_flags(overrides: dict[str, Any]) -> Iterator[None]:
    """A ``ConfigError`` about a setting a flag gave names the flag, not the setting (one
    about a value from the environment names its variable, as ever)."""
    try:
        yield
    except ConfigError as exc:
        flag = _FLAG_OF.get(exc.setting)
        if flag is None or exc.setting not in overrides:
            raise
        raise ConfigError(flag, exc.value, exc.expected) from None


def build_app(settings: Settings) -> _Probes:
    """The standalone gateway as one ASGI app (what ``obleth serve`` runs)."""
    if not settings.upstreams:
        raise settings.error(
            "upstreams", (), "obleth serve needs upstreams: --upstream http://vllm-0:8000 ..."
        )
    gateway = Gateway(settings)
    proxy = ProxyApp(
        connect_timeout_s=settings.upstream_connect_timeout_s,
        response_timeout_s=settings.upstream_response_timeout_s,
        read_timeout_s=settings.upstream_read_timeout_s,
    )
    return _Probes(GatewayMiddleware(proxy, gateway=gateway), gateway)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns the exit code."""
    overrides = _overrides(args)
    with _naming_flags(overrides):
        settings = Settings.from_env(**overrides)
        app = build_app(settings)
    upstreams = ", ".join(str(u) for u in settings.upstreams)
    print(
        f"obleth serve: http://{args.host}:{args.port} -> {upstreams} "
        f"({settings.routing_policy}), at most {app.gateway.capacity.current()} in flight",
        file=sys.stderr,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        lifespan="on",
        timeout_graceful_shutdown=30,
    )
    return 0


class _Probes:
    """Answers the liveness and readiness probes; everything else goes to the gateway."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path") if scope["type"] == "http" else None
        if path == HEALTH_PATH:
            await send_json(send, 200, {"status": "alive"})
        elif path == READY_PATH:
            readings = self.gateway.readings
            healthy = [u for u in readings if readings.get(u).healthy]
            snapshot = self.gateway.snapshot()
            # a queue at 80 % of its bound sends a load balancer's traffic to other pods
            backed_up = snapshot.max_queue > 0 and snapshot.queued >= 0.8 * snapshot.max_queue
            ready = bool(healthy) and self.gateway.started and not backed_up
            payload = {"healthy_upstreams": healthy, "queued": snapshot.queued}
            await send_json(send, 200 if ready else 503, payload)
        else:
            await self.app(scope, receive, send)
