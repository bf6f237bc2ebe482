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
    "over_capacity",
    "unavailable",
]
