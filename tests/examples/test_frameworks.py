"""Each framework example, served by the command its docstring gives and called over HTTP:
the app never serves more requests at once than the limit (counted by the app itself), a
request past it is refused with 503 JSON and ``Retry-After``, and a streamed answer keeps
its seat until its last chunk."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest

from tests.examples.documented import Documented, commands_of, example_path

CHAT = "/v1/chat/completions"
ASK = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
#: 40 words at 50 ms: still streaming while the test sends its next requests
LONG = {**ASK, "stream": True, "max_tokens": 40}

EXAMPLES = {
    "fastapi": "fastapi_app.py",
    "litestar": "litestar_app.py",
    "flask": "flask_app.py",
    "django": "django_project/__init__.py",
}
COMMANDS = [
    pytest.param(command, id=f"{name}-{command.split()[-1]}")
    for name, file in EXAMPLES.items()
    for command in commands_of(example_path(file))
]


def test_every_example_documents_a_command() -> None:
    """Django documents one command per server kind; the others one each."""
    counts = {name: len(commands_of(example_path(file))) for name, file in EXAMPLES.items()}
    assert counts == {"fastapi": 1, "litestar": 1, "flask": 1, "django": 2}


@pytest.mark.parametrize("command", COMMANDS)
def test_the_documented_command_holds_the_limit(command: str) -> None:
    with Documented(command) as server:
        assert server._env["OBLETH_GLOBAL_MAX_IN_FLIGHT"] == "2"
        held, past, health, burst, stats = asyncio.run(_scenario(server.url))
    log = server.log_tail(400)

    # the gateway started and stopped with the server, also around Django's handler
    assert "appears unsupported" not in log and "Traceback" not in log, log
    # two streams held both seats until their last chunk (the first was read before)
    for rest in held:
        assert rest[-1] == "data: [DONE]" and len(rest) == 40, rest[-3:]
    assert past.status_code == 503, past.text
    assert past.headers["retry-after"] == "1"
    assert past.json()["error"]["code"] == "over_capacity"
    assert health.status_code == 200  # exempt: answered during overload
    served = [response for response in burst if response.status_code == 200]
    refused = [response for response in burst if response.status_code == 503]
    assert len(served) + len(refused) == len(burst)
    assert served and refused, [response.status_code for response in burst]
    assert all(r.json()["error"]["code"] == "over_capacity" for r in refused)
    assert all(r.headers["x-obleth-tenant"] == "anonymous" for r in served)
    # counted by the app: never more than the limit at once, every admitted one served
    assert stats == {"in_flight": 0, "peak": 2, "served": 2 + len(served)}


async def _scenario(url: str) -> tuple[Any, ...]:
    async with (
        httpx.AsyncClient(base_url=url, trust_env=False, timeout=20) as http,
        contextlib.AsyncExitStack() as stack,
    ):
        streams = []
        for _ in range(2):
            response = await stack.enter_async_context(http.stream("POST", CHAT, json=LONG))
            assert response.status_code == 200
            lines = response.aiter_lines()
            assert (await anext(lines)).startswith("data: ")  # running: its seat is held
            streams.append(lines)
        past = await http.post(CHAT, json=ASK)
        health = await http.get("/healthz")
        held = [[line async for line in lines if line] for lines in streams]
    # the seats are free again: six at once, two seats. On new connections: gunicorn
    # closes one kept alive past its 2 s while the streams ran, which a reuse would race
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=20) as http:
        burst = await asyncio.gather(*(http.post(CHAT, json=ASK) for _ in range(6)))
        stats = (await http.get("/stats")).json()
    return held, past, health, burst, stats
