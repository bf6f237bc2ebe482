"""The OpenAI wire format the simulator speaks: request parsing, response and chunk bodies."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.errors import OblethError
from gateway.sim.tokens import chat_prompt_text, completion_prompt_text

Endpoint = Literal["completions", "chat"]
FinishReason = Literal["length"]


class InvalidRequest(OblethError):
    """A request body the simulator refuses; becomes a 400 `invalid_request_error`."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """What the simulator takes from a completions or chat completions request."""

    endpoint: Endpoint
    model: str | None
    """The `model` the request names; None when it names none (the served model then)."""
    prompt_text: str
    """The prompt as one string (chat messages serialized in order)."""
    max_tokens: int | None
    """Requested completion length; None means the simulator's default."""
    max_tokens_param: str
    """The parameter ``max_tokens`` came from (``max_completion_tokens`` or ``max_tokens``),
    for an error about it."""
    stream: bool
    include_usage: bool
    """`stream_options.include_usage`: end the stream with a usage chunk."""


def parse_request(endpoint: Endpoint, body: bytes) -> CompletionRequest:
    """Validate a request body; raise `InvalidRequest` naming the offending parameter.

    Fields the simulator does not model (temperature, stop, tools, ...) are accepted and
    ignored; `model` must be a string when given (whether it is served is for the caller
    to check, see `unserved_model_body`).
    """
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        # ValueError covers bad UTF-8, bad JSON and integers too long to convert;
        # RecursionError, nesting deeper than the parser goes
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("request body must be a JSON object")
    max_param = "max_tokens"
    if endpoint == "completions":
        text = completion_prompt_text(_prompt(payload))
        max_tokens = _positive_int_or_none(payload, "max_tokens")
    else:
        text = chat_prompt_text(_messages(payload))
        max_tokens = _positive_int_or_none(payload, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _positive_int_or_none(payload, "max_tokens")
        else:
            max_param = "max_completion_tokens"
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("model must be a string", "model")
    n = payload.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise InvalidRequest("the simulator generates one choice per request; n must be 1", "n")
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("stream must be a boolean", "stream")
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("stream_options must be an object", "stream_options")
    include_usage = (options or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise InvalidRequest("include_usage must be a boolean", "stream_options.include_usage")
    if options and not stream:  # as vLLM (an empty object passes): a client learns now
        raise InvalidRequest(
            "stream_options can only be given with stream set to true", "stream_options"
        )
    return CompletionRequest(
        endpoint=endpoint,
        model=model,
        prompt_text=text,
        max_tokens=max_tokens,
        max_tokens_param=max_param,
        stream=bool(stream),
        include_usage=bool(include_usage),
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int_or_none(payload: dict[str, Any], name: str) -> int | None:
    value = payload.get(name)
    if value is None:
        return None
    if not _is_int(value) or value < 1:
        raise InvalidRequest(f"{name} must be an integer >= 1, got {value!r}", name)
    result: int = value
    return result


def _prompt(payload: dict[str, Any]) -> str | list[str]:
    prompt = payload.get("prompt")
    if prompt is None:
        raise InvalidRequest("prompt is required", "prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(item, str) for item in prompt):
        return prompt
    raise InvalidRequest(
        "prompt must be a string or a non-empty list of strings "
        "(token-id prompts are not simulated)",
        "prompt",
    )


def _messages(payload: dict[str, Any]) -> list[tuple[str, str]]:
    messages = payload.get("messages")
    if messages is None:
        raise InvalidRequest("messages is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty array of message objects", "messages")
    pairs: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"{where} must be an object", where)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequest(f"{where}.role must be a non-empty string", f"{where}.role")
        pairs.append((role, _content_text(message.get("content"), f"{where}.content")))
    return pairs


def _content_text(content: object, where: str) -> str:
    """Message content as text: a string, null (e.g. tool calls only) or content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string, null or an array of parts", where)
    texts: list[str] = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidRequest(f"{where}[{index}] must be an object with a type", where)
        if part["type"] == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequest(f"{where}[{index}].text must be a string", where)
            texts.append(text)
        else:
            # Images and other parts have no text; their JSON stands in, so that prompts
            # differing only there still hash differently.
            texts.append(json.dumps(part, sort_keys=True))
    return "".join(texts)


def error_body(
    message: str,
    *,
    error_type: str = "invalid_request_error",
    param: str | None = None,
    code: int | None = None,
) -> dict[str, Any]:
    """An OpenAI-style error body."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def unserved_model_body(model: str, served: Sequence[str]) -> dict[str, Any]:
    """The body of the 404 that answers a request for a model not served, in vLLM's shape
    (its `type` is `NotFoundError`, its `code` the status, its `param` `model`), with the
    served names in the message, so that a misconfigured client learns what to ask for."""
    message = f"The model `{model}` does not exist; this backend serves: {', '.join(served)}."
    return error_body(message, error_type="NotFoundError", param="model", code=404)


def usage_body(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """The `usage` object; `prompt_tokens_details.cached_tokens` counts prefix-cache hits."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def new_response_id(endpoint: Endpoint) -> str:
    """A fresh response id with OpenAI's prefix for the endpoint."""
    return f"{'cmpl' if endpoint == 'completions' else 'chatcmpl'}-{uuid.uuid4().hex}"


def response_body(
    request: CompletionRequest,
    *,
    response_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: FinishReason,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """The whole non-streamed response."""
    choice: dict[str, Any]
    if request.endpoint == "completions":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    else:
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        kind = "chat.completion"
    return {
        "id": response_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def chunk_body(
    request: CompletionRequest,
    *,
    response_id: str,
    created: int,
    model: str,
    token: str,
    first: bool,
    finish_reason: FinishReason | None,
) -> dict[str, Any]:
    """One streamed chunk carrying one token; the first chat chunk also carries the role."""
    choice: dict[str, Any]
    if request.endpoint == "completions":
        choice = {"index": 0, "text": token, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    else:
        delta = {"role": "assistant", "content": token} if first else {"content": token}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        kind = "chat.completion.chunk"
    return {
        "id": response_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [choice],
    }


def usage_chunk_body(
    request: CompletionRequest, *, response_id: str, created: int, model: str, usage: dict[str, Any]
) -> dict[str, Any]:
    """The last chunk of a stream asked for with `stream_options.include_usage`."""
    kind = "text_completion" if request.endpoint == "completions" else "chat.completion.chunk"
    return {
        "id": response_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage,
    }


def sse_event(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event: `data: <json>` (or a literal such as [DONE]) and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
