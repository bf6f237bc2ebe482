"""contrib/'s deployment files read as the programs that run them read them.

- An obleth container, from its command line and environment, the way ``obleth`` itself
  does: the command parsed by obleth's own parser, the settings read from its
  ``OBLETH_*`` variables, and the very ASGI apps ``obleth serve`` or
  ``obleth mock-backend`` would serve on each port, asked in process (nothing binds a
  socket, nothing is started).
- contrib/compose/compose.yaml, its variables interpolated as ``docker compose`` does.
- contrib/haproxy/haproxy.cfg, in sections of directives.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.admin.api import admin_app
from gateway.cli import build_parser
from gateway.cli.mock_backend import config_from_args
from gateway.cli.serve import _overrides, build_app
from gateway.settings import Settings
from gateway.sim import create_app
from gateway.types import ASGIApp

CONTRIB = Path(__file__).resolve().parents[2] / "contrib"
COMPOSE_DIR = CONTRIB / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
HAPROXY_CFG = CONTRIB / "haproxy" / "haproxy.cfg"

PROMETHEUS_TEXT = "text/plain; version=0.0.4"
#: how long a request to an app in process may take
GET_TIMEOUT_S = 15

Doc = dict[str, Any]


def obleth_args(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` (what follows ``obleth``) parsed by obleth's own parser; a command line
    obleth would refuse fails the test with argparse's own message."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser().parse_args(list(argv))
    except SystemExit:
        message = stderr.getvalue().strip().splitlines()[-1:]
        raise AssertionError(f"`obleth {shlex.join(argv)}` does not parse: {message}") from None


def obleth_argv(entrypoint: Sequence[str], args: Sequence[str]) -> list[str]:
    """What follows ``obleth`` in a container started as ``entrypoint + args``."""
    argv = [*entrypoint, *args]
    assert argv[:1] == ["obleth"], f"the container runs {argv[:1]}, not obleth"
    return argv[1:]


@dataclass
class Container:
    """One obleth process: its parsed command, its settings (``obleth serve`` only) and the
    app behind each port it listens on."""

    args: argparse.Namespace
    settings: Settings | None
    apps: dict[int, ASGIApp] = field(default_factory=dict)

    @property
    def command(self) -> str:
        command: str = self.args.command
        return command

    def get(self, port: int, path: str) -> httpx.Response:
        """``GET path`` on ``port``, answered by the app obleth serves there."""
        app = self.apps.get(port)
        assert app is not None, (
            f"obleth {self.command} listens on {sorted(self.apps)}, not on port {port}"
        )
        return asyncio.run(_get(app, path))


async def _get(app: ASGIApp, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    # a path the probes do not answer goes to the gateway, which routes it to upstreams
    # that do not exist here: bounded, so that such a mistake fails rather than hangs
    async with (
        asyncio.timeout(GET_TIMEOUT_S),
        httpx.AsyncClient(transport=transport, base_url="http://pod") as client,
    ):
        return await client.get(path)


def container(argv: Sequence[str], environ: Mapping[str, str]) -> Container:
    """The obleth process ``obleth *argv`` would be with ``environ``: a setting it would
    refuse raises the ``ConfigError`` it would stop on."""
    args = obleth_args(argv)
    if args.command == "serve":
        # as obleth serve's run(): the flags given win over the OBLETH_* variables
        settings = Settings.from_env(environ, **_overrides(args))
        app = build_app(settings)
        apps: dict[int, ASGIApp] = {args.port: app}
        if settings.admin_token is not None:
            apps[args.admin_port] = admin_app(app.gateway)
        return Container(args, settings, apps)
    if args.command == "mock-backend":
        return Container(args, None, {args.port: create_app(config_from_args(args))})
    raise AssertionError(f"obleth {args.command} serves nothing the manifests could use")


def is_readiness(response: httpx.Response) -> bool:
    """Whether ``response`` is the gateway's ``/readyz`` answer (200 ready or 503 not; an
    unstarted gateway in process is not ready) rather than some other app's."""
    return response.status_code in (200, 503) and "healthy_upstreams" in response.json()


def is_liveness(response: httpx.Response) -> bool:
    """Whether ``response`` is the gateway's ``/healthz`` answer: alive."""
    return response.status_code == 200 and response.json() == {"status": "alive"}


