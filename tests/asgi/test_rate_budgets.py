"""``tenant_rpm`` and ``tenant_tpm`` through the middleware, in one process: a tenant over
a budget gets 429 with the wait in ``Retry-After`` and a JSON error naming the budget; the
token estimate comes from the body; a request the gate then refuses gives its reservation
back; other tenants are not touched."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway import GatewayMiddleware, Settings
from gateway.asgi.plan import FlightPlan
from gateway.complaints import Complaints
from gateway.loopback import serve_in_task
from gateway.rates.budgets import NOTHING
from tests.backends.redis_pods import eventually


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


async def completion(request: Request) -> JSONResponse:
    await request.body()
    if request.headers.get("x-hold"):
        request.app.state.entered.set()
        await request.app.state.hold.wait()
    return JSONResponse({"ok": True})


def app() -> Starlette:
    made = Starlette(routes=[Route("/v1/completions", completion, methods=["POST"])])
    made.state.hold = asyncio.Event()
    made.state.entered = asyncio.Event()
    return made


def post(http: httpx.AsyncClient, url: str, tenant: str, **body: Any) -> Awaitable[httpx.Response]:
    return http.post(
        f"{url}/v1/completions", headers={"x-tenant": tenant}, content=json.dumps(body)
    )


def test_a_tenant_over_its_requests_per_minute_gets_429_with_the_wait() -> None:
    async def scenario() -> None:
        settings = Settings(tenant_header="x-tenant", tenant_rpm={"free": 3, "*": 100})
        gw = GatewayMiddleware(app(), settings)
        async with serve_in_task(gw) as server, httpx.AsyncClient(trust_env=False) as http:
            answers = [await post(http, server.url, "free", prompt="hi") for _ in range(4)]
            others = [await post(http, server.url, "gold", prompt="hi") for _ in range(4)]
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
        assert [a.status_code for a in others] == [200] * 4
        refused = answers[-1]
        # one request comes back every 20 s: the wait is about that, in whole seconds
        assert 19 <= int(refused.headers["retry-after"]) <= 20
        error = refused.json()["error"]
        assert error["code"] == "requests_per_minute"
        assert "3 requests per minute" in error["message"] and "tenant_rpm" in error["message"]
        totals = gw.gateway.tallies.totals()
        assert totals[("free", "standard", "rejected", "requests_per_minute")] == 1

    run(scenario)


def test_tokens_are_reserved_from_the_body_s_estimate() -> None:
    async def scenario() -> None:
        settings = Settings(tenant_header="x-tenant", tenant_tpm=1000)
        gw = GatewayMiddleware(app(), settings)
        async with serve_in_task(gw) as server, httpx.AsyncClient(trust_env=False) as http:
            # 400 bytes of prompt (100 tokens) + 300 generated: 400 each
            small = [
                await post(http, server.url, "a", prompt="x" * 400, max_tokens=300)
                for _ in range(3)
            ]
            # a request bigger than the whole minute is told so, not to wait
            huge = await post(http, server.url, "b", prompt="", max_tokens=5000)
            # without max_tokens, default_max_tokens (256) is what it may generate
            unstated = [await post(http, server.url, "c", prompt="") for _ in range(4)]
        assert [a.status_code for a in small] == [200, 200, 429]
        assert small[2].json()["error"]["code"] == "tokens_per_minute"
        assert huge.status_code == 429
        assert "estimated at 5000 tokens" in huge.json()["error"]["message"]
        assert [a.status_code for a in unstated] == [200, 200, 200, 429]

    run(scenario)


def test_a_request_the_gate_refuses_gives_its_reservation_back() -> None:
    """Under ``reject`` with the only seat taken, a request is refused 503: it never ran,
    so it must not cost its tenant a request of its minute."""

    async def scenario() -> None:
        settings = Settings(
            tenant_header="x-tenant",
            tenant_rpm=2,
            global_max_in_flight=1,
            overflow_policy="reject",
        )
        made = app()
        gw = GatewayMiddleware(made, settings)
        async with serve_in_task(gw) as server, httpx.AsyncClient(trust_env=False) as http:
            held = asyncio.create_task(
                http.post(f"{server.url}/v1/completions", headers={"x-tenant": "a", "x-hold": "1"})
            )
            await asyncio.wait_for(made.state.entered.wait(), 5)
            refused = [await post(http, server.url, "a") for _ in range(3)]
            made.state.hold.set()
            assert (await held).status_code == 200
            after = [await post(http, server.url, "a") for _ in range(2)]
        assert [a.status_code for a in refused] == [503] * 3
        assert [a.json()["error"]["code"] for a in refused] == ["over_capacity"] * 3
        # the held request took one of the two; the refused ones took none
        assert [a.status_code for a in after] == [200, 429]

    run(scenario)


def test_without_budgets_no_body_is_read_for_them() -> None:
    """Budgets cost nothing when none is set: the request path reserves nothing and the
    body streams to the app (no router, no classifier that reads bodies)."""
    gw = GatewayMiddleware(app(), Settings())
    assert gw.gateway.rates is None
    assert gw._plan is not None and not gw._plan.reads_body
    rpm_only = GatewayMiddleware(app(), Settings(tenant_rpm=5))
    assert rpm_only._plan is not None and not rpm_only._plan.reads_body


def test_a_token_budget_holds_requests_by_their_estimate_and_status_shows_it() -> None:
    """``global_max_tokens_in_flight``: two requests of 600 tokens do not run together
    under a budget of 1000; a small one waits behind the second (no barging)."""

    async def scenario() -> None:
        settings = Settings(tenant_header="x-tenant", global_max_tokens_in_flight=1000)
        made = app()
        gw = GatewayMiddleware(made, settings)
        async with serve_in_task(gw) as server, httpx.AsyncClient(trust_env=False) as http:
            body = json.dumps({"prompt": "x" * 400, "max_tokens": 500})  # 100 + 500
            first = asyncio.create_task(
                http.post(
                    f"{server.url}/v1/completions",
                    headers={"x-tenant": "a", "x-hold": "1"},
                    content=body,
                )
            )
            await asyncio.wait_for(made.state.entered.wait(), 5)
            second = asyncio.create_task(
                post(http, server.url, "b", prompt="x" * 400, max_tokens=500)
            )
            assert await eventually(lambda: _queued(gw), 5)
            snapshot = gw.gateway.snapshot()
            assert (snapshot.inflight, snapshot.tokens_inflight) == (1, 600)
            assert not second.done()
            made.state.hold.set()
            assert [(await t).status_code for t in (first, second)] == [200, 200]
            assert gw.gateway.snapshot().tokens_inflight == 0

    run(scenario)


async def _queued(gw: GatewayMiddleware) -> bool:
    return gw.gateway.snapshot().queued >= 1


def test_bodies_the_gateway_would_not_read_as_json_are_priced_too() -> None:
    """A server that parses any body as JSON (vLLM without a Content-Type) must not get
    what the budget would refuse for free: a chunked body without a Content-Type is read
    and estimated; one declared larger than ``max_body_bytes`` is priced by its length
    (and still reaches the app: no 413 for a budget alone)."""

    async def scenario() -> None:
        settings = Settings(
            tenant_header="x-tenant", tenant_tpm={"a": 1000, "b": 4000}, max_body_bytes=10_000
        )
        gw = GatewayMiddleware(app(), settings)
        body = json.dumps({"prompt": "", "max_tokens": 600}).encode()

        async def chunked() -> AsyncIterator[bytes]:
            yield body

        async with serve_in_task(gw) as server, httpx.AsyncClient(trust_env=False) as http:
            url = f"{server.url}/v1/completions"
            untyped = [
                await http.post(url, headers={"x-tenant": "a"}, content=chunked()) for _ in range(2)
            ]
            large = json.dumps({"prompt": "x" * 12_000, "max_tokens": 1}).encode()
            big = [
                await http.post(
                    url,
                    headers={"x-tenant": "b", "content-type": "application/json"},
                    content=large,
                )
                for _ in range(2)
            ]
        assert [a.status_code for a in untyped] == [200, 429]
        assert untyped[1].json()["error"]["code"] == "tokens_per_minute"
        # 12 000 bytes: over 3 000 tokens each, read by the app, not refused 413
        assert [a.status_code for a in big] == [200, 429]
        assert big[1].json()["error"]["code"] == "tokens_per_minute"

    run(scenario)


async def reporting(request: Request) -> Response:
    """Answers as vLLM does: the usage in a JSON body, or in a stream's last event when
    the client asked for it; ``x-usage`` says how many tokens to report (none: no usage)."""
    body = json.loads(await request.body())
    used = request.headers.get("x-usage")
    usage = None if used is None else {"total_tokens": int(used)}
    if not body.get("stream"):
        return JSONResponse({"choices": [{"text": "hi"}], **({"usage": usage} if usage else {})})

    async def events() -> AsyncIterator[bytes]:
        for text in ("a", "b"):
            yield b"data: " + json.dumps({"choices": [{"text": text}], "usage": None}).encode()
            yield b"\n\n"
        if usage and body.get("stream_options", {}).get("include_usage"):
            yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.mark.parametrize(
    ("extra", "reported", "second"),
    [
        ({}, "10", 200),  # JSON with usage: 600 estimated, 10 charged
        ({"stream": True, "stream_options": {"include_usage": True}}, "10", 200),
        ({"stream": True}, "10", 429),  # a stream that did not ask reports nothing
        ({}, None, 429),  # no usage: the estimate stays
    ],
)
def test_a_served_request_is_charged_the_tokens_its_response_reports(
    extra: dict[str, Any], reported: str | None, second: int
) -> None:
    """Estimated at 600 tokens of a 1 000 budget (100 of prompt, max_tokens 500), a
    request that used 10 leaves room for another; without a usage to read, it does not."""

    async def scenario() -> None:
        settings = Settings(tenant_header="x-tenant", tenant_tpm=1000)
        served = Starlette(routes=[Route("/v1/completions", reporting, methods=["POST"])])
        headers = {"x-tenant": "a", **({"x-usage": reported} if reported else {})}
        body = {"prompt": "x" * 400, "max_tokens": 500, **extra}
        async with (
            serve_in_task(GatewayMiddleware(served, settings)) as server,
            httpx.AsyncClient(trust_env=False) as http,
        ):
            url = f"{server.url}/v1/completions"
            answers = [await http.post(url, headers=headers, json=body) for _ in range(2)]
        assert [a.status_code for a in answers] == [200, second]
        if extra.get("stream"):
            assert answers[0].text.endswith("data: [DONE]\n\n")  # passed on unchanged

    run(scenario)


def test_only_tenants_with_a_token_budget_have_their_responses_read() -> None:
    """Reading a response for its usage costs a parse: a tenant with no budget, or with
    requests per minute only, is spared it (and one with no budget reserves nothing)."""

    async def scenario() -> None:
        settings = Settings(tenant_rpm={"free": 10}, tenant_tpm={"paid": 1000})
        gw = GatewayMiddleware(app(), settings)
        plan = FlightPlan(gw.app, gw.gateway, Complaints())
        rates = gw.gateway.rates
        assert rates is not None
        reserved = {t: await rates.reserve(t, 10) for t in ("paid", "free", "nobody")}
        assert reserved["nobody"] is NOTHING
        assert [plan.settles_usage(t, r) for t, r in reserved.items()] == [True, False, False]
        assert not FlightPlan(gw.app, GatewayMiddleware(app()).gateway, Complaints()).meters_usage

    run(scenario)
