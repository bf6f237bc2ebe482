"""Placement of new prefixes: bounded-load rendezvous hashing and the placement record that
keeps pods in agreement (``gateway.core.placement``)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.placement import KEPT, PlacementLog, place
from gateway.core.rendezvous import pick, stable_hash, weight

NAMES = ["http://a:8000", "http://b:8000", "http://c:8000", "http://d:8000"]
CANDIDATES = [(name, stable_hash(name)) for name in NAMES]
KEYS = [stable_hash(f"system prompt {i}") for i in range(400)]


def _idle(_: str) -> int:
    return 0


def _placed_one_by_one(keys: list[int], bound: float, size: int = 31) -> Counter[str]:
    """Place ``keys`` in turn, each ``size`` blocks, as a router with no requests in flight
    would; the number of prefixes that ended on each upstream."""
    log = PlacementLog(10_000)
    for key in keys:
        upstream = place(
            key, CANDIDATES, bound=bound, blocks=log.blocks, in_flight=_idle, last_sent=_idle
        )
        assert upstream is not None
        log.record(key, upstream, size)
    return Counter(log.get(key) for key in keys)


def test_with_bound_zero_placement_is_plain_rendezvous() -> None:
    log = PlacementLog(100)
    log.record(KEYS[0], NAMES[0], 10_000)  # a heavily loaded upstream changes nothing
    for key in KEYS[:50]:
        chosen = place(
            key, CANDIDATES, bound=0, blocks=log.blocks, in_flight=lambda u: 99, last_sent=_idle
        )
        assert chosen == pick(key, CANDIDATES)


def test_an_idle_fleet_places_every_prefix_on_its_rendezvous_choice() -> None:
    for key in KEYS[:50]:
        assert place(
            key, CANDIDATES, bound=1.25, blocks=_idle, in_flight=_idle, last_sent=_idle
        ) == pick(key, CANDIDATES)


@pytest.mark.parametrize("start", range(0, 400, 16))
def test_sixteen_prefixes_never_crowd_one_upstream_of_four(start: int) -> None:
    """The case plain hashing gets wrong a time in three: 16 large prefixes on 4
    upstreams. Bounded at 1.25, no upstream takes more than 5 (hashing alone: up to 7+)."""
    keys = KEYS[start : start + 16]
    assert max(_placed_one_by_one(keys, 1.25).values()) <= 5


def test_plain_hashing_does_crowd_some_upstream_in_the_same_key_sets() -> None:
    """The counterpart of the test above: the bound is what makes the difference."""
    worst = max(max(_placed_one_by_one(KEYS[s : s + 16], 0).values()) for s in range(0, 400, 16))
    assert worst >= 7


def _order(key: int) -> list[str]:
    """The upstreams in the rendezvous order of ``key``."""
    return sorted(NAMES, key=lambda u: -weight(key, stable_hash(u)))


def test_an_upstream_two_requests_above_the_fewest_in_flight_is_passed_over() -> None:
    key = KEYS[0]
    first = pick(key, CANDIDATES)
    busy = {first: 2}
    chosen = place(
        key,
        CANDIDATES,
        bound=1.25,
        blocks=_idle,
        in_flight=lambda u: busy.get(u, 0),
        last_sent=_idle,
    )
    assert chosen != first
    rest = [c for c in CANDIDATES if c[0] != first]
    assert chosen == pick(key, rest), "the next upstream in the key's own rendezvous order"


@pytest.mark.parametrize("key", KEYS[:40])
def test_a_new_prefix_goes_where_a_request_was_sent_longest_ago_among_the_least_loaded(
    key: int,
) -> None:
    """A new prefix misses the cache wherever it goes: load decides, not the hash. Of the
    upstreams within one request of the fewest in flight (here the 2nd and 3rd of the
    key's order, with 1 and 2), the one sent a request longest ago; upstreams further
    above are passed over even when they were sent nothing yet."""
    order = _order(key)
    assert _placed_by_load(key, order, in_flight=[3, 1, 2, 4], sent=[0, 9, 5, 0]) == order[2]


@pytest.mark.parametrize("key", KEYS[:40])
def test_equally_placed_upstreams_are_taken_in_the_keys_rendezvous_order(key: int) -> None:
    """Ties go by the prefix's own rendezvous order, so idle pods agree and ties do not
    pile onto one upstream by position."""
    order = _order(key)
    assert _placed_by_load(key, order, in_flight=[2, 1, 1, 1], sent=[7, 3, 3, 3]) == order[1]


def _placed_by_load(
    key: int, order: list[str], *, in_flight: list[int], sent: list[int]
) -> str | None:
    """Where ``key`` goes with nothing placed yet and these in-flight counts and send
    times, given in the key's rendezvous ``order``."""
    counts = dict(zip(order, in_flight, strict=True))
    last = dict(zip(order, sent, strict=True))
    return place(
        key,
        CANDIDATES,
        bound=1.25,
        blocks=_idle,
        in_flight=counts.__getitem__,
        last_sent=last.__getitem__,
    )


def _placed_new(
    key: int, log: PlacementLog, counts: dict[str, int], sent: dict[str, int]
) -> str | None:
    """Where ``key`` goes given what ``log`` placed, the in-flight ``counts`` and when each
    upstream was last sent a request (``sent``, absent for never)."""
    return place(
        key,
        CANDIDATES,
        bound=1.25,
        blocks=log.blocks,
        in_flight=counts.__getitem__,
        last_sent=lambda u: sent.get(u, 0),
    )


def test_back_to_back_new_prefixes_are_spread_as_round_robin_spreads_them() -> None:
    """A burst of new prefixes with nothing finishing: every four consecutive placements
    cover the four upstreams, so no prefill queues behind another sent a moment before."""
    log = PlacementLog(KEPT)
    counts = dict.fromkeys(NAMES, 0)
    sent: dict[str, int] = {}
    chosen = []
    for i in range(400):
        key = stable_hash(f"burst prompt {i}")
        upstream = _placed_new(key, log, counts, sent)
        assert upstream is not None
        log.record(key, upstream, 32)
        counts[upstream] += 1
        sent[upstream] = i + 1
        chosen.append(upstream)
    for i in range(len(chosen) - 3):
        assert set(chosen[i : i + 4]) == set(NAMES), i


def test_prefix_free_traffic_stays_within_one_request_of_the_least_loaded() -> None:
    """Every prompt new (uniform traffic), requests finishing in any order: each placement
    takes an upstream within one request of the fewest in flight, and content placed
    stays within the bound."""
    rng = random.Random(5)
    log = PlacementLog(KEPT)
    counts = dict.fromkeys(NAMES, 0)
    sent: dict[str, int] = {}
    elsewhere: list[int] = []
    for i in range(2000):
        key = stable_hash(f"uniform prompt {i}")
        chosen = _placed_new(key, log, counts, sent)
        assert chosen is not None
        if counts[chosen] > min(counts.values()) + 1:
            elsewhere.append(i)
        log.record(key, chosen, 32)
        counts[chosen] += 1
        sent[chosen] = i + 1
        while sum(counts.values()) > 8 or (rng.random() < 0.5 and sum(counts.values())):
            done = rng.choice([u for u in NAMES if counts[u]])  # any request may finish first
            counts[done] -= 1
    spread = max(log.blocks(u) for u in NAMES) / (sum(log.blocks(u) for u in NAMES) / 4)
    assert spread <= 1.25
    # the content bound may override load only while few prompts are placed (one prompt
    # is then a large share of all content)
    assert all(i < 200 for i in elsewhere), elsewhere


def test_content_placed_bounds_where_the_least_loaded_upstream_may_be() -> None:
    """The least loaded upstream holds far more content than the others: the placement
    goes where the content fits, to the least loaded of the rest."""
    key = KEYS[1]
    order = _order(key)
    held = {order[0]: 500}
    counts = dict(zip(order, [0, 7, 5, 5], strict=True))
    chosen = place(
        key,
        CANDIDATES,
        bound=1.25,
        blocks=lambda u: held.get(u, 0),
        in_flight=counts.__getitem__,
        last_sent=_idle,
    )
    assert chosen == order[2]


def test_no_candidates_place_nowhere() -> None:
    assert place(KEYS[0], [], bound=1.25, blocks=_idle, in_flight=_idle, last_sent=_idle) is None


# -- the placement record ----------------------------------------------------------------------


def test_the_first_placement_of_a_key_is_kept() -> None:
    log = PlacementLog(10)
    log.record(1, NAMES[0], 5)
    log.record(1, NAMES[1], 5)
    assert log.get(1) == NAMES[0]
    assert log.blocks(NAMES[0]) == 5 and log.blocks(NAMES[1]) == 0


def test_the_shared_record_overrides_an_unconfirmed_own_placement() -> None:
    """Two pods placed key 1 before hearing of each other; the record's first entry (the
    other pod's) wins, and this pod's own later entry changes nothing."""
    log = PlacementLog(10, shared=True)
    log.record(1, NAMES[0], 5)
    assert log.unshared(10) == [(1, NAMES[0], 5)]
    log.shared(1)
    log.learn(1, NAMES[2], 5)  # the other pod's entry, first in the record
    log.learn(1, NAMES[0], 5)  # this pod's own, second
    assert log.get(1) == NAMES[2]
    assert log.blocks(NAMES[2]) == 5 and log.blocks(NAMES[0]) == 0


def test_own_placements_wait_for_the_synchroniser_until_written() -> None:
    log = PlacementLog(10, shared=True)
    for key in range(5):
        log.record(key, NAMES[key % 4], 1)
    assert [k for k, _, _ in log.unshared(3)] == [0, 1, 2]
    log.shared(3)
    assert [k for k, _, _ in log.unshared(3)] == [3, 4]
    assert PlacementLog(10).unshared(10) == [], "one process: nothing to share"


def test_unshared_placements_stay_bounded_while_redis_is_unreachable() -> None:
    """A pod that cannot share for a long time keeps at most ``capacity`` own placements
    waiting for the synchroniser, the newest: the shared record keeps no more either."""
    log = PlacementLog(100, shared=True)
    for key in range(10_000):
        log.record(key, NAMES[key % 4], 1)
    waiting = log.unshared(10_000)
    assert len(waiting) == 100
    assert [k for k, _, _ in waiting] == list(range(9_900, 10_000))


def test_placements_dropped_for_the_bound_during_a_sync_are_not_counted_twice() -> None:
    """Placements written while newer ones pushed the oldest out are taken off once: the
    ones not yet written still wait for the next report."""
    log = PlacementLog(4, shared=True)
    for key in range(4):
        log.record(key, NAMES[0], 1)
    assert [k for k, _, _ in log.unshared(2)] == [0, 1]
    for key in range(4, 7):  # while the report is on its way: 0, 1 and 2 drop out
        log.record(key, NAMES[0], 1)
    log.shared(2)
    assert [k for k, _, _ in log.unshared(10)] == [3, 4, 5, 6]


class ReferenceRecord:
    """The placement record's contract, written the plain way."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: dict[int, tuple[str, int, bool]] = {}  # insertion ordered

    def record(self, key: int, upstream: str, size: int) -> None:
        if key not in self.entries:
            self._put(key, (upstream, size, False))

    def learn(self, key: int, upstream: str, size: int) -> None:
        known = self.entries.get(key)
        if known is not None:
            if known[2]:
                return
            del self.entries[key]
        self._put(key, (upstream, size, True))

    def _put(self, key: int, entry: tuple[str, int, bool]) -> None:
        self.entries[key] = entry
        while len(self.entries) > self.capacity:
            del self.entries[next(iter(self.entries))]

    def blocks(self, upstream: str) -> int:
        return sum(size for u, size, _ in self.entries.values() if u == upstream)


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=5),
    ops=st.lists(
        st.tuples(st.booleans(), st.integers(0, 8), st.sampled_from(NAMES), st.integers(1, 40)),
        max_size=60,
    ),
)
def test_the_record_stays_bounded_first_entry_wins_and_totals_add_up(
    capacity: int, ops: list[tuple[bool, int, str, int]]
) -> None:
    log = PlacementLog(capacity, shared=True)
    reference = ReferenceRecord(capacity)
    for learned, key, upstream, size in ops:
        for record in (log, reference):
            (record.learn if learned else record.record)(key, upstream, size)
        assert len(log) <= capacity  # the record's own bound, not the reference's
        assert len(log) == len(reference.entries)
        for k in range(9):
            expected = reference.entries.get(k)
            assert log.get(k) == (None if expected is None else expected[0])
        for u in NAMES:
            assert log.blocks(u) == reference.blocks(u)
