"""Redirects through the proxy: a ``Location`` on the upstream itself is told as a path on
the gateway, so that the client follows it through the gateway and never learns the
upstream's address (vLLM, a FastAPI app, redirects ``/v1/models/`` to ``/v1/models``
with its own absolute URL)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
from yarl import URL

from gateway.loopback import serve_in_task
from gateway.proxy import ProxyApp
from gateway.proxy.upstream import client_location
from gateway.types import Receive, Scope, Send

pytestmark = pytest.mark.anyio


class Redirecting:
    """An upstream that answers a path ending in ``/`` with ``307`` to the location in
    the ``x-redirect-to`` request header, ``{own}`` standing for its own base URL, as a
    framework redirects to a canonical path; any other request with ``200 <path>``."""

    def __init__(self) -> None:
        self.own = ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        headers = dict(scope["headers"])
        to = headers.get(b"x-redirect-to")
        if to is None or not scope["path"].endswith("/"):
            start = {"type": "http.response.start", "status": 200, "headers": []}
            await send(start)
            await send({"type": "http.response.body", "body": scope["path"].encode()})
            return
        location = to.replace(b"{own}", self.own.encode())
        await send(
            {"type": "http.response.start", "status": 307, "headers": [(b"location", location)]}
        )
        await send({"type": "http.response.body", "body": b""})


@contextlib.asynccontextmanager
async def proxied(base_path: str = "") -> AsyncIterator[tuple[httpx.AsyncClient, str, str]]:
    """A client of a ``ProxyApp`` in front of a ``Redirecting`` upstream whose base URL
    has ``base_path``; yields the client, the proxy's URL and the upstream's address."""
    upstream_app = Redirecting()
    async with serve_in_task(upstream_app, lifespan="off") as upstream:
        upstream_app.own = upstream.url
        async with (
            serve_in_task(ProxyApp(upstream.url + base_path)) as proxy,
            httpx.AsyncClient(trust_env=False, timeout=10.0) as http,
        ):
            yield http, proxy.url, upstream.url


async def redirect(http: httpx.AsyncClient, url: str, to: str) -> httpx.Response:
    return await http.get(url, headers={"x-redirect-to": to})


async def test_a_redirect_to_the_upstream_itself_becomes_a_path_on_the_gateway() -> None:
    """The client gets ``/v1/models`` (query and fragment kept), follows it, and reaches
    the upstream through the gateway."""
    async with proxied() as (http, url, _):
        plain = await redirect(http, f"{url}/v1/models/", "{own}/v1/models")
        query = await redirect(http, f"{url}/v1/models/", "{own}/v1/models?limit=2#top")
        followed = await http.get(
            f"{url}/v1/models/",
            headers={"x-redirect-to": "{own}/v1/models"},
            follow_redirects=True,
        )

    assert (plain.status_code, plain.headers["location"]) == (307, "/v1/models")
    assert query.headers["location"] == "/v1/models?limit=2#top"
    assert followed.status_code == 200
    assert followed.url == httpx.URL(f"{url}/v1/models")  # the gateway's, not the upstream's
    assert followed.text == "/v1/models"


async def test_with_a_base_path_the_upstreams_own_prefix_is_taken_off() -> None:
    """An upstream behind ``http://h:port/v``: its ``/v/v1/models`` is the gateway's
    ``/v1/models``; a location outside ``/v`` is no path of the gateway's and is kept."""
    async with proxied("/v") as (http, url, own):
        inside = await redirect(http, f"{url}/v1/models/", "{own}/v/v1/models")
        outside = await redirect(http, f"{url}/v1/models/", "{own}/elsewhere")

    assert inside.headers["location"] == "/v1/models"
    assert outside.headers["location"] == f"{own}/elsewhere"


@pytest.mark.parametrize(
    "location",
    ["/v1/models", "v1/models", "https://login.example.com/authorize?x=1"],
    ids=["path", "relative", "another-host"],
)
async def test_any_other_location_is_relayed_as_the_upstream_sent_it(location: str) -> None:
    async with proxied() as (http, url, _):
        response = await redirect(http, f"{url}/v1/models/", location)

    assert (response.status_code, response.headers["location"]) == (307, location)


def test_a_location_that_is_no_url_is_kept_as_it_came() -> None:
    """(Checked on the function: an HTTP client refuses such a response itself.)"""
    url = URL("http://127.0.0.1:8000/v1/models/", encoded=True)
    scope: Scope = {"raw_path": b"/v1/models/", "path": "/v1/models/"}
    assert client_location(b"http://[::1", url, scope) == b"http://[::1"
