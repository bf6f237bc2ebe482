"""``SharedRates``: the tenants' rate budgets of a pool, kept in Redis (``rates.lua``) so
that every pod spends from the same minute.

Reservations and refunds go to Redis in batches, one call at a time per pod, as the seats'
calls do (``calls.py``): a lone request waits for nothing, a busy pod pays one round trip
and holds one connection for many requests. A call that fails is retried with backoff
within ``redis_retry_budget_s``; past it, or while the pod is in its failure mode,
``redis_failure_mode`` decides as it does for seats: ``closed`` refuses (``503
unavailable``), ``open`` lets requests through without a budget, and ``local`` keeps a
budget in this process at this pod's share of the pool's (the rate divided by the live
pods it last heard of), counted afresh for each outage.

A reservation is settled where it was taken (``Refund``): to Redis, or to the local
budget of the outage it was taken in; given back when its request did not run, corrected
to the tokens its response reported when it did. A settlement that cannot reach Redis is
dropped: a refund lost makes the rest of that tenant's minute stricter (as does a retried
call that had run after all), a charge lost makes it more lenient. A caller that leaves
while its reservation is on its way has it given back when Redis answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from typing import Any

from gateway.backends.redis.calls import FAILED, retry_within
from gateway.backends.redis.connect import Client
from gateway.backends.redis.keys import escape_tenant
from gateway.backends.redis.pod import PodState
from gateway.complaints import Complaints
from gateway.core.rates import LocalRates, OverRate, RateReason, RateRules
from gateway.errors import Rejected
from gateway.rates.budgets import NOTHING, Refund, over_rate, settle
from gateway.tasks import cancel_and_wait

log = logging.getLogger("obleth.cluster")

_REASONS: dict[int, RateReason] = {1: "requests_per_minute", 2: "tokens_per_minute"}

#: The most operations one call carries (the rest go in the next).
_BATCH = 256

#: How long ``stop`` waits for refunds still on their way.
_DRAIN_S = 1.0


@cache
def rates_source() -> str:
    return files("gateway.backends.redis").joinpath("rates.lua").read_text(encoding="utf-8")


class _Unreachable(Exception):
    """Redis did not answer an operation within the retry budget."""


@dataclass(slots=True)
class _Op:
    key: str
    args: tuple[str, int, int, int]
    #: (code, wait ms) as the script answers; _Unreachable when Redis was not reached
    answer: asyncio.Future[tuple[int, int]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class SharedRates:
    """The pool's rate budgets; see ``gateway.rates.budgets.RateBudgets``."""

    def __init__(self, client: Client, pod: PodState, rules: RateRules) -> None:
        self.rules = rules
        self._pod = pod
        self._script: Any = client.register_script(rates_source())
        self._prefix = pod.keys.key("rate:")
        self._budget_s = pod.settings.redis_retry_budget_s
        self._ops: list[_Op] = []
        self._flusher: asyncio.Task[None] | None = None
        #: this pod's own budgets while Redis cannot be reached in ``local`` mode, and
        #: the outage they belong to (``pod.degraded_since``; None: a call that failed)
        self._alone: LocalRates | None = None
        self._alone_since: float | None = None
        self._complaints = Complaints()

    async def reserve(self, tenant: str, tokens: int) -> Refund | Rejected:
        rpm, tpm = self.rules.of(tenant)
        if rpm is None and tpm is None:
            return NOTHING
        if self._pod.fallback is None:
            key = self._prefix + escape_tenant(tenant)
            op = self._send(key, ("reserve", rpm or 0, tpm or 0, tokens))
            try:
                code, wait_ms = await asyncio.shield(op.answer)
            except asyncio.CancelledError:
                # the caller left: what Redis takes for it all the same is given back
                op.answer.add_done_callback(functools.partial(self._unclaimed, key, op.args))
                raise
            except _Unreachable:
                pass
            else:
                if code == 0:
                    return functools.partial(self._refund, key, op.args)
                per_minute, cost = (rpm, 1) if code == 1 else (tpm, tokens)
                assert per_minute is not None
                wait = None if wait_ms < 0 else wait_ms / 1000
                return over_rate(OverRate(_REASONS[code], wait, per_minute, cost))
        return self._without_redis(tenant, tokens)

    async def stop(self) -> None:
        """Send the refunds still waiting (for at most ``_DRAIN_S``), then stop sending."""
        flusher = self._flusher
        if flusher is not None and not flusher.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(flusher), _DRAIN_S)
            await cancel_and_wait(flusher)
        for op in self._ops:
            op.answer.cancel()
        self._ops.clear()

    # -- Redis -------------------------------------------------------------------------

    def _send(self, key: str, args: tuple[str, int, int, int]) -> _Op:
        op = _Op(key, args)
        self._ops.append(op)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush(), name="obleth-redis-rates"
            )
        return op

    def _refund(self, key: str, args: tuple[str, int, int, int], used: int | None = None) -> None:
        if not self._pod.running:
            return  # stopped: the client is closed (stop sent the refunds made before)
        _, rpm, tpm, tokens = args
        if used is None:
            self._send(key, ("refund", rpm, tpm, tokens))
        elif tpm and used != tokens:  # the request stays counted (no requests per minute)
            if used > tokens:  # at most a minute's budget, as LocalRates.settle takes
                self._send(key, ("charge", 0, tpm, min(used - tokens, tpm)))
            else:
                self._send(key, ("refund", 0, tpm, tokens - used))

    def _unclaimed(
        self, key: str, args: tuple[str, int, int, int], answer: asyncio.Future[tuple[int, int]]
    ) -> None:
        if not answer.cancelled() and answer.exception() is None and answer.result()[0] == 0:
            self._refund(key, args)

    async def _flush(self) -> None:
        """Send what waits, one call at a time, until nothing does."""
        while self._ops:
            batch, self._ops = self._ops[:_BATCH], self._ops[_BATCH:]
            try:
                answers = await self._call(batch)
            except FAILED as exc:
                self._complain(exc)
                for op in batch:
                    if not op.answer.done():
                        op.answer.set_exception(_Unreachable())
                        op.answer.exception()  # a refund's answer nobody reads
                continue
            for n, op in enumerate(batch):
                if not op.answer.done():
                    op.answer.set_result((int(answers[2 * n]), int(answers[2 * n + 1])))

    async def _call(self, batch: list[_Op]) -> list[Any]:
        """One call for ``batch``, retried with backoff within the retry budget while the
        pod is not in its failure mode."""
        keys = [op.key for op in batch]
        args = [word for op in batch for word in op.args]
        started = time.monotonic()
        try:
            return await self._attempt(keys, args)
        except FAILED:
            left_s = self._budget_s - (time.monotonic() - started)
            if left_s <= 0 or self._pod.fallback is not None:
                raise
        return await retry_within(left_s, self._budget_s, lambda: self._attempt(keys, args))

    async def _attempt(self, keys: list[str], args: list[Any]) -> list[Any]:
        return list(await self._script(keys=keys, args=args))

    # -- without Redis -----------------------------------------------------------------

    def _without_redis(self, tenant: str, tokens: int) -> Refund | Rejected:
        """The decision while Redis cannot be reached, by ``redis_failure_mode``."""
        pod = self._pod
        mode = pod.settings.redis_failure_mode
        if mode == "closed":
            return pod.reject("unavailable")
        if mode == "open":
            return NOTHING
        alone = self._alone
        if alone is None or self._alone_since != pod.degraded_since:
            alone = self._alone = LocalRates(self.rules)  # a new outage: counted afresh
            self._alone_since = pod.degraded_since
        alone.scale = 1 / max(1, pod.live_pods)
        over = alone.reserve(tenant, tokens, time.monotonic())
        if over is not None:
            return over_rate(over)
        return functools.partial(settle, alone, tenant, tokens)

    def _complain(self, exc: BaseException) -> None:
        if self._complaints.may("rates"):
            log.warning(
                "rate budgets: Redis did not answer within redis_retry_budget_s=%s (%s); "
                "redis_failure_mode %r decides meanwhile",
                self._budget_s,
                exc,
                self._pod.settings.redis_failure_mode,
            )
