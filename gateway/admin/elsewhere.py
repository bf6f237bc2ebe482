"""``AdminElsewhere``: the admin API's paths on the gateway's own port of ``obleth serve``.

There the admin API is served on a port of its own (``--admin-port``). A request for one
of its paths that reaches the gateway's port is an operator's mistake (``obleth capacity
--url`` given the wrong port), and it carries the admin token: it is answered here, not
forwarded to a backend that has no business seeing that token.
"""

from __future__ import annotations

from gateway.admin.api import PATHS
from gateway.asgi.responses import send_json_error
from gateway.core.exemptions import ExemptPaths, route_path
from gateway.types import ASGIApp, Receive, Scope, Send


class AdminElsewhere:
    """Answers the admin API's paths (and those below them) ``404 not_found``, naming the
    admin port; everything else goes to ``app`` untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._paths = ExemptPaths(PATHS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._paths.covers(route_path(scope)):
            await send_json_error(
                send,
                404,
                "the admin API is served on its own port (obleth serve --admin-port, 9090 "
                "by default, once OBLETH_ADMIN_TOKEN is set), not on the gateway's",
                code="not_found",
            )
            return
        await self.app(scope, receive, send)
