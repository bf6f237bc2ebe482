"""The simulator app over a real uvicorn server: OpenAI shapes, streaming, ground truth, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any, cast

import httpx
import pytest

from gateway.loopback import RunningServer, serve_in_task, serve_in_thread
from gateway.sim import SimConfig, create_app

pytestmark = pytest.mark.anyio

# 10 ms steps: short requests finish in a few tens of milliseconds, while a request for
# LONG tokens streams for far longer than any test lasts (tests disconnect from those).
CONFIG = SimConfig(
    step_s=0.01,
    step_s_per_seq=0.0,
    prefill_s_per_token=0.0,
    max_num_seqs=8,
    chars_per_token=4,
    block_size_tokens=4,
)
LONG = 30_000  # within the default 32 768-token KV cache: 300 s of 10 ms steps
Stats = dict[str, Any]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    """One simulator on a uvicorn thread for the whole module; tests reset it."""
    with serve_in_thread(create_app(CONFIG)) as running:
        yield running


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the shared server, which starts the test idle and with zeroed counters."""
    async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=10.0) as client:
        await wait_for(client, lambda s: s["concurrency"] == 0 and s["running"] == 0)
        await client.post("/sim/reset")
        yield client


async def stats(client: httpx.AsyncClient) -> Stats:
    response = await client.get("/sim/stats")
    response.raise_for_status()
    result: Stats = response.json()
    return result


async def wait_for(client: httpx.AsyncClient, condition: Callable[[Stats], bool]) -> Stats:
    """Poll /sim/stats until `condition` holds; fail with the last stats after 5 s."""
    current = await stats(client)
    for _ in range(500):
        if condition(current):
            return current
        await asyncio.sleep(0.01)
        current = await stats(client)
    raise AssertionError(f"condition never held; last /sim/stats: {current}")


async def events(response: httpx.Response) -> list[str]:
    """The `data:` payloads of a whole server-sent-event stream."""
    return [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]


@contextlib.asynccontextmanager
async def open_stream(client: httpx.AsyncClient, max_tokens: int) -> AsyncIterator[str]:
    """Start a streamed completion and yield its first event; leaving disconnects."""
    body = {"prompt": "tell me a story", "max_tokens": max_tokens, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        # httpx types aiter_lines() as an iterator; it is an async generator, closed here.
        lines = cast("AsyncGenerator[str, None]", response.aiter_lines())
        async with contextlib.aclosing(lines):
            async for line in lines:
                if line.startswith("data: "):
                    yield line[6:]
                    return
    raise AssertionError("the stream ended without an event")


async def test_health_and_models_answer(client: httpx.AsyncClient) -> None:
    """/health is 200 and /v1/models lists the configured model."""
    assert (await client.get("/health")).status_code == 200
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [CONFIG.model]


async def test_completion_returns_openai_shape_with_usage(client: httpx.AsyncClient) -> None:
    """A non-streamed completion has OpenAI's fields and exact token usage."""
    response = await client.post("/v1/completions", json={"prompt": "abcd" * 10, "max_tokens": 3})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["model"] == CONFIG.model
    assert body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length"
    assert len(choice["text"]) == 3 * CONFIG.chars_per_token
    assert body["usage"]["prompt_tokens"] == 10
    assert body["usage"]["completion_tokens"] == 3
    assert body["usage"]["total_tokens"] == 13


async def test_repeated_prompt_reports_cached_tokens(client: httpx.AsyncClient) -> None:
    """The second identical prompt is served from the prefix cache, and usage says so."""
    request = {"prompt": "abcd" * 10, "max_tokens": 1}
    first = (await client.post("/v1/completions", json=request)).json()["usage"]
    second = (await client.post("/v1/completions", json=request)).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] == 8  # two full 4-token blocks
    current = await stats(client)
    assert current["prefix_cache_query_tokens"] == 20
    assert current["prefix_cache_hit_tokens"] == 8


async def test_chat_completion_returns_an_assistant_message(client: httpx.AsyncClient) -> None:
    """Chat answers with an assistant message; max_completion_tokens wins over max_tokens."""
    request = {
        "model": CONFIG.model,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "max_completion_tokens": 2,
    }
    response = await client.post("/v1/chat/completions", json=request)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_stream_sends_one_event_per_token_then_done(
    client: httpx.AsyncClient, path: str
) -> None:
    """A stream is text/event-stream: one chunk per token, the last with finish_reason, [DONE]."""
    if path == "/v1/completions":
        request: dict[str, Any] = {"prompt": "hello"}
    else:
        request = {"messages": [{"role": "user", "content": "hello"}]}
    request |= {"max_tokens": 4, "stream": True}
    async with client.stream("POST", path, json=request) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = await events(response)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert len(chunks) == 4
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert len({c["id"] for c in chunks}) == 1


