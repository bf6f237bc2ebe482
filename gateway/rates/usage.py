"""``UsageMeter``: the tokens a response says its request used, read as the response
passes, so that a tenant's token budget is charged what the backend counted rather than
the estimate taken before admission.

An OpenAI-style backend (vLLM, SGLang, OpenAI itself) reports ``"usage": {"prompt_tokens",
"completion_tokens", "total_tokens"}``: in a JSON response's body, and in a streamed one's
last event when the client asked for it (``"stream_options": {"include_usage": true}``;
vLLM's ``continuous_usage_stats`` puts it in every event, and the last one counts). A
response without it (a stream that did not ask, an error, another kind of app) leaves the
estimate as it was.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, TypeGuard

from gateway.types import Message, Send

#: The most of a JSON response kept to read its usage; a larger one keeps the estimate.
MAX_JSON_BYTES: Final[int] = 1 << 20
#: The most of one streamed event kept while it is incomplete.
MAX_EVENT_BYTES: Final[int] = 1 << 20

_JSON, _EVENTS = 1, 2


class UsageReader:
    """Reads one response's usage from its status, headers and body chunks, in order:
    ``started``, ``read`` for each chunk, then ``ended``, which answers the
    ``total_tokens`` reported, or None. Reads only a 2xx response that is JSON or an event
    stream, not compressed. Used on the loop (``UsageMeter``) and in a WSGI worker thread
    alike; one reader per response."""

    __slots__ = ("_kept", "_kind", "_used")

    def __init__(self) -> None:
        self._kind = 0  # 0: nothing to read (not yet started, or not a kind it reads)
        self._kept = b""
        self._used: int | None = None

    def started(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self._kind = _kind_of(status, headers)

    def read(self, body: bytes) -> None:
        kind = self._kind
        if not kind or not body:
            return
        kept = self._kept + body if self._kept else body
        if kind == _JSON:
            if len(kept) > MAX_JSON_BYTES:
                self._kind, kept = 0, b""
            self._kept = kept
            return
        # events end with a blank line; only whole ones are read, the rest is kept
        *whole, rest = kept.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in whole:
            if b'"total_tokens"' in event:  # not the "usage": null of every other event
                used = _event_usage(event)
                if used is not None:
                    self._used = used
        self._kept = rest if len(rest) <= MAX_EVENT_BYTES else b""

    def ended(self) -> int | None:
        kind, self._kind = self._kind, 0
        kept, self._kept = self._kept, b""
        if kind == _JSON:
            return _usage(kept)
        return self._used if kind == _EVENTS else None


class UsageMeter:
    """Wraps a ``send``: passes every message on unchanged, and when the response ends
    with its last chunk, calls ``settle(total_tokens)`` with the usage it reported, if it
    reported one (``UsageReader``), before that chunk is passed on."""

    __slots__ = ("_reader", "_send", "_settle")

    def __init__(self, send: Send, settle: Callable[[int], None]) -> None:
        self._send = send
        self._settle = settle
        self._reader = UsageReader()

    def __call__(self, message: Message) -> Awaitable[None]:
        kind = message["type"]
        if kind == "http.response.body":
            reader = self._reader
            reader.read(message.get("body", b""))
            if not message.get("more_body", False):
                used = reader.ended()
                if used is not None:
                    self._settle(used)
        elif kind == "http.response.start":
            self._reader.started(message["status"], message.get("headers", ()))
        return self._send(message)


def _kind_of(status: int, headers: Iterable[tuple[bytes, bytes]]) -> int:
    if not 200 <= status < 300:
        return 0
    content_type = b""
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            return 0
        if lowered == b"content-type":
            content_type = value.split(b";", 1)[0].strip().lower()
    if content_type == b"text/event-stream":
        return _EVENTS
    if content_type == b"application/json":
        return _JSON
    return 0


def _event_usage(event: bytes) -> int | None:
    data = b"\n".join(
        line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
    )
    return _usage(data)


def _usage(document: bytes) -> int | None:
    """The ``total_tokens`` a JSON object's ``usage`` reports (or its prompt plus completion
    tokens); None when it reports none, or is not such an object."""
    if b'"usage"' not in document:
        return None
    try:
        usage = json.loads(document).get("usage")
    except (ValueError, AttributeError):
        return None
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if _whole(total):
        return total
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if _whole(prompt) and _whole(completion):
        return prompt + completion
    return None


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
