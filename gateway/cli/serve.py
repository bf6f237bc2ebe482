"""`obleth serve`: the standalone gateway, admission control and routing in front of the
streaming proxy, for users without an ASGI app of their own."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

from gateway.admin.api import admin_app
from gateway.admin.health import HEALTH_PATH, METRICS_PATH, READY_PATH, Probes
from gateway.asgi.middleware import GatewayMiddleware
from gateway.cli.server_flags import add_server_flags, tcp_port
from gateway.errors import ConfigError
from gateway.gateway import Gateway
from gateway.proxy import ProxyApp
from gateway.server import BodyTimeout, bounded_protocol
from gateway.settings import Settings
from gateway.telemetry.instruments import watch
from gateway.telemetry.sdk import PrometheusExport, install_prometheus_export, install_tracing
from gateway.types import ASGIApp, Message, Receive, Scope, Send

#: where ``obleth serve`` listens for the admin API unless told otherwise (the seed's port)
ADMIN_PORT = 9090

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
    (
        "--overflow-policy",
        "overflow_policy",
        str,
        "block, drop-newest, drop-oldest or reject (see docs/configuration.md)",
    ),
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
            f"{HEALTH_PATH} (alive), {READY_PATH} (an upstream is healthy and the queue is "
            f"below 80 % of its bound) and {METRICS_PATH} (Prometheus text) itself."
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
    parser.add_argument(
        "--admin-port",
        type=tcp_port,
        default=ADMIN_PORT,
        help=f"port of the admin API (default {ADMIN_PORT}), on the same interface; served "
        "only when OBLETH_ADMIN_TOKEN is set",
    )
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


def build_app(settings: Settings, *, export: PrometheusExport | None = None) -> Probes:
    """The standalone gateway as one ASGI app (what ``obleth serve`` runs): the probes and
    ``/metrics``, then the body timeout, the gateway and the streaming proxy.

    ``/metrics`` renders ``export`` (default: a private one, which holds the gateway's
    instruments only); they report to the host's provider too, if it has one.
    Serve it with ``server_options(settings)`` for the bounds on request heads.
    """
    if not settings.upstreams:
        raise settings.error(
            "upstreams", (), "obleth serve needs upstreams: --upstream http://vllm-0:8000 ..."
        )
    if export is None:
        export = PrometheusExport()
    gateway = Gateway(settings)  # watched by the global provider's instruments
    watch(gateway, export.provider)
    proxy = ProxyApp(
        connect_timeout_s=settings.upstream_connect_timeout_s,
        response_timeout_s=settings.upstream_response_timeout_s,
        read_timeout_s=settings.upstream_read_timeout_s,
        trusted_proxies=settings.trusted_proxies,
        answered=gateway.answers.count,
    )
    gated = GatewayMiddleware(proxy, gateway=gateway)
    timed = BodyTimeout(gated, timeout_s=settings.client_body_timeout_s)
    return Probes(timed, gateway, export.render)


def server_options(settings: Settings) -> dict[str, Any]:
    """The uvicorn options ``obleth serve`` owes to ``settings``: the HTTP protocol that
    bounds request heads (``max_header_bytes``, ``client_header_timeout_s``), and no
    rewriting of the client's address from ``X-Forwarded-For`` by uvicorn (by default it
    believes 127.0.0.1): ``trusted_proxies`` alone says whose forwarding headers count."""
    return {
        "http": bounded_protocol(
            max_header_bytes=settings.max_header_bytes,
            header_timeout_s=settings.client_header_timeout_s,
        ),
        "proxy_headers": False,
    }


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns the exit code."""
    overrides = _overrides(args)
    with _naming_flags(overrides):
        settings = Settings.from_env(**overrides)
        tracing = install_tracing()
        app = build_app(settings, export=install_prometheus_export())
    upstreams = ", ".join(str(u) for u in settings.upstreams)
    admin = settings.admin_token is not None
    print(
        f"obleth serve: http://{args.host}:{args.port} -> {upstreams} "
        f"({settings.routing_policy}), at most {app.gateway.capacity.current()} in flight; "
        + (
            f"admin API on http://{args.host}:{args.admin_port}"
            if admin
            else "admin API off (no OBLETH_ADMIN_TOKEN)"
        ),
        file=sys.stderr,
    )
    common = {"host": args.host, "log_level": args.log_level, "timeout_graceful_shutdown": 30}
    servers = [
        uvicorn.Server(
            uvicorn.Config(
                app if tracing is None else _AfterShutdown(app, tracing.shutdown),
                port=args.port,
                access_log=args.access_log,
                lifespan="on",
                **common,
                **server_options(settings),
            )
        )
    ]
    if admin:
        # its own listener: operators reach it however busy the gateway's port is
        servers.append(
            uvicorn.Server(
                uvicorn.Config(
                    admin_app(app.gateway),
                    port=args.admin_port,
                    access_log=True,
                    lifespan="off",
                    proxy_headers=False,
                    **common,
                )
            )
        )
    asyncio.run(_serve_all(servers))
    return 0


class _AfterShutdown:
    """``app``, with ``then()`` called once its lifespan shutdown is complete: the last
    moment a signalled uvicorn gives us (it raises the signal again once it has stopped
    serving, and the process ends there). ``obleth serve`` sends the spans still
    batched then."""

    def __init__(self, app: ASGIApp, then: Callable[[], object]) -> None:
        self.app = app
        self.then = then

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            await send(message)
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                self.then()

        await self.app(scope, receive, sending)


async def _serve_all(servers: list[uvicorn.Server]) -> None:
    """Serve every server on this loop until a signal stops them; if one stops (it could
    not bind its port), the others are told to stop too."""
    tasks = [asyncio.create_task(server.serve()) for server in servers]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        task.result()  # a server's own error, if it had one
