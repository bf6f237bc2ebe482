"""CompletionEndpoint: the ASGI app behind /v1/completions and /v1/chat/completions."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.sim.config import SimConfig
from gateway.sim.engine import SimEngine
from gateway.sim.generation import EngineStopped, Generation
from gateway.sim.kvcache import PromptTooLong
from gateway.sim.stats import Outcome, SimStats
from gateway.sim.wire import (
    CompletionRequest,
    Endpoint,
    FinishReason,
    InvalidRequest,
    chunk_body,
    error_body,
    new_response_id,
    parse_request,
    response_body,
    sse_event,
    unserved_model_body,
    usage_body,
    usage_chunk_body,
)
from gateway.types import Message, Receive, Scope, Send

FAIL_HEADER = b"x-sim-fail"
"""Request header asking for an error answer: its value is the status (400-599)."""


class CompletionEndpoint:
    """Serves one completion endpoint of the simulator and keeps its ground-truth count.

    Every call is counted in `stats` from entry until the final body message has been
    sent, or until the client disconnects (which also withdraws the request from the
    engine at once). A request with `x-sim-fail: <status>` is answered with that status
    and an OpenAI-style error body, without reaching the engine; so is a request naming
    a model other than the served one: 404, as vLLM answers it (a request naming no
    model, or an empty name, gets the served model, as on vLLM).
    """

    def __init__(self, endpoint: Endpoint, engine: SimEngine, stats: SimStats) -> None:
        self._endpoint: Endpoint = endpoint
        self._engine = engine
        self._stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._stats.request_arrived()
        left = False
        status = 0

        def leave(outcome: Outcome) -> None:
            nonlocal left
            if not left:
                left = True
                self._stats.request_left(outcome)

        async def counted_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            # Leave in the same loop step as the last send: the client cannot have a next
            # request processed before this one stops counting (see SimStats).
            if message["type"] == "http.response.body" and not message.get("more_body"):
                leave("completed" if status == 200 else "failed")

        try:
            await self._handle(scope, receive, counted_send, leave)
        finally:
            leave("disconnected")

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, leave: Callable[[Outcome], None]
    ) -> None:
        body = await _read_body(receive)
        if body is None:
            return
        fail = _header(scope, FAIL_HEADER)
        if fail is not None:
            await _send_failure(send, fail)
            return
        try:
            request = parse_request(self._endpoint, body)
        except InvalidRequest as exc:
            await _send_json(send, 400, error_body(exc.message, param=exc.param))
            return
        served = self._engine.config.model
        if request.model and request.model != served:
            await _send_json(send, 404, unserved_model_body(request.model, [served]))
            return
        prompt = self._engine.tokenize(request.prompt_text)
        try:
            _check_context(self._engine.config, prompt.num_tokens, request)
            generation = self._engine.submit(prompt, request.max_tokens)
        except PromptTooLong as exc:
            param = "prompt" if request.endpoint == "completions" else "messages"
            await _send_json(send, 400, error_body(str(exc), param=param))
            return
        except _TooManyTokens as exc:
            await _send_json(send, 400, error_body(str(exc), param=request.max_tokens_param))
            return
        try:
            # the request stops counting the moment the disconnect is seen, with its slot
            # in the engine: no later than the client's side can hand its seat on
            gone = functools.partial(_withdraw, generation, leave)
            if request.stream:
                await _unless_disconnected(self._stream(request, generation, send), receive, gone)
            else:
                await _unless_disconnected(self._respond(request, generation, send), receive, gone)
        finally:
            generation.cancel()

    async def _respond(
        self, request: CompletionRequest, generation: Generation, send: Send
    ) -> None:
        try:
            text = "".join([token async for token in generation])
        except EngineStopped as exc:
            await _send_json(send, 503, error_body(str(exc), error_type="server_error"))
            return
        body = response_body(
            request,
            response_id=new_response_id(request.endpoint),
            created=int(time.time()),
            model=self._engine.config.model,
            text=text,
            finish_reason="length",
            usage=_usage(generation),
        )
        await _send_json(send, 200, body)

    async def _stream(self, request: CompletionRequest, generation: Generation, send: Send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        fields: dict[str, Any] = {
            "response_id": new_response_id(request.endpoint),
            "created": int(time.time()),
            "model": self._engine.config.model,
        }
        produced = 0
        try:
            async for token in generation:
                produced += 1
                last = produced == generation.max_tokens
                finish: FinishReason | None = "length" if last else None
                chunk = chunk_body(
                    request, token=token, first=produced == 1, finish_reason=finish, **fields
                )
                await send(_body(sse_event(chunk)))
        except EngineStopped as exc:
            await send(_body(sse_event(error_body(str(exc), error_type="server_error"))))
        else:
            if request.include_usage:
                usage = usage_chunk_body(request, usage=_usage(generation), **fields)
                await send(_body(sse_event(usage)))
        await send(_body(sse_event("[DONE]"), more=False))


class _TooManyTokens(ValueError):
    """A ``max_tokens`` that cannot fit in the context beside the prompt."""


def _check_context(config: SimConfig, prompt_tokens: int, request: CompletionRequest) -> None:
    """``_TooManyTokens`` for a ``max_tokens`` the client gave that does not fit beside the
    prompt in the KV cache, this server's context: vLLM refuses it with a 400 rather than
    generate less than asked (a default, not given, is capped instead). A prompt over the
    whole context is ``PromptTooLong``'s, raised by the engine."""
    if request.max_tokens is None:
        return
    context = config.kv_cache_blocks * config.block_size_tokens
    room = context - prompt_tokens + 1  # the last token's KV is never needed
    if prompt_tokens <= context and request.max_tokens > room:
        raise _TooManyTokens(
            f"{request.max_tokens_param} is too large: {request.max_tokens}. The simulated KV "
            f"cache, this server's context, holds {context} tokens and the request has "
            f"{prompt_tokens} input tokens, which leaves room for {room} output tokens; ask "
            "for fewer, or start the simulator with a larger --kv-cache-blocks"
        )


