"""The example project's views, the same under ASGI and WSGI.

The chat view is a coroutine, so that under ASGI many requests wait on the pretend model
at once (Django runs plain views of an ASGI server one at a time in a single thread).
Under WSGI Django runs it in the worker's thread, and a streamed answer is a plain
generator there, an async one under ASGI, as each server iterates its own kind.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping

from django.core.handlers.wsgi import WSGIRequest
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from examples.pretend_model import WORD_S, Chat, InFlight, InvalidChat

in_flight = InFlight()


async def chat_completions(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    if request.method != "POST":
        return JsonResponse({"error": {"message": "POST only", "code": None}}, status=405)
    try:
        chat = Chat.parse_bytes(request.body)
    except InvalidChat as exc:
        return JsonResponse(exc.document(), status=400)
    headers = {"x-obleth-tenant": str(admitted(request)["tenant"])}
    if chat.stream:
        events = _written(chat) if isinstance(request, WSGIRequest) else _written_async(chat)
        return StreamingHttpResponse(events, content_type="text/event-stream", headers=headers)
    with in_flight:
        await asyncio.sleep(chat.seconds)
    return JsonResponse(chat.completion(), headers=headers)


def admitted(request: HttpRequest) -> Mapping[str, object]:
    """What the gateway decided about ``request``: tenant, priority, waited_s."""
    if isinstance(request, WSGIRequest):
        record: Mapping[str, object] = request.META["obleth"]
    else:
        record = request.scope["state"]["obleth"]
    return record


def _written(chat: Chat) -> Iterator[str]:
    with in_flight:
        for event in chat.events():
            time.sleep(WORD_S)
            yield event


async def _written_async(chat: Chat) -> AsyncIterator[str]:
    with in_flight:
        for event in chat.events():
            await asyncio.sleep(WORD_S)
            yield event


def stats(request: HttpRequest) -> JsonResponse:
    return JsonResponse(in_flight.stats())


def healthz(request: HttpRequest) -> HttpResponse:
    """Exempt from admission (``exempt_paths``): it answers during overload."""
    return HttpResponse("ok", content_type="text/plain")
