"""``UsageMeter`` reads the usage an OpenAI-style response reports as it passes, in a JSON
body or a stream's events however they are cut into chunks, and reads nothing it cannot
trust: error statuses, compressed bodies, other content types, answers cut short."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.rates.usage import MAX_JSON_BYTES, UsageMeter
from gateway.types import Message

SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]
JSON = [(b"content-type", b"application/json")]


def answer(
    chunks: list[bytes], headers: list[tuple[bytes, bytes]], status: int = 200, end: bool = True
) -> tuple[list[int], list[Message]]:
    """What the meter settled and what it passed on, for a response sent in ``chunks``."""
    settled: list[int] = []
    passed: list[Message] = []

    async def send(message: Message) -> None:
        passed.append(message)

    async def respond() -> None:
        meter = UsageMeter(send, settled.append)
        await meter({"type": "http.response.start", "status": status, "headers": headers})
        for n, chunk in enumerate(chunks):
            more = not end or n < len(chunks) - 1
            await meter({"type": "http.response.body", "body": chunk, "more_body": more})

    asyncio.run(respond())
    return settled, passed


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def stream(usage_at_end: dict[str, Any] | None) -> bytes:
    tokens = [event({"choices": [{"text": t}], "usage": None}) for t in ("a", "b", "c")]
    last = [event({"choices": [], "usage": usage_at_end})] if usage_at_end else []
    return b"".join([*tokens, *last, b"data: [DONE]\n\n"])


def test_a_json_answer_settles_its_total_tokens_whatever_its_chunks() -> None:
    body = json.dumps({"choices": [{"text": "hi"}], "usage": {"total_tokens": 42}}).encode()
    settled, passed = answer([body[:10], body[10:30], body[30:]], JSON)
    assert settled == [42]
    assert b"".join(m.get("body", b"") for m in passed) == body  # passed on unchanged


@pytest.mark.parametrize("cut", [1, 7, 40, 1000])
def test_a_stream_settles_the_usage_of_its_last_event_cut_anywhere(cut: int) -> None:
    body = stream({"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8})
    chunks = [body[i : i + cut] for i in range(0, len(body), cut)]
    assert answer(chunks, SSE)[0] == [8]
    crlf = body.replace(b"\n", b"\r\n")
    assert answer([crlf[i : i + cut] for i in range(0, len(crlf), cut)], SSE)[0] == [8]


def test_continuous_usage_in_every_event_counts_the_last() -> None:
    body = b"".join(event({"usage": {"total_tokens": n}}) for n in (6, 7, 9))
    assert answer([body], SSE)[0] == [9]


def test_prompt_plus_completion_when_no_total_is_given() -> None:
    body = json.dumps({"usage": {"prompt_tokens": 10, "completion_tokens": 4}}).encode()
    assert answer([body], JSON)[0] == [14]


@pytest.mark.parametrize(
    ("chunks", "headers", "status", "end"),
    [
        ([stream(None)], SSE, 200, True),  # a stream that did not ask for usage
        ([b'{"usage": {"total_tokens": 5}}'], JSON, 429, True),  # an error's
        ([b'{"usage": {"total_tokens": 5}}'], [*JSON, (b"content-encoding", b"gzip")], 200, True),
        ([b'{"usage": {"total_tokens": 5}}'], [(b"content-type", b"text/plain")], 200, True),
        ([b'{"usage": {"total_tokens": 5}}'], JSON, 200, False),  # cut short: no last chunk
        ([b'{"usage": {"total_tokens": -5}}'], JSON, 200, True),
        ([b'{"usage": {"total_tokens": true}}'], JSON, 200, True),
        ([b'{"usage": "lots"}'], JSON, 200, True),
        ([b"[1, 2]"], JSON, 200, True),
        ([b'{"usage": {"total_tokens": 5'], JSON, 200, True),  # cut inside the usage
        ([b'{"usage": {"total_tokens": 5}, "x": "', b"y" * MAX_JSON_BYTES, b'"}'], JSON, 200, True),
    ],
)
def test_what_cannot_be_trusted_settles_nothing(
    chunks: list[bytes], headers: list[tuple[bytes, bytes]], status: int, end: bool
) -> None:
    assert answer(chunks, headers, status, end)[0] == []


def test_only_the_usage_object_is_read_and_a_usage_in_the_text_does_not_count() -> None:
    answer_text = 'the field is called "usage": {"total_tokens": 999}'
    body = json.dumps({"choices": [{"text": answer_text}], "usage": {"total_tokens": 7}})
    assert answer([body.encode()], JSON)[0] == [7]
    no_usage = json.dumps({"choices": [{"text": answer_text}]}).encode()
    assert answer([no_usage], JSON)[0] == []


def test_a_stream_reporting_prompt_and_completion_tokens_counts_their_sum() -> None:
    body = stream({"prompt_tokens": 5, "completion_tokens": 3})
    assert answer([body], SSE)[0] == [8]


@pytest.mark.parametrize("cut", [1, 3, 1000])
def test_events_ending_in_a_bare_cr_or_without_a_last_blank_line_are_read(cut: int) -> None:
    body = stream({"total_tokens": 8}).replace(b"\n", b"\r")
    assert answer([body[i : i + cut] for i in range(0, len(body), cut)], SSE)[0] == [8]
    unended = event({"usage": {"total_tokens": 4}}).rstrip(b"\n")
    assert answer([unended], SSE)[0] == [4]


def test_a_cr_lf_cut_between_chunks_does_not_split_an_event() -> None:
    """An event whose data spans two lines, its CR LF cut in two: still one event."""
    body = b'data: {"usage":\r\ndata: {"total_tokens": 6}}\r\n\r\n'
    at = body.index(b"\r") + 1
    assert answer([body[:at], body[at:]], SSE)[0] == [6]


def test_a_later_usage_key_without_counts_is_passed_over() -> None:
    """vLLM writes ``prompt_logprobs`` after ``usage``: a prompt token that reads
    ``usage`` is a key there, and the usage before it still counts."""
    body = json.dumps(
        {
            "choices": [],
            "usage": {"total_tokens": 12},
            "prompt_logprobs": [None, {"42": {"decoded_token": "x", "usage": -0.1}}],
            "metadata": {"usage": "n/a"},
        }
    ).encode()
    assert answer([body], JSON)[0] == [12]