async def test_stream_ends_with_usage_when_asked(client: httpx.AsyncClient) -> None:
    """stream_options.include_usage adds a usage chunk with no choices before [DONE]."""
    request = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.stream("POST", "/v1/chat/completions", json=request) as response:
        payloads = await events(response)
    usage_chunk = json.loads(payloads[-2])
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 2


async def test_first_chunk_arrives_while_the_request_is_still_running(
    client: httpx.AsyncClient,
) -> None:
    """Tokens stream as they are produced, not after the whole generation."""
    async with open_stream(client, max_tokens=LONG) as first:
        assert json.loads(first)["choices"][0]["finish_reason"] is None
        current = await stats(client)
        assert current["running"] == 1
        assert current["concurrency"] == 1
        assert current["completed"] == 0


async def test_client_disconnect_mid_stream_frees_concurrency_and_engine_slots(
    client: httpx.AsyncClient,
) -> None:
    """Streams whose clients go away leave the ground truth and the batch."""
    async with contextlib.AsyncExitStack() as streams:
        for _ in range(3):
            await streams.enter_async_context(open_stream(client, max_tokens=LONG))
        assert (await stats(client))["running"] == 3
    after = await wait_for(client, lambda s: s["concurrency"] == 0 and s["running"] == 0)
    assert after["waiting"] == 0
    assert after["disconnected"] == 3
    assert after["completed"] == 0


async def test_client_giving_up_on_a_non_streamed_request_frees_its_slot(
    client: httpx.AsyncClient, server: RunningServer
) -> None:
    """A non-streamed request is withdrawn as soon as its client disconnects."""
    async with httpx.AsyncClient(base_url=server.url, trust_env=False) as impatient:
        request = impatient.post("/v1/completions", json={"prompt": "x", "max_tokens": LONG})
        task = asyncio.ensure_future(request)
        await wait_for(client, lambda s: s["running"] == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    after = await wait_for(client, lambda s: s["concurrency"] == 0 and s["running"] == 0)
    assert after["disconnected"] == 1


async def test_max_concurrency_counts_exactly_the_requests_inside_at_once(
    client: httpx.AsyncClient,
) -> None:
    """N simultaneous requests read as exactly N, and the peak survives until reset."""
    async with contextlib.AsyncExitStack() as streams:
        for _ in range(5):
            await streams.enter_async_context(open_stream(client, max_tokens=LONG))
        current = await stats(client)
        assert (current["concurrency"], current["max_concurrency"]) == (5, 5)
    after = await wait_for(client, lambda s: s["concurrency"] == 0)
    assert after["max_concurrency"] == 5
    assert (await client.post("/sim/reset")).json()["max_concurrency"] == 0


async def test_back_to_back_requests_never_overlap_in_the_ground_truth(
    client: httpx.AsyncClient,
) -> None:
    """A request stops counting before its client can send the next one (no false peaks)."""
    for index in range(6):
        request = {"prompt": "abc", "max_tokens": 2, "stream": index % 2 == 0}
        async with client.stream("POST", "/v1/completions", json=request) as response:
            await response.aread()
        assert (await stats(client))["concurrency"] == 0
    final = await stats(client)
    assert final["max_concurrency"] == 1
    assert final["completed"] == 6


def parse_prometheus(text: str) -> tuple[dict[str, str], dict[str, tuple[dict[str, str], float]]]:
    """({family: type}, {sample name: (labels, value)}); fails on any malformed line."""
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-z_]+="[^"]*",?)*)\} (\S+)$')
    types: dict[str, str] = {}
    samples: dict[str, tuple[dict[str, str], float]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line.startswith("# HELP ") or not line:
            continue
        else:
            match = sample.match(line)
            assert match, f"not a Prometheus sample line: {line!r}"
            labels = dict(re.findall(r'([a-z_]+)="([^"]*)"', match.group(2)))
            samples[match.group(1)] = (labels, float(match.group(3)))
    return types, samples


async def test_metrics_use_vllm_names_and_parse_as_prometheus_text(
    client: httpx.AsyncClient,
) -> None:
    """/metrics carries vLLM's gauges and counters and the ground-truth gauges."""
    await client.post("/v1/completions", json={"prompt": "abcd" * 4, "max_tokens": 1})
    async with open_stream(client, max_tokens=LONG):
        response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    types, samples = parse_prometheus(response.text)
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries_total": "counter",
        "vllm:prefix_cache_hits_total": "counter",
        "vllm:request_success_total": "counter",
        "vllm:num_preemptions_total": "counter",
        "obleth_sim_concurrency": "gauge",
        "obleth_sim_max_concurrency": "gauge",
    }
    assert types == expected
    assert set(samples) == set(expected)
    assert all(labels["model_name"] == CONFIG.model for labels, _ in samples.values())
    assert samples["vllm:num_requests_running"][1] == 1
    assert samples["obleth_sim_concurrency"][1] == 1
    assert samples["vllm:request_success_total"][1] == 1
    assert 0 < samples["vllm:kv_cache_usage_perc"][1] <= 1


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", b"{not json", None),
        ("/v1/completions", b"[1, 2]", None),
        ("/v1/completions", b"[" * 100_000 + b"]" * 100_000, None),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", None),
        ("/v1/completions", b"{}", "prompt"),
        ("/v1/completions", b'{"prompt": 42}', "prompt"),
        ("/v1/completions", b'{"prompt": [1, 2, 3]}', "prompt"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": "3"}', "max_tokens"),
        ("/v1/completions", b'{"prompt": "x", "stream": "yes"}', "stream"),
        ("/v1/completions", b'{"prompt": "x", "n": 2}', "n"),
        ("/v1/chat/completions", b'{"prompt": "x"}', "messages"),
        ("/v1/chat/completions", b'{"messages": "hi"}', "messages"),
        ("/v1/chat/completions", b'{"messages": [{"content": "hi"}]}', "messages[0].role"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": 7}]}',
            "messages[0].content",
        ),
    ],
)
async def test_bad_requests_get_an_openai_style_400(
    client: httpx.AsyncClient, path: str, body: bytes, param: str | None
) -> None:
    """Malformed input is a 400 invalid_request_error naming the parameter, never a 500."""
    response = await client.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["code"] is None
    assert error["message"]
    current = await stats(client)
    assert (current["failed"], current["concurrency"]) == (1, 0)


