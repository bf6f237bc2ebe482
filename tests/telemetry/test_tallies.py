"""The request path's tallies: every request counted once, and the tenant label bounded
however many tenant names clients send."""

from __future__ import annotations

import threading

from gateway.core.tickets import ticket
from gateway.telemetry.tallies import OTHER, RequestTallies


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def by_tenant(tallies: RequestTallies) -> dict[str, int]:
    found: dict[str, int] = {}
    for (tenant, _, _, _), n in tallies.totals().items():
        found[tenant] = found.get(tenant, 0) + n
    return found


def test_the_busiest_tenants_are_named_and_the_rest_counted_as_other() -> None:
    tallies = RequestTallies(2)
    for tenant, n in (("a", 1), ("b", 5), ("c", 3), ("d", 2)):
        for _ in range(n):
            tallies.count(ticket(tenant), "completed")
    assert by_tenant(tallies) == {"b": 5, "c": 3, OTHER: 3}
    assert sorted(tallies.named()) == ["b", "c"]


def test_totals_keep_priority_outcome_and_reason_apart() -> None:
    tallies = RequestTallies(5)
    tallies.count(ticket("a", "critical"), "completed")
    tallies.count(ticket("a"), "rejected", "queue_full")
    tallies.count(ticket("a"), "rejected", "queue_full")
    assert tallies.totals() == {
        ("a", "critical", "completed", ""): 1,
        ("a", "standard", "rejected", "queue_full"): 2,
    }


def test_a_name_once_given_is_kept_while_the_tenant_is_active() -> None:
    """A burst of a new tenant does not take the name of one that keeps sending: totals
    only grow (a Prometheus counter)."""
    clock = Clock()
    tallies = RequestTallies(1, idle_s=60, clock=clock)
    tallies.count(ticket("steady"), "completed")
    assert by_tenant(tallies) == {"steady": 1}
    for second in range(1, 200):
        clock.now = float(second)
        tallies.count(ticket("steady"), "completed")
        for _ in range(10):
            tallies.count(ticket(f"burst-{second}"), "completed")
        totals = by_tenant(tallies)
        assert totals["steady"] == second + 1
        assert totals[OTHER] == 10 * second


def test_an_idle_tenant_gives_its_name_to_a_busier_one() -> None:
    clock = Clock()
    tallies = RequestTallies(1, idle_s=60, clock=clock)
    tallies.count(ticket("early"), "completed")
    tallies.totals()
    clock.now = 30.0
    tallies.count(ticket("late"), "completed")
    assert by_tenant(tallies) == {"early": 1, OTHER: 1}  # early is not idle for long enough
    clock.now = 100.0
    tallies.count(ticket("late"), "completed")
    assert by_tenant(tallies) == {"late": 1, OTHER: 1}  # early's series is dropped
    assert tallies.named() == ["late"]


def test_a_tenant_called_other_is_counted_with_the_unnamed_ones() -> None:
    """A tenant literally named ``other`` never takes a name (its series would be the
    unnamed tenants' sum, and forgetting it would wipe that sum, a counter reset)."""
    clock = Clock()
    tallies = RequestTallies(2, idle_s=60, clock=clock)
    for _ in range(3):
        tallies.count(ticket(OTHER), "completed")
    tallies.count(ticket("a"), "completed")
    tallies.count(ticket("b"), "completed")
    tallies.count(ticket("c"), "completed")
    assert by_tenant(tallies) == {"a": 1, "b": 1, OTHER: 4}
    assert sorted(tallies.named()) == ["a", "b"]
    clock.now = 100.0
    tallies.count(ticket(OTHER), "completed")
    assert by_tenant(tallies)[OTHER] == 5  # never goes back


def test_a_flood_of_tenant_names_stays_bounded_without_a_reader() -> None:
    """Nobody collects (a host without an SDK): 100 000 tenant names still leave a bounded
    number of entries, and every request is still counted."""
    tallies = RequestTallies(3)
    for i in range(100_000):
        tallies.count(ticket(f"t{i}"), "completed")
    assert len(tallies._pending) <= 4096 + 1
    totals = tallies.totals()
    assert len(totals) == 4  # three named tenants and other
    assert sum(totals.values()) == 100_000


def test_counts_from_many_threads_are_all_kept_while_a_reader_collects() -> None:
    """A WSGI server's threads count while an OpenTelemetry reader collects on its own
    thread: nothing is lost, nothing raises."""
    tallies = RequestTallies(4)
    per_thread = 20_000

    def count(tenant: str) -> None:
        for _ in range(per_thread):
            tallies.count(ticket(tenant), "completed")

    workers = [threading.Thread(target=count, args=(f"t{i}",)) for i in range(4)]
    for worker in workers:
        worker.start()
    while any(worker.is_alive() for worker in workers):
        tallies.totals()
    for worker in workers:
        worker.join()
    assert by_tenant(tallies) == {f"t{i}": per_thread for i in range(4)}
