"""The ASGI side: the middleware and what it needs (body replay, lifespan, responses)."""

from __future__ import annotations

from gateway.asgi.middleware import GatewayMiddleware

__all__ = ["GatewayMiddleware"]
