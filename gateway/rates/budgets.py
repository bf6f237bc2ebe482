"""Where the tenants' rate budgets are kept: ``InProcessRates`` in this process, or the
Redis pool's (``gateway.backends.redis.rates.SharedRates``), behind one ``RateBudgets``
interface the request path calls before admission.
"""

from __future__ import annotations

import functools
import math
import time
from typing import TYPE_CHECKING, Protocol

from gateway.core.rates import WINDOW_S, LocalRates, OverRate, RateRules
from gateway.errors import Rejected

if TYPE_CHECKING:
    from gateway.protocols import CounterBackend
    from gateway.settings import Settings


class Refund(Protocol):
    """What a reservation answers, to settle it where it was taken; never blocks, never
    raises. Called once:

    - ``refund()``: the request did not run; the request and its tokens are given back;
    - ``refund(used)``: it ran, and its response said it used ``used`` tokens; the
      difference from the estimate is given back (or taken, when it used more).
    """

    def __call__(self, used: int | None = None, /) -> None: ...


def _nothing(used: int | None = None, /) -> None:
    """The refund of a reservation that took nothing (a tenant without budgets)."""


NOTHING: Refund = _nothing


class RateBudgets(Protocol):
    """The tenants' budgets of requests and tokens per minute.

    ``reserve`` takes one request and ``tokens`` from ``tenant``'s budgets and answers
    the ``Refund`` that gives them back, for a request that did not run after all (the
    gate refused it, or its client left while it waited); or it takes nothing and
    answers the ``Rejected`` to send: 429, or 503 ``unavailable`` when the budgets cannot
    be reached and ``redis_failure_mode`` is ``closed``.
    """

    rules: RateRules

    async def reserve(self, tenant: str, tokens: int) -> Refund | Rejected: ...


class InProcessRates:
    """The budgets of a gateway without Redis, on the process' monotonic clock."""

    def __init__(self, rules: RateRules) -> None:
        self.rules = rules
        self._rates = LocalRates(rules)

    async def reserve(self, tenant: str, tokens: int) -> Refund | Rejected:
        rpm, tpm = self.rules.of(tenant)
        if rpm is None and tpm is None:
            return NOTHING
        over = self._rates.reserve(tenant, tokens, time.monotonic())
        if over is not None:
            return over_rate(over)
        return functools.partial(settle, self._rates, tenant, tokens)


def settle(rates: LocalRates, tenant: str, tokens: int, used: int | None = None) -> None:
    """Settle a reservation of ``tokens`` that ``rates`` took for ``tenant`` (see
    ``Refund``), now."""
    if used is None:
        rates.refund(tenant, tokens, time.monotonic())
    else:
        rates.settle(tenant, tokens, used, time.monotonic())


_SETTING = {"requests_per_minute": "tenant_rpm", "tokens_per_minute": "tenant_tpm"}


def over_rate(over: OverRate) -> Rejected:
    """The 429 for a reservation that did not fit: which budget, and when to retry (the
    next whole second it fits; a minute when it never will, with a message saying why)."""
    setting = _SETTING[over.reason]
    if over.retry_after_s is None:
        message = (
            f"this request is estimated at {over.cost} tokens, more than this tenant's whole "
            f"budget of {over.per_minute} tokens per minute ({setting}); ask for fewer "
            "tokens (max_tokens, a shorter prompt), or have the budget raised"
        )
        return Rejected(over.reason, message, retry_after_s=WINDOW_S)
    unit = "requests" if over.reason == "requests_per_minute" else "tokens"
    wait = max(1, math.ceil(over.retry_after_s))
    message = (
        f"this tenant has used its budget of {over.per_minute} {unit} per minute "
        f"({setting}); retry in {wait} s"
    )
    return Rejected(over.reason, message, retry_after_s=wait)


def rates_for(settings: Settings, backend: CounterBackend) -> RateBudgets | None:
    """The budgets ``settings`` ask for, kept where ``backend`` keeps the seats; None when
    no tenant has one (the request path then reserves nothing)."""
    rules = settings.rate_rules()
    if not rules.any:
        return None
    shared = getattr(backend, "shared_rates", None)
    if shared is not None:
        budgets: RateBudgets = shared(rules)
        return budgets
    return InProcessRates(rules)