def is_metrics(response: httpx.Response, metric: str) -> bool:
    """Whether ``response`` is a Prometheus page that has ``metric`` on it."""
    return (
        response.status_code == 200
        and response.headers["content-type"].startswith(PROMETHEUS_TEXT)
        and f"\n{metric}" in f"\n{response.text}"
    )


# -- contrib/compose/compose.yaml -------------------------------------------------------

#: what the person starting the stack exports as OBLETH_ADMIN_TOKEN
COMPOSE_ADMIN_TOKEN = "compose-test-admin-token-0123"

# `$$`, `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `${NAME:?error}`, `${NAME?error}`
_VARIABLE = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})")


def compose_file() -> Doc:
    """compose.yaml as written (YAML anchors and merge keys resolved, nothing else)."""
    loaded: Doc = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    return loaded


def interpolate(value: Any, environ: Mapping[str, str]) -> Any:
    """``value`` with every variable reference replaced as compose does; a required
    variable that is unset or empty raises ``LookupError`` with compose's message."""
    if isinstance(value, dict):
        return {key: interpolate(item, environ) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, environ) for item in value]
    if not isinstance(value, str):
        return value

    def replace(found: re.Match[str]) -> str:
        if found["escaped"]:
            return "$"
        name, op, arg = found["name"], found["op"], found["arg"]
        unset = name not in environ or (op is not None and op.startswith(":") and not environ[name])
        if op is not None and op.endswith("?") and unset:
            raise LookupError(f"required variable {name} is missing a value: {arg}")
        if op is not None and op.endswith("-") and unset:
            return str(arg)
        return environ.get(name, "")

    return _VARIABLE.sub(replace, value)


def compose_services(environ: Mapping[str, str] | None = None) -> dict[str, Doc]:
    """The services as ``docker compose up`` sees them with ``environ`` exported (by
    default, the admin token the stack requires)."""
    if environ is None:
        environ = {"OBLETH_ADMIN_TOKEN": COMPOSE_ADMIN_TOKEN}
    services: dict[str, Doc] = interpolate(compose_file()["services"], environ)
    return services


def service_env(service: Doc) -> dict[str, str]:
    """A service's ``environment``, given as a mapping or as ``NAME=value`` items."""
    environment = service.get("environment", {})
    if isinstance(environment, list):
        return dict(item.split("=", 1) for item in environment)
    return {name: "" if value is None else str(value) for name, value in environment.items()}


def compose_container(service: Doc) -> Container:
    """The obleth process a service of compose.yaml runs."""
    argv = obleth_argv(service.get("entrypoint", []), service.get("command", []))
    return container(argv, service_env(service))


def obleth_services(services: Mapping[str, Doc], command: str) -> dict[str, Doc]:
    """The services that run ``obleth <command>``."""
    return {
        name: service
        for name, service in services.items()
        if service.get("entrypoint") == ["obleth"] and service["command"][:1] == [command]
    }


def target_port(port: str | int | Doc) -> int:
    """The container side of a ``ports`` entry: ``[ip:][published:]target[/protocol]``
    or the long syntax."""
    if isinstance(port, dict):
        return int(port["target"])
    return int(str(port).split("/")[0].rsplit(":", 1)[-1])


def bind_mounts(service: Doc) -> dict[str, Path]:
    """A service's bind mounts: container path -> host path (relative to the compose
    file's folder, as compose resolves them)."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (COMPOSE_DIR / source).resolve()
    return mounts


# -- contrib/haproxy/haproxy.cfg --------------------------------------------------------

_DURATION = re.compile(r"(\d+)(us|ms|s|m|h|d)?")
_MS_PER_UNIT = {
    "us": 0.001,
    "ms": 1,
    None: 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}


def haproxy_sections(text: str) -> dict[str, list[list[str]]]:
    """Each section (``"defaults"``, ``"backend gateways"``, ...) and its directives,
    each split into words, comments left out."""
    sections: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if not line[0].isspace():
            current = sections.setdefault(" ".join(words), [])
        else:
            assert current is not None, f"a directive outside any section: {line!r}"
            current.append(words)
    return sections


def haproxy_ms(duration: str) -> float:
    """An HAProxy duration (``360s``, ``5m``, a bare number of milliseconds) in ms."""
    found = _DURATION.fullmatch(duration)
    assert found is not None, f"not an HAProxy duration: {duration!r}"
    return int(found[1]) * _MS_PER_UNIT[found[2]]
