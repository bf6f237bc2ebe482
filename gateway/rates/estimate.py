"""How many tokens a request is expected to cost, before it runs: what ``tenant_tpm``
reserves.

The gateway has no tokenizer for the model behind it, and must decide before the backend
has seen the request, so the estimate is deliberately simple and stated in the docs: the
prompt's UTF-8 bytes divided by ``BYTES_PER_TOKEN`` (rounded up; close for English with
the common BPE vocabularies, high for code, low for some scripts), plus the tokens the
request may generate (``max_completion_tokens``, else ``max_tokens``, else
``default_max_tokens``), times ``n`` completions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gateway.routing.request import parse_body, prompt_text

#: Prompt bytes counted as one token.
BYTES_PER_TOKEN: Final[int] = 4

#: No estimate goes beyond this: a body may state any integer, and Redis' numbers are
#: doubles (a budget is at most 10^9 per minute, so this is refused all the same).
MAX_ESTIMATE: Final[int] = 10**12


def estimate_tokens(body: bytes | None, default_max_tokens: int) -> int:
    """The tokens the request with JSON ``body`` is expected to cost; a body that is no
    OpenAI-style JSON object (or none) costs ``default_max_tokens``."""
    return tokens_of(parse_body(body), default_max_tokens)


def tokens_of(payload: Mapping[str, object] | None, default_max_tokens: int) -> int:
    """``estimate_tokens`` of a body already parsed."""
    if payload is None:
        return default_max_tokens
    prompt = -(-len(prompt_text(payload)) // BYTES_PER_TOKEN)
    output = _count(payload.get("max_completion_tokens"))
    if output is None:
        output = _count(payload.get("max_tokens"))
    if output is None:
        output = default_max_tokens
    choices = _count(payload.get("n"))
    if choices is not None and choices > 1:
        output *= choices
    return min(prompt + output, MAX_ESTIMATE)


def _count(value: object) -> int | None:
    """A whole number of at least 0 as JSON gives it; None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return min(value, MAX_ESTIMATE)
    return None
