"""Batch: the simulated engine's step model (batching, prefix cache, KV blocks), with no clock.

One model, two clocks: `SimEngine` drives a `Batch` on the event loop's real time, and a
discrete-event simulation can drive the same `Batch` on a virtual clock. Every time is
an argument (`now`), never read; nothing here sleeps, awaits or does I/O, so the same
calls in the same order give the same steps, durations and outcomes.

A step has two halves, because things happen while it runs (requests arrive, clients
withdraw): `begin_step(now)` decides what the step computes and returns its duration;
`end_step(now)` is called when that duration has passed and says which sequences got a
token. Requests added in between wait for the next step; a sequence withdrawn in
between gets nothing from this one.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict

from gateway.sim.config import SimConfig
from gateway.sim.kvcache import KVCache, PromptTooLong
from gateway.sim.prefixcache import PrefixCache
from gateway.sim.records import BatchCounters, Sequence, StepPlan, StepResult
from gateway.sim.tokens import TokenizedPrompt


class Batch:
    """Continuous batching with a prefix cache and a bounded KV cache (see docs/sim.md).

    Each step, in order: running sequences, oldest first, get KV blocks for the tokens
    they compute (one decode token each, or the next prefill chunk); when a block is
    missing, the newest running sequence is preempted (back to the front of the waiting
    queue, its KV freed, recomputed when re-admitted) until it fits. Then, unless the
    step preempted, waiting requests are admitted first come first served while a batch
    slot, token budget and KV blocks for their prompt are free; the first that does not
    fit stops admission. Not thread-safe.
    """

    def __init__(self, config: SimConfig | None = None) -> None:
        self._config = config if config is not None else SimConfig()
        self._block = self._config.block_size_tokens
        self._prefix_cache = PrefixCache(self._config.prefix_cache_blocks)
        self._kv = KVCache(
            self._config.kv_cache_blocks, share_prefixes=self._config.prefix_cache_blocks > 0
        )
        self._waiting: OrderedDict[int, Sequence] = OrderedDict()
        self._running: dict[int, Sequence] = {}  # insertion order is admission order
        self._ids = itertools.count()
        self._step: tuple[StepPlan, list[tuple[Sequence, int]]] | None = None
        self.counters = BatchCounters()

    @property
    def config(self) -> SimConfig:
        return self._config

    @property
    def capacity_tokens(self) -> int:
        """Tokens the whole KV cache holds: the longest prompt `add()` accepts."""
        return self._config.kv_cache_blocks * self._block

    @property
    def running(self) -> tuple[Sequence, ...]:
        """Sequences in the batch, oldest admission first."""
        return tuple(self._running.values())

    @property
    def waiting(self) -> tuple[Sequence, ...]:
        """Sequences waiting for admission, next first."""
        return tuple(self._waiting.values())

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing waits: the next step would do nothing."""
        return not self._running and not self._waiting

    @property
    def kv_blocks_used(self) -> int:
        """KV blocks held by running sequences (a shared prefix block counts once)."""
        return self._kv.used

    @property
    def kv_cache_usage(self) -> float:
        """`kv_blocks_used` over `kv_cache_blocks`: 0..1."""
        return self._kv.used / self._kv.num_blocks

    def add(self, prompt: TokenizedPrompt, max_tokens: int, now: float) -> Sequence:
        """Queue a request at the back of the waiting queue and return its `Sequence`.

        Raises `PromptTooLong` when the prompt alone needs more than the whole KV cache.
        `max_tokens` (>= 1) is capped so that prompt and output fit in the cache, as a
        server's context length caps generation: a sequence alone always fits.
        """
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        capacity = self.capacity_tokens
        if prompt.num_tokens > capacity:
            raise PromptTooLong(prompt.num_tokens, self._config.kv_cache_blocks, self._block)
        # The last token's KV is never needed: it is the output, not an input.
        max_tokens = min(max_tokens, capacity - prompt.num_tokens + 1)
        sequence = Sequence(next(self._ids), prompt, max_tokens, now)
        self._waiting[sequence.seq_id] = sequence
        return sequence

    def withdraw(self, seq_id: int) -> Sequence | None:
        """Take a waiting or running sequence out now, freeing its KV; None if not there."""
        sequence = self._waiting.pop(seq_id, None) or self._running.pop(seq_id, None)
        if sequence is None:
            return None
        self._kv.release(seq_id)
        sequence.state = "withdrawn"
        self.counters.withdrawn += 1
        return sequence

    def begin_step(self, now: float) -> StepPlan:
        """Start a step at `now`: grow or preempt running sequences, admit waiting ones.

        Call `end_step()` before the next `begin_step()`.
        """
        if self._step is not None:
            raise RuntimeError("a step is in flight: call end_step() first")
        budget = self._config.max_num_batched_tokens
        left = math.inf if budget is None else budget
        # Decodes first, then prefill chunks from what is left of the budget.
        tokens: dict[int, int] = {}
        for sequence in self._running.values():
            if not sequence.prefilling:
                tokens[sequence.seq_id] = 1
                left -= 1
        for sequence in self._running.values():
            if sequence.prefilling:
                chunk = int(min(sequence.prefill_end - sequence.computed, left))
                tokens[sequence.seq_id] = chunk
                left -= chunk
        preempted = self._grow_running(tokens)
        scheduled = [(s, tokens[s.seq_id]) for s in self._running.values() if tokens[s.seq_id]]
        admitted: list[Sequence] = []
        # As vLLM: no admission in a step that had to preempt.
        while not preempted and self._waiting and left > 0:
            if len(self._running) >= self._config.max_num_seqs:
                break
            head = next(iter(self._waiting.values()))
            chunk = self._admit(head, left, now)
            if chunk == 0:
                break  # first come, first served: the head blocks those behind it
            scheduled.append((head, chunk))
            admitted.append(head)
            left -= chunk
        prefill_tokens = sum(n for s, n in scheduled if s.prefilling)
        config = self._config
        plan = StepPlan(
            started_at=now,
            duration_s=config.step_s
            + config.step_s_per_seq * len(scheduled)
            + config.prefill_s_per_token * prefill_tokens,
            scheduled=len(scheduled),
            prefill_tokens=prefill_tokens,
            admitted=tuple(admitted),
            preempted=tuple(preempted),
        )
        self._step = (plan, scheduled)
        return plan

    def end_step(self, now: float) -> StepResult:
        """End the step in flight at `now`: scheduled sequences still running get their
        tokens; a sequence that completes its prefill or decodes produces one token."""
        if self._step is None:
            raise RuntimeError("no step in flight: call begin_step() first")
        plan, scheduled = self._step
        self._step = None
        self.counters.steps += 1
        emitted: list[Sequence] = []
        finished: list[Sequence] = []
        for sequence, count in scheduled:
            if self._running.get(sequence.seq_id) is not sequence:
                continue  # withdrawn while the step ran
            sequence.computed += count
            if sequence.computed < sequence.num_tokens:
                continue  # a prefill chunk; the prompt is not complete yet
            sequence.generated += 1
            if sequence.first_token_at is None:
                sequence.first_token_at = now
            elif sequence.last_token_at is not None:
                gap = sequence.last_gap_s = now - sequence.last_token_at
                if gap > sequence.longest_gap_s:
                    sequence.longest_gap_s = gap
            sequence.last_token_at = now
            emitted.append(sequence)
            if sequence.generated >= sequence.max_tokens:
                del self._running[sequence.seq_id]
                self._kv.release(sequence.seq_id)
                sequence.state = "finished"
                sequence.finished_at = now
                self.counters.finished += 1
                finished.append(sequence)
        return StepResult(plan, now, tuple(emitted), tuple(finished))

    def abort_all(self) -> list[Sequence]:
        """Drop every sequence and the step in flight; returns them, running first."""
        dropped = [*self._running.values(), *self._waiting.values()]
        self._running.clear()
        self._waiting.clear()
        self._kv.clear()
        self._step = None
        return dropped

    def reset(self) -> None:
        """Zero the counters and empty the prefix cache; sequences are unaffected."""
        self.counters = BatchCounters()
        self._prefix_cache.clear()

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self._block)

    def _grow_running(self, tokens: dict[int, int]) -> list[Sequence]:
        """Allocate the running sequences' new blocks, oldest first, preempting the newest
        while one does not fit; returns the preempted, newest first."""
        preempted: list[Sequence] = []
        for sequence in list(self._running.values()):
            if sequence.seq_id not in self._running:
                continue  # preempted for an older one
            count = tokens[sequence.seq_id]
            if not sequence.prefilling and sequence.computed % self._block:
                continue  # a decode inside its last block: nothing to allocate
            while self._cost(sequence, count) > self._kv.free:
                victim = next(reversed(self._running.values()))
                self._preempt(victim)
                preempted.append(victim)
                if victim is sequence:
                    break
            else:
                self._allocate(sequence, count)
        return preempted

    def _cost(self, sequence: Sequence, count: int) -> int:
        blocks = self._blocks(sequence.computed + count)
        return self._kv.cost(sequence.seq_id, sequence.prompt.block_hashes, blocks)

    def _admit(self, head: Sequence, budget: float, now: float) -> int:
        """Admit `head` with its first prefill chunk if its blocks are free; the chunk's
        token count, or 0 when it does not fit."""
        target = head.num_tokens
        hit_blocks = self._prefix_cache.hits(head.prompt.block_hashes)
        # The last token is always computed, as in vLLM: its logits produce the next
        # token, so a fully cached prompt still costs one token of prefill.
        cached = min(hit_blocks * self._block, target - 1)
        chunk = int(min(target - cached, budget))
        blocks = self._blocks(cached + chunk)
        if self._kv.cost(head.seq_id, head.prompt.block_hashes, blocks) > self._kv.free:
            return 0
        del self._waiting[head.seq_id]
        self._running[head.seq_id] = head
        head.state = "running"
        head.computed = cached
        head.prefill_end = target
        if head.admitted_at is None:
            head.admitted_at = now
            head.cached_prompt_tokens = cached
        self.counters.prefix_cache_query_tokens += target
        self.counters.prefix_cache_hit_tokens += cached
        # Allocate now, so the next admission in this step sees these blocks taken.
        self._allocate(head, chunk)
        return chunk

    def _allocate(self, sequence: Sequence, count: int) -> None:
        """Grow the sequence's blocks to cover `count` more tokens; the prompt blocks
        they complete enter the prefix cache (vLLM V1 caches a full block when it is
        allocated, so a request admitted in the same step already hits it)."""
        end = sequence.computed + count
        hashes = sequence.prompt.block_hashes
        self._kv.grow(sequence.seq_id, hashes, self._blocks(end))
        full = min(len(hashes), end // self._block)
        if sequence.prefilling and full:
            self._prefix_cache.insert(hashes[:full])

    def _preempt(self, victim: Sequence) -> None:
        """Recompute mode, as vLLM V1: free the victim's KV, queue it first again."""
        hashes = victim.prompt.block_hashes
        held = hashes[: self._kv.held(victim.seq_id)]
        # Its blocks are handed to the sequences that needed them, so the prefix cache
        # loses them too, except the blocks other running sequences still hold.
        self._prefix_cache.discard([h for h in held if self._kv.holders(h) <= 1])
        self._kv.release(victim.seq_id)
        del self._running[victim.seq_id]
        victim.state = "waiting"
        victim.computed = 0
        victim.prefill_end = 0
        victim.preemptions += 1
        self.counters.preemptions += 1
        self._waiting[victim.seq_id] = victim
        self._waiting.move_to_end(victim.seq_id, last=False)
