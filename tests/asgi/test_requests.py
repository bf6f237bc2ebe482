"""What the middleware promises each request: classification, body replay, JSON answers."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

from gateway import Classification, GatewayMiddleware, Settings, Ticket, hookimpl
from gateway.asgi.body import WATCH_BYTES
from gateway.builtin.classifier import tenant_of_key
from gateway.loopback import serve_in_task
from gateway.types import ASGIApp, Message, Receive, Scope, Send
from tests.asgi.conftest import Client, http_scope
from tests.proxy.rawhttp import host_port, request_head


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


class Echo:
    """An app that records what it received and answers with it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.states: list[dict[str, Any]] = []
        self.hold = asyncio.Event()
        self.hold.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        self.states.append(dict(scope.get("state", {}).get("obleth", {})))
        await self.hold.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


def json_headers(**extra: str) -> dict[str, str]:
    return {"content-type": "application/json", **extra}


class ModelClassifier:
    """A plugin that reads the body: the tenant is the requested model."""

    def __init__(self) -> None:
        self.bodies: list[bytes | None] = []

    @hookimpl
    def obleth_classify_request(self, body: bytes | None) -> Classification | None:
        self.bodies.append(body)
        if not body:
            return None
        return Classification(tenant=json.loads(body)["model"])


def test_json_body_reaches_the_app_byte_for_byte() -> None:
    """The body read for classification is replayed unchanged, however it was chunked."""
    body = json.dumps({"model": "m", "prompt": "x" * 5000}).encode()

    async def scenario() -> None:
        app = Echo()
        classifier = ModelClassifier()
        gw = GatewayMiddleware(app, Settings(), plugins=[classifier])
        client = Client(body=body, chunks=7)
        await gw(http_scope(headers=json_headers()), client.receive, client.send)
        assert classifier.bodies == [body]
        assert app.bodies == [body] and client.text == body
        assert app.states[0]["tenant"] == "m"

    run(scenario)


def test_a_json_content_type_is_recognised_in_any_case() -> None:
    """``Application/JSON; charset=UTF-8`` is JSON: the body reaches the classifier."""
    body = json.dumps({"model": "m"}).encode()

    async def scenario() -> None:
        classifier = ModelClassifier()
        gw = GatewayMiddleware(Echo(), Settings(), plugins=[classifier])
        client = Client(body=body)
        headers = {"content-type": "Application/JSON; charset=UTF-8"}
        await gw(http_scope(headers=headers), client.receive, client.send)
        assert classifier.bodies == [body] and client.status == 200

    run(scenario)


@pytest.mark.parametrize(
    ("headers", "limit", "read"),
    [
        # requests.post(url, data=json.dumps(...)) sends no Content-Type
        ({"content-length": "14"}, 14, True),
        # over max_body_bytes, or of a length not told: maybe a file posted raw
        ({"content-length": "14"}, 13, False),
        ({}, 14, False),
        ({"content-type": "application/vnd.api+json"}, 14, True),
        ({"content-type": "application/jsonl"}, 14, False),
        ({"content-type": "text/plain"}, 14, False),
        ({"content-type": "application/x-www-form-urlencoded"}, 14, False),
    ],
)
def test_a_body_is_read_as_json_when_an_openai_style_server_would_parse_it_so(
    headers: dict[str, str], limit: int, read: bool
) -> None:
    """FastAPI (so vLLM) parses a body with no ``Content-Type``, or an ``+json`` one, as
    JSON: such a request works sent to vLLM directly, and through the gateway it used to
    be routed blind (no model, no prefix), to an upstream that may not serve its model.
    Without a ``Content-Type`` only a body whose length is declared within
    ``max_body_bytes`` is read: another may be a file posted raw, and streams."""
    body = json.dumps({"model": "m"}).encode()
    assert len(body) == 14

    async def scenario() -> None:
        classifier = ModelClassifier()
        gw = GatewayMiddleware(Echo(), Settings(max_body_bytes=limit), plugins=[classifier])
        client = Client(body=body)
        await gw(http_scope(headers=headers), client.receive, client.send)
        assert client.status == 200 and client.text == body
        assert classifier.bodies == [body if read else None]

    run(scenario)


def test_a_scope_whose_state_is_none_still_gets_its_record_and_gives_the_seat_back() -> None:
    """A server may pass ``state: None``; the record is stored in a new dict, on the path
    that takes a free seat as on the others."""

    async def scenario() -> None:
        app = Echo()
        gw = GatewayMiddleware(app, Settings(global_max_in_flight=1))
        for _ in range(3):
            client = Client()
            scope = {**http_scope(), "state": None}
            await gw(scope, client.receive, client.send)
            assert client.status == 200
        assert [state["tenant"] for state in app.states] == ["anonymous"] * 3
        scheduler = gw.gateway.scheduler
        assert (scheduler.admitted, scheduler.released) == (3, 3)

    run(scenario)


