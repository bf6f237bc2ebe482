"""Generation: one submitted request's token stream, timings and state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Literal

from gateway.errors import OblethError
from gateway.sim.tokens import TokenizedPrompt

GenerationState = Literal["waiting", "running", "finished", "cancelled", "aborted"]


class EngineStopped(OblethError):
    """The engine stopped before a generation finished; its token stream ends with this."""


class Generation:
    """One request submitted to a `SimEngine`: an async iterator over its output tokens.

    Iterating yields each token's text as soon as the step that produced it ends, and
    stops after `max_tokens` tokens. The consumer must either iterate to the end or
    withdraw the request with `cancel()` / `aclose()` / leaving `async with`; a consumer
    task cancelled while awaiting the next token withdraws it automatically. Withdrawing
    frees the request's queue position or batch slot immediately. If the engine stops
    first, iteration raises `EngineStopped`.

    Times are seconds on the event loop's clock (`loop.time()`); prefer the durations
    `queued_s` and `ttft_s`.
    """

    def __init__(
        self,
        seq_id: int,
        prompt: TokenizedPrompt,
        max_tokens: int,
        now: float,
        withdraw: Callable[[Generation], None],
    ) -> None:
        """Made by `SimEngine.submit()`; `withdraw` takes it out of the engine's queue or batch."""
        self._withdraw = withdraw
        self._seq_id = seq_id
        self._prompt = prompt
        self._max_tokens = max_tokens
        self._state: GenerationState = "waiting"
        self._cached_prompt_tokens = 0
        self._completion_tokens = 0
        self._preemptions = 0
        self._submitted_at = now
        self._admitted_at: float | None = None
        self._first_token_at: float | None = None
        self._finished_at: float | None = None
        # None marks the end of the stream; the engine never blocks on a slow consumer.
        self._outbox: asyncio.Queue[str | None] = asyncio.Queue()
        self._error: EngineStopped | None = None
        self._drained = False

    @property
    def state(self) -> GenerationState:
        """Where the request is: waiting, running, or ended (finished/cancelled/aborted)."""
        return self._state

    @property
    def seq_id(self) -> int:
        """The engine's id for this request, unique per engine."""
        return self._seq_id

    @property
    def prompt(self) -> TokenizedPrompt:
        """The tokenized prompt."""
        return self._prompt

    @property
    def prompt_tokens(self) -> int:
        """Prompt length in tokens."""
        return self._prompt.num_tokens

    @property
    def cached_prompt_tokens(self) -> int:
        """Prompt tokens served from the prefix cache; 0 until admitted."""
        return self._cached_prompt_tokens

    @property
    def max_tokens(self) -> int:
        """Tokens this generation produces if it runs to the end."""
        return self._max_tokens

    @property
    def completion_tokens(self) -> int:
        """Tokens produced so far (possibly not yet consumed)."""
        return self._completion_tokens

    @property
    def preemptions(self) -> int:
        """Times the engine preempted it (its KV freed, its prefill recomputed later)."""
        return self._preemptions

    @property
    def submitted_at(self) -> float:
        """Loop time of `submit()`."""
        return self._submitted_at

    @property
    def admitted_at(self) -> float | None:
        """Loop time the request first left the waiting queue for a batch slot."""
        return self._admitted_at

    @property
    def first_token_at(self) -> float | None:
        """Loop time the step producing the first token ended."""
        return self._first_token_at

    @property
    def finished_at(self) -> float | None:
        """Loop time the last token was produced, or the request was withdrawn or aborted."""
        return self._finished_at

    @property
    def queued_s(self) -> float | None:
        """Seconds spent waiting for the first admission; None until admitted."""
        if self._admitted_at is None:
            return None
        return self._admitted_at - self._submitted_at

    @property
    def ttft_s(self) -> float | None:
        """Seconds from submit to the end of the step that produced the first token."""
        if self._first_token_at is None:
            return None
        return self._first_token_at - self._submitted_at

    def cancel(self) -> None:
        """Withdraw the request from the queue or batch now; no effect once it has ended."""
        self._withdraw(self)

    async def aclose(self) -> None:
        """Same as `cancel()`, for `contextlib.aclosing` and async-generator-like use."""
        self.cancel()

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> str:
        if self._drained:
            raise StopAsyncIteration
        try:
            token = await self._outbox.get()
        except asyncio.CancelledError:
            # The consumer is gone (typically its client disconnected): give the slot back
            # now rather than decoding tokens nobody will read.
            self.cancel()
            raise
        if token is None:
            self._drained = True
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        return token

    # Transitions. Only the SimEngine that made this generation calls them.

    def mark_admitted(self, now: float, cached_tokens: int) -> None:
        """The request got a batch slot; `cached_tokens` of its prompt hit the cache.

        A re-admission after a preemption changes only the state: `admitted_at` and
        `cached_prompt_tokens` keep their first values, as vLLM's usage does."""
        self._state = "running"
        if self._admitted_at is None:
            self._admitted_at = now
            self._cached_prompt_tokens = cached_tokens

    def mark_preempted(self) -> None:
        """The engine took the request out of the batch to free KV blocks; it waits
        again, first in line, and keeps the tokens it already produced."""
        self._state = "waiting"
        self._preemptions += 1

    def emit(self, token: str, now: float) -> None:
        """The step that produced `token` ended."""
        if self._first_token_at is None:
            self._first_token_at = now
        self._completion_tokens += 1
        self._outbox.put_nowait(token)

    def end(self, state: GenerationState, now: float, error: EngineStopped | None = None) -> None:
        """The request left the engine; iteration ends after the buffered tokens."""
        self._state = state
        self._finished_at = now
        self._error = error
        self._outbox.put_nowait(None)
