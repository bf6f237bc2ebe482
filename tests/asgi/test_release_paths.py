"""Every way a request can end gives its seats back exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gateway import GatewayMiddleware, Settings, Ticket, hookimpl
from gateway.types import Receive, Scope, Send
from tests.asgi.conftest import Client, http_scope


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


def middleware(
    app: Callable[[Scope, Receive, Send], Awaitable[None]], **settings: object
) -> GatewayMiddleware:
    settings.setdefault("global_max_in_flight", 4)
    return GatewayMiddleware(app, Settings(**settings))  # type: ignore[arg-type]


def assert_released_once(gw: GatewayMiddleware, admitted: int) -> None:
    scheduler = gw.gateway.scheduler
    assert scheduler.admitted == admitted
    assert scheduler.released == admitted
    assert gw.gateway.snapshot().inflight == 0


def test_permit_released_when_the_response_ends() -> None:
    """A plain response frees its seat once it is sent."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await JSONResponse({"ok": True})(scope, receive, send)

    async def scenario() -> None:
        gw = middleware(app)
        client = Client()
        await gw(http_scope(), client.receive, client.send)
        assert client.status == 200
        assert_released_once(gw, 1)

    run(scenario)


def test_streamed_response_holds_its_seat_until_the_last_chunk() -> None:
    """Tokens still streaming keep the seat; it is freed after the last chunk."""
    seen_inflight: list[int] = []

    async def scenario() -> None:
        async def tokens():  # type: ignore[no-untyped-def]
            for i in range(3):
                seen_inflight.append(gw.gateway.snapshot().inflight)
                yield f"data: {i}\n\n"

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await StreamingResponse(tokens(), media_type="text/event-stream")(scope, receive, send)

        gw = middleware(app)
        client = Client()
        await gw(http_scope(), client.receive, client.send)
        assert client.text == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert seen_inflight == [1, 1, 1]
        assert_released_once(gw, 1)

    run(scenario)


class Observer:
    """A plugin that observes requests, which puts them on the observed path."""

    @hookimpl
    def obleth_request_finished(self, outcome: str) -> None:
        pass


@pytest.mark.parametrize("path", ["free seat", "observed", "waited"])
def test_the_seat_comes_back_at_the_last_byte_before_the_app_returns(path: str) -> None:
    """An app that goes on after its last byte (a proxy closing its upstream connection,
    background tasks) no longer holds the seat: the same client's next request, under a
    tenant cap of 1, is admitted while the first app is still running, and the seat is
    counted back once."""
    after_last_byte = asyncio.Event()
    finish = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})
        if scope["path"] == "/first":
            after_last_byte.set()
            await finish.wait()

    async def scenario() -> None:
        plugins = [Observer()] if path == "observed" else []
        gw = GatewayMiddleware(
            app,
            Settings(global_max_in_flight=1, tenant_max_in_flight={"*": 1}),
            plugins=plugins,
        )
        first = Client()
        if path == "waited":
            await gw.gateway.start()
            holder = await gw.gateway.scheduler.acquire(Ticket("other"))
        running = asyncio.create_task(gw(http_scope("/first"), first.receive, first.send))
        if path == "waited":
            await asyncio.sleep(0)
            assert gw.gateway.snapshot().queued == 1
            holder.release()
        await asyncio.wait_for(after_last_byte.wait(), 2)
        second = Client()
        await asyncio.wait_for(gw(http_scope("/second"), second.receive, second.send), 2)
        finish.set()
        await running
        assert (first.status, second.status) == (200, 200)
        assert_released_once(gw, 3 if path == "waited" else 2)

    run(scenario)


