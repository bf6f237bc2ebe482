"""The ASGI side: the middleware and what it needs (the per-request flight and the plan
every flight shares, body replay, lifespan, responses)."""

from __future__ import annotations

from gateway.asgi.middleware import GatewayMiddleware

__all__ = ["GatewayMiddleware"]
