"""A Litestar app with an OpenAI-style chat endpoint, behind ``GatewayMiddleware``.

Run it from the repository's root (``pip install -e . litestar`` first):

    OBLETH_GLOBAL_MAX_IN_FLIGHT=2 OBLETH_OVERFLOW_POLICY=reject uvicorn examples.litestar_app:app

The gateway wraps the whole Litestar application rather than sitting in its
``middleware=[...]`` list: Litestar builds that list's middleware once per route and keeps
lifespan out of it, which would give each route a budget of its own and start the gateway
late. Wrapped, there is one gateway, started and stopped with the server.

With the limit at 2 and the ``reject`` policy, a third request while two answers are
being written gets 503 with ``Retry-After``; ``GET /stats`` tells how many requests the
app served at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from litestar import Litestar, Request, get, post
from litestar.response import Response, Stream

from examples.pretend_model import WORD_S, Chat, InFlight, InvalidChat
from gateway import GatewayMiddleware

in_flight = InFlight()


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[object] | Stream:
    try:
        chat = Chat.parse_bytes(await request.body())
    except InvalidChat as exc:
        return Response(exc.document(), status_code=400)
    # what the gateway decided about this request: tenant, priority, waited_s
    headers = {"x-obleth-tenant": str(request.scope["state"]["obleth"]["tenant"])}
    if chat.stream:
        return Stream(_written(chat), media_type="text/event-stream", headers=headers)
    with in_flight:
        await asyncio.sleep(chat.seconds)
    return Response(chat.completion(), headers=headers)


async def _written(chat: Chat) -> AsyncIterator[str]:
    with in_flight:
        for event in chat.events():
            await asyncio.sleep(WORD_S)
            yield event


@get("/stats")
async def stats() -> dict[str, int]:
    return in_flight.stats()


@get("/healthz", media_type="text/plain")
async def healthz() -> str:
    """Exempt from admission (``exempt_paths``): it answers during overload."""
    return "ok"


litestar = Litestar(route_handlers=[chat_completions, stats, healthz])
# Litestar types its ASGI messages as TypedDicts, Starlette (and Obleth) as mappings
app = GatewayMiddleware(litestar)  # type: ignore[arg-type]
