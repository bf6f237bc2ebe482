"""The streaming proxy between a real httpx client and the simulated backend, over uvicorn."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from gateway.loopback import serve_in_task, serve_in_thread
from gateway.proxy import ProxyApp, proxy_to
from gateway.sim import SimConfig, create_app
from gateway.types import ASGIApp, Message, Receive, Scope, Send
from tests.proxy.upstreams import (
    FakeRoute,
    Gated,
    breaks_after_first_chunk,
    eventually,
    routed,
    unused_port,
    within,
)

pytestmark = pytest.mark.anyio

# 10 ms per token: a 50-token stream lasts about 500 ms, far longer than a stats query,
# and a stream of LONG tokens outlasts any test (tests disconnect from those).
CONFIG = SimConfig(step_s=0.01, step_s_per_seq=0.0, prefill_s_per_token=0.0, max_num_seqs=16)
LONG = 100_000  # within the default 131 072-token KV cache: 1 000 s of 10 ms steps
TEST_ID = "x-test-id"
Stats = dict[str, Any]


@dataclass
class Seen:
    """One request as the upstream received it, and the exact body bytes it answered."""

    method: str
    raw_path: bytes
    query_string: bytes
    headers: dict[bytes, bytes]
    answered: bytearray = field(default_factory=bytearray)


class Recorder:
    """Wraps the upstream app; keeps a ``Seen`` for each request carrying ``x-test-id``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: dict[str, Seen] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", []))
        key = headers.get(TEST_ID.encode())
        if scope["type"] != "http" or key is None:
            await self.app(scope, receive, send)
            return
        seen = self.seen[key.decode()] = Seen(
            scope["method"], scope["raw_path"], scope["query_string"], headers
        )

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                seen.answered += message.get("body", b"")
            await send(message)

        await self.app(scope, receive, recording_send)


@dataclass(frozen=True)
class Upstream:
    url: str
    recorder: Recorder


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    """One simulated backend for the module, behind a recorder; tests reset its counters."""
    recorder = Recorder(create_app(CONFIG))
    with serve_in_thread(recorder) as server:
        yield Upstream(server.url, recorder)


@pytest.fixture(scope="module")
def proxy(upstream: Upstream) -> Iterator[str]:
    """The proxy to that backend, on its own uvicorn server and event loop."""
    with serve_in_thread(proxy_to(upstream.url)) as server:
        yield server.url


@pytest.fixture
async def http(upstream: Upstream) -> AsyncIterator[httpx.AsyncClient]:
    """A client; the backend starts each test idle, with zeroed counters."""
    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
        await wait_for(client, upstream, lambda s: s["concurrency"] == 0)
        (await client.post(f"{upstream.url}/sim/reset")).raise_for_status()
        yield client


async def sim_stats(http: httpx.AsyncClient, upstream: Upstream) -> Stats:
    response = await http.get(f"{upstream.url}/sim/stats")
    response.raise_for_status()
    stats: Stats = response.json()
    return stats


async def wait_for(
    http: httpx.AsyncClient, upstream: Upstream, condition: Callable[[Stats], bool]
) -> Stats:
    """Poll the backend's stats until ``condition`` holds; fail with them after 5 s."""
    stats = await sim_stats(http, upstream)
    for _ in range(500):
        if condition(stats):
            return stats
        await asyncio.sleep(0.01)
        stats = await sim_stats(http, upstream)
    raise AssertionError(f"the backend never got there: {stats}")


def new_id() -> dict[str, str]:
    return {TEST_ID: uuid.uuid4().hex}


async def test_a_completion_comes_back_byte_for_byte_as_the_upstream_sent_it(
    http: httpx.AsyncClient, upstream: Upstream, proxy: str
) -> None:
    """A non-streamed completion through the proxy is the upstream's answer, unchanged."""
    body = {"prompt": "Say something short.", "max_tokens": 5}
    tag = new_id()
    proxied = await http.post(f"{proxy}/v1/completions", json=body, headers=tag)
    direct = await http.post(f"{upstream.url}/v1/completions", json=body)

    assert proxied.status_code == direct.status_code == 200
    assert proxied.content == bytes(upstream.recorder.seen[tag[TEST_ID]].answered)
    assert proxied.headers["content-type"] == direct.headers["content-type"]
    assert proxied.headers["content-length"] == str(len(proxied.content))
    # apart from the fresh id and timestamp of every answer, direct and proxied agree
    mine, theirs = proxied.json(), direct.json()
    for answer in (mine, theirs):
        del answer["id"], answer["created"]
    assert mine == theirs


