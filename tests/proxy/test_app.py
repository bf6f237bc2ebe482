"""ProxyApp as built: its options checked up front, and requests it has no upstream for."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from gateway.errors import ConfigError
from gateway.loopback import serve_in_task
from gateway.proxy import ProxyApp, proxy_to


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("connect_timeout_s", None),
        ("connect_timeout_s", 0),
        ("response_timeout_s", 0),
        ("response_timeout_s", -1.0),
        ("response_timeout_s", math.inf),
        ("response_timeout_s", "5"),
        ("read_timeout_s", 0.0),
        ("read_timeout_s", math.nan),
        ("read_timeout_s", True),
        ("retry_body_bytes", -1),
        ("retry_body_bytes", 1.5),
        ("retry_body_bytes", False),
        ("max_connections", 0),
        ("max_header_bytes", 1023),
        ("max_header_bytes", 8192.0),
    ],
)
def test_a_bad_option_stops_construction_naming_it(option: str, value: Any) -> None:
    """``ConfigError`` names the option and says what it expected, before any request."""
    with pytest.raises(ConfigError, match=f"^{option}=") as raised:
        ProxyApp("http://127.0.0.1:8000", **{option: value})
    assert raised.value.setting == option
    with pytest.raises(ConfigError, match=f"^{option}="):
        proxy_to("http://127.0.0.1:8000", **{option: value})


def test_timeouts_may_be_unlimited_and_the_retry_bound_zero() -> None:
    """None turns the response and read timeouts off; 0 retries bodiless requests only."""
    ProxyApp(response_timeout_s=None, read_timeout_s=None, retry_body_bytes=0)
    ProxyApp(response_timeout_s=1, read_timeout_s=0.5)


@pytest.mark.anyio
async def test_an_unrouted_request_without_a_configured_upstream_is_answered_503() -> None:
    """No upstream configured and no router's choice: a JSON 503 ``no_upstream``."""
    async with (
        serve_in_task(ProxyApp()) as proxy,
        httpx.AsyncClient(trust_env=False, timeout=10.0) as http,
    ):
        response = await http.post(f"{proxy.url}/v1/completions", json={"prompt": "hi"})

    assert response.status_code == 503
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == "no_upstream"
    assert "no upstream" in error["message"]
