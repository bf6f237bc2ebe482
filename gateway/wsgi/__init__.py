"""The WSGI side: ``WSGIGatewayMiddleware`` and what it needs (the environ read as a
request, the gateway's loop thread, the passage of a request between the two)."""

from __future__ import annotations

from gateway.wsgi.middleware import WSGIGatewayMiddleware

__all__ = ["WSGIGatewayMiddleware"]