@pytest.mark.parametrize(
    ("method", "path", "status", "said"),
    [
        ("POST", "/v1/embeddings", 404, "no route /v1/embeddings"),
        ("GET", "/v1/completions", 405, "GET is not allowed on /v1/completions; use POST"),
    ],
)
async def test_unknown_paths_and_methods_get_an_openai_style_error(
    client: httpx.AsyncClient, method: str, path: str, status: int, said: str
) -> None:
    """A client of the simulator parses one kind of error body, whatever went wrong."""
    response = await client.request(method, path)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and said in error["message"]
    if status == 405:
        assert response.headers["allow"] == "POST"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "hello"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]}),
    ],
    ids=["completions", "chat"],
)
async def test_a_model_the_simulator_does_not_serve_gets_vllms_404(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], stream: bool
) -> None:
    """A request naming a model the simulator does not serve is answered as vLLM answers
    it: 404 with a ``NotFoundError`` body whose message names the served model; the
    engine never sees it. A client mistyping the model finds out at once, not after
    a run of answers from a model it never asked for."""
    request = {**body, "model": "gpt-4o", "max_tokens": 2, "stream": stream}
    response = await client.post(path, json=request)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error == {
        "message": f"The model `gpt-4o` does not exist; this backend serves: {CONFIG.model}.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    current = await stats(client)
    assert (current["failed"], current["completed"], current["concurrency"]) == (1, 0, 0)
    # nothing reached the engine
    assert (current["prefix_cache_query_tokens"], current["requests_finished"]) == (0, 0)


@pytest.mark.parametrize("model", [CONFIG.model, "", None], ids=["served", "empty", "absent"])
async def test_a_request_naming_the_served_model_or_none_is_answered(
    client: httpx.AsyncClient, model: str | None
) -> None:
    """The served name, an empty name or no ``model`` at all get the served model (vLLM
    treats a missing or empty name as its own), named in the answer."""
    request: dict[str, Any] = {"prompt": "hello", "max_tokens": 2}
    if model is not None:
        request["model"] = model
    response = await client.post("/v1/completions", json=request)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == CONFIG.model


async def test_x_sim_fail_answers_the_requested_status_without_generating(
    client: httpx.AsyncClient,
) -> None:
    """`x-sim-fail: 500` gets a 500 error body, and the engine never sees the request."""
    response = await client.post(
        "/v1/completions", json={"prompt": "x"}, headers={"x-sim-fail": "500"}
    )
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"
    current = await stats(client)
    assert (current["failed"], current["prefix_cache_query_tokens"]) == (1, 0)


# 8 blocks of 4 one-character tokens: a 32-token KV cache. 10 ms steps leave two
# requests sent together 160 ms to overlap in the batch before the first fills the cache.
SMALL_KV = SimConfig(
    step_s=0.01,
    step_s_per_seq=0.0,
    prefill_s_per_token=0.0,
    chars_per_token=1,
    block_size_tokens=4,
    kv_cache_blocks=8,
)


@pytest.fixture
async def small_kv() -> AsyncIterator[httpx.AsyncClient]:
    """A client of a fresh simulator whose KV cache holds 32 tokens."""
    async with (
        serve_in_task(create_app(SMALL_KV)) as running,
        httpx.AsyncClient(base_url=running.url, trust_env=False, timeout=10.0) as client,
    ):
        yield client


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "x" * 33}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 20}]}, "messages"),
    ],
)
async def test_a_prompt_larger_than_the_kv_cache_gets_a_400_naming_the_setting(
    small_kv: httpx.AsyncClient, path: str, body: dict[str, Any], param: str
) -> None:
    """A prompt that could never be admitted is refused at once, as vLLM refuses one over
    max_model_len, and the error says which setting to raise."""
    response = await small_kv.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert "KV cache holds at most 32 tokens" in error["message"]
    assert "--kv-cache-blocks" in error["message"]
    current = await stats(small_kv)
    assert (current["failed"], current["waiting"], current["concurrency"]) == (1, 0, 0)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "y" * 8, "max_tokens": 26}, "max_tokens"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "y"}], "max_completion_tokens": 10**9},
            "max_completion_tokens",
        ),
    ],
)
async def test_an_output_that_cannot_fit_beside_the_prompt_gets_a_400(
    small_kv: httpx.AsyncClient, path: str, body: dict[str, Any], param: str
) -> None:
    """As vLLM refuses a ``max_tokens`` over its context: the simulator used to cut it
    silently and answer 200 with fewer tokens, while the request filled the KV cache
    and preempted the others."""
    response = await small_kv.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert f"{param} is too large" in error["message"]
    assert "holds 32 tokens" in error["message"] and "--kv-cache-blocks" in error["message"]
    fits = await small_kv.post("/v1/completions", json={"prompt": "y" * 8, "max_tokens": 25})
    assert fits.json()["usage"]["completion_tokens"] == 25
    unasked = await small_kv.post("/v1/completions", json={"prompt": "y" * 8})
    assert unasked.status_code == 200  # a default left to the server is capped instead


