"""Why a request was not admitted: the reasons decisions in ``core`` give, which
``gateway.errors.Rejected`` carries to the client's error body."""

from __future__ import annotations

from typing import Literal

RejectReason = Literal[
    "queue_full",
    "queue_timeout",
    "evicted",
    "no_wait",
    "tenant_limit",
    "requests_per_minute",
    "tokens_per_minute",
    "over_capacity",
    "unavailable",
]

#: The reasons a tenant brought on itself (its cap, its rate budgets): answered 429, the
#: others 503 (the service is full or cannot admit).
TENANT_REASONS: frozenset[str] = frozenset(
    {"tenant_limit", "requests_per_minute", "tokens_per_minute"}
)
