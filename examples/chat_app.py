"""An OpenAI-style chat endpoint behind ``GatewayMiddleware``, set up from ``OBLETH_*``.

Run it from the repository's root (``pip install -e .`` first):

    OBLETH_GLOBAL_MAX_IN_FLIGHT=2 OBLETH_TENANT_HEADER=x-tenant \\
    OBLETH_TENANT_WEIGHTS=gold:4,free:1 uvicorn examples.chat_app:app

and call it as a client of an inference service would:

    curl -sN localhost:8000/v1/chat/completions -H 'x-tenant: gold' \\
         -d '{"messages": [{"role": "user", "content": "hi"}], "stream": true}'

The "model" writes one word every 50 ms (7 words, or ``max_tokens``), slowly enough to
watch the gate: with the limit at 2, a third request at the same time waits for a seat (with
``OBLETH_OVERFLOW_POLICY=drop-newest`` it is answered 503 at once). A streamed answer
holds its seat until its last chunk. The endpoint reads what the gateway decided from
``request.state.obleth`` and returns it in ``x-obleth-tenant`` and ``x-obleth-waited-ms``
headers. ``/healthz`` is one of the gateway's exempt paths: it answers during overload.
A request without the tenant header belongs to its bearer API key (a hash of it).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway import GatewayMiddleware

#: the seconds the "model" takes per word of its answer
WORD_S = 0.05
WORDS = ("Seats", "are", "handed", "out", "fairly", "between", "tenants.")


async def chat_completions(request: Request) -> Response:
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return _invalid('the body must be a JSON object with a "messages" list', "messages")
    length = body.get("max_tokens", len(WORDS))
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        return _invalid("max_tokens must be a whole number of at least 1", "max_tokens")
    answer = [WORDS[i % len(WORDS)] for i in range(length)]
    admitted: Mapping[str, Any] = request.state.obleth  # set by the gateway
    headers = {
        "x-obleth-tenant": str(admitted["tenant"]),
        "x-obleth-waited-ms": f"{admitted['waited_s'] * 1000:.0f}",
    }
    created = int(time.time())
    if body.get("stream"):
        return StreamingResponse(
            _stream(answer, created), media_type="text/event-stream", headers=headers
        )
    await asyncio.sleep(WORD_S * len(answer))
    message = {"role": "assistant", "content": " ".join(answer)}
    return JSONResponse(
        {
            "id": f"chatcmpl-{created}",
            "object": "chat.completion",
            "created": created,
            "model": "example",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        },
        headers=headers,
    )


async def _stream(answer: list[str], created: int) -> AsyncIterator[str]:
    for index, word in enumerate(answer):
        await asyncio.sleep(WORD_S)
        delta = {"content": word if index == 0 else " " + word}
        chunk = {
            "id": f"chatcmpl-{created}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": "example",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


def _invalid(message: str, param: str) -> Response:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    return JSONResponse({"error": error}, status_code=400)


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


app = Starlette(
    routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/healthz", healthz),
    ]
)
# settings from the OBLETH_* environment; a bad value stops the server's startup, naming it
app.add_middleware(GatewayMiddleware)
