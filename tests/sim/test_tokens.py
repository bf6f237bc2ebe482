"""The stand-in tokenizer: token counts, chained block hashes, prompt serialization."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gateway.sim.tokens import (
    chat_prompt_text,
    completion_prompt_text,
    filler_token,
    tokenize,
)


def _tokens(text: str) -> tuple[int, int]:
    """(token count, full blocks) with 2 characters per token and 3 tokens per block."""
    prompt = tokenize(text, chars_per_token=2, block_size_tokens=3)
    return prompt.num_tokens, len(prompt.block_hashes)


@pytest.mark.parametrize(
    ("text", "tokens", "blocks"),
    [
        ("", 1, 0),  # even an empty prompt is one token
        ("a", 1, 0),
        ("ab", 1, 0),
        ("abc", 2, 0),  # a partial token still counts
        ("abcdef", 3, 1),
        ("abcdefg", 4, 1),  # a partial block has no hash
        ("abcdefghijkl", 6, 2),
    ],
)
def test_tokens_are_fixed_runs_of_characters_and_only_full_blocks_are_hashed(
    text: str, tokens: int, blocks: int
) -> None:
    """Token count rounds up; one hash per full block."""
    assert _tokens(text) == (tokens, blocks)


def test_equal_block_hashes_mean_equal_whole_prefixes() -> None:
    """Hash i matches only when blocks 0..i all match."""

    def hashes(text: str) -> tuple[bytes, ...]:
        return tokenize(text, chars_per_token=1, block_size_tokens=4).block_hashes

    base = hashes("AAAABBBBCCCC")
    same_head = hashes("AAAABBBBXXXX")
    other_head = hashes("XXXXBBBBCCCC")
    assert base[:2] == same_head[:2]
    assert base[2] != same_head[2]
    # Same block 1 and 2 text after a different block 0: nothing matches.
    assert all(a != b for a, b in zip(base, other_head, strict=True))


def test_block_hashes_are_the_same_in_every_process() -> None:
    """Hashes do not depend on Python's per-process hash salt."""
    code = (
        "from gateway.sim.tokens import tokenize;"
        "print(tokenize('x' * 64 + 'y' * 64, chars_per_token=4, block_size_tokens=16)"
        ".block_hashes[-1].hex())"
    )
    here = tokenize("x" * 64 + "y" * 64, chars_per_token=4, block_size_tokens=16)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root}
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        assert result.stdout.strip() == here.block_hashes[-1].hex()


def test_a_prompt_list_is_one_prompt_of_its_items_in_order() -> None:
    """A completions prompt list is joined in order; a string is used as is."""
    assert completion_prompt_text("hello") == "hello"
    assert completion_prompt_text(["a", "b"]) == "a\nb"
    assert completion_prompt_text(["a", "b"]) != completion_prompt_text(["b", "a"])


def test_chat_serialization_depends_on_every_role_and_content_in_order() -> None:
    """Changing a role, a content or the order of messages changes the prompt."""
    base = chat_prompt_text([("system", "be brief"), ("user", "hi")])
    assert "be brief" in base
    assert "hi" in base
    assert base != chat_prompt_text([("user", "be brief"), ("user", "hi")])
    assert base != chat_prompt_text([("system", "be brief"), ("user", "hello")])
    assert base != chat_prompt_text([("user", "hi"), ("system", "be brief")])
    assert base == chat_prompt_text([("system", "be brief"), ("user", "hi")])


def test_next_chat_turn_extends_the_previous_prompt() -> None:
    """A conversation's next turn starts with the previous turn's prompt (cache reuse)."""
    first = chat_prompt_text([("system", "s"), ("user", "q1")])
    second = chat_prompt_text(
        [("system", "s"), ("user", "q1"), ("assistant", "a1"), ("user", "q2")]
    )
    assert second.startswith(first)


@pytest.mark.parametrize("chars_per_token", [1, 4, 7, 200])
def test_generated_text_tokenizes_back_to_its_token_count(chars_per_token: int) -> None:
    """n filler tokens are n tokens again when sent back as history."""
    text = "".join(filler_token(i, chars_per_token=chars_per_token) for i in range(50))
    prompt = tokenize(text, chars_per_token=chars_per_token, block_size_tokens=16)
    assert prompt.num_tokens == 50
