"""An OpenAI-style chat endpoint behind ``GatewayMiddleware``, set up from ``OBLETH_*``.

Run it from the repository's root (``pip install -e .`` first):

    OBLETH_GLOBAL_MAX_IN_FLIGHT=2 OBLETH_TENANT_HEADER=x-tenant \\
    OBLETH_TENANT_WEIGHTS=gold:4,free:1 uvicorn examples.chat_app:app

and call it as a client of an inference service would:

    curl -sN localhost:8000/v1/chat/completions -H 'x-tenant: gold' \\
         -d '{"messages": [{"role": "user", "content": "hi"}], "stream": true}'

The "model" writes one word every 50 ms (7 words, or ``max_tokens``), slowly enough to
watch the gate: with the limit at 2, a third request at the same time waits for a seat (with
``OBLETH_OVERFLOW_POLICY=reject`` it is answered 503 at once). A streamed answer
holds its seat until its last chunk. The endpoint reads what the gateway decided from
``request.state.obleth`` and returns it in ``x-obleth-tenant`` and ``x-obleth-waited-ms``
headers. ``/healthz`` is one of the gateway's exempt paths: it answers during overload.
``GET /stats`` tells how many requests the app served at once: never more than the limit.
A request without the tenant header belongs to its bearer API key (a hash of it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from examples.pretend_model import WORD_S, Chat, InFlight, InvalidChat
from gateway import GatewayMiddleware

in_flight = InFlight()


async def chat_completions(request: Request) -> Response:
    try:
        chat = Chat.parse_bytes(await request.body())
    except InvalidChat as exc:
        return JSONResponse(exc.document(), status_code=400)
    admitted: Mapping[str, Any] = request.state.obleth  # set by the gateway
    headers = {
        "x-obleth-tenant": str(admitted["tenant"]),
        "x-obleth-waited-ms": f"{admitted['waited_s'] * 1000:.0f}",
    }
    if chat.stream:
        return StreamingResponse(_written(chat), media_type="text/event-stream", headers=headers)
    with in_flight:
        await asyncio.sleep(chat.seconds)
    return JSONResponse(chat.completion(), headers=headers)


async def _written(chat: Chat) -> AsyncIterator[str]:
    with in_flight:
        for event in chat.events():
            await asyncio.sleep(WORD_S)
            yield event


async def stats(request: Request) -> Response:
    return JSONResponse(in_flight.stats())


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


app = Starlette(
    routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/stats", stats),
    ]
)
# settings from the OBLETH_* environment; a bad value stops the server's startup, naming it
app.add_middleware(GatewayMiddleware)
