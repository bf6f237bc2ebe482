"""The demo's live table and final summary, as plain text."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import get_args

from gateway.demo.load import Tally
from gateway.demo.tenants import TenantLoad
from gateway.errors import RejectReason
from gateway.protocols import Snapshot

REASONS = get_args(RejectReason)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def live_table(
    elapsed_s: float,
    duration_s: float,
    tenants: Sequence[TenantLoad],
    tallies: Mapping[str, Tally],
    snapshot: Snapshot,
    backend_now: int,
    backend_max: int,
    *,
    policy: str | None = None,
) -> str:
    # tenants' waiting requests include those waiting for room in a full queue (block)
    waiting_all = sum(sum(state.queued.values()) for state in snapshot.tenants.values())
    for_room = waiting_all - snapshot.queued
    lines = [
        f"obleth demo  {elapsed_s:5.1f}/{duration_s:.0f} s   limit {snapshot.limit}   "
        + (f"policy {policy}   " if policy else "")
        + f"in flight {snapshot.inflight}   queued {snapshot.queued}/{snapshot.max_queue}"
        + (f" (+{for_room} waiting for room)" if for_room > 0 else "")
        + f"   backend now {backend_now}, max {backend_max}",
        "",
        f"{'tenant':<10}{'weight':>7}{'clients':>8}{'admitted':>9}{'running':>8}{'waiting':>8}"
        f"{'done':>7}{'wait p50':>10}{'wait p99':>10}  rejected",
    ]
    for tenant in tenants:
        tally = tallies[tenant.name]
        state = snapshot.tenants.get(tenant.name)
        running = state.inflight if state else 0
        waiting = sum(state.queued.values()) if state else 0
        rejected = ", ".join(f"{r} {tally.rejected[r]}" for r in REASONS if tally.rejected[r])
        lines.append(
            f"{tenant.name:<10}{tenant.weight:>7g}{tenant.clients:>8}{len(tally.waits):>9}"
            f"{running:>8}{waiting:>8}"
            f"{tally.completed:>7}{_ms(percentile(tally.waits, 50)):>10}"
            f"{_ms(percentile(tally.waits, 99)):>10}  {rejected or '-'}"
        )
    return "\n".join(lines)


def summary(
    tenants: Sequence[TenantLoad],
    tallies: Mapping[str, Tally],
    fair: Mapping[str, float],
    limit: int,
    backend_max: int,
    admitted: int,
    released: int,
) -> str:
    total_seat_s = sum(t.seat_seconds for t in tallies.values()) or 1.0
    # answers that were neither a completion nor a refusal (a 400, a connection lost), shown
    # when there are any: otherwise such a tenant's row reads as if it sent nothing
    errors = any(t.errors for t in tallies.values())
    lines = [
        "",
        "Share of seats held over the run, against the weighted max-min fair share:",
        f"{'tenant':<10}{'weight':>7}{'held':>8}{'fair':>8}{'admitted':>9}{'done':>7}"
        f"{'rejected':>10}" + (f"{'errors':>8}" if errors else ""),
    ]
    for tenant in tenants:
        tally = tallies[tenant.name]
        lines.append(
            f"{tenant.name:<10}{tenant.weight:>7g}"
            f"{tally.seat_seconds / total_seat_s:>8.1%}{fair[tenant.name]:>8.1%}"
            f"{len(tally.waits):>9}{tally.completed:>7}{sum(tally.rejected.values()):>10}"
            + (f"{tally.errors:>8}" if errors else "")
        )
    notes = [f"{t.name} sends {t.critical_share:.0%} critical" for t in tenants if t.critical_share]
    notes += [
        f"{t.name} {t.background_share:.0%} background" for t in tenants if t.background_share
    ]
    if notes:
        lines += [
            f"({'; '.join(notes)}: critical requests go first whatever the shares, and",
            " background ones run only on a free seat, so shares lean away from the targets.)",
        ]
    verdict = "never above the limit" if backend_max <= limit else "ABOVE THE LIMIT"
    lines += [
        "",
        f"Highest concurrency the backend itself saw: {backend_max} (limit {limit}): {verdict}.",
        f"Permits: {admitted} admitted, {released} released"
        + (" (every one released once)." if admitted == released else " (MISMATCH)."),
    ]
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"
