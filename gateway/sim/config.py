"""SimConfig: every knob of the simulated inference backend, with its unit."""

from __future__ import annotations

from dataclasses import dataclass, fields

from gateway.core.numbers import finite
from gateway.errors import ConfigError

# Smallest accepted value of each integer setting. prefix_cache_blocks may be 0: that
# turns prefix caching off, which benchmarks use as their cache-less baseline.
_INT_MINIMUMS = {
    "max_num_seqs": 1,
    "block_size_tokens": 1,
    "chars_per_token": 1,
    "prefix_cache_blocks": 0,
    "kv_cache_blocks": 1,
    "default_max_tokens": 1,
}
# Largest accepted value, where one too large would be built in memory: each generated
# token is text of chars_per_token characters (real tokenizers average about 4).
_INT_MAXIMUMS = {"chars_per_token": 100}
_DURATIONS = ("prefill_s_per_token", "step_s", "step_s_per_seq")
#: The longest each of them may be, in seconds: no model steps for a minute (real ones
#: take milliseconds), and near 1e17 s a clock that adds a 0.25 s polling interval no
#: longer moves, so a slip of the keyboard would never end.
MAX_DURATION_S = 60.0


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How the simulated backend behaves; immutable, validated on construction.

    The defaults stand for a small real GPU server running a 7-8B model: a 10 ms decode
    step plus 0.2 ms per sequence in the batch, and 0.2 ms per prompt token that misses the
    prefix cache (5,000 prompt tokens per second of prefill). Tests shrink or stretch
    these to make behaviour observable; nothing else depends on the defaults.

    Raises `gateway.errors.ConfigError` naming the first field with an unusable value.
    """

    model: str = "obleth-sim"
    """Model name served by /v1/models, echoed in responses and used as the `model_name`
    metric label. A request naming another model is answered 404 `NotFoundError`, as
    vLLM answers it; one naming none is answered as this one."""

    max_num_seqs: int = 32
    """Continuous-batching slots (sequences): how many requests decode at once. Requests
    beyond this wait in the engine's FIFO queue (`vllm:num_requests_waiting`)."""

    block_size_tokens: int = 16
    """Tokens per KV-cache block; the unit of prefix caching and of KV usage."""

    chars_per_token: int = 4
    """Characters per token of the stand-in tokenizer: a token is a fixed run of this
    many characters of the prompt text."""

    prefix_cache_blocks: int = 4096
    """Capacity of the prefix cache, in blocks, least recently used evicted first;
    0 disables prefix caching."""

    kv_cache_blocks: int = 8192
    """Size of the KV cache, in blocks of `block_size_tokens` tokens. A waiting request
    is admitted only when its prompt's blocks are free; a running sequence that needs a
    block when none is free preempts the newest running sequence. A prompt longer than
    the whole cache is refused, and generation stops when one sequence fills it."""

    max_num_batched_tokens: int | None = None
    """Tokens computed per step at most, shared by decodes (one per running sequence)
    and prefill chunks: a longer prompt is prefilled over several steps (chunked
    prefill). None turns chunked prefill off: every prompt is prefilled in one step.
    Must be >= `max_num_seqs`, as vLLM requires, so every running sequence can decode."""

    prefill_s_per_token: float = 0.0002
    """Seconds added to a step per prompt token it computes that missed the prefix cache
    (a recompute after a preemption and each prefill chunk included)."""

    step_s: float = 0.010
    """Seconds of the base decode step; a decoding sequence emits one token per step."""

    step_s_per_seq: float = 0.0002
    """Seconds added to a step per sequence computing in it (batch size cost)."""

    default_max_tokens: int = 16
    """Completion tokens generated when a request sets no `max_tokens`."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError("model", self.model, "must be a non-empty model name")
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name in _INT_MINIMUMS:
                minimum = _INT_MINIMUMS[field.name]
                # bool is an int subclass; True as a slot count is a mistake, not a 1.
                if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                    raise ConfigError(field.name, value, f"must be an integer >= {minimum}")
                most = _INT_MAXIMUMS.get(field.name)
                if most is not None and value > most:
                    raise ConfigError(field.name, value, f"must be an integer <= {most}")
            elif field.name in _DURATIONS and (
                not finite(value) or not 0 <= value <= MAX_DURATION_S
            ):
                raise ConfigError(
                    field.name, value, f"must be a number of seconds from 0 to {MAX_DURATION_S:g}"
                )
        budget = self.max_num_batched_tokens
        if budget is not None and (
            not isinstance(budget, int) or isinstance(budget, bool) or budget < self.max_num_seqs
        ):
            raise ConfigError(
                "max_num_batched_tokens",
                budget,
                f"must be an integer >= max_num_seqs ({self.max_num_seqs}), so that every "
                "running sequence can decode in each step; leave it unset (None) for no "
                "chunked prefill",
            )
