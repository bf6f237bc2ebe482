"""``AdminElsewhere``: the admin API's paths on the gateway's own port of ``obleth serve``.

There the admin API is served on a port of its own (``--admin-port``). A request for one
of its paths that reaches the gateway's port is an operator's mistake (``obleth capacity
--url`` given the wrong port), and it carries the admin token: it is answered here, not
forwarded to a backend that has no business seeing that token.
"""

from __future__ import annotations

import re

from gateway.admin.api import PATHS
from gateway.admin.contract import ADMIN_PORT
from gateway.asgi.responses import send_json_error
from gateway.core.exemptions import ExemptPaths, route_path
from gateway.types import ASGIApp, Receive, Scope, Send


class AdminElsewhere:
    """Answers the admin API's paths (and those below them) ``404 not_found``, naming the
    admin port; everything else goes to ``app`` untouched.

    ``admin_port``: the port the admin API listens on, or None while it is off (no
    ``admin_token``); the message tells the operator which, and what to do."""

    def __init__(self, app: ASGIApp, admin_port: int | None = None) -> None:
        self.app = app
        self._paths = ExemptPaths(PATHS)
        if admin_port is None:
            self._message = (
                "the admin API is off; set OBLETH_ADMIN_TOKEN to turn it on, and it is "
                f"served on a port of its own (obleth serve --admin-port, {ADMIN_PORT} by "
                "default), not on the gateway's"
            )
        else:
            self._message = (
                f"the admin API is served on its own port, {admin_port} (obleth serve "
                "--admin-port), not on the gateway's"
            )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._paths.covers(_as_routed(route_path(scope))):
            await send_json_error(send, 404, self._message, code="not_found")
            return
        await self.app(scope, receive, send)


def _as_routed(path: str) -> str:
    """``path`` as a lenient router may read it: slashes in a row taken for one, and
    ``;parameters`` cut off a segment (``//api/v1//capacity;x``), so that no spelling
    of an admin path slips through to a backend with the token."""
    if "//" in path:
        path = _SLASHES.sub("/", path)
    if ";" in path:
        path = "/".join(segment.split(";", 1)[0] for segment in path.split("/"))
    return path


_SLASHES = re.compile(r"/{2,}")
