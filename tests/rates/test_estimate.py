"""What ``tenant_tpm`` reserves for a request, before it runs: prompt bytes / 4 plus what
it may generate, times ``n``; documented, so users can predict their budgets."""

from __future__ import annotations

import json

import pytest

from gateway.rates.estimate import MAX_ESTIMATE, PART_TOKENS, estimate_tokens, request_tokens


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_a_completion_costs_its_prompt_bytes_over_4_plus_max_tokens() -> None:
    assert estimate_tokens(body(prompt="x" * 41, max_tokens=10), 256) == 11 + 10


def test_a_chat_request_counts_every_message_and_its_role() -> None:
    messages = [
        {"role": "system", "content": "s" * 10},
        {"role": "user", "content": [{"type": "text", "text": "y" * 40}]},
    ]
    # "system" + 10 + "user" + 40 bytes: 60 bytes, 15 tokens
    assert estimate_tokens(body(messages=messages, max_tokens=0), 256) == 15


def test_an_image_counts_a_fixed_cost_not_its_base64_bytes() -> None:
    """A 300 KB data URL would be 75 000 tokens as text; models see a few hundred to a few
    thousand."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 300_000}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}]
    assert estimate_tokens(body(messages=messages, max_tokens=0), 0) == 4 + PART_TOKENS


def test_max_completion_tokens_wins_over_max_tokens_and_n_multiplies_the_output() -> None:
    assert estimate_tokens(body(prompt="", max_tokens=100, max_completion_tokens=7), 256) == 7
    assert estimate_tokens(body(prompt="", max_tokens=10, n=3), 256) == 30


@pytest.mark.parametrize("stated", ["5000.0", 5000.0, "5000", " 5000 "])
def test_whole_numbers_are_read_as_the_backends_read_them(stated: object) -> None:
    """vLLM's pydantic models take 5000.0 and "5000" for 5000: so does the estimate, or a
    client could generate 5000 tokens on an estimate of the default."""
    assert estimate_tokens(body(prompt="", max_tokens=stated), 256) == 5000
    assert estimate_tokens(body(prompt="", max_tokens=10, n=str(stated).strip()), 0) == 50000


@pytest.mark.parametrize("stated", [None, -1, True, "12a", 1.5, "5e3"])
def test_a_request_that_states_no_usable_max_tokens_is_expected_to_use_the_default(
    stated: object,
) -> None:
    assert estimate_tokens(body(prompt="", max_tokens=stated), 256) == 256


@pytest.mark.parametrize("raw", [None, b"", b"not json!", b"[1, 2, 3]"])
def test_a_body_that_is_no_json_object_costs_its_bytes_and_the_default(raw: bytes | None) -> None:
    assert estimate_tokens(raw, 99) == 99 + (len(raw or b"") + 3) // 4


def test_a_body_the_gateway_did_not_read_costs_its_declared_length() -> None:
    """Too large to read, or not JSON: a server that parses it anyway must not get it free."""
    scope = {"headers": [(b"content-length", b"40000")]}
    assert request_tokens(None, scope, 256) == 10_000 + 256
    assert request_tokens(None, {"headers": []}, 256) == 256  # chunked: only the default


def test_an_absurd_max_tokens_is_bounded() -> None:
    assert estimate_tokens(body(prompt="", max_tokens=10**30, n=10**30), 0) == MAX_ESTIMATE


def test_a_prompt_nested_as_deep_as_the_parser_goes_is_priced_without_a_fault() -> None:
    """JSON the parser only just takes may be too deep to measure again (a few calls
    deeper): such a body is priced by its length, like one that is no JSON, never with a
    RecursionError (which its client would get as a 500). Every depth from well under
    the parser's limit to past it."""
    for depth in range(600, 1100):
        nested = "[" * depth + "]" * depth
        chat = f'{{"messages": [{{"role": "user", "content": [{nested}]}}]}}'.encode()
        completion = f'{{"prompt": [{nested}]}}'.encode()
        for raw in (chat, completion):
            assert 16 <= estimate_tokens(raw, 16) <= -(-len(raw) // 4) + 16, depth