async def test_an_answer_without_fresh_ids_is_identical_direct_and_through_the_proxy(
    http: httpx.AsyncClient, upstream: Upstream, proxy: str
) -> None:
    """GET /v1/models is deterministic: the proxied bytes equal the direct bytes."""
    proxied = await http.get(f"{proxy}/v1/models")
    direct = await http.get(f"{upstream.url}/v1/models")
    assert (proxied.status_code, proxied.content) == (direct.status_code, direct.content)


async def test_streamed_tokens_arrive_while_the_upstream_is_still_generating(
    http: httpx.AsyncClient, upstream: Upstream, proxy: str
) -> None:
    """The first SSE chunk reaches the client before the upstream has produced the last."""
    body = {"prompt": "Count slowly.", "max_tokens": 50, "stream": True}
    tag = new_id()
    chunks: list[bytes] = []
    at_first_chunk: Stats = {}
    async with http.stream("POST", f"{proxy}/v1/completions", json=body, headers=tag) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for chunk in response.aiter_raw():
            if not chunks:
                at_first_chunk = await sim_stats(http, upstream)
            chunks.append(chunk)

    assert at_first_chunk["concurrency"] == 1 and at_first_chunk["completed"] == 0
    assert len(chunks) > 1
    streamed = b"".join(chunks)
    assert streamed == bytes(upstream.recorder.seen[tag[TEST_ID]].answered)
    assert streamed.count(b"data: ") == 51 and streamed.endswith(b"data: [DONE]\n\n")


async def test_a_client_leaving_mid_stream_is_seen_by_the_upstream_at_once(
    http: httpx.AsyncClient, upstream: Upstream, proxy: str
) -> None:
    """Closing the client's connection mid-stream ends the upstream request too."""
    body = {"prompt": "Never stop.", "max_tokens": LONG, "stream": True}
    async with http.stream("POST", f"{proxy}/v1/completions", json=body) as response:
        async for _ in response.aiter_raw():
            break  # one token arrived: the upstream is generating
        assert (await sim_stats(http, upstream))["concurrency"] == 1
    # leaving the block closed the connection with the stream unfinished

    stats = await wait_for(http, upstream, lambda s: s["concurrency"] == 0)
    assert stats["disconnected"] == 1 and stats["running"] == 0


async def test_a_client_giving_up_before_the_answer_starts_is_seen_by_the_upstream(
    http: httpx.AsyncClient, upstream: Upstream, proxy: str
) -> None:
    """A non-streamed request abandoned while the upstream still generates ends there too."""
    body = {"prompt": "Take your time.", "max_tokens": LONG}
    with pytest.raises(httpx.ReadTimeout):
        await http.post(f"{proxy}/v1/completions", json=body, timeout=httpx.Timeout(10.0, read=0.3))

    stats = await wait_for(http, upstream, lambda s: s["concurrency"] == 0)
    assert stats["disconnected"] == 1 and stats["running"] == 0


async def test_a_body_arriving_in_several_messages_is_streamed_through_whole(
    upstream: Upstream,
) -> None:
    """A body the server hands over in pieces goes upstream as it comes (chunked), intact."""
    document = json.dumps({"prompt": "Piece by piece. " * 50, "max_tokens": 2}).encode()
    parts = [document[i : i + 100] for i in range(0, len(document), 100)]
    incoming: list[Message] = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]
    answered: list[Message] = []
    done = asyncio.Event()

    async def receive() -> Message:
        if incoming:
            return incoming.pop(0)
        await done.wait()  # as uvicorn does: after the response, the request is over
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        answered.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    tag = new_id()
    headers = [(b"content-type", b"application/json"), (TEST_ID.encode(), tag[TEST_ID].encode())]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "headers": headers,
    }
    proxy = proxy_to(upstream.url)
    try:
        await proxy(scope, receive, send)
    finally:
        await proxy.aclose()

    assert answered[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in answered[1:])
    assert json.loads(body)["usage"]["prompt_tokens"] == 200  # 800 characters, 4 per token
    seen = upstream.recorder.seen[tag[TEST_ID]]
    assert seen.headers[b"transfer-encoding"] == b"chunked"
    assert b"content-length" not in seen.headers


