"""The admin API's paths on the gateway's port of ``obleth serve``: answered there, 404
naming the admin port, and never forwarded, since such a request carries the admin token.
``obleth serve``'s app on a real server in front of an echoing upstream."""

from __future__ import annotations

import httpx
import pytest

from tests.proxy.serving import serving

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/api/v1/capacity"),
        ("GET", "/api/v1/status"),
        ("GET", "/api/v1/openapi.json"),
        ("GET", "/dashboard"),
        ("GET", "/dashboard/app.js"),
        # spellings a lenient router reads as the same path
        ("GET", "//api/v1/capacity"),
        ("PUT", "/api/v1//capacity"),
        ("GET", "/api/v1/capacity;x"),
        ("GET", "/api;v=1/v1/status"),
    ],
)
async def test_an_admin_path_on_the_gateway_port_is_answered_404_and_not_forwarded(
    method: str, path: str
) -> None:
    headers = {"authorization": "Bearer the-admin-token-here", "x-test-id": path}
    async with serving() as served, httpx.AsyncClient(trust_env=False, timeout=10) as http:
        answer = await http.request(method, served.url + path, headers=headers)
        forwarded = await http.get(served.url + "/v1/anything", headers={"x-test-id": "plain"})

    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["code"] == "not_found" and "--admin-port" in error["message"]
    assert forwarded.status_code == 200
    assert served.echo.received == ["plain"]  # the admin request never reached it


@pytest.mark.parametrize(
    ("token", "said"),
    [
        ("the-admin-token-here", "served on its own port, 9123 (obleth serve --admin-port)"),
        (None, "the admin API is off; set OBLETH_ADMIN_TOKEN to turn it on"),
    ],
)
async def test_the_answer_names_the_admin_port_in_use_or_says_the_api_is_off(
    token: str | None, said: str
) -> None:
    """An operator who sent ``obleth capacity --url`` to the wrong port learns where the
    API is, the port this server was given rather than the default; or that it is off."""
    async with (
        serving(admin_port=9123, admin_token=token) as served,
        httpx.AsyncClient(trust_env=False, timeout=10) as http,
    ):
        answer = await http.get(served.url + "/api/v1/status")
    assert answer.status_code == 404
    assert said in answer.json()["error"]["message"]
