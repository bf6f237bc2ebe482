"""Per-tenant rate budgets: requests and tokens per minute, reserved before admission.

Each budget is a generic cell rate algorithm (GCRA) over one minute: a tenant allowed ``N``
per minute may spend its whole minute at once, then earns one unit back every ``60 / N``
seconds. Its whole state is one time per tenant and budget, the *theoretical arrival
time* (``tat``): the moment at which everything it reserved so far would have been earned
back. A reservation of ``cost`` units moves it ``cost * 60 / N`` seconds on, and fits
while it stays within a minute of now. ``step.lua``'s sibling ``rates.lua`` computes the
same in Redis, for a pool of pods.

Nothing here reads a clock: callers pass ``now``, so tests run on a virtual one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

#: The window of a per-minute budget, in seconds.
WINDOW_S: Final[float] = 60.0

RateReason = Literal["requests_per_minute", "tokens_per_minute"]


@dataclass(frozen=True, slots=True)
class RateRules:
    """What each tenant may spend per minute: requests (``rpm``) and tokens (``tpm``), by
    name, with ``*`` (in ``default_*``) for every other tenant. None: no such budget."""

    rpm: Mapping[str, int]
    default_rpm: int | None
    tpm: Mapping[str, int]
    default_tpm: int | None

    @property
    def any(self) -> bool:
        """Whether any tenant has a budget at all."""
        return (
            bool(self.rpm or self.tpm)
            or self.default_rpm is not None
            or self.default_tpm is not None
        )

    @property
    def counts_tokens(self) -> bool:
        return bool(self.tpm) or self.default_tpm is not None

    def of(self, tenant: str) -> tuple[int | None, int | None]:
        """``tenant``'s requests and tokens per minute (None where it has no budget)."""
        return self.rpm.get(tenant, self.default_rpm), self.tpm.get(tenant, self.default_tpm)


@dataclass(frozen=True, slots=True)
class OverRate:
    """A reservation that did not fit: which budget, and how long until it would.

    ``retry_after_s`` is None when the reservation can never fit: it costs more than the
    tenant's whole minute (a request estimated at more tokens than ``tenant_tpm``)."""

    reason: RateReason
    retry_after_s: float | None
    per_minute: int
    cost: int


def spend(tat: float, now: float, cost: int, per_minute: int) -> float | None:
    """The budget's new ``tat`` once ``cost`` units are reserved at ``now``; None when
    they do not fit within the minute."""
    after = max(tat, now) + cost * WINDOW_S / per_minute
    return after if after - now <= WINDOW_S else None


def wait_for(tat: float, now: float, cost: int, per_minute: int) -> float | None:
    """How long until ``cost`` units fit (0 when they fit now); None for never."""
    if cost > per_minute:
        return None
    return max(0.0, max(tat, now) + cost * WINDOW_S / per_minute - now - WINDOW_S)


def give_back(tat: float, now: float, cost: int, per_minute: int) -> float:
    """The ``tat`` once a reservation of ``cost`` units is returned (its request never
    ran); never earlier than ``now``, which would bank credit beyond the minute."""
    return max(now, tat - cost * WINDOW_S / per_minute)


def _slower(requests: OverRate | None, tokens: OverRate | None) -> OverRate:
    """The refusal of the budget that keeps the request waiting longest (never first): a
    client told to retry then finds both budgets with room."""
    waits = [over for over in (tokens, requests) if over is not None and over.retry_after_s != 0]
    never = [over for over in waits if over.retry_after_s is None]
    if never:
        return never[0]
    return max(waits, key=lambda over: over.retry_after_s or 0.0)


#: How many tenants' times are kept before the ones that hold nothing are swept away.
_SWEEP_AT: Final[int] = 1024


class LocalRates:
    """The rate budgets of one process: ``reserve`` before admission, ``refund`` when the
    request did not run after all, ``settle`` when it ran and its response said how many
    tokens it used.

    What the caller may rely on: a reservation takes from both budgets or from neither,
    and a refusal waits for both (its ``retry_after_s`` is the longer wait, None when
    either never fits); a tenant whose reservations have all been earned back is swept
    away when the state grows, so it holds at most about twice the most tenants active
    within a minute.
    ``scale`` multiplies every budget (a pod's share of the pool's, when it decides
    alone); it may change between calls.
    """

    __slots__ = ("_swept_at", "_tats", "rules", "scale")

    def __init__(self, rules: RateRules, *, scale: float = 1.0) -> None:
        self.rules = rules
        self.scale = scale
        #: per tenant: the request budget's tat, the token budget's tat
        self._tats: dict[str, list[float]] = {}
        self._swept_at = _SWEEP_AT

    def reserve(self, tenant: str, tokens: int, now: float) -> OverRate | None:
        """Take one request and ``tokens`` tokens from ``tenant``'s budgets; the refusal
        (and nothing taken) when one of them lacks room."""
        rpm, tpm = self._budgets(tenant)
        if rpm is None and tpm is None:
            return None
        tats = self._tats.get(tenant) or [now, now]
        new_requests = tats[0] if rpm is None else spend(tats[0], now, 1, rpm)
        new_tokens = tats[1] if tpm is None else spend(tats[1], now, tokens, tpm)
        if new_requests is None or new_tokens is None:
            return _slower(
                None
                if rpm is None
                else OverRate("requests_per_minute", wait_for(tats[0], now, 1, rpm), rpm, 1),
                None
                if tpm is None
                else OverRate(
                    "tokens_per_minute", wait_for(tats[1], now, tokens, tpm), tpm, tokens
                ),
            )
        self._tats[tenant] = [new_requests, new_tokens]
        if len(self._tats) >= self._swept_at:
            self._sweep(now)
        return None

    def refund(self, tenant: str, tokens: int, now: float) -> None:
        """Return a reservation ``reserve`` took for ``tenant``."""
        tats = self._tats.get(tenant)
        if tats is None:
            return
        rpm, tpm = self._budgets(tenant)
        if rpm is not None:
            tats[0] = give_back(tats[0], now, 1, rpm)
        if tpm is not None:
            tats[1] = give_back(tats[1], now, tokens, tpm)

    def settle(self, tenant: str, reserved: int, used: int, now: float) -> None:
        """Correct a served request's ``reserved`` tokens to the ``used`` its response
        reported: the difference is given back, or taken on top when it used more (taken
        whatever the room, the tokens being spent, but no more than one minute's budget:
        a usage no backend could report makes the tenant wait a minute, not for ever). The
        request itself stays counted."""
        tpm = self._budgets(tenant)[1]
        if tpm is None or used == reserved:
            return
        tats = self._tats.setdefault(tenant, [now, now])
        if used < reserved:
            tats[1] = give_back(tats[1], now, reserved - used, tpm)
        else:
            tats[1] = max(tats[1], now) + min(used - reserved, tpm) * WINDOW_S / tpm

    def _budgets(self, tenant: str) -> tuple[int | None, int | None]:
        rpm, tpm = self.rules.of(tenant)
        if self.scale != 1.0:
            rpm = None if rpm is None else max(1, math.floor(rpm * self.scale))
            tpm = None if tpm is None else max(1, math.floor(tpm * self.scale))
        return rpm, tpm

    def _sweep(self, now: float) -> None:
        """Forget the tenants whose reservations have all been earned back."""
        self._tats = {t: tats for t, tats in self._tats.items() if max(tats) > now}
        self._swept_at = max(_SWEEP_AT, 2 * len(self._tats))

    def __len__(self) -> int:
        """Tenants whose times are kept (for tests of the bound)."""
        return len(self._tats)
