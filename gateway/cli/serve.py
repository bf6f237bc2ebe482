"""`obleth serve`: the standalone gateway, admission control and routing in front of the
streaming proxy, for users without an ASGI app of their own."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from gateway.admin.api import admin_app
from gateway.admin.contract import ADMIN_PORT
from gateway.admin.elsewhere import AdminElsewhere
from gateway.admin.health import HEALTH_PATH, METRICS_PATH, READY_PATH, Probes
from gateway.asgi.lifespan import STARTUP_FAILURE, AfterShutdown
from gateway.asgi.middleware import GatewayMiddleware
from gateway.cli.defaults import DefaultsShown, of_setting
from gateway.cli.server_flags import (
    GRACEFUL_S,
    add_server_flags,
    cannot_listen,
    listen_url,
    tcp_port,
    worker_count,
)
from gateway.errors import ConfigError, OblethError
from gateway.gateway import Gateway
from gateway.proxy import ProxyApp
from gateway.proxy.models import ModelCatalog, ModelList
from gateway.proxy.upstream import unforwardable_path
from gateway.server import BodyTimeout, bounded_protocol
from gateway.server.running import Server, serve
from gateway.server.workers import Workers, listening_socket, worker_sockets
from gateway.settings import Settings
from gateway.telemetry.instruments import watch
from gateway.telemetry.sdk import PrometheusExport, install_prometheus_export, install_tracing
from gateway.telemetry.workers import WorkerPages, pages_directory
from gateway.types import ASGIApp

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

# flag -> setting; a flag left out keeps the OBLETH_* value or the default
_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--policy", "routing_policy", str, "weighted, round-robin or least-loaded"),
    ("--scorers", "routing_scorers", str, "the weighted policy's scorers, name:weight pairs"),
    ("--max-in-flight", "global_max_in_flight", int, "requests in flight at most, all upstreams"),
    (
        "--overflow-policy",
        "overflow_policy",
        str,
        "block, drop-newest, drop-oldest, reject or a plugin's policy",
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
            "from OBLETH_* variables; flags given here win over them (every variable set "
            "is still checked: a bad one stops startup even when a flag replaces it). The "
            "gateway answers "
            f"{HEALTH_PATH} (alive), {READY_PATH} (an upstream is healthy and the queue is "
            f"below 80 % of its bound) and {METRICS_PATH} (Prometheus text) itself."
        ),
        formatter_class=DefaultsShown,
    )
    parser.add_argument(
        "--upstream",
        action="append",
        metavar="URL",
        help="an inference server's base URL, optionally URL=model|model; repeat for more "
        + of_setting("upstreams"),
    )
    add_server_flags(parser, port=8000)
    parser.add_argument(
        "--admin-port",
        type=tcp_port,
        default=ADMIN_PORT,
        help="port of the admin API (and of /healthz and /readyz again), on the same "
        "interface, not --port's; served only when OBLETH_ADMIN_TOKEN is set",
    )
    parser.add_argument(
        "--workers",
        type=worker_count,
        default=1,
        metavar="N",
        help="processes serving the gateway, on the same ports; more than one needs "
        "--redis-url (or OBLETH_REDIS_URL), so that all of them share one budget",
    )
    for flag, setting, kind, help_text in _FLAGS:
        parser.add_argument(
            flag, type=kind, default=None, help=f"{help_text} {of_setting(setting)}"
        )
    parser.add_argument(
        "--upstream-header",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add X-Obleth-Upstream to every response " + of_setting("upstream_header"),
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


def build_app(
    settings: Settings,
    *,
    export: PrometheusExport | None = None,
    metrics: Callable[[], bytes] | None = None,
    admin_port: int = ADMIN_PORT,
) -> Probes:
    """The standalone gateway as one ASGI app (what ``obleth serve`` runs): the probes and
    ``/metrics``, the admin API's paths answered 404 (it has a port of its own,
    ``admin_port``: ``AdminElsewhere``), ``GET /v1/models`` (the union of the upstreams'
    models, see ``gateway.proxy.models``), then the body timeout, the gateway (which
    refuses the targets never forwarded, ``unforwardable_path``, before admission) and the
    streaming proxy.

    ``/metrics`` answers ``metrics()``, by default ``export.render`` (``export`` default: a
    private one, which holds the gateway's instruments only); they report to the host's
    provider too, if it has one. Serve it with ``server_options(settings)`` for the bounds
    on request heads.
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
        # a response's head lines may be as long as a request's head
        max_header_bytes=settings.max_header_bytes,
    )
    # unanswered exempt paths are forwarded too; what the proxy would refuse, refused first
    gated = GatewayMiddleware(
        proxy, gateway=gateway, route_exempt=True, refuse_target=unforwardable_path
    )
    timed = _body_timed(gated, settings)
    readings = gateway.readings
    catalog = ModelCatalog(settings.upstreams, healthy=lambda url: readings.get(url).healthy)
    listed = ModelList(timed, catalog, retry_after_s=settings.retry_after_s)
    admin = admin_port if settings.admin_token is not None else None
    return Probes(AdminElsewhere(listed, admin), gateway, metrics or export.render)


