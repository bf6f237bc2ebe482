"""Obleth: admission control, fair queueing and routing for LLM inference services.

The public surface; everything a user or plugin author imports comes from here.
"""

from __future__ import annotations

import importlib.metadata

from gateway.asgi import GatewayMiddleware
from gateway.core.tickets import Priority, Ticket
from gateway.errors import (
    BadRequest,
    ConfigError,
    Disconnected,
    OblethError,
    PluginError,
    Rejected,
    Unroutable,
)
from gateway.gateway import Gateway
from gateway.hookimpl import hookimpl
from gateway.protocols import (
    CapacityProvider,
    Classification,
    OverflowPolicy,
    RequestInfo,
    RoutingScorer,
    Snapshot,
)
from gateway.routing.readings import Reading, Readings
from gateway.routing.request import RouteRequest
from gateway.routing.router import Decision
from gateway.routing.upstreams import Upstream
from gateway.settings import Settings
from gateway.settings.knobs import PluginKnobs


def _installed_version() -> str:
    try:
        return importlib.metadata.version("obleth")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


__version__ = _installed_version()
"""The version of the ``obleth`` distribution this package was installed from."""

__all__ = [
    "BadRequest",
    "CapacityProvider",
    "Classification",
    "ConfigError",
    "Decision",
    "Disconnected",
    "Gateway",
    "GatewayMiddleware",
    "OblethError",
    "OverflowPolicy",
    "PluginError",
    "PluginKnobs",
    "Priority",
    "Reading",
    "Readings",
    "Rejected",
    "RequestInfo",
    "RouteRequest",
    "RoutingScorer",
    "Settings",
    "Snapshot",
    "Ticket",
    "Unroutable",
    "Upstream",
    "hookimpl",
]