async def test_an_unreachable_upstream_is_answered_502_with_a_json_error(
    http: httpx.AsyncClient,
) -> None:
    """Nothing listening upstream: 502 and an OpenAI-style error body, not a traceback."""
    async with serve_in_task(proxy_to(f"http://127.0.0.1:{unused_port()}")) as server:
        response = await http.post(f"{server.url}/v1/completions", json={"prompt": "hi"})

    assert response.status_code == 502
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == "upstream_unreachable"
    assert error["message"] and error["type"]


async def test_query_string_and_request_headers_reach_the_upstream(
    http: httpx.AsyncClient, upstream: Upstream, proxy: str
) -> None:
    """Query and end-to-end headers arrive unchanged; hop-by-hop ones do not cross."""
    tag = new_id()
    headers = {
        **tag,
        "x-tenant": "gold",
        "authorization": "Bearer sk-test",
        "connection": "keep-alive, x-this-hop",
        "x-this-hop": "1",
        "keep-alive": "timeout=5",
        "proxy-authorization": "Basic c2VjcmV0",
    }
    url = f"{proxy}/v1/completions?api-version=2024-06-01&note=a%20b%2Fc"
    response = await http.post(url, json={"prompt": "hi", "max_tokens": 1}, headers=headers)

    assert response.status_code == 200
    seen = upstream.recorder.seen[tag[TEST_ID]]
    assert seen.method == "POST" and seen.raw_path == b"/v1/completions"
    assert seen.query_string == b"api-version=2024-06-01&note=a%20b%2Fc"
    assert seen.headers[b"x-tenant"] == b"gold"
    assert seen.headers[b"authorization"] == b"Bearer sk-test"
    assert seen.headers[b"host"] == upstream.url.removeprefix("http://").encode()
    assert seen.headers[b"content-type"] == b"application/json"
    for hop in (b"x-this-hop", b"keep-alive", b"proxy-authorization"):
        assert hop not in seen.headers


async def test_paths_keep_their_escapes_and_error_answers_pass_through(
    http: httpx.AsyncClient, upstream: Upstream, proxy: str
) -> None:
    """The path reaches the upstream as sent; its 404 comes back as it answered it."""
    tag = new_id()
    response = await http.get(f"{proxy}/v1/a%2Fb%20c", headers=tag)
    direct = await http.get(f"{upstream.url}/v1/a%2Fb%20c")
    assert upstream.recorder.seen[tag[TEST_ID]].raw_path == b"/v1/a%2Fb%20c"
    assert (response.status_code, response.content) == (404, direct.content)


