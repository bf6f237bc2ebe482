"""A FastAPI app with an OpenAI-style chat endpoint, behind ``GatewayMiddleware``.

Run it from the repository's root (``pip install -e . fastapi`` first):

    OBLETH_GLOBAL_MAX_IN_FLIGHT=2 OBLETH_OVERFLOW_POLICY=reject uvicorn examples.fastapi_app:app

With the limit at 2 and the ``reject`` policy, a third request while two answers are
being written is refused at once: 503 with ``Retry-After`` and an OpenAI-style JSON error
(leave the policy out and it waits for a seat instead). ``GET /stats`` tells how many
requests the app served at once: never more than the limit.

    curl -sN localhost:8000/v1/chat/completions \\
         -d '{"messages": [{"role": "user", "content": "hi"}], "stream": true}'

``app.add_middleware`` is the one line the gateway needs; its settings come from the
``OBLETH_*`` variables. FastAPI builds its middleware when the server starts, so a bad
value stops uvicorn's startup with a message naming it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from examples.pretend_model import WORD_S, Chat, InFlight, InvalidChat
from gateway import GatewayMiddleware

app = FastAPI(title="chat behind Obleth")
app.add_middleware(GatewayMiddleware)
in_flight = InFlight()


@app.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    try:
        chat = Chat.parse_bytes(await request.body())
    except InvalidChat as exc:
        return JSONResponse(exc.document(), status_code=400)
    # what the gateway decided about this request: tenant, priority, waited_s
    headers = {"x-obleth-tenant": str(request.state.obleth["tenant"])}
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


@app.get("/stats")
async def stats() -> dict[str, int]:
    return in_flight.stats()


@app.get("/healthz")
async def healthz() -> Response:
    """Exempt from admission (``exempt_paths``): it answers during overload."""
    return PlainTextResponse("ok")