def test_body_is_not_read_when_no_classifier_asks_for_it() -> None:
    """With the built-in classifier alone the body streams to the app, never buffered."""
    body = json.dumps({"prompt": "y" * 1000}).encode()

    async def scenario() -> None:
        app = Echo()
        gw = GatewayMiddleware(app, Settings(max_body_bytes=10))
        client = Client(body=body, chunks=5)
        await gw(http_scope(headers=json_headers()), client.receive, client.send)
        assert client.status == 200 and app.bodies == [body]

    run(scenario)


def test_non_json_body_streams_to_the_app_unread() -> None:
    """Uploads that are not JSON are not buffered by the gateway, and still arrive whole."""
    body = b"\x00binary" * 1000

    async def scenario() -> None:
        app = Echo()
        gw = GatewayMiddleware(app, Settings(max_body_bytes=100))
        client = Client(body=body, chunks=3)
        scope = http_scope(headers={"content-type": "application/octet-stream"})
        await gw(scope, client.receive, client.send)
        assert app.bodies == [body]

    run(scenario)


def test_a_waiting_upload_is_left_on_the_connection_past_the_watch_budget() -> None:
    """While a large upload waits for a seat, the gateway takes no more than
    ``WATCH_BYTES`` of it off the connection (holding every waiter's body would cost
    ``max_queue`` times ``max_body_bytes``); once admitted, the app reads it whole."""
    body = bytes(range(256)) * 4096  # 1 MiB, in 64 chunks of 16 KiB

    async def scenario() -> None:
        app = Echo()
        gw = GatewayMiddleware(app, Settings(global_max_in_flight=1))
        await gw.gateway.start()
        holder = await gw.gateway.scheduler.acquire(Ticket("other"))
        client = Client(body=body, chunks=64)
        scope = http_scope(headers={"content-type": "application/octet-stream"})
        request = asyncio.create_task(gw(scope, client.receive, client.send))
        await asyncio.sleep(0.05)
        assert gw.gateway.snapshot().queued == 1
        taken = 64 - len(client._pending)
        assert 1 <= taken * 16 * 1024 <= WATCH_BYTES + 16 * 1024
        holder.release()
        await asyncio.wait_for(request, 2)
        assert app.bodies == [body] and client.status == 200

    run(scenario)


async def _read_until(reader: asyncio.StreamReader, marker: bytes) -> bytes:
    """What the server sends until ``marker`` has arrived (or 5 s have passed)."""
    seen = b""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            while marker not in seen:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                seen += chunk
    return seen


def test_a_client_expecting_100_continue_is_not_asked_for_its_body_while_it_waits() -> None:
    """``Expect: 100-continue`` lets a client hold its body back until the server will
    take it: a request that waits is not asked for it (a 503 comes without a
    ``100 Continue`` first), and one admitted is, and runs with its body."""
    head = (
        b"POST /v1/upload HTTP/1.1\r\nhost: t\r\ncontent-type: application/octet-stream\r\n"
        b"expect: 100-continue\r\ncontent-length: 5\r\n\r\n"
    )

    async def scenario() -> None:
        app = Echo()
        gw = GatewayMiddleware(app, Settings(global_max_in_flight=1, queue_timeout_s=0.3))
        await gw.gateway.start()
        async with serve_in_task(gw, lifespan="off") as server:
            holder = await gw.gateway.scheduler.acquire(Ticket("other"))
            reader, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(head)
            refused = await _read_until(reader, b"queue_timeout")
            writer.close()
            holder.release()
            reader, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(head)
            asked = await _read_until(reader, b"100 Continue\r\n\r\n")
            writer.write(b"hello")
            served = await _read_until(reader, b"hello")
            writer.close()
        await gw.gateway.stop()
        assert b"100 Continue" not in refused and b" 503 " in refused.split(b"\r\n")[0]
        assert asked.startswith(b"HTTP/1.1 100 Continue")
        assert served.startswith(b"HTTP/1.1 200") and app.bodies == [b"hello"]

    run(scenario)


def test_observers_hear_a_streamed_response_read_to_its_end_completed() -> None:
    """On a real server, a streaming response listens for the client going away and is
    told so once the response is complete: that does not make a finished request
    ``cancelled``; a client that leaves mid-stream does."""
    outcomes: list[str] = []
    gone = asyncio.Event()

    class Outcomes:
        @hookimpl
        def obleth_request_finished(self, outcome: str) -> None:
            outcomes.append(outcome)
            if len(outcomes) == 2:
                gone.set()

    async def tokens(count: int) -> AsyncIterator[bytes]:
        for i in range(count):
            await asyncio.sleep(0.01)
            yield f"data: {i}\n\n".encode()

    async def stream(request: Request) -> StreamingResponse:
        count = int(request.query_params["n"])
        return StreamingResponse(tokens(count), media_type="text/event-stream")

    async def scenario() -> None:
        app = Starlette(routes=[Route("/v1/stream", stream)])
        gw = GatewayMiddleware(app, Settings(), plugins=[Outcomes()])
        async with serve_in_task(gw) as server, httpx.AsyncClient(trust_env=False) as http:
            whole = await http.get(f"{server.url}/v1/stream?n=5")
            assert whole.text.count("data:") == 5
            async with http.stream("GET", f"{server.url}/v1/stream?n=1000") as partial:
                async for _ in partial.aiter_bytes():
                    break  # the client leaves after the first chunk
            await asyncio.wait_for(gone.wait(), 5)
        assert outcomes == ["completed", "cancelled"]

    run(scenario)