async def _raw_request(url: str, request_line: str, tag: dict[str, str]) -> bytes:
    """The answer to ``request_line`` sent as written (httpx would resolve dot segments
    itself before sending); the connection is closed after it."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        headers = "".join(f"{name}: {value}\r\n" for name, value in tag.items())
        writer.write(f"{request_line}\r\nhost: x\r\n{headers}connection: close\r\n\r\n".encode())
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("request_line", "said"),
    [
        ("GET /../../admin HTTP/1.1", "has a '.' or '..' segment"),
        ("GET /v1/a/../b HTTP/1.1", "has a '.' or '..' segment"),
        ("GET /v1/./models HTTP/1.1", "has a '.' or '..' segment"),
        ("GET /v1/%2e%2e/%2E%2e/admin HTTP/1.1", "has a '.' or '..' segment"),
        ("GET /v1/..%2f..%2fstats HTTP/1.1", "has a '.' or '..' segment"),
        ("GET /v1/%2E%2E%2F%2e%2E%2Fstats HTTP/1.1", "has a '.' or '..' segment"),
        ("GET /v1/..%5c..%5Cstats HTTP/1.1", "has a '.' or '..' segment"),
        ("GET /v1/..\\..\\stats HTTP/1.1", "has a '.' or '..' segment"),
        ("GET /v1/models%2f.%2fx HTTP/1.1", "has a '.' or '..' segment"),
        ("OPTIONS * HTTP/1.1", "is not a path"),
    ],
)
async def test_a_target_that_could_leave_the_upstreams_path_is_refused_400(
    http: httpx.AsyncClient, upstream: Upstream, proxy: str, request_line: str, said: str
) -> None:
    """Dot segments, written out or escaped, also behind an escaped slash or a backslash
    that an upstream may decode first, would be resolved on the way and could climb out of
    the path an upstream's base URL puts in front; the request is answered 400 and never
    forwarded."""
    tag = new_id()
    answer = await _raw_request(proxy, request_line, tag)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_path" and said in error["message"]
    assert tag[TEST_ID] not in upstream.recorder.seen
    # a dot that is part of a segment is no dot segment: it goes as sent
    dotted = await http.get(f"{proxy}/v1/a.b/%2e..%2e%2f...%5c.x", headers=tag)
    assert upstream.recorder.seen[tag[TEST_ID]].raw_path == b"/v1/a.b/%2e..%2e%2f...%5c.x"
    assert dotted.status_code == 404


async def test_an_upstream_error_status_passes_through_unchanged(
    http: httpx.AsyncClient, upstream: Upstream, proxy: str
) -> None:
    """An upstream 503 is the client's 503, with the upstream's own body."""
    response = await http.post(
        f"{proxy}/v1/completions", json={"prompt": "hi"}, headers={"x-sim-fail": "503"}
    )
    assert response.status_code == 503
    assert "simulated failure" in response.json()["error"]["message"]


async def test_a_router_choice_in_the_scope_state_wins_over_the_configured_upstream(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    """``scope["state"]["obleth"]["upstream"]`` picks the upstream for that request."""
    proxy = proxy_to(f"http://127.0.0.1:{unused_port()}")  # configured, and down

    async def router(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})["obleth"] = {"upstream": upstream.url}
        await proxy(scope, receive, send)

    async with serve_in_task(router) as server:
        response = await http.get(f"{server.url}/v1/models")
    assert response.status_code == 200
    assert response.json()["data"][0]["id"] == CONFIG.model


async def test_an_upstream_failing_mid_stream_cuts_the_response_short(
    http: httpx.AsyncClient,
) -> None:
    """The status is already sent, so the client sees a truncated body, not a clean end."""
    async with (
        serve_in_task(breaks_after_first_chunk, lifespan="off") as broken,
        serve_in_task(proxy_to(broken.url)) as server,
    ):
        received: list[bytes] = []
        async with http.stream("GET", f"{server.url}/events") as response:
            assert response.status_code == 200

            async def read_to_the_end() -> None:
                async for chunk in response.aiter_raw():
                    received.append(chunk)

            with pytest.raises(httpx.RemoteProtocolError, match="incomplete"):
                await read_to_the_end()
    assert b"".join(received) == b"data: 1\n\n"


@pytest.mark.parametrize("by", ["configured", "routed"])
async def test_the_first_event_reaches_the_client_before_the_upstream_produced_the_last(
    by: str,
) -> None:
    """Events are relayed as they come, with or without a route (and its retry buffering)."""
    gated = Gated()
    async with serve_in_task(gated, lifespan="off") as upstream:
        proxy = (
            proxy_to(upstream.url)
            if by == "configured"
            else routed(ProxyApp(), FakeRoute(upstream.url))
        )
        async with (
            serve_in_task(proxy) as server,
            httpx.AsyncClient(trust_env=False, timeout=10.0) as client,
            client.stream(
                "POST", f"{server.url}/v1/completions", json={"stream": True}
            ) as response,
        ):
            assert response.status_code == 200
            chunks = response.aiter_raw()
            first = await within(anext(chunks), "the first event through the proxy")
            assert first == b"data: 1\n\n"
            assert not gated.sent_last
            gated.release.set()
            rest = await within(_join(chunks), "the rest of the stream")
    assert first + rest == Gated.EVENTS


async def _join(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


async def test_a_routed_client_leaving_mid_stream_ends_the_generation_upstream() -> None:
    """With a route (body held for a retry), a disconnect still reaches the upstream: the
    simulator's ground-truth concurrency drops back to 0."""
    sim = create_app(CONFIG)
    body = {"prompt": "Never stop.", "max_tokens": LONG, "stream": True}
    async with (
        serve_in_task(sim) as upstream,
        serve_in_task(routed(ProxyApp(), FakeRoute(upstream.url))) as server,
        httpx.AsyncClient(trust_env=False, timeout=10.0) as client,
    ):
        async with client.stream("POST", f"{server.url}/v1/completions", json=body) as response:
            assert response.status_code == 200
            await within(anext(response.aiter_raw()), "the first token")
            assert sim.state.stats.concurrency == 1
        # leaving the block closed the connection with the stream unfinished

        await eventually(lambda: sim.state.stats.concurrency == 0, "the upstream saw the leave")
        assert sim.state.stats.snapshot().disconnected == 1
