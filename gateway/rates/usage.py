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
    alike; one reader per response.

    What it costs: a JSON body's chunks are kept (up to ``MAX_JSON_BYTES``) and only its
    ``usage`` object is parsed, once, at the end; a stream is split into events as it
    passes, and only the last event that names a usage is kept, and parsed at the end."""

    __slots__ = ("_kept", "_kind", "_last", "_parts", "_size")

    def __init__(self) -> None:
        self._kind = 0  # 0: nothing to read (not yet started, or not a kind it reads)
        self._parts: list[bytes] = []  # a JSON body's chunks
        self._size = 0
        self._kept = b""  # a stream's event still incomplete
        self._last = b""  # a stream's last whole event that names a usage

    def started(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self._kind = _kind_of(status, headers)

    def read(self, body: bytes) -> None:
        kind = self._kind
        if not kind or not body:
            return
        if kind == _JSON:
            self._size += len(body)
            if self._size > MAX_JSON_BYTES:
                self._kind, self._parts = 0, []
            else:
                self._parts.append(body)
            return
        # events end with a blank line; only whole ones are looked at, the rest is kept
        kept = self._kept + body if self._kept else body
        held = b""
        if kept.endswith(b"\r"):  # maybe half of a CR LF: read with the next chunk
            kept, held = kept[:-1], b"\r"
        if b"\r" in kept:  # lines may end in CR LF, LF or CR
            kept = kept.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *whole, rest = kept.split(b"\n\n")
        for event in whole:
            if b'"usage"' in event:
                self._last = event
        self._kept = rest + held if len(rest) <= MAX_EVENT_BYTES else b""

    def ended(self) -> int | None:
        kind, self._kind = self._kind, 0
        if kind == _JSON:
            document, self._parts = b"".join(self._parts), []
            return _usage_in(document)
        if kind == _EVENTS:
            last = self._kept if b'"usage"' in self._kept else self._last
            self._kept = self._last = b""
            return _event_usage(last) if last else None
        return None


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
    return _usage_in(data)


_DECODER = json.JSONDecoder()


def _usage_in(document: bytes) -> int | None:
    """The tokens the usage object of a JSON document reports (its ``total_tokens``, else
    prompt plus completion tokens); None when it reports none. Only that object is parsed:
    the last ``"usage":`` followed by counts, where OpenAI-style servers put it, after the
    answer; a later ``"usage"`` that holds none (a log-prob's token, a string) is passed
    over, and one inside the answer's text is escaped and never matches."""
    end = len(document)
    for _ in range(_USAGE_TRIES):
        at = document.rfind(b'"usage"', 0, end)
        if at < 0:
            return None
        found = _usage_at(document, at + len(b'"usage"'))
        if found is not None:
            return found
        end = at  # a key of the same name further in (a log-prob's token), or a string
    return None


#: how many ``"usage"`` a document is searched back through for the one with counts
_USAGE_TRIES = 8


def _usage_at(document: bytes, after: int) -> int | None:
    """The tokens the usage object right after a ``"usage"`` at ``after`` reports."""
    text = document[after:].lstrip()
    if not text.startswith(b":"):
        return None
    try:
        usage, _ = _DECODER.raw_decode(text[1:].lstrip().decode("utf-8", "replace"))
    except ValueError:
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
