"""The admin API's OpenAPI document: served without a token, naming every path, and true
to what the API answers, checked by schemathesis against a real server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any
from urllib.parse import urljoin

import httpx
import pytest
import requests
import schemathesis

from gateway import Gateway, Settings
from gateway.admin import admin_app, api, contract, openapi
from gateway.core.tickets import Ticket
from gateway.loopback import serve_in_task, serve_in_thread
from gateway.routing.decisions import ROUTED
from gateway.types import ASGIApp, Receive, Scope, Send
from tests.admin.client import BEARER, TOKEN, admin
from tests.backends.redis_pods import Pods

UPSTREAM = "http://127.0.0.1:9"

#: every case schemathesis generates, positive and negative; all of its checks run (its
#: default), these are the ones this test is for
CONFIG: dict[str, Any] = {
    "auth": {"openapi": {"adminToken": {"bearer": TOKEN}}},
    "generation": {"mode": "all", "max-examples": 100, "database": "none"},
    "checks": {
        name: {"enabled": True}
        for name in (
            "not_a_server_error",
            "status_code_conformance",
            "content_type_conformance",
            "response_schema_conformance",
            "response_headers_conformance",
            "negative_data_rejection",
            "unsupported_method",
            "ignored_auth",
        )
    },
}
#: requests would take a proxy from the environment even for 127.0.0.1
NO_PROXY: dict[str, Any] = {"http": None, "https": None}


def _started(gateway: Gateway) -> ASGIApp:
    """``admin_app(gateway)``, starting the gateway at the server's lifespan startup, so
    that it runs on the loop the server calls the API on."""
    app = admin_app(gateway)

    async def served(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        await receive()  # lifespan.startup
        await gateway.start()
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        await gateway.stop()
        await send({"type": "lifespan.shutdown.complete"})

    return served


@pytest.fixture(scope="module")
def admin_url() -> Iterator[str]:
    """A started gateway's admin API (limit 8, one unreachable upstream) on a loopback port,
    in a thread of its own: schemathesis calls it synchronously."""
    settings = Settings(
        global_max_in_flight=8, admin_token=TOKEN, upstreams=("http://127.0.0.1:9",)
    )
    with serve_in_thread(_started(Gateway(settings, entry_points=False)), lifespan="on") as server:
        yield server.url


@pytest.fixture
def admin_schema(admin_url: str) -> schemathesis.BaseSchema:
    """The document the API serves, loaded by schemathesis from its URL."""
    config = schemathesis.Config.from_dict(CONFIG)
    return schemathesis.openapi.from_url(
        admin_url + openapi.OPENAPI_PATH, config=config, proxies=NO_PROXY
    )


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.trust_env = False  # no proxy from the environment for 127.0.0.1
        yield session


schema = schemathesis.pytest.from_fixture("admin_schema")


@schema.parametrize()
def test_every_operation_answers_as_documented_whatever_it_is_sent(
    case: schemathesis.Case, session: requests.Session
) -> None:
    """Valid and invalid bodies, tokens and methods: never a 5xx, and every answer has a
    status, content type, headers and body the document declares. (schemathesis leaves out
    the document's own path, which the next tests cover.)"""
    case.call_and_validate(session=session)


@pytest.mark.anyio
async def test_the_document_needs_no_token_and_names_every_path() -> None:
    """A new endpoint without documentation fails here."""
    gateway = Gateway(Settings(admin_token=TOKEN), entry_points=False)
    async with admin(gateway) as client:
        answer = await client.get(openapi.OPENAPI_PATH)
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "application/json"
        document = answer.json()
        assert document == openapi.document()
        assert sorted(document["paths"]) == sorted(api.PATHS)
        for path, item in document["paths"].items():  # what `obleth serve` may answer any
            for method in ("get", "put"):  # request for how it was sent
                answers = item.get(method, {}).get("responses", {"408": 1, "431": 1})
                assert {"408", "431"} <= set(answers), (path, method)
        assert {"TimedOut", "HeadersTooLarge"} <= set(document["components"]["responses"])
        assert document["info"]["version"] != ""
        assert (await client.get(openapi.OPENAPI_PATH, headers=BEARER)).status_code == 200
        refused = await client.post(openapi.OPENAPI_PATH)
        assert (refused.status_code, refused.headers["allow"]) == (405, "GET, HEAD")


@pytest.mark.anyio
@pytest.mark.parametrize("prefix", ["", "/admin"])
async def test_a_client_built_from_the_document_calls_the_api_where_it_was_loaded(
    prefix: str,
) -> None:
    """The document's server is relative to its own URL, so that a client generator or an
    API explorer loading it from an API mounted under a prefix (``Mount("/admin", ...)``,
    as docs/operations.md shows) calls the API under that prefix, and at the root when
    it is served on a port of its own."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    gateway = Gateway(Settings(global_max_in_flight=6, admin_token=TOKEN), entry_points=False)
    app = admin_app(gateway)
    served = Starlette(routes=[Mount(prefix, app=app)]) if prefix else app
    async with (
        serve_in_task(served, lifespan="off") as server,
        httpx.AsyncClient(trust_env=False) as client,
    ):
        document_url = f"{server.url}{prefix}{openapi.OPENAPI_PATH}"
        document = (await client.get(document_url)).json()
        (server_entry,) = document["servers"]
        base = urljoin(document_url, server_entry["url"]).rstrip("/")
        assert base == server.url + prefix
        answer = await client.get(base + contract.CAPACITY_PATH, headers=BEARER)
        assert (answer.status_code, answer.json()) == (200, {"max_in_flight": 6})


@pytest.mark.anyio
async def test_without_a_token_the_document_is_not_served_either() -> None:
    async with admin(Gateway(Settings(), entry_points=False)) as client:
        assert (await client.get(openapi.OPENAPI_PATH)).status_code == 404


@pytest.mark.anyio
async def test_a_whole_number_written_with_a_decimal_point_is_a_whole_number() -> None:
    """JSON Schema's ``integer`` takes 300.0, so the API does too."""
    gateway = Gateway(Settings(global_max_in_flight=4, admin_token=TOKEN), entry_points=False)
    async with admin(gateway) as client:
        body = b'{"max_in_flight": 300.0}'
        answer = await client.put(contract.CAPACITY_PATH, headers=BEARER, content=body)
        assert (answer.status_code, answer.json()) == (200, {"max_in_flight": 300, "ceiling": 300})
        assert gateway.capacity.current() == 300


@pytest.mark.anyio
async def test_a_busy_gateways_status_is_as_documented() -> None:
    """Seats held, tenants waiting, an upstream: the parts an idle gateway leaves empty."""
    settings = Settings(
        global_max_in_flight=2,
        admin_token=TOKEN,
        tenant_weights={"gold": 4},
        upstreams=(UPSTREAM,),
    )
    gateway = Gateway(settings, entry_points=False)
    await gateway.start()
    try:
        held = [await gateway.scheduler.acquire(Ticket(t)) for t in ("gold", "free")]
        waiting = [
            asyncio.create_task(gateway.scheduler.acquire(Ticket(t, p)))
            for t, p in (("gold", "critical"), ("spare", "background"), ("spare", "standard"))
        ]
        for _ in range(20):
            await asyncio.sleep(0)
        assert gateway.router is not None  # a choice as the router logs it, with its scores
        gateway.router.decisions.chose(UPSTREAM, ROUTED, {"total": {UPSTREAM: 0.75}})
        async with admin(gateway) as client:
            answer = await documented_status(client)
            assert answer["tenants"]["listed"]["gold"]["in_flight"] == 1
            assert answer["upstreams"][UPSTREAM]["healthy"] is False
            assert answer["upstreams"][UPSTREAM]["routed"] == 1
            (recent,) = answer["routing"]["recent"]
            assert (recent["upstream"], recent["scores"]) == (UPSTREAM, {"total": 0.75})
        for task in waiting:
            task.cancel()
        for permit in held:
            permit.release()
    finally:
        await gateway.stop()


@pytest.mark.anyio
async def test_a_pods_status_in_cluster_mode_is_as_documented(
    redis_url: str, pool_name: str
) -> None:
    pods = Pods(redis_url, pool_name, settings={"admin_token": TOKEN})
    try:
        gateway = await pods.start()
        async with admin(gateway) as client:
            cluster = (await documented_status(client))["cluster"]
            assert (cluster["pool"], cluster["mode"]) == (pool_name, "redis")
    finally:
        await pods.close()


async def documented_status(client: httpx.AsyncClient) -> dict[str, Any]:
    """``GET /api/v1/status``, checked against the document the API serves."""
    served = (await client.get(openapi.OPENAPI_PATH)).json()
    operation = schemathesis.openapi.from_dict(served, config=schemathesis.Config())[
        contract.STATUS_PATH
    ]["GET"]
    answer = await client.get(contract.STATUS_PATH, headers=BEARER)
    assert answer.status_code == 200
    operation.validate_response(answer)
    document: dict[str, Any] = answer.json()
    return document