def test_permit_released_when_the_app_raises() -> None:
    """An app exception propagates to the server, and the seat still comes back."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("model crashed")

    async def scenario() -> None:
        gw = middleware(app)
        client = Client()
        with pytest.raises(RuntimeError, match="model crashed"):
            await gw(http_scope(), client.receive, client.send)
        assert_released_once(gw, 1)

    run(scenario)


def test_permit_released_when_client_disconnects_mid_stream() -> None:
    """A client leaving mid-stream ends the response and frees the seat once."""
    finished: list[str] = []

    async def scenario() -> None:
        client = Client()

        async def tokens():  # type: ignore[no-untyped-def]
            try:
                for i in range(1000):
                    if i == 2:
                        client.gone.set()
                    yield f"data: {i}\n\n"
                    await asyncio.sleep(0.001)
            finally:
                finished.append("generator closed")

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await StreamingResponse(tokens(), media_type="text/event-stream")(scope, receive, send)

        gw = middleware(app)
        await gw(http_scope(), client.receive, client.send)
        assert finished == ["generator closed"]
        assert_released_once(gw, 1)

    run(scenario)


def test_permit_released_when_the_request_task_is_cancelled() -> None:
    """A server cancelling the request task mid-response frees the seat once."""

    async def scenario() -> None:
        entered = asyncio.Event()

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            entered.set()
            await asyncio.sleep(3600)

        gw = middleware(app)
        client = Client()
        task = asyncio.create_task(gw(http_scope(), client.receive, client.send))
        await entered.wait()
        assert gw.gateway.snapshot().inflight == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert_released_once(gw, 1)

    run(scenario)


@pytest.mark.parametrize(
    ("body", "max_body"),
    [(b"", 8 * 1024 * 1024), (b"x" * 5000, 1000)],
    ids=["no-body", "body-received-whole-past-the-bound"],
)
def test_client_that_leaves_while_queued_takes_no_seat(body: bytes, max_body: int) -> None:
    """A queued request whose client disconnects is dropped without running the app; a
    body received whole is watched past it, however large."""
    calls: list[str] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            calls.append(scope["path"])
            await release.wait()
            await JSONResponse({})(scope, receive, send)

        gw = middleware(app, global_max_in_flight=1, max_body_bytes=max_body)
        first, second = Client(), Client(body=body)
        running = asyncio.create_task(gw(http_scope("/a"), first.receive, first.send))
        scope = http_scope("/b", headers={"content-type": "application/octet-stream"})
        waiting = asyncio.create_task(gw(scope, second.receive, second.send))
        await asyncio.sleep(0.01)
        assert gw.gateway.snapshot().queued == 1
        second.gone.set()
        await asyncio.wait_for(waiting, 1)
        assert second.sent == [] and gw.gateway.snapshot().queued == 0
        release.set()
        await running
        assert calls == ["/a"]
        assert_released_once(gw, 1)

    run(scenario)


def test_observers_see_each_request_admitted_and_finished_once() -> None:
    """Plugins observing requests get one admitted and one finished call per request."""
    from gateway import hookimpl

    events: list[tuple[str, str]] = []

    class Recorder:
        @hookimpl
        def obleth_request_admitted(self, request, wait_s):  # type: ignore[no-untyped-def]
            events.append(("admitted", request.tenant))

        @hookimpl
        def obleth_request_finished(self, request, duration_s, outcome):  # type: ignore[no-untyped-def]
            events.append((outcome, request.tenant))

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/boom":
            raise RuntimeError("boom")
        await JSONResponse({})(scope, receive, send)

    async def scenario() -> None:
        gw = GatewayMiddleware(app, Settings(), plugins=[Recorder()])
        client = Client()
        await gw(http_scope("/ok"), client.receive, client.send)
        with pytest.raises(RuntimeError):
            await gw(http_scope("/boom"), Client().receive, Client().send)
        assert events == [
            ("admitted", "anonymous"),
            ("completed", "anonymous"),
            ("admitted", "anonymous"),
            ("error", "anonymous"),
        ]

    run(scenario)


def test_starlette_app_with_middleware_releases_under_concurrency() -> None:
    """Many concurrent requests through a Starlette app: in-flight never passes the limit."""
    peak = {"now": 0, "max": 0}

    async def endpoint(request: Request) -> JSONResponse:
        peak["now"] += 1
        peak["max"] = max(peak["max"], peak["now"])
        await asyncio.sleep(0.002)
        peak["now"] -= 1
        return JSONResponse({"tenant": request.scope["state"]["obleth"]["tenant"]})

    async def scenario() -> None:
        app = Starlette(routes=[Route("/v1/completions", endpoint, methods=["POST"])])
        gw = middleware(app, global_max_in_flight=3, tenant_header="x-tenant")
        clients = [Client() for _ in range(60)]
        await asyncio.gather(
            *(
                gw(http_scope(headers={"x-tenant": f"t{i % 3}"}), c.receive, c.send)
                for i, c in enumerate(clients)
            )
        )
        assert {c.status for c in clients} == {200}
        assert peak["max"] == 3
        assert_released_once(gw, 60)

    run(scenario)