def build_admin_app(settings: Settings, gateway: Gateway) -> Probes:
    """What ``obleth serve`` serves on ``--admin-port``: the probes (``/healthz``,
    ``/readyz``, the same as on the gateway's port) and the admin API over ``gateway``,
    with the gateway port's body timeout. Serve it with ``server_options(settings)`` too:
    a client dribbling its request head or a ``PUT`` body is cut off here as there."""
    return Probes(_body_timed(admin_app(gateway), settings), gateway)


def _body_timed(app: ASGIApp, settings: Settings) -> BodyTimeout:
    """``app`` with every pause of a request body bounded by ``client_body_timeout_s``."""
    return BodyTimeout(app, timeout_s=settings.client_body_timeout_s)


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


@dataclass(frozen=True)
class _Plan:
    """What every process of one ``obleth serve`` needs to serve: the settings the flags
    gave and where to listen. Picklable: ``--workers`` hands it to each worker."""

    overrides: dict[str, Any]
    host: str
    port: int
    admin_port: int
    log_level: str
    access_log: bool

    @classmethod
    def of(cls, args: argparse.Namespace) -> _Plan:
        return cls(
            _overrides(args), args.host, args.port, args.admin_port, args.log_level, args.access_log
        )


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns the exit code."""
    plan = _Plan.of(args)
    workers: int = args.workers
    tracing = None
    with _naming_flags(plan.overrides):
        settings = Settings.from_env(**plan.overrides)
        admin = settings.admin_token is not None
        if admin and plan.admin_port == plan.port:
            raise ConfigError(
                "--admin-port",
                plan.admin_port,
                f"the same port as --port ({plan.port}); the admin API listens on a port of "
                "its own: give --port and --admin-port different ports",
            )
        if workers > 1:
            _check_one_budget(settings, workers)
            # only to stop on a bad setting or plugin here, once: each worker builds its own
            app = build_app(settings, admin_port=plan.admin_port)
        else:
            tracing = install_tracing()
            export = install_prometheus_export()
            app = build_app(settings, export=export, admin_port=plan.admin_port)
    bound = _listen(plan, admin, workers)
    if bound is None:
        return STARTUP_FAILURE
    own, shared = bound
    upstreams = ", ".join(str(u) for u in settings.upstreams)
    processes = (
        f"{workers} worker processes sharing one budget in Redis (pool {settings.pool!r}); "
        if workers > 1
        else ""
    )
    print(
        f"obleth serve: {listen_url(args.host, args.port)} -> {upstreams} "
        f"({settings.routing_policy}), at most {app.gateway.capacity.current()} in flight"
        + ("; " if settings.redis_url is None else " (this pod's; the pool's is in Redis); ")
        + processes
        + (
            f"admin API on {listen_url(args.host, args.admin_port)}"
            if admin
            else "admin API off (no OBLETH_ADMIN_TOKEN)"
        ),
        file=sys.stderr,
    )
    try:
        if workers > 1:
            slots = [[sock, *shared] for sock in own]
            # each worker's page of metrics, for the others' scrapes (gateway.telemetry.workers)
            pages = pages_directory()
            try:
                return Workers(
                    _worker, (plan, str(pages)), slots, stop_timeout_s=GRACEFUL_S + 5
                ).run()
            finally:
                shutil.rmtree(pages, ignore_errors=True)
        serve(_servers(plan, settings, app, tracing), [*own, *shared])
        return 0
    finally:
        for sock in (*own, *shared):
            sock.close()


def _check_one_budget(settings: Settings, workers: int) -> None:
    """Worker processes share one budget through Redis, or not at all: an in-process
    budget per worker would admit ``workers`` times the limit (the process-model rule,
    see ``MemoryBackend.shared_with_pids``)."""
    if settings.redis_url is None:
        limit = settings.global_max_in_flight
        raise ConfigError(
            "--workers",
            workers,
            f"without --redis-url each worker process would admit up to {limit} requests on "
            f"a budget of its own ({workers} x {limit} = {workers * limit} at once); set "
            "--redis-url (or OBLETH_REDIS_URL) so that all workers share one budget, or "
            "serve with --workers 1",
        )


def _servers(
    plan: _Plan,
    settings: Settings,
    app: Probes,
    tracing: TracerProvider | None,
    pages: WorkerPages | None = None,
) -> list[Server]:
    """The gateway's uvicorn server and, when the admin API is on, the admin API's: the
    same bounds on request heads and bodies on both. A worker of several publishes its
    ``pages`` while it serves."""
    common: dict[str, Any] = {
        "host": plan.host,
        "log_level": plan.log_level,
        "timeout_graceful_shutdown": GRACEFUL_S,
        # one access logger for both servers (uvicorn's is process-wide): --access-log
        # decides; capacity changes are logged by obleth.admin anyway
        "access_log": plan.access_log,
        **server_options(settings),
    }
    gateway_app: ASGIApp = app if tracing is None else AfterShutdown(app, tracing.shutdown)
    if pages is not None:
        gateway_app = pages.serving(gateway_app)
    servers = [Server(uvicorn.Config(gateway_app, port=plan.port, lifespan="on", **common))]
    if settings.admin_token is not None:
        # its own listener: operators reach it however busy the gateway's port is
        admin = build_admin_app(settings, app.gateway)
        servers.append(
            Server(uvicorn.Config(admin, port=plan.admin_port, lifespan="off", **common))
        )
    return servers


def _listen(
    plan: _Plan, admin: bool, workers: int
) -> tuple[list[socket.socket], list[socket.socket]] | None:
    """The gateway's sockets, one per worker process (see ``gateway.server.workers``), and
    the admin API's when it is on, bound here before anything is served; None when a port
    is taken, after one line on stderr naming it and its flag (rather than a server that
    stops with a traceback once the other has started)."""
    own: list[socket.socket] = []
    try:
        if workers > 1:
            own = worker_sockets(plan.host, plan.port, workers)
        else:
            own = [listening_socket(plan.host, plan.port)]
        shared = [listening_socket(plan.host, plan.admin_port)] if admin else []
    except OSError as exc:
        for sock in own:
            sock.close()
        flag, port = ("--admin-port", plan.admin_port) if own else ("--port", plan.port)
        print(cannot_listen("serve", plan.host, port, flag, exc), file=sys.stderr)
        return None
    return own, shared


def _worker(plan: _Plan, pages_in: str, slot: int, sockets: list[socket.socket]) -> None:
    """The process in ``slot`` of ``obleth serve --workers N``: a gateway of its own (its
    own pod of the Redis pool) serving the sockets its parent bound, whose ``/metrics``
    shows every worker's series, labelled ``worker="<slot>"``, through the pages they
    publish in the directory ``pages_in``. A setting that fails here ends it with
    uvicorn's startup-failure status, which stops the parent too."""
    try:
        with _naming_flags(plan.overrides):
            settings = Settings.from_env(**plan.overrides)
            tracing = install_tracing()
            export = install_prometheus_export()
            pages = WorkerPages(export.render, Path(pages_in), slot)
            app = build_app(
                settings, export=export, metrics=pages.scrape, admin_port=plan.admin_port
            )
    except OblethError as exc:
        print(f"obleth: {exc}", file=sys.stderr)
        sys.exit(STARTUP_FAILURE)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C reaches every worker too
        serve(_servers(plan, settings, app, tracing, pages), sockets)
