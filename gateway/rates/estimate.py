"""How many tokens a request is expected to cost, before it runs: what ``tenant_tpm``,
``global_max_tokens_in_flight`` and ``fairness_cost = "tokens"`` count.

The gateway has no tokenizer for the model behind it, and must decide before the backend
has seen the request, so the estimate is deliberately simple and stated in the docs:

- the prompt: the UTF-8 bytes of its text divided by ``BYTES_PER_TOKEN``, rounded up
  (close for English with the common BPE vocabularies, high for code, low for some
  scripts): ``prompt`` or ``input``, or each message's role and text; each part of a
  message that is not text (an image, audio) counts ``PART_TOKENS``, whatever its size
  (a base64 image is no measure of the tokens a model makes of it);
- plus what it may generate: ``max_completion_tokens``, else ``max_tokens``, else
  ``default_max_tokens``, times ``n`` completions. Whole numbers are read as the
  backends read them (pydantic): ``5000``, ``5000.0`` and ``"5000"`` alike.

A body that is no OpenAI-style JSON object (or that the gateway did not read: too large,
or not JSON; or whose prompt is nested too deep to measure) counts its bytes as prompt,
its declared ``Content-Length`` when it was not read, plus ``default_max_tokens``: a
server that parses it anyway is not given it free.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Final

from gateway.asgi.body import declared_length
from gateway.routing.request import parse_body
from gateway.types import Scope

#: Prompt bytes counted as one token.
BYTES_PER_TOKEN: Final[int] = 4

#: What a part of a message that is not text costs (an image of a few hundred tokens to a
#: few thousand, depending on the model and the image's size).
PART_TOKENS: Final[int] = 1024

#: No estimate goes beyond this: a body may state any number, and Redis' numbers are
#: doubles (a budget is at most 10^12, so this is refused all the same).
MAX_ESTIMATE: Final[int] = 10**12

_WHOLE = re.compile(r"\s*\+?\d+(\.0*)?\s*")


def request_tokens(body: bytes | None, scope: Scope, default_max_tokens: int) -> int:
    """The tokens the request of ``scope`` is expected to cost: from ``body``, the JSON the
    gateway read, or when it read none, from the length its headers declare."""
    if body is None:
        return _unparsed(declared_length(scope) or 0, default_max_tokens)
    return estimate_tokens(body, default_max_tokens)


def estimate_tokens(body: bytes | None, default_max_tokens: int) -> int:
    """The tokens the request with ``body`` is expected to cost."""
    payload = parse_body(body)
    if payload is None:
        return _unparsed(len(body) if body else 0, default_max_tokens)
    try:
        return tokens_of(payload, default_max_tokens)
    except RecursionError:  # a part nested too deep to measure again: priced by length
        assert body is not None
        return _unparsed(len(body), default_max_tokens)


def _unparsed(size: int, default_max_tokens: int) -> int:
    """A body of ``size`` bytes that is no JSON object: all prompt, and the default."""
    return min(-(-size // BYTES_PER_TOKEN) + default_max_tokens, MAX_ESTIMATE)


def tokens_of(payload: Mapping[str, object], default_max_tokens: int) -> int:
    """``estimate_tokens`` of a JSON object already parsed."""
    text, parts = _prompt(payload)
    prompt = -(-text // BYTES_PER_TOKEN) + parts * PART_TOKENS
    output = _count(payload.get("max_completion_tokens"))
    if output is None:
        output = _count(payload.get("max_tokens"))
    if output is None:
        output = default_max_tokens
    choices = _count(payload.get("n"))
    if choices is not None and choices > 1:
        output *= choices
    return min(prompt + output, MAX_ESTIMATE)


def _prompt(payload: Mapping[str, object]) -> tuple[int, int]:
    """The prompt's text bytes, and how many of its parts are not text."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        size, parts = 0, 0
        for message in messages:
            if not isinstance(message, dict):
                size += _size(message)
                continue
            size += _size(message.get("role"))
            content = message.get("content")
            for part in content if isinstance(content, list) else [content]:
                if isinstance(part, dict) and part.get("type", "text") != "text":
                    parts += 1
                else:
                    size += _size(part.get("text") if isinstance(part, dict) else part)
        return size, parts
    return _size(payload.get("prompt", payload.get("input"))), 0


def _size(value: object) -> int:
    """The UTF-8 bytes of a text, or of anything else as compact JSON; 0 for None."""
    if value is None:
        return 0
    if not isinstance(value, str):
        value = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return len(value.encode("utf-8", "surrogatepass"))


def _count(value: object) -> int | None:
    """A whole number of at least 0 as a backend reads it: an integer, a float with no
    fraction, or a string of digits; None for anything else (then the default counts)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and _WHOLE.fullmatch(value) and len(value) <= 30:
        value = int(float(value)) if "." in value else int(value)
    if isinstance(value, int) and value >= 0:
        return min(value, MAX_ESTIMATE)
    return None
