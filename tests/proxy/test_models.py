"""``GET /v1/models`` under ``obleth serve``: the union of what the healthy upstreams serve,
answered by the gateway, from real loopback upstreams that list different models."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest

from gateway.admin import Probes
from gateway.cli.serve import build_app, server_options
from gateway.loopback import RunningServer, serve_in_task
from gateway.proxy.models import ModelCatalog
from gateway.routing.upstreams import parse_upstream_entry
from gateway.settings import Settings
from gateway.types import Receive, Scope, Send
from tests.proxy.upstreams import closed_upstream, eventually, within

pytestmark = pytest.mark.anyio

JSON = [(b"content-type", b"application/json")]


class Listing:
    """An upstream that lists ``models`` at ``GET /v1/models`` (owned by ``owner``), or
    answers there with ``status`` and ``body`` when they are set; ``/health`` and
    ``/metrics`` answer 200, so the gateway's poller finds it healthy. A request for
    ``/hold`` waits for ``release``. ``asked`` counts the model-list requests."""

    def __init__(
        self, *models: str, owner: str = "upstream", status: int = 200, body: bytes | None = None
    ) -> None:
        self.models = list(models)
        self.owner = owner
        self.status = status
        self.body = body
        self.asked = 0
        self.release = asyncio.Event()

    def document(self) -> dict[str, Any]:
        data = [
            {"id": m, "object": "model", "created": 1700000000, "owned_by": self.owner}
            for m in self.models
        ]
        return {"object": "list", "data": data}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        status, body = 200, b"{}"
        if scope["path"] == "/v1/models":
            self.asked += 1
            status = self.status
            body = self.body if self.body is not None else json.dumps(self.document()).encode()
        elif scope["path"] == "/metrics":
            body = b""
        elif scope["path"] == "/hold":
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await self.release.wait()
        await send({"type": "http.response.start", "status": status, "headers": JSON})
        await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def upstreams(*apps: Listing) -> AsyncIterator[list[RunningServer]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(serve_in_task(a, lifespan="off")) for a in apps]


@contextlib.asynccontextmanager
async def gateway_before(
    entries: Sequence[str], *, ready: bool = True, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """``obleth serve``'s app in front of ``entries``, served on loopback; a client to it,
    once an upstream is healthy (unless ``ready`` is False)."""
    async with served_before(entries, ready=ready, **settings) as (http, _):
        yield http


@contextlib.asynccontextmanager
async def served_before(
    entries: Sequence[str], *, ready: bool = True, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Probes]]:
    """``gateway_before``, with the app served (its ``gateway`` can be read)."""
    config = Settings(upstreams=list(entries), upstream_poll_interval_s=0.05, **settings)
    app = build_app(config)
    async with (
        serve_in_task(app, **server_options(config)) as server,
        httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=10.0) as http,
    ):
        if ready:
            for _ in range(250):
                if (await http.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.02)
            else:
                pytest.fail("the gateway never saw an upstream healthy")
        yield http, app


def ids(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [entry["id"] for entry in answer.json()["data"]]


async def test_v1_models_is_the_union_of_the_upstreams_lists_in_a_stable_order() -> None:
    """Each model once, upstreams in configured order, each one's models in its order; a
    model two upstreams list keeps the first one's entry, in OpenAI's shape."""
    first = Listing("llama", "shared", owner="first")
    second = Listing("shared", "qwen", owner="second")
    async with (
        upstreams(first, second) as (a, b),
        gateway_before([a.url, b.url]) as http,
    ):
        answer = await http.get("/v1/models")
        again = await http.get("/v1/models")

    assert ids(answer) == ["llama", "shared", "qwen"] == ids(again)
    document = answer.json()
    assert document["object"] == "list"
    assert document["data"][1] == {
        "id": "shared",
        "object": "model",
        "created": 1700000000,
        "owned_by": "first",
    }


async def test_an_upstream_configured_with_models_contributes_those_unasked() -> None:
    """``URL=model|model`` is what the router sends there: those are listed, sorted, in
    OpenAI's shape, and that upstream's own list is never fetched."""
    configured = Listing("not-this-one")
    asked = Listing("phi")
    async with (
        upstreams(configured, asked) as (a, b),
        gateway_before([f"{a.url}=qwen|llama", b.url]) as http,
    ):
        answer = await http.get("/v1/models")

    assert ids(answer) == ["llama", "qwen", "phi"]
    assert configured.asked == 0 and asked.asked == 1
    entry = answer.json()["data"][0]
    assert entry["object"] == "model" and isinstance(entry["created"], int)
    assert entry["owned_by"] == "obleth"


@pytest.mark.parametrize(
    ("status", "body"),
    [(500, b'{"error": "boom"}'), (200, b"<html>not json</html>"), (200, b'{"models": []}')],
    ids=["status-500", "not-json", "no-data-list"],
)
async def test_an_upstream_that_fails_to_list_is_left_out_and_logged(
    status: int, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """The other upstreams' models are still answered; the failure is logged (naming the
    upstream), not answered to the client."""
    failing = Listing("ghost", status=status, body=body)
    working = Listing("llama")
    with caplog.at_level(logging.WARNING, logger="obleth.proxy"):
        async with (
            upstreams(failing, working) as (a, b),
            gateway_before([a.url, b.url]) as http,
        ):
            answer = await http.get("/v1/models")

    assert ids(answer) == ["llama"]
    [line] = [r.getMessage() for r in caplog.records if "/v1/models" in r.getMessage()]
    assert a.url in line and "left out" in line


async def test_no_upstream_answering_is_a_503_json_error() -> None:
    """Every upstream failing its list (and one not even reachable): 503 with an
    OpenAI-style error and ``Retry-After``, never an empty list."""
    failing = Listing(status=502, body=b"{}")
    async with (
        upstreams(failing) as (a,),
        gateway_before([a.url, closed_upstream()]) as http,
    ):
        answer = await http.get("/v1/models")
        one = await http.get("/v1/models/llama")

    for response in (answer, one):
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "no_model_list"
        assert "retry-after" in response.headers


async def test_one_model_is_answered_from_the_union_or_not_found() -> None:
    """``GET /v1/models/{id}``: the entry of a listed model (ids may hold slashes), or a
    404 ``model_not_found``."""
    async with (
        upstreams(Listing("meta-llama/Llama-3-8B"), Listing("qwen")) as (a, b),
        gateway_before([a.url, b.url]) as http,
    ):
        found = await http.get("/v1/models/meta-llama/Llama-3-8B")
        other = await http.get("/v1/models/qwen")
        missing = await http.get("/v1/models/mistral")

    assert found.status_code == 200 and found.json()["id"] == "meta-llama/Llama-3-8B"
    assert other.status_code == 200 and other.json()["id"] == "qwen"
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert missing.json()["error"]["param"] == "model"  # as a completion naming it gets


async def test_listing_models_takes_no_seat_while_the_gateway_is_full() -> None:
    """With the only seat held and no queue, a completion is refused 503, and the model
    list is answered all the same: it never goes through admission."""
    upstream = Listing("llama")
    async with (
        upstreams(upstream) as (a,),
        served_before(
            [a.url], global_max_in_flight=1, max_queue=0, overflow_policy="drop-newest"
        ) as (http, app),
    ):
        holding = asyncio.ensure_future(http.get("/hold"))
        try:
            await eventually(lambda: app.gateway.snapshot().inflight == 1, "the seat held")
            refused = await http.post("/v1/completions", json={"prompt": "hi"})
            listed = await http.get("/v1/models")
            headed = await http.head("/v1/models")
        finally:
            upstream.release.set()
            assert (await within(holding, "the held request")).status_code == 200

    assert refused.status_code == 503, refused.text
    assert ids(listed) == ["llama"]
    # HEAD, as monitoring checks send it, is answered as GET is, without the body (it
    # was forwarded through admission: 503 here, and one upstream's length otherwise)
    assert headed.status_code == 200 and headed.content == b""
    assert headed.headers["content-length"] == listed.headers["content-length"]


async def test_other_methods_on_the_models_path_are_forwarded() -> None:
    """Only GET and HEAD are answered by the gateway; a POST goes through admission to an upstream
    (which answers it as it likes)."""
    upstream = Listing("llama")
    async with upstreams(upstream) as (a,), gateway_before([a.url]) as http:
        answer = await http.post("/v1/models", json={})
    assert answer.status_code == 200 and upstream.asked == 1


# -- the catalog on its own: when it fetches ---------------------------------------------------


async def test_the_catalog_fetches_once_for_concurrent_callers_and_keeps_the_list() -> None:
    """Concurrent callers share one fetch; a fresh list is answered without asking again."""
    upstream = Listing("llama")
    async with upstreams(upstream) as (a,):
        catalog = ModelCatalog([parse_upstream_entry(a.url)], healthy=lambda _: True, fresh_s=3600)
        try:
            answers = await asyncio.gather(*(catalog.models() for _ in range(10)))
            later = await catalog.models()
        finally:
            await catalog.aclose()

    assert upstream.asked == 1
    assert all(a is not None and [m["id"] for m in a] == ["llama"] for a in [*answers, later])


async def test_the_catalog_leaves_out_an_unhealthy_upstream_without_asking_it() -> None:
    """An upstream the health checks fail is neither asked nor listed; healthy again, it
    is listed again."""
    sick, well = Listing("ghost"), Listing("llama")
    healthy = {"sick": False}
    async with upstreams(sick, well) as (a, b):
        names = {a.url: "sick", b.url: "well"}
        catalog = ModelCatalog(
            [parse_upstream_entry(a.url), parse_upstream_entry(b.url)],
            healthy=lambda url: healthy.get(names[url], True),
            fresh_s=0,
            stale_s=0,
        )
        try:
            while_sick = await catalog.models()
            healthy["sick"] = True
            recovered = await catalog.models()
        finally:
            await catalog.aclose()

    assert while_sick is not None and [m["id"] for m in while_sick] == ["llama"]
    assert recovered is not None and [m["id"] for m in recovered] == ["ghost", "llama"]
    assert sick.asked == 1


async def test_a_stale_list_is_answered_while_a_fresh_one_is_fetched() -> None:
    """Past ``fresh_s`` the caller gets the list it had at once; the fetch in the
    background then drops an upstream that stopped listing."""
    flaky = Listing("ghost")
    async with upstreams(flaky, Listing("llama")) as (a, b):
        catalog = ModelCatalog(
            [parse_upstream_entry(a.url), parse_upstream_entry(b.url)],
            healthy=lambda _: True,
            fresh_s=0,
            stale_s=3600,
        )
        try:
            first = await catalog.models()
            flaky.status, flaky.body = 500, b"{}"
            second = await catalog.models()  # the old list, a fetch started

            async def dropped() -> bool:
                listed = await catalog.models()
                return listed is not None and [m["id"] for m in listed] == ["llama"]

            for _ in range(500):
                if await dropped():
                    break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("the failing upstream was never left out")
        finally:
            await catalog.aclose()

    assert first == second and first is not None
    assert [m["id"] for m in first] == ["ghost", "llama"]


async def test_a_catalog_of_configured_models_only_never_fetches() -> None:
    """Upstreams that all name their models need no HTTP at all."""
    catalog = ModelCatalog(
        [parse_upstream_entry(f"{closed_upstream()}=b|a")], healthy=lambda _: True
    )
    listed = await catalog.models()
    await catalog.aclose()
    assert listed is not None and [m["id"] for m in listed] == ["a", "b"]


async def test_a_catalog_with_nothing_to_answer_waits_for_the_next_fetch() -> None:
    """When no upstream gave a list last time, a caller waits for a fresh fetch rather
    than being told "nothing" from memory: an upstream that recovered is listed at once."""
    flaky = Listing("llama", status=500, body=b"{}")
    async with upstreams(flaky) as (a,):
        catalog = ModelCatalog(
            [parse_upstream_entry(a.url)], healthy=lambda _: True, fresh_s=0, stale_s=3600
        )
        try:
            failing = await catalog.models()
            flaky.status, flaky.body = 200, None
            recovered = await catalog.models()
        finally:
            await catalog.aclose()

    assert failing is None
    assert recovered is not None and [m["id"] for m in recovered] == ["llama"]
