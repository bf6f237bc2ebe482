"""Obleth: admission control, fair queueing and routing for LLM inference services.

The public surface; everything a user or plugin author imports comes from here.
"""

from __future__ import annotations

from gateway.asgi import GatewayMiddleware
from gateway.core.tickets import Priority, Ticket
from gateway.errors import (
    BadRequest,
    ConfigError,
    Disconnected,
    OblethError,
    PluginError,
    Rejected,
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
from gateway.settings import Settings

__all__ = [
    "BadRequest",
    "CapacityProvider",
    "Classification",
    "ConfigError",
    "Disconnected",
    "Gateway",
    "GatewayMiddleware",
    "OblethError",
    "OverflowPolicy",
    "PluginError",
    "Priority",
    "Rejected",
    "RequestInfo",
    "RoutingScorer",
    "Settings",
    "Snapshot",
    "Ticket",
    "hookimpl",
]
