"""``PathGuard``: request targets the proxy never forwards, refused before admission.

A path with a dot segment, or a target that is no path (``OPTIONS *``), is a client's
mistake that no upstream should see (``unforwardable_path``). Refused in front of the
gateway, it is answered ``400 invalid_path`` at once, even while the gate is full, and
takes no seat, no routing decision and no upstream's name in the answer.
"""

from __future__ import annotations

from gateway.asgi.responses import send_json_error
from gateway.proxy.upstream import unforwardable_path
from gateway.types import ASGIApp, Receive, Scope, Send


class PathGuard:
    """Answers ``400 invalid_path`` to what ``unforwardable_path`` refuses; everything
    else goes to ``app`` untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = unforwardable_path(scope)
            if refused is not None:
                await send_json_error(send, 400, refused, code="invalid_path")
                return
        await self.app(scope, receive, send)