def test_a_response_the_app_begins_and_never_finishes_is_an_error() -> None:
    """An app that returns after its response began but before its last chunk (a proxy
    whose upstream died mid-stream) leaves the server to close the connection: the
    client's response is cut short, so the request counts ``error``, not ``completed``;
    its seat is given back all the same."""
    outcomes: list[str] = []

    class Outcomes:
        @hookimpl
        def obleth_request_finished(self, outcome: str) -> None:
            outcomes.append(outcome)

    async def abandoning(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 0\n\n", "more_body": True})

    async def scenario() -> None:
        gw = GatewayMiddleware(abandoning, Settings(), plugins=[Outcomes()])
        async with serve_in_task(gw) as server, httpx.AsyncClient(trust_env=False) as http:
            with pytest.raises(httpx.RemoteProtocolError):
                await http.get(f"{server.url}/v1/stream")
            assert gw.gateway.snapshot().inflight == 0
        assert outcomes == ["error"]

    run(scenario)


def test_an_app_that_answers_nothing_to_a_client_still_there_is_an_error() -> None:
    """An app that returns without a response while the client waits (the server then
    answers 500 itself) failed the request: a watched request (a JSON body the gateway
    read) counts ``error``, not ``completed``, and its seat comes back."""

    async def silent(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await receive()

    async def scenario() -> None:
        gw = GatewayMiddleware(silent, Settings(), plugins=[ModelClassifier()])
        async with serve_in_task(gw) as server, httpx.AsyncClient(trust_env=False) as http:
            answer = await http.post(f"{server.url}/v1/completions", json={"model": "m"})
        assert answer.status_code == 500
        assert gw.gateway.snapshot().inflight == 0
        outcomes = {outcome for (_, _, outcome, _) in gw.gateway.tallies.totals()}
        assert outcomes == {"error"}

    run(scenario)


def test_a_client_leaving_a_stream_unwatched_is_counted_cancelled() -> None:
    """Without a plugin that observes requests, nor a body the gateway read, the flight
    does not watch ``receive()``: a streaming response stopped by the client leaving is
    counted ``cancelled`` all the same, not ``error``."""

    async def tokens() -> AsyncIterator[bytes]:
        for i in range(1000):
            await asyncio.sleep(0.01)
            yield f"data: {i}\n\n".encode()

    async def stream(request: Request) -> StreamingResponse:
        return StreamingResponse(tokens(), media_type="text/event-stream")

    async def scenario() -> None:
        gw = GatewayMiddleware(Starlette(routes=[Route("/v1/stream", stream)]), Settings())
        async with serve_in_task(gw) as server, httpx.AsyncClient(trust_env=False) as http:
            async with http.stream("GET", f"{server.url}/v1/stream") as partial:
                async for _ in partial.aiter_bytes():
                    break  # the client leaves after the first chunk
            for _ in range(500):  # the server notices, the stream stops: bounded wait
                if gw.gateway.snapshot().inflight == 0:
                    break
                await asyncio.sleep(0.01)
        outcomes = {outcome for (_, _, outcome, _) in gw.gateway.tallies.totals()}
        assert outcomes == {"cancelled"}

    run(scenario)


class Finished:
    """An observer plugin: with it, the gateway watches ``receive()`` of every request."""

    def __init__(self) -> None:
        self.outcomes: list[str] = []

    @hookimpl
    def obleth_request_finished(self, outcome: str) -> None:
        self.outcomes.append(outcome)


@pytest.mark.parametrize("watched", [False, True], ids=["unwatched", "watched"])
def test_an_app_that_raises_because_its_client_left_counts_cancelled(watched: bool) -> None:
    """A client announces 20 000 bytes of upload, sends 200 and hangs up; the app, reading
    the body with Starlette, raises ``ClientDisconnect``. The client stopped the request,
    not the app: it counts ``cancelled`` (an error would page someone for clients that
    leave), and its seat comes back."""

    async def upload(request: Request) -> PlainTextResponse:
        return PlainTextResponse(str(len(await request.body())))

    async def scenario() -> None:
        app = Starlette(routes=[Route("/v1/upload", upload, methods=["POST"])])
        plugins = [Finished()] if watched else []
        gw = GatewayMiddleware(app, Settings(), plugins=plugins)
        async with serve_in_task(gw) as server:
            _, writer = await asyncio.open_connection(*host_port(server.url))
            headers = (("content-type", "application/octet-stream"), ("content-length", "20000"))
            writer.write(request_head("/v1/upload", *headers, method="POST") + b"y" * 200)
            await writer.drain()
            for _ in range(500):  # the app reads the first 200 bytes: bounded wait
                if gw.gateway.scheduler.admitted == 1:
                    break
                await asyncio.sleep(0.01)
            writer.close()
            await writer.wait_closed()
            for _ in range(500):  # the server tells the app, which raises: bounded wait
                if gw.gateway.tallies.totals():
                    break
                await asyncio.sleep(0.01)
            assert gw.gateway.snapshot().inflight == 0
        outcomes = {outcome for (_, _, outcome, _) in gw.gateway.tallies.totals()}
        assert outcomes == {"cancelled"}
        if watched:
            assert plugins[0].outcomes == ["cancelled"]

    run(scenario)


def test_an_app_that_raises_after_its_whole_response_counts_error_not_cancelled() -> None:
    """Once the response is whole, the server answers ``receive()`` with a disconnect
    though no client left; an app (a task of its own after the response) that then fails
    failed: ``error``, not ``cancelled``, with the flight watching ``receive()``."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})
        await receive()  # the server's disconnect, after the last chunk
        raise RuntimeError("the app's own failure after its response")

    async def scenario() -> None:
        finished = Finished()
        gw = GatewayMiddleware(app, Settings(), plugins=[finished])
        async with serve_in_task(gw) as server, httpx.AsyncClient(trust_env=False) as http:
            answer = await http.get(f"{server.url}/v1/x")
            for _ in range(500):  # the app raises after the answer: bounded wait
                if finished.outcomes:
                    break
                await asyncio.sleep(0.01)
        assert answer.text == "done"
        assert finished.outcomes == ["error"]

    run(scenario)


def test_json_body_over_the_bound_gets_413_with_a_json_error() -> None:
    """A JSON body larger than max_body_bytes is refused before admission, with a reason."""

    async def scenario() -> None:
        app = Echo()
        gw = GatewayMiddleware(app, Settings(max_body_bytes=100), plugins=[ModelClassifier()])
        client = Client(body=b'{"model": "m", "prompt": "' + b"x" * 500 + b'"}', chunks=4)
        await gw(http_scope(headers=json_headers()), client.receive, client.send)
        assert client.status == 413
        assert "max_body_bytes" in client.json()["error"]["message"]
        assert app.bodies == [] and gw.gateway.scheduler.admitted == 0

    run(scenario)


def test_tenant_comes_from_the_configured_header() -> None:
    """With tenant_header set, its value is the tenant the app sees."""

    async def scenario() -> None:
        app = Echo()
        gw = GatewayMiddleware(app, Settings(tenant_header="x-tenant"))
        client = Client()
        await gw(http_scope(headers={"x-tenant": "gold"}), client.receive, client.send)
        assert app.states[0]["tenant"] == "gold"

    run(scenario)


def test_api_keys_become_hashed_tenants_and_are_never_kept() -> None:
    """Without a tenant header the tenant is a hash of the bearer key, never the key."""
    key = "sk-live-very-secret-0001"

    async def scenario() -> None:
        app = Echo()
        gw = GatewayMiddleware(app, Settings())
        client = Client()
        await gw(
            http_scope(headers={"authorization": f"Bearer {key}"}), client.receive, client.send
        )
        tenant = app.states[0]["tenant"]
        assert tenant == tenant_of_key(key) and key not in tenant
        assert key not in repr(gw.gateway.snapshot())
        other = Client()
        await gw(http_scope(headers={"x-api-key": key}), other.receive, other.send)
        assert app.states[1]["tenant"] == tenant

    run(scenario)


def test_priority_header_is_ignored_unless_trusted() -> None:
    """A client cannot claim critical unless the settings trust the priority header."""

    async def scenario() -> None:
        app = Echo()
        plain = GatewayMiddleware(app, Settings())
        trusting = GatewayMiddleware(app, Settings(trust_priority_header=True))
        for gw in (plain, trusting):
            client = Client()
            await gw(http_scope(headers={"x-priority": "critical"}), client.receive, client.send)
        assert [s["priority"] for s in app.states] == ["standard", "critical"]

    run(scenario)


def test_unknown_priority_gets_400_naming_the_header() -> None:
    """A trusted priority header with a bad value is a 400 with a JSON error."""

    async def scenario() -> None:
        gw = GatewayMiddleware(Echo(), Settings(trust_priority_header=True))
        client = Client()
        await gw(http_scope(headers={"x-priority": "urgent"}), client.receive, client.send)
        assert client.status == 400
        error = client.json()["error"]
        assert error["param"] == "x-priority" and "critical" in error["message"]

    run(scenario)


def test_a_tenant_name_over_256_characters_gets_400_naming_the_header() -> None:
    """A tenant's name becomes a metrics label and a queue key: a client may not make one
    of 65 000 characters. 256 are taken."""

    async def scenario() -> None:
        app = Echo()
        gw = GatewayMiddleware(app, Settings(tenant_header="x-tenant"))
        longest, over = "é" * 256, "t" * 257  # characters, not bytes: é is two in UTF-8
        answers = []
        for name in (longest, over):
            client = Client()
            await gw(http_scope(headers={"x-tenant": name}), client.receive, client.send)
            answers.append(client)
        assert [c.status for c in answers] == [200, 400]
        error = answers[1].json()["error"]
        assert error["param"] == "x-tenant" and "at most 256" in error["message"]
        assert [s["tenant"] for s in app.states] == [longest]

    run(scenario)


@pytest.mark.parametrize(
    ("settings", "headers", "status", "reason"),
    [
        ({"max_queue": 0, "overflow_policy": "drop-newest"}, {}, 503, "queue_full"),
        ({"overflow_policy": "reject"}, {}, 503, "over_capacity"),
        ({"trust_priority_header": True}, {"x-priority": "background"}, 503, "no_wait"),
        ({"tenant_max_in_flight": 1}, {}, 429, "tenant_limit"),
        ({"queue_timeout_s": 0.01}, {}, 503, "queue_timeout"),
    ],
)
def test_each_rejection_is_json_with_retry_after(
    settings: dict[str, Any], headers: dict[str, str], status: int, reason: str
) -> None:
    """A full gateway answers 503 (429 for a tenant cap) with Retry-After and a reason code."""

    async def scenario() -> None:
        app = Echo()
        app.hold.clear()
        gw = GatewayMiddleware(app, Settings(global_max_in_flight=1, retry_after_s=2.5, **settings))
        holder = Client()
        running = asyncio.create_task(gw(http_scope(), holder.receive, holder.send))
        await asyncio.sleep(0.01)
        client = Client()
        await gw(http_scope(headers=headers), client.receive, client.send)
        assert client.status == status
        assert client.headers["retry-after"] == "3"
        assert client.headers["content-type"] == "application/json"
        assert client.json()["error"]["code"] == reason
        app.hold.set()
        await running

    run(scenario)


def one_seat_queue_of_one(app: Echo, policy: str) -> GatewayMiddleware:
    """``app`` behind one seat and a queue of one, under ``policy``; tenants by header."""
    settings = Settings(
        global_max_in_flight=1, max_queue=1, overflow_policy=policy, tenant_header="x-tenant"
    )
    return GatewayMiddleware(app, settings)


def test_under_block_a_full_queue_refuses_nobody_and_requests_run_in_arrival_order() -> None:
    """Past ``max_queue``, block answers no 503 ``queue_full``: the newcomers wait for
    room in the queue, and every request runs, in the order it arrived."""

    async def scenario() -> None:
        app = Echo()
        app.hold.clear()
        gw = one_seat_queue_of_one(app, "block")
        clients = [Client() for _ in range(4)]
        tasks = []
        for i, client in enumerate(clients):
            scope = http_scope(headers={"x-tenant": f"t{i}"})
            tasks.append(asyncio.create_task(gw(scope, client.receive, client.send)))
            await asyncio.sleep(0.01)
        assert not any(task.done() for task in tasks)
        assert gw.gateway.snapshot().queued == 1  # the queue keeps its bound
        app.hold.set()
        await asyncio.gather(*tasks)
        assert [c.status for c in clients] == [200] * 4
        assert [state["tenant"] for state in app.states] == ["t0", "t1", "t2", "t3"]

    run(scenario)


def test_evicted_waiter_gets_503_evicted() -> None:
    """Under drop-oldest the evicted waiter is answered 503 with code evicted."""

    async def scenario() -> None:
        app = Echo()
        app.hold.clear()
        gw = one_seat_queue_of_one(app, "drop-oldest")
        clients = [Client() for _ in range(3)]
        tasks = []
        for i, client in enumerate(clients):
            scope = http_scope(headers={"x-tenant": "flood" if i < 2 else "light"})
            tasks.append(asyncio.create_task(gw(scope, client.receive, client.send)))
            await asyncio.sleep(0.01)
        await asyncio.wait_for(tasks[1], 1)
        assert clients[1].status == 503 and clients[1].json()["error"]["code"] == "evicted"
        app.hold.set()
        await asyncio.gather(*tasks)
        assert [c.status for c in clients] == [200, 503, 200]

    run(scenario)


def test_exempt_paths_are_served_even_when_the_gateway_is_full() -> None:
    """Health and metrics paths never queue, so operators can act during overload."""

    async def scenario() -> None:
        app = Echo()
        app.hold.clear()
        gw = GatewayMiddleware(app, Settings(global_max_in_flight=1, max_queue=0))
        holder = Client()
        running = asyncio.create_task(gw(http_scope(), holder.receive, holder.send))
        await asyncio.sleep(0.01)
        app.hold.set()
        probe = Client()
        await gw(http_scope("/healthz", "GET"), probe.receive, probe.send)
        nested = Client()
        await gw(http_scope("/metrics/detail", "GET"), nested.receive, nested.send)
        assert probe.status == nested.status == 200
        assert gw.gateway.scheduler.admitted == 1
        await running

    run(scenario)


def test_exempt_paths_stay_exempt_however_many_paths_were_seen() -> None:
    """An exempt path and those under it never queue, a path that only starts with the same
    letters does, one that climbs out of an exempt path with ``..`` (or a ``.`` segment)
    does too, and this holds after more distinct paths than the check remembers."""
    release = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/hold":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def scenario() -> None:
        # drop-newest with no queue: a path that is not exempt is refused at once
        settings = Settings(global_max_in_flight=1, max_queue=0, overflow_policy="drop-newest")
        gw = GatewayMiddleware(app, settings)
        holder = Client()
        running = asyncio.create_task(gw(http_scope("/hold"), holder.receive, holder.send))
        await asyncio.sleep(0.01)
        statuses: dict[str, list[int | None]] = {}
        paths = [f"/v1/models/m{i}" for i in range(1500)]
        climbing = ["/healthz/../v1/completions", "/healthz/./live", "/healthz/.."]
        for path in [*paths, "/healthz", "/healthz/live", "/healthzx", *climbing, *paths[:3]] * 2:
            client = Client()
            await gw(http_scope(path, "GET"), client.receive, client.send)
            statuses.setdefault(path, []).append(client.status)
        assert statuses["/healthz"] == statuses["/healthz/live"] == [200, 200]
        assert statuses["/healthzx"] == [503, 503]
        assert {status for path in climbing for status in statuses[path]} == {503}
        assert {status for path in paths for status in statuses[path]} == {503}
        release.set()
        await running
        assert holder.status == 200

    run(scenario)


def test_the_app_reads_its_own_admission_record_and_cannot_change_it() -> None:
    """``scope["state"]["obleth"]`` holds the request's own tenant, priority and wait, for
    requests admitted at once and after waiting alike; it is read-only, so one request
    cannot change what the next one reads."""
    seen: list[dict[str, Any]] = []
    refused: list[bool] = []
    release = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        record = scope["state"]["obleth"]
        seen.append(dict(record))
        try:
            record["tenant"] = "someone else"
        except TypeError:
            refused.append(True)
        if scope["path"] == "/hold":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def scenario() -> None:
        settings = Settings(global_max_in_flight=1, tenant_header="x-tenant")
        gw = GatewayMiddleware(app, settings)
        for tenant in ("a", "b", "a"):
            client = Client()
            await gw(http_scope(headers={"x-tenant": tenant}), client.receive, client.send)
        holder, waiter = Client(), Client()
        held = asyncio.create_task(
            gw(http_scope("/hold", headers={"x-tenant": "a"}), holder.receive, holder.send)
        )
        await asyncio.sleep(0.01)
        queued = asyncio.create_task(
            gw(http_scope(headers={"x-tenant": "b"}), waiter.receive, waiter.send)
        )
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(held, queued)
        assert [r["tenant"] for r in seen] == ["a", "b", "a", "a", "b"]
        assert {r["priority"] for r in seen} == {"standard"}
        assert [r["waited_s"] for r in seen[:4]] == [0.0] * 4
        assert seen[4]["waited_s"] > 0
        assert refused == [True] * 5

    run(scenario)


def test_websockets_and_other_scopes_pass_through() -> None:
    """Scopes other than http and lifespan reach the app untouched."""
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def scenario() -> None:
        gw = GatewayMiddleware(app, Settings())

        async def nothing() -> Message:
            return {"type": "websocket.connect"}

        async def ignore(message: Message) -> None:
            pass

        await gw({"type": "websocket", "path": "/ws", "headers": []}, nothing, ignore)
        assert seen == ["websocket"] and gw.gateway.scheduler.admitted == 0

    run(scenario)


def test_lifespan_is_wrapped_so_the_apps_own_startup_still_runs() -> None:
    """The gateway starts on lifespan startup; the app still sees and answers every event."""
    events: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            events.append(message["type"])
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return

    assert lifespan_of(app) == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert events == ["lifespan.startup", "lifespan.shutdown"]


def lifespan_of(app: ASGIApp) -> list[str]:
    """What a server hears from ``app`` behind the middleware over a lifespan of startup
    then shutdown; checks that the gateway runs from startup's completion to shutdown."""
    outbox: list[str] = []

    async def scenario() -> None:
        gw = GatewayMiddleware(app, Settings())
        inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

        async def receive() -> Message:
            return inbox.pop(0)

        async def send(message: Message) -> None:
            outbox.append(message["type"])
            if message["type"] == "lifespan.startup.complete":
                assert gw.gateway.started

        await gw({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
        assert not gw.gateway.started

    run(scenario)
    return outbox


@pytest.mark.parametrize("how", ["raises", "returns"])
def test_an_app_that_does_not_speak_lifespan_is_answered_for(how: str) -> None:
    """Django's ASGI handler raises on a lifespan scope: the middleware completes startup
    itself, with the gateway started, and stops the gateway at shutdown."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" and how == "raises":
            raise ValueError("only HTTP connections")

    assert lifespan_of(app) == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_an_app_whose_startup_raises_fails_the_servers_startup(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An app that takes the startup message and then raises (its database is down) used
    to be reported started, and served broken. The gateway is stopped again and the
    server told that startup failed, with the error: every server then stops, where an
    exception would make most of them (uvicorn's ``--lifespan auto``, hypercorn) take
    lifespan for unsupported and serve."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        raise ConnectionError("database unreachable")

    with caplog.at_level(logging.ERROR, logger="obleth"):
        assert lifespan_of(app) == ["lifespan.startup.failed"]  # and the gateway stopped
    assert "the app's startup raised" in caplog.text
    assert "ConnectionError: database unreachable" in caplog.text  # with its traceback


class FailingStart:
    """A plugin whose capacity provider ``down`` fails to start; ``stops`` counts the
    stops of the provider that started before it (``up``)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.stops = 0
        self.error = error or ConnectionError("control plane unreachable")

    @hookimpl
    def obleth_capacity_providers(self) -> dict[str, object]:
        plugin = self

        class Up:
            def max_in_flight(self) -> int:
                return 8

            async def start(self) -> None:
                pass

            async def stop(self) -> None:
                plugin.stops += 1

        class Down(Up):
            async def start(self) -> None:
                raise plugin.error

        return {"up": lambda settings: Up(), "down": lambda settings: Down()}


def failing_to_start(
    app: Any, error: BaseException | None = None
) -> tuple[GatewayMiddleware, FailingStart]:
    plugin = FailingStart(error)
    settings = Settings(capacity_providers=["up", "down"], global_max_in_flight=1)
    return GatewayMiddleware(app, settings, plugins=[plugin]), plugin


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (ConnectionError("control plane unreachable"), "control plane unreachable"),
        # raised by the provider, not a cancellation of the start: a failure like any other
        (asyncio.CancelledError(), "CancelledError"),
    ],
    ids=["error", "its-own-cancelled-error"],
)
def test_a_gateway_that_cannot_start_fails_the_servers_startup_and_leaves_nothing_open(
    error: BaseException, said: str
) -> None:
    """The server is told ``lifespan.startup.failed`` with the plugin named; the app's own
    startup never runs; what had started is stopped again, and no seat is free."""
    events: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        events.append((await receive())["type"])

    async def scenario() -> None:
        gw, plugin = failing_to_start(app, error)
        outbox: list[Message] = []

        async def receive() -> Message:
            return {"type": "lifespan.startup"}

        async def send(message: Message) -> None:
            outbox.append(message)

        await gw({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
        [failed] = outbox
        assert failed["type"] == "lifespan.startup.failed"
        assert failed["message"] == (
            f"plugin 'FailingStart-0': capacity provider 'down' failed to start: {said}"
        )
        assert events == []
        assert not gw.gateway.started and plugin.stops == 1
        seats = gw.gateway.scheduler.free_seats
        assert seats is not None and not seats.take(Ticket("a"))

    run(scenario)


def test_requests_that_find_the_gateway_closed_together_share_one_failed_start() -> None:
    """Served without lifespan, twelve requests arrive before the gateway has started (the
    first starts it, the others come while that start runs), and a provider's start()
    fails after 0.2 s: it is tried once for all of them, none of them gets a seat while
    it runs, and each is answered 503 when it fails (not one attempt after another, the
    last answered seconds later); the next request tries again."""
    starts: list[float] = []

    class SlowToFail:
        def max_in_flight(self) -> int:
            return 8

        async def start(self) -> None:
            starts.append(time.monotonic())
            await asyncio.sleep(0.2)
            raise ConnectionError("control plane unreachable")

    class Plugin:
        @hookimpl
        def obleth_capacity_providers(self) -> dict[str, object]:
            return {"slow": lambda settings: SlowToFail()}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("the app must not run")

    async def scenario() -> None:
        gw = GatewayMiddleware(
            app, Settings(capacity_providers=["static", "slow"]), plugins=[Plugin()]
        )
        clients = [Client() for _ in range(12)]
        first = asyncio.create_task(gw(http_scope(), clients[0].receive, clients[0].send))
        await asyncio.sleep(0.05)  # the start is under way
        await asyncio.gather(first, *(gw(http_scope(), c.receive, c.send) for c in clients[1:]))
        assert len(starts) == 1
        assert {c.status for c in clients} == {503}
        assert {c.json()["error"]["code"] for c in clients} == {"gateway_not_started"}
        again = Client()
        await gw(http_scope(), again.receive, again.send)
        assert len(starts) == 2 and again.status == 503

    run(scenario)


def test_a_real_server_does_not_serve_when_the_gateway_cannot_start() -> None:
    """uvicorn with its default ``lifespan="auto"`` exits at startup (status 3) instead of
    taking the failure for an app without lifespan and serving without the gateway."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("the app must not run")

    gw, _ = failing_to_start(app)
    server = uvicorn.Server(uvicorn.Config(gw, host="127.0.0.1", port=0, log_level="critical"))

    async def scenario() -> None:
        await asyncio.wait_for(server.serve(), 10)

    with pytest.raises(SystemExit) as exit_:
        run(scenario)
    assert exit_.value.code == 3
    assert not server.started and not gw.gateway.started


def test_a_server_that_raises_at_a_failed_startup_ends_the_process_with_status_3(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """hypercorn answers ``lifespan.startup.failed`` by raising into the app, which would
    end its worker with a traceback: the gateway ends the process with ``SystemExit(3)``
    instead, the error logged on one line, and asyncio reports no exception left behind."""

    class Refused(Exception):
        pass

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("the app must not run")

    gw, _ = failing_to_start(app)

    async def scenario() -> None:
        async def receive() -> Message:
            return {"type": "lifespan.startup"}

        async def send(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                raise Refused(message["message"])

        # in a task of its own, as hypercorn runs lifespan; SystemExit leaves the loop
        # from there at once, so the sleep never ends
        lifespan = {"type": "lifespan", "asgi": {"version": "3.0"}}
        started = asyncio.create_task(gw(lifespan, receive, send))
        await asyncio.sleep(10)
        started.cancel()

    gc.collect()  # what earlier tests left behind is reported now, and not counted
    caplog.clear()
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as exit_:
        run(scenario)
    status = exit_.value.code
    del exit_  # its traceback holds on to the task
    gc.collect()  # a task whose exception nobody retrieved is reported when collected
    assert status == 3
    assert [r.getMessage() for r in caplog.records] == [
        "the gateway could not start: plugin 'FailingStart-0': capacity provider 'down' "
        "failed to start: control plane unreachable"
    ]


def starlette_app_with_gateway(started: list[str]) -> Starlette:
    """The README's way: ``add_middleware(GatewayMiddleware)``, settings from the
    environment; Starlette builds the middleware on the first event it serves."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        started.append("app")
        yield

    app = Starlette(
        routes=[
            Route("/", lambda request: PlainTextResponse("hello")),
            Route("/healthz", lambda request: PlainTextResponse("alive")),
        ],
        lifespan=lifespan,
    )
    app.add_middleware(GatewayMiddleware)
    return app


def test_a_bad_environment_stops_a_starlette_app_at_startup(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """uvicorn with its default ``lifespan="auto"`` exits at startup, the log naming the
    variable, instead of serving every request a traceback."""
    monkeypatch.setenv("OBLETH_GLOBAL_MAX_IN_FLIGHT", "0")
    started: list[str] = []
    app = starlette_app_with_gateway(started)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical"))

    async def scenario() -> None:
        await asyncio.wait_for(server.serve(), 10)

    with caplog.at_level(logging.ERROR, logger="obleth"), pytest.raises(SystemExit):
        run(scenario)
    assert not server.started and started == []
    assert any("OBLETH_GLOBAL_MAX_IN_FLIGHT=0" in r.getMessage() for r in caplog.records)


def test_a_bad_environment_without_lifespan_answers_503_and_logs_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Served without lifespan, the app is reached only on exempt paths (the health check
    that tells the operator): every other request gets a JSON 503 ``gateway_not_started``
    with ``Retry-After``, and the log says why, once."""
    monkeypatch.setenv("OBLETH_GLOBAL_MAX_IN_FLIGHT", "0")

    async def scenario() -> None:
        app = starlette_app_with_gateway([])
        async with serve_in_task(app, lifespan="off") as server, httpx.AsyncClient() as http:
            responses = [await http.get(f"{server.url}/") for _ in range(3)]
            health = await http.get(f"{server.url}/healthz")
        assert (health.status_code, health.text) == (200, "alive")
        for response in responses:
            assert response.status_code == 503
            assert response.headers["retry-after"] == "1"
            assert response.json()["error"]["code"] == "gateway_not_started"

    with caplog.at_level(logging.ERROR, logger="obleth"):
        run(scenario)
    logged = [r.getMessage() for r in caplog.records if r.name == "obleth"]
    assert len(logged) == 1 and "OBLETH_GLOBAL_MAX_IN_FLIGHT=0" in logged[0]


def test_a_gateway_not_started_or_stopped_starts_on_the_next_request() -> None:
    """Without lifespan, or after it stopped the gateway, the next request starts it and
    is served through the gate like any other."""

    async def scenario() -> None:
        gw = GatewayMiddleware(Echo(), Settings())
        for _ in range(2):
            assert not gw.gateway.started
            client = Client()
            await gw(http_scope(), client.receive, client.send)
            assert client.status == 200 and gw.gateway.started
            await gw.gateway.stop()
        scheduler = gw.gateway.scheduler
        assert scheduler.admitted == scheduler.released == 2

    run(scenario)
