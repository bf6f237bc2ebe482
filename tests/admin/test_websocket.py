"""The admin API takes no WebSocket connection: a handshake on its port (``obleth serve
--admin-port``, or the API mounted in an app under uvicorn) is refused with a status and
an OpenAI-style JSON error, as the gateway's own port refuses one, not the server's 500
for an app that answered nothing. A real server, a real WebSocket client."""

from __future__ import annotations

import pytest

from gateway import Gateway, Settings
from gateway.admin import admin_app
from gateway.loopback import serve_in_task
from tests.admin.client import BEARER, TOKEN
from tests.proxy.test_websocket import refused_handshake

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("path", ["/api/v1/capacity", "/healthz", "/nowhere"])
async def test_a_websocket_handshake_is_refused_501_with_a_json_error(path: str) -> None:
    gateway = Gateway(Settings(admin_token=TOKEN), entry_points=False)
    async with serve_in_task(admin_app(gateway)) as server:
        await refused_handshake(server.url.replace("http://", "ws://") + path, BEARER)