async def test_stream_options_without_a_stream_get_a_400(small_kv: httpx.AsyncClient) -> None:
    """vLLM refuses them: a client that sets ``include_usage`` on a plain request must
    learn it here, not in production."""
    body = {"prompt": "hi", "max_tokens": 2, "stream_options": {"include_usage": True}}
    response = await small_kv.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "stream_options"


async def test_requests_preempted_for_kv_still_complete_and_the_metrics_count_it(
    small_kv: httpx.AsyncClient,
) -> None:
    """Two requests that outgrow the KV cache together both get all their tokens; the
    preemption shows in /sim/stats and as vllm:num_preemptions_total."""
    body = {"prompt": "y" * 8, "max_tokens": 25}  # 8 + 25 - 1 tokens: the whole cache
    responses = await asyncio.gather(*(small_kv.post("/v1/completions", json=body) for _ in "ab"))
    assert [r.json()["usage"]["completion_tokens"] for r in responses] == [25, 25]
    assert (await stats(small_kv))["preemptions"] >= 1
    _, samples = parse_prometheus((await small_kv.get("/metrics")).text)
    assert samples["vllm:num_preemptions_total"][1] >= 1
    assert samples["vllm:kv_cache_usage_perc"][1] == 0


async def test_engine_starts_on_first_request_when_lifespan_does_not_run() -> None:
    """Served with lifespan off (or behind middleware that eats it), the app still answers."""
    app = create_app(CONFIG)
    try:
        async with (
            serve_in_task(app, lifespan="off") as running,
            httpx.AsyncClient(base_url=running.url, trust_env=False) as client,
        ):
            assert not app.state.engine.is_running
            response = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert response.status_code == 200
            assert app.state.engine.is_running
            assert app.state.stats.max_concurrency == 1
    finally:
        await app.state.engine.stop()


async def test_lifespan_starts_and_stops_the_engine() -> None:
    """With lifespan on, the engine runs exactly while the server does."""
    app = create_app(CONFIG)
    async with serve_in_task(app, lifespan="on"):
        assert app.state.engine.is_running
    assert not app.state.engine.is_running
