"""``SharedRates``: the tenants' rate budgets of a pool, kept in Redis (``rates.lua``) so
that every pod spends from the same minute.

One round trip per request that has a budget, on Redis' clock. While Redis cannot be
reached, ``redis_failure_mode`` decides as it does for seats: ``closed`` refuses
(``503 unavailable``), ``open`` lets requests through without a budget, and ``local``
keeps a budget in this process at this pod's share of the pool's (the rate divided by the
live pods it last heard of), until Redis answers again. Refunds are sent in the
background and dropped when Redis cannot take them: a lost refund only makes a budget
stricter for the rest of its minute.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import cache
from importlib.resources import files
from typing import Any

from gateway.backends.redis.calls import FAILED
from gateway.backends.redis.connect import Client
from gateway.backends.redis.keys import escape_tenant
from gateway.backends.redis.pod import PodState
from gateway.complaints import Complaints
from gateway.core.rates import LocalRates, OverRate, RateReason, RateRules
from gateway.errors import Rejected
from gateway.rates.budgets import over_rate

log = logging.getLogger("obleth.cluster")

_REASONS: dict[int, RateReason] = {1: "requests_per_minute", 2: "tokens_per_minute"}


@cache
def rates_source() -> str:
    return files("gateway.backends.redis").joinpath("rates.lua").read_text(encoding="utf-8")


class SharedRates:
    """The pool's rate budgets; see ``gateway.rates.budgets.RateBudgets``."""

    def __init__(self, client: Client, pod: PodState, rules: RateRules) -> None:
        self.rules = rules
        self._pod = pod
        self._script: Any = client.register_script(rates_source())
        self._prefix = pod.keys.key("rate:")
        #: this pod's own budgets, used only while Redis cannot be reached in ``local`` mode
        self._alone = LocalRates(rules)
        self._refunds: set[asyncio.Task[None]] = set()
        self._complaints = Complaints()

    async def reserve(self, tenant: str, tokens: int) -> Rejected | None:
        rpm, tpm = self.rules.of(tenant)
        if rpm is None and tpm is None:
            return None
        if self._pod.fallback is None:
            try:
                answer = await self._script(
                    keys=[self._prefix + escape_tenant(tenant)],
                    args=["reserve", rpm or 0, tpm or 0, tokens],
                )
            except FAILED as exc:
                self._complain(exc)
            else:
                code, wait_ms = int(answer[0]), int(answer[1]) if len(answer) > 1 else 0
                if code == 0:
                    return None
                reason = _REASONS[code]
                per_minute, cost = (rpm, 1) if code == 1 else (tpm, tokens)
                assert per_minute is not None
                wait = None if wait_ms < 0 else wait_ms / 1000
                return over_rate(OverRate(reason, wait, per_minute, cost))
        return self._without_redis(tenant, tokens)

    def refund(self, tenant: str, tokens: int) -> None:
        rpm, tpm = self.rules.of(tenant)
        if rpm is None and tpm is None:
            return
        if self._pod.fallback is not None:
            self._alone.refund(tenant, tokens, time.monotonic())
            return
        task = asyncio.get_running_loop().create_task(self._send_refund(tenant, rpm, tpm, tokens))
        self._refunds.add(task)
        task.add_done_callback(self._refunds.discard)

    async def _send_refund(
        self, tenant: str, rpm: int | None, tpm: int | None, tokens: int
    ) -> None:
        try:
            await self._script(
                keys=[self._prefix + escape_tenant(tenant)],
                args=["refund", rpm or 0, tpm or 0, tokens],
            )
        except FAILED as exc:
            self._complain(exc)

    def _without_redis(self, tenant: str, tokens: int) -> Rejected | None:
        """The decision while Redis cannot be reached, by ``redis_failure_mode``."""
        mode = self._pod.settings.redis_failure_mode
        if mode == "closed":
            raise self._pod.reject("unavailable")
        if mode == "open":
            return None
        self._alone.scale = 1 / max(1, self._pod.live_pods)
        over = self._alone.reserve(tenant, tokens, time.monotonic())
        return None if over is None else over_rate(over)

    def _complain(self, exc: BaseException) -> None:
        if self._complaints.may("rates"):
            log.warning(
                "rate budgets: Redis did not answer (%s); redis_failure_mode %r decides meanwhile",
                exc,
                self._pod.settings.redis_failure_mode,
            )