def _body(data: bytes, *, more: bool = True) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


def _usage(generation: Generation) -> dict[str, Any]:
    return usage_body(
        generation.prompt_tokens, generation.completion_tokens, generation.cached_prompt_tokens
    )


def _withdraw(generation: Generation, leave: Callable[[Outcome], None]) -> None:
    generation.cancel()
    leave("disconnected")


async def _unless_disconnected(
    work: Coroutine[Any, Any, None], receive: Receive, gone: Callable[[], None]
) -> None:
    """Run `work` to completion, or cancel it as soon as the client disconnects; `gone` is
    called in the very step the disconnect is seen.

    The ASGI server's `send` may silently drop messages after a disconnect (uvicorn's
    does), so a stream cannot rely on `send` failing; it has to watch `receive`.
    """
    worker = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnected(receive, gone))
    try:
        await asyncio.wait((worker, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        worker.cancel()
        watcher.cancel()
        # Let the worker unwind (withdrawing its generation) before the request leaves.
        await asyncio.wait((worker, watcher))
    for task in (worker, watcher):
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error


async def _until_disconnected(receive: Receive, gone: Callable[[], None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone()


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None if the client went away first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value).decode("latin-1").strip()
    return None


async def _send_failure(send: Send, requested: str) -> None:
    try:
        status = int(requested)
    except ValueError:
        status = 0
    if not 400 <= status <= 599:
        message = f"x-sim-fail must be an HTTP error status from 400 to 599, got {requested!r}"
        await _send_json(send, 400, error_body(message, param="x-sim-fail"))
        return
    error_type = "server_error" if status >= 500 else "invalid_request_error"
    message = f"simulated failure: the request asked for {status} with x-sim-fail"
    await _send_json(send, status, error_body(message, error_type=error_type))


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send(_body(body, more=False))
