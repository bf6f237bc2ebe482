"""What ``tenant_tpm`` reserves for a request, before it runs: prompt bytes / 4 plus what
it may generate, times ``n``; documented, so users can predict their budgets."""

from __future__ import annotations

import json

import pytest

from gateway.rates.estimate import MAX_ESTIMATE, estimate_tokens


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_a_completion_costs_its_prompt_bytes_over_4_plus_max_tokens() -> None:
    assert estimate_tokens(body(prompt="x" * 41, max_tokens=10), 256) == 11 + 10


def test_a_chat_request_counts_every_message_and_its_role() -> None:
    messages = [{"role": "user", "content": "y" * 40}]
    # "user" + separators + 40 bytes: 47 bytes, 12 tokens
    assert estimate_tokens(body(messages=messages, max_tokens=0), 256) == 12


def test_max_completion_tokens_wins_over_max_tokens_and_n_multiplies_the_output() -> None:
    assert estimate_tokens(body(prompt="", max_tokens=100, max_completion_tokens=7), 256) == 7
    assert estimate_tokens(body(prompt="", max_tokens=10, n=3), 256) == 30


@pytest.mark.parametrize("stated", [None, -1, True, "12", 1.5])
def test_a_request_that_states_no_usable_max_tokens_is_expected_to_use_the_default(
    stated: object,
) -> None:
    assert estimate_tokens(body(prompt="", max_tokens=stated), 256) == 256


@pytest.mark.parametrize("raw", [None, b"", b"not json", b"[1, 2]"])
def test_a_body_that_is_no_json_object_costs_the_default(raw: bytes | None) -> None:
    assert estimate_tokens(raw, 99) == 99


def test_an_absurd_max_tokens_is_bounded() -> None:
    assert estimate_tokens(body(prompt="", max_tokens=10**30, n=10**30), 0) == MAX_ESTIMATE
