"""The examples under examples/, served as their docstrings say: uvicorn from the
repository's root, settings from OBLETH_* variables, called over HTTP."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from gateway.builtin.classifier import tenant_of_key
from tests.cluster.pods import UvicornApp

CHAT = "/v1/chat/completions"
ASK = {"messages": [{"role": "user", "content": "hi"}]}
#: long enough that a stream is still running while the test sends its next request
LONG = {**ASK, "stream": True, "max_tokens": 40}


def chat_app(**settings: str) -> UvicornApp:
    env = {f"OBLETH_{name.upper()}": value for name, value in settings.items()}
    return UvicornApp("examples.chat_app:app", health_path="/healthz", env=env)


def test_chat_app_answers_503_past_the_limit_while_streams_hold_the_seats() -> None:
    async def scenario(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=10) as http:
            async with contextlib.AsyncExitStack() as stack:
                streams = []
                for _ in range(2):
                    response = await stack.enter_async_context(
                        http.stream("POST", CHAT, json=LONG, headers={"x-tenant": "gold"})
                    )
                    lines = response.aiter_lines()
                    assert (await anext(lines)).startswith("data: ")  # running: seat held
                    streams.append((response, lines))
                over = await http.post(CHAT, json=ASK, headers={"x-tenant": "free"})
                health = await http.get("/healthz")
                for response, lines in streams:
                    assert response.headers["x-obleth-tenant"] == "gold"
                    assert [line async for line in lines if line][-1] == "data: [DONE]"
            # the streams gave their seats back at their last chunk
            after = await http.post(CHAT, json=ASK, headers={"authorization": "Bearer sk-ex"})
            stats = (await http.get("/stats")).json()

        assert over.status_code == 503 and "retry-after" in over.headers
        assert over.json()["error"]["code"] == "over_capacity"
        assert health.status_code == 200
        assert after.status_code == 200
        assert after.headers["x-obleth-tenant"] == tenant_of_key("sk-ex")
        assert after.json()["choices"][0]["message"]["content"].endswith("tenants.")
        assert stats == {"in_flight": 0, "peak": 2, "served": 3}  # never above the limit

    with chat_app(
        global_max_in_flight="2", tenant_header="x-tenant", overflow_policy="reject"
    ) as server:
        asyncio.run(scenario(server.url))


def test_chat_app_queues_a_request_until_a_seat_is_free() -> None:
    async def scenario(url: str) -> tuple[list[str], httpx.Response]:
        async with (
            httpx.AsyncClient(base_url=url, trust_env=False, timeout=10) as http,
            http.stream("POST", CHAT, json=LONG, headers={"x-tenant": "gold"}) as stream,
        ):
            lines = stream.aiter_lines()
            assert (await anext(lines)).startswith("data: ")  # the only seat is taken
            waiting = asyncio.create_task(
                http.post(CHAT, json={**ASK, "max_tokens": 1}, headers={"x-tenant": "free"})
            )
            rest = [line async for line in lines if line]
            return rest, await waiting

    with chat_app(global_max_in_flight="1", tenant_header="x-tenant") as server:
        rest, queued = asyncio.run(scenario(server.url))

    assert rest[-1] == "data: [DONE]"
    assert queued.status_code == 200 and queued.headers["x-obleth-tenant"] == "free"
    assert int(queued.headers["x-obleth-waited-ms"]) > 0


def test_chat_app_refuses_a_bad_body_with_a_json_error() -> None:
    with chat_app() as server:
        response = httpx.post(server.url + CHAT, content=b"{", trust_env=False)
        too_short = httpx.post(server.url + CHAT, json={**ASK, "max_tokens": 0}, trust_env=False)

    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
    assert too_short.status_code == 400 and too_short.json()["error"]["param"] == "max_tokens"


def test_chat_app_with_a_bad_setting_does_not_start_and_says_which() -> None:
    with pytest.raises(RuntimeError) as caught, chat_app(global_max_in_flight="0"):
        pass

    message = str(caught.value)
    assert "OBLETH_GLOBAL_MAX_IN_FLIGHT=0: expected a whole number of at least 1" in message
