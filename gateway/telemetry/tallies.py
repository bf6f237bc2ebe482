"""Tallies of what happened to requests, kept in plain dictionaries on the request path and
read by the metrics when a reader collects.

An OpenTelemetry counter's ``add()`` costs several microseconds in the SDK, more than the
rest of a request's admission; a dictionary increment costs a tenth of one. So the request
path only counts, and observable instruments (``instruments.py``) report the counts.

The tenant is a label that clients choose. ``RequestTallies`` names at most
``tenants_named`` of them, the most active first, and counts the rest as ``other``: a
flood of tenant names costs one series, not one each.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from gateway.core.tickets import Ticket

#: the tenant label of every tenant not named
OTHER = "other"

#: what an ended request is counted as (``obleth_requests_total``'s ``outcome``)
COMPLETED = "completed"  # the app sent the whole response
CANCELLED = "cancelled"  # the client left while the app answered
ERROR = "error"  # the app raised, or left a response it began unfinished
REJECTED = "rejected"  # not admitted: 503/429, the reason says why
UNROUTABLE = "unroutable"  # admitted, but no upstream could take it: 404/503
BAD_REQUEST = "bad_request"  # refused before admission: 400/408/413
ABANDONED = "abandoned"  # the client left while it waited for a seat

#: how many distinct (ticket, outcome, reason) counts wait for the next collection before
#: the request path folds them itself: what bounds the memory without a metrics reader
_PENDING_KEPT = 4096

#: a named tenant with no request for this long gives its name's place to a busier one
IDLE_S = 900.0

Key = tuple[str, str, str, str]
"""``(tenant or "other", priority, outcome, reason)``"""


class RequestTallies:
    """How many requests ended how, by tenant, priority, outcome and reason.

    ``count`` is the request path's, one call per request; ``totals`` is the metrics'.
    What a reader of ``totals`` may rely on:

    - each total only grows (a Prometheus counter), but for a tenant that loses its name:
      its totals are dropped, and it starts again from 0 if it gets a name back;
    - at most ``tenants_named`` tenants are named at a time. A tenant gets a name when a
      place is free, the busiest first at each collection; a named tenant idle for
      ``IDLE_S`` gives its place up when another tenant is waiting for one. What a tenant
      did before it was named stays in ``other``.

    Thread-safe: OpenTelemetry's periodic readers collect on a thread of their own.
    """

    def __init__(
        self,
        tenants_named: int,
        *,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tenants_named = tenants_named
        self.idle_s = idle_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[tuple[Ticket, str, str], int] = {}
        #: the named tenants, each with when it last had a request
        self._named: dict[str, float] = {}
        self._totals: dict[Key, int] = {}

    def count(self, ticket: Ticket, outcome: str, reason: str = "") -> None:
        """One request of ``ticket`` ended with ``outcome`` (``reason``: why it was refused)."""
        # by class: a key per estimate would fold often (the check first: a hot path)
        key = (ticket.of_class if ticket.tokens else ticket, outcome, reason)
        with self._lock:
            pending = self._pending
            pending[key] = pending.get(key, 0) + 1
            if len(pending) > _PENDING_KEPT:
                self._fold()

    def totals(self) -> Mapping[Key, int]:
        """Every total so far, tenants beyond the named ones summed up as ``other``."""
        with self._lock:
            self._fold()
            return dict(self._totals)

    def named(self) -> list[str]:
        """The tenants named now."""
        with self._lock:
            return list(self._named)

    def _fold(self) -> None:
        pending, self._pending = self._pending, {}
        if not pending:
            return
        now = self._clock()
        named = self._named
        activity: dict[str, int] = {}
        for (ticket, _, _), n in pending.items():
            activity[ticket.tenant] = activity.get(ticket.tenant, 0) + n
        unnamed = []
        for tenant, n in activity.items():
            if tenant in named:
                named[tenant] = now
            elif tenant != OTHER:  # a tenant called so is counted with the unnamed ones
                unnamed.append((-n, tenant))
        if unnamed:
            if len(named) >= self.tenants_named:
                self._forget_idle(now)
            for _, tenant in sorted(unnamed)[: self.tenants_named - len(named)]:
                named[tenant] = now
        totals = self._totals
        for (ticket, outcome, reason), n in pending.items():
            tenant = ticket.tenant if ticket.tenant in named else OTHER
            key = (tenant, ticket.priority, outcome, reason)
            totals[key] = totals.get(key, 0) + n

    def _forget_idle(self, now: float) -> None:
        idle = {tenant for tenant, seen in self._named.items() if now - seen >= self.idle_s}
        if not idle:
            return
        for tenant in idle:
            del self._named[tenant]
        self._totals = {key: n for key, n in self._totals.items() if key[0] not in idle}


class AnswerTallies:
    """How many requests each upstream answered, by status: the HTTP status as a string, or
    ``error`` when it failed before answering (no connection, a timeout, a broken reply).

    Counted by the proxy, once per attempt: a request retried on another upstream counts
    once on each. Written on the event loop; ``totals`` copies, so a reader on another
    thread sees a consistent view.
    """

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}

    def count(self, upstream: str, status: str) -> None:
        key = (upstream, status)
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1

    def totals(self) -> Mapping[tuple[str, str], int]:
        return self._counts.copy()
