"""The simulator's stand-in tokenizer: prompt text, token counts, block hashes, filler output."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

_DIGEST_BYTES = 16
# Parent of block 0, so every block is hashed from the same shape of input.
_ROOT_HASH = bytes(_DIGEST_BYTES)
_FILLER = "The quick brown fox jumps over the lazy dog while the simulator keeps time. "


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    """What the engine needs to know about a prompt."""

    num_tokens: int
    """Prompt length in tokens; at least 1."""

    block_hashes: tuple[bytes, ...]
    """Chained hash of each full block, in order; a trailing partial block has none."""


def tokenize(text: str, *, chars_per_token: int, block_size_tokens: int) -> TokenizedPrompt:
    """Cut `text` into tokens of `chars_per_token` characters and hash its full blocks.

    The count rounds up, with a minimum of one token (a real tokenizer adds a start
    token even to an empty prompt). Block i covers characters
    [i * block_size_tokens * chars_per_token, (i + 1) * ...) and its hash is
    blake2b(hash of block i-1 + UTF-8 of block i), so two prompts share the hash of
    block i exactly when they share their first i + 1 blocks. Hashes are the same in
    every process and on every run (unlike Python's salted `hash`), so separate
    simulator processes and benchmark runs agree on them.
    """
    if chars_per_token < 1 or block_size_tokens < 1:
        raise ValueError("chars_per_token and block_size_tokens must be >= 1")
    num_tokens = max(1, -(-len(text) // chars_per_token))
    block_chars = block_size_tokens * chars_per_token
    hashes: list[bytes] = []
    parent = _ROOT_HASH
    for start in range(0, len(text) - block_chars + 1, block_chars):
        block = text[start : start + block_chars].encode("utf-8", "surrogatepass")
        parent = hashlib.blake2b(parent + block, digest_size=_DIGEST_BYTES).digest()
        hashes.append(parent)
    return TokenizedPrompt(num_tokens=num_tokens, block_hashes=tuple(hashes))


def completion_prompt_text(prompt: str | Sequence[str]) -> str:
    """The text of a /v1/completions `prompt`.

    A list of strings is read as one prompt, its items joined by newlines: the simulator
    does not fan a list out into one completion per item as OpenAI does.
    """
    if isinstance(prompt, str):
        return prompt
    return "\n".join(prompt)


def chat_prompt_text(messages: Sequence[tuple[str, str]]) -> str:
    """The text of a /v1/chat/completions `messages` list of (role, content) pairs.

    Every message is written in order as its role and content, then an assistant header
    is appended as a chat template's generation prompt does. The serialization of an
    assistant message starts with that same header, so the prompt of a conversation's
    next turn extends the prompt of the previous one and hits the prefix cache, as it
    does on a real server.
    """
    parts = [f"<|{role}|>\n{content}<|end|>\n" for role, content in messages]
    parts.append("<|assistant|>\n")
    return "".join(parts)


def filler_token(index: int, *, chars_per_token: int) -> str:
    """Text of output token number `index` (from 0): deterministic filler.

    Each token is exactly `chars_per_token` characters, so a generated text of n tokens
    tokenizes back to n tokens when a client sends it as conversation history.
    """
    start = (index * chars_per_token) % len(_FILLER)
    doubled = _FILLER * (2 + chars_per_token // len(_FILLER))
    return doubled[start : start + chars_per_token]
