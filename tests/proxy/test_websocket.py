"""``obleth serve`` forwards no WebSocket connection: a handshake (an OpenAI Realtime
client, say) is refused with a status and a JSON error saying so, not a bare 403, and
nothing reaches the upstream. ``obleth serve``'s app on a real server, a real WebSocket
client."""

from __future__ import annotations

import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.proxy.serving import serving

pytestmark = pytest.mark.anyio


async def test_a_websocket_handshake_is_refused_501_with_a_json_error() -> None:
    async with serving() as served:
        url = served.url.replace("http://", "ws://") + "/v1/realtime?model=m"
        await refused_handshake(url, {"x-test-id": "ws"})
        assert served.echo.received == []
        assert served.scheduler.admitted == 0


async def refused_handshake(url: str, headers: dict[str, str]) -> None:
    """Open a WebSocket to ``url``: it must be refused ``501 websocket_not_supported``,
    an OpenAI-style JSON error that says WebSocket."""
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, additional_headers=headers, open_timeout=5):
            pytest.fail("the handshake was accepted")
    answer = refused.value.response
    assert answer.status_code == 501
    assert answer.headers["content-type"] == "application/json"
    error = json.loads(answer.body)["error"]
    assert error["code"] == "websocket_not_supported"
    assert "WebSocket" in error["message"] and error["type"] == "server_error"
