"""The demo's live table and summary: the columns the issue promises, filled from the run."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.demo.load import Tally
from gateway.demo.table import live_table, summary
from gateway.demo.tenants import TenantLoad, parse_tenants
from gateway.errors import ConfigError
from gateway.protocols import Snapshot, TenantState

TENANTS = [TenantLoad("gold", 4, 16), TenantLoad("bronze", 1, 48)]


def _tallies() -> dict[str, Tally]:
    return {
        # gold: 5 admitted (one wait each), 3 of them done, none rejected
        "gold": Tally(completed=3, waits=[0.0, 0.01, 0.02, 0.03, 0.04], seat_seconds=3.0),
        # bronze: 2 admitted, 1 done, rejected twice for two reasons
        "bronze": Tally(
            completed=1,
            waits=[0.5, 1.5],
            rejected=Counter({"queue_full": 7, "evicted": 2}),
            seat_seconds=1.0,
        ),
    }


def _row(text: str, tenant: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.startswith(tenant + " "))


def test_live_table_shows_admitted_waiting_rejections_and_waits_per_tenant() -> None:
    snapshot = Snapshot(
        limit=4,
        inflight=3,
        queued=5,
        max_queue=24,
        tenants={
            "gold": TenantState(inflight=2, queued={"standard": 0}, weight=4),
            "bronze": TenantState(inflight=1, queued={"standard": 4, "critical": 1}, weight=1),
        },
    )
    table = live_table(1.0, 10.0, TENANTS, _tallies(), snapshot, 3, 4)

    assert "limit 4" in table and "in flight 3" in table and "queued 5/24" in table
    header = _row(table, "tenant")
    assert header[:7] == ["tenant", "weight", "clients", "admitted", "running", "waiting", "done"]
    gold, bronze = _row(table, "gold"), _row(table, "bronze")
    assert gold[2:7] == ["16", "5", "2", "0", "3"]
    assert bronze[2:7] == ["48", "2", "1", "5", "1"]
    assert "queue_full 7" in table and "evicted 2" in table
    assert bronze[7:11] == ["1000", "ms", "1490", "ms"]  # p50 and p99 of 0.5 s and 1.5 s


def test_live_table_names_the_policy_and_counts_requests_waiting_for_room() -> None:
    """Under block, requests waiting for room in the full queue show next to the queue's
    bound (tenants' waiting counts include them), and the header names the policy."""
    snapshot = Snapshot(
        limit=4,
        inflight=4,
        queued=2,
        max_queue=2,
        tenants={
            "gold": TenantState(inflight=4, queued={"standard": 1}, weight=4),
            "bronze": TenantState(inflight=0, queued={"standard": 6, "critical": 1}, weight=1),
        },
    )
    table = live_table(1.0, 10.0, TENANTS, _tallies(), snapshot, 4, 4, policy="block")

    assert "policy block" in table
    assert "queued 2/2 (+6 waiting for room)" in table
    assert _row(table, "bronze")[5] == "7"


def test_summary_shows_each_tenants_admissions_and_share_against_its_fair_share() -> None:
    text = summary(TENANTS, _tallies(), {"gold": 0.8, "bronze": 0.2}, 4, 4, 7, 7)

    header = _row(text, "tenant")
    assert header == ["tenant", "weight", "held", "fair", "admitted", "done", "rejected"]
    assert _row(text, "gold")[2:] == ["75.0%", "80.0%", "5", "3", "0"]
    assert _row(text, "bronze")[2:] == ["25.0%", "20.0%", "2", "1", "9"]
    assert "never above the limit" in text and "7 admitted, 7 released" in text


def test_answers_that_were_neither_done_nor_refused_are_counted_in_the_summary() -> None:
    """A tenant whose every request failed (a 400 for a name the gateway refuses, a
    connection lost) read 0 admitted, 0 done, 0 rejected, as if it had sent nothing."""
    tallies = _tallies()
    tallies["bronze"].errors = 576
    text = summary(TENANTS, tallies, {"gold": 0.8, "bronze": 0.2}, 4, 4, 7, 7)
    assert _row(text, "tenant")[-1] == "errors"
    assert _row(text, "bronze")[-1] == "576"
    assert _row(text, "gold")[-1] == "0"


def test_a_tenant_name_the_gateway_would_refuse_stops_the_demo_naming_it() -> None:
    """The gateway refuses a tenant name over 256 characters with a 400; the demo used
    to send it anyway, and that tenant's every request failed."""
    with pytest.raises(ConfigError, match="names are at most 256 characters"):
        parse_tenants("a" * 300 + ":1,b:1", limit=4, flood=None)
