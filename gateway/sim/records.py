"""Records the step model (`gateway.sim.batch`) hands its drivers: sequences, steps, counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.sim.tokens import TokenizedPrompt

SequenceState = Literal["waiting", "running", "finished", "withdrawn"]


@dataclass(slots=True, eq=False)
class Sequence:
    """One request as the batch sees it; the `Batch` updates it, callers only read it.

    Times are the `now` values the batch was given.
    """

    seq_id: int
    prompt: TokenizedPrompt
    max_tokens: int
    """Tokens it generates in all; at most what fits in the KV cache after its prompt."""
    arrived_at: float
    state: SequenceState = "waiting"
    generated: int = 0
    """Tokens produced so far; kept through preemptions (the client already has them)."""
    computed: int = 0
    """Tokens whose KV exists: prefix-cache hits plus what steps computed. 0 while waiting."""
    prefill_end: int = 0
    """`computed` at which the current prefill ends: the prompt, plus the tokens already
    generated when it is a recompute after a preemption."""
    cached_prompt_tokens: int = 0
    """Prompt tokens found in the prefix cache at the first admission (the usage's
    `cached_tokens`, as vLLM reports it)."""
    admitted_at: float | None = None
    """First admission; a re-admission after a preemption leaves it."""
    first_token_at: float | None = None
    last_token_at: float | None = None
    """When its latest token came (the client's stream has it by then)."""
    last_gap_s: float = 0.0
    """The wait before its latest token (0 before its second)."""
    longest_gap_s: float = 0.0
    """The longest wait between two of its tokens: a stall the client saw, as a preemption
    and its recompute cause."""
    finished_at: float | None = None
    preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return self.prompt.num_tokens + self.generated

    @property
    def prefilling(self) -> bool:
        """True while the prompt (or the recompute) is not fully computed."""
        return self.computed < self.prefill_end


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What a step computes, decided at its start by `Batch.begin_step()`."""

    started_at: float
    duration_s: float
    """step_s + step_s_per_seq * scheduled + prefill_s_per_token * prefill_tokens."""
    scheduled: int
    """Sequences computing at least one token in this step."""
    prefill_tokens: int
    """Prompt and recompute tokens computed in this step (decode tokens excluded)."""
    admitted: tuple[Sequence, ...]
    """Sequences that left the waiting queue at the start of this step, in order."""
    preempted: tuple[Sequence, ...]
    """Sequences sent back to the front of the waiting queue, newest first."""


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a step produced, reported by `Batch.end_step()`."""

    plan: StepPlan
    ended_at: float
    emitted: tuple[Sequence, ...]
    """Sequences that produced one token (their `generated` already counts it), in
    admission order; a prefill chunk that does not end the prompt produces none."""
    finished: tuple[Sequence, ...]
    """Of those, the ones that reached `max_tokens` and left the batch."""


@dataclass(slots=True)
class BatchCounters:
    """Counters since construction or `Batch.reset()`."""

    steps: int = 0
    prefix_cache_query_tokens: int = 0
    """Tokens to compute at each admission (vLLM's prefix-cache queries)."""
    prefix_cache_hit_tokens: int = 0
    """Of those, the tokens found in the prefix cache."""
    finished: int = 0
    withdrawn: int = 0
    preemptions: int = 0
