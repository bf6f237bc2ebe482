"""The five built-in scorers against the formulas of ROUTING.md, on real Readings,
InFlight and Fleet objects, built by the names users type."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from gateway.core.prefix import prompt_blocks
from gateway.core.rendezvous import stable_hash
from gateway.plugins import Plugins
from gateway.routing.fleet import Fleet
from gateway.routing.inflight import InFlight
from gateway.routing.readings import Reading, Readings
from gateway.routing.request import RouteRequest
from gateway.settings import Settings

A, B, C, D = URLS = [f"http://vllm-{name}:8000" for name in "abcd"]


def scorer(name: str, **settings: Any) -> Any:
    """A scorer built the way a gateway builds it: by name, through the plugin facade."""
    return Plugins(Settings(**settings), entry_points=False).build("routing scorer", name)


def fleet(
    readings: dict[str, dict[str, float | None]] | None = None,
    ours: dict[str, int] | None = None,
) -> Fleet:
    """Readings set as a scrape would set them, our in-flight counts as routing adds them."""
    scraped = Readings(URLS, stale_after_s=60.0)
    for url in URLS:
        fields = (readings or {}).get(url, {})
        scraped.update(Reading(url, healthy=True, at=time.monotonic(), **fields))  # type: ignore[arg-type]
    inflight = InFlight(URLS)
    for url, n in (ours or {}).items():
        for _ in range(n):
            inflight.add(url)
    return Fleet(scraped, inflight)


def request(on: Fleet, blocks: tuple[int, ...] = (), session_id: str | None = None) -> RouteRequest:
    return RouteRequest(
        path="/v1/chat/completions",
        model="llama",
        blocks=blocks,
        session_id=session_id,
        tenant="t",
        fleet=on,
    )


# -- queue-depth: (maxQ - q) / (maxQ - minQ), q = waiting + ours ----------------------------------


@pytest.mark.parametrize(
    ("waiting", "ours", "candidates", "expected"),
    [
        ({A: 0, B: 5, C: 10}, {}, [A, B, C], {A: 1.0, B: 0.5, C: 0.0}),
        # our own requests count as queued, at once, before any scrape shows them
        ({A: 2, B: 2}, {A: 3}, [A, B], {A: 0.0, B: 1.0}),
        (
            {A: 0, B: 0, C: 0, D: 0},
            {A: 1, B: 2, C: 3, D: 5},
            URLS,
            {A: 1.0, B: 0.75, C: 0.5, D: 0.0},
        ),
        # all equal (scraped plus ours): every upstream scores 1
        ({A: 4, B: 2, C: 0}, {B: 2, C: 4}, [A, B, C], {A: 1.0, B: 1.0, C: 1.0}),
        ({A: 0, B: 0, C: 0, D: 0}, {}, URLS, dict.fromkeys(URLS, 1.0)),
        # no waiting number exported: counts as 0 waiting
        ({A: None, B: 4}, {}, [A, B], {A: 1.0, B: 0.0}),
        # min and max are taken over the candidates only
        ({A: 0, B: 5, C: 10}, {}, [B, C], {B: 1.0, C: 0.0}),
        ({A: 3, B: 7}, {}, [A], {A: 1.0}),
    ],
    ids=[
        "scraped",
        "ours-count",
        "ours-only",
        "all-equal-mixed",
        "all-idle",
        "missing-waiting",
        "candidates-only",
        "single",
    ],
)
def test_queue_depth_formula(
    waiting: dict[str, float | None],
    ours: dict[str, int],
    candidates: list[str],
    expected: dict[str, float],
) -> None:
    """``(maxQ - q) / (maxQ - minQ)`` with q = scraped waiting + our in flight; ties all 1."""
    on = fleet({u: {"waiting": w, "running": 100.0} for u, w in waiting.items()}, ours)
    assert scorer("queue-depth").score(request(on), candidates) == pytest.approx(expected)


def test_queue_depth_ignores_running_requests() -> None:
    """Running requests are the upstream's batch, not its queue: only waiting counts."""
    on = fleet({A: {"waiting": 1, "running": 50}, B: {"waiting": 1, "running": 0}})
    assert scorer("queue-depth").score(request(on), [A, B]) == {A: 1.0, B: 1.0}


def test_queue_depth_of_no_candidates_is_empty() -> None:
    """With no candidates there is nothing to score (and no division by zero)."""
    assert scorer("queue-depth").score(request(fleet()), []) == {}


# -- kv-utilization: 1 - kv ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kv", "expected"),
    [
        ({A: 0.25, B: 0.0, C: 1.0, D: 0.9}, {A: 0.75, B: 1.0, C: 0.0, D: 0.1}),
        # an upstream that exports no KV usage scores 0
        ({A: None, B: 0.5, C: None, D: 0.0}, {A: 0.0, B: 0.5, C: 0.0, D: 1.0}),
    ],
    ids=["scraped", "missing"],
)
def test_kv_utilization_formula(kv: dict[str, float | None], expected: dict[str, float]) -> None:
    """``1 - kv``; an upstream with no KV number is not preferred (0)."""
    on = fleet({u: {"kv_usage": value} for u, value in kv.items()}, {A: 5})
    assert scorer("kv-utilization").score(request(on), URLS) == pytest.approx(expected)


# -- load-balance: 1 / (1 + waiting + running + ours) ------------------------------------------


@pytest.mark.parametrize(
    ("scraped", "ours", "expected"),
    [
        (
            {A: (1, 2), B: (0, 0), C: (None, 3), D: (None, None)},
            {A: 1},
            {A: 0.2, B: 1.0, C: 0.25, D: 1.0},
        ),
        (
            {A: (0, 0), B: (0, 0), C: (0, 0), D: (0, 0)},
            {A: 1, B: 3, D: 9},
            {A: 0.5, B: 0.25, C: 1.0, D: 0.1},
        ),
        ({A: (2.5, 1.5), B: (4, 0), C: (0, 4), D: (1, 1)}, {D: 2}, dict.fromkeys(URLS, 0.2)),
    ],
    ids=["mixed", "ours-only", "equal-load"],
)
def test_load_balance_formula(
    scraped: dict[str, tuple[float | None, float | None]],
    ours: dict[str, int],
    expected: dict[str, float],
) -> None:
    """``1 / (1 + waiting + running + ours)``; a missing number counts as 0."""
    on = fleet({u: {"waiting": w, "running": r} for u, (w, r) in scraped.items()}, ours)
    assert scorer("load-balance").score(request(on), URLS) == pytest.approx(expected)


# -- session-affinity --------------------------------------------------------------------------


def test_session_affinity_scores_one_for_the_rendezvous_upstream_of_the_session() -> None:
    """Exactly one upstream scores 1 for a session: the one rendezvous hashing assigns."""
    on = fleet()
    for i in range(50):
        session = f"session-{i}"
        scores = scorer("session-affinity").score(request(on, session_id=session), URLS)
        assert scores == {on.rendezvous(stable_hash(session), URLS): 1.0}


def test_two_pods_put_a_session_on_the_same_upstream() -> None:
    """Two gateway pods (separate scorers, separate state) agree on every session."""
    pod1, pod2 = scorer("session-affinity"), scorer("session-affinity")
    fleet1, fleet2 = fleet(ours={A: 7}), fleet({B: {"waiting": 30}})
    chosen = Counter()
    for i in range(200):
        session = f"user-{i}"
        one = pod1.score(request(fleet1, session_id=session), URLS)
        two = pod2.score(request(fleet2, session_id=session), list(reversed(URLS)))
        assert one == two
        chosen.update(one)
    # sessions are spread, not all kept on one upstream
    assert set(chosen) == set(URLS)


@pytest.mark.parametrize("session_id", [None, ""])
def test_session_affinity_has_no_opinion_without_a_session_id(session_id: str | None) -> None:
    """A request with no session id scores nothing anywhere."""
    assert scorer("session-affinity").score(request(fleet(), session_id=session_id), URLS) == {}


def test_a_session_moves_only_when_its_upstream_leaves_the_candidates() -> None:
    """Losing an upstream moves only the sessions it held; all others stay put."""
    score = scorer("session-affinity").score
    on = fleet()
    moved = 0
    for i in range(300):
        session = f"conversation-{i}"
        home = next(iter(score(request(on, session_id=session), URLS)))
        for gone in URLS:
            rest = [u for u in URLS if u != gone]
            now = next(iter(score(request(on, session_id=session), rest)))
            if gone == home:
                moved += 1
                assert now in rest
                assert now == on.rendezvous(stable_hash(session), rest)
            else:
                assert now == home
    assert moved == 300


# -- prefix-affinity ------------------------------------------------------------------------------

BLOCK = 16


def prompt(*parts: str, model: str = "llama") -> tuple[int, ...]:
    """Blocks of a prompt made of ``BLOCK``-sized parts."""
    text = b"".join(part.encode().ljust(BLOCK, b".")[:BLOCK] for part in parts)
    return prompt_blocks(text, seed=model.encode(), block_bytes=BLOCK)


SYSTEM = ("you are", "a helpful", "assistant")


@pytest.mark.parametrize(
    ("query", "expected_on_a"),
    [
        (prompt(*SYSTEM, "question 1"), 1.0),
        (prompt(*SYSTEM, "question 2"), 0.75),
        (prompt(*SYSTEM[:2], "other", "question 1"), 0.5),
        (prompt(*SYSTEM, "question 1", "more", "and more", "and more", "end"), 0.5),
        (prompt(*SYSTEM[:1]), 1.0),
    ],
    ids=["same", "three-of-four", "two-of-four", "four-of-eight", "head-only"],
)
def test_prefix_affinity_is_matched_leading_blocks_over_total(
    query: tuple[int, ...], expected_on_a: float
) -> None:
    """After a prompt is dispatched to an upstream, a later prompt scores there the share of
    its blocks that lead with the same blocks; upstreams holding none are left out (0)."""
    affinity = scorer("prefix-affinity")
    on = fleet()
    affinity.dispatched(request(on, prompt(*SYSTEM, "question 1")), A)
    assert affinity.score(request(on, query), URLS) == pytest.approx({A: expected_on_a})


def test_prefix_affinity_credits_every_holder_with_its_own_depth() -> None:
    """Several upstreams holding different depths of a prompt each score their share."""
    affinity = scorer("prefix-affinity")
    on = fleet()
    full = prompt(*SYSTEM, "question")
    affinity.dispatched(request(on, full), A)
    affinity.dispatched(request(on, prompt(SYSTEM[0], "else")), B)
    affinity.dispatched(request(on, prompt(*SYSTEM[:2], "x", "y")), C)
    assert affinity.score(request(on, full), URLS) == pytest.approx({A: 1.0, B: 0.25, C: 0.5})
    assert affinity.score(request(on, full), [B, C, D]) == pytest.approx({B: 0.25, C: 0.5})


def test_prefix_affinity_has_no_opinion_without_a_full_block() -> None:
    """A prompt shorter than one block (no hashes) scores nothing anywhere."""
    affinity = scorer("prefix-affinity")
    on = fleet()
    affinity.dispatched(request(on), A)  # recording nothing must not fail either
    assert affinity.score(request(on), URLS) == {}


def test_an_unseen_prefix_scores_one_on_its_rendezvous_upstream_only() -> None:
    """A prefix no upstream holds scores 1 on exactly one upstream: the one rendezvous
    hashing of its first block assigns."""
    affinity = scorer("prefix-affinity")
    on = fleet()
    placed = Counter()
    for i in range(200):
        blocks = prompt(f"document {i}", "summarise it")
        scores = affinity.score(request(on, blocks), URLS)
        assert scores == {on.rendezvous(blocks[0], URLS): 1.0}
        placed.update(scores)
    assert set(placed) == set(URLS)


def test_two_pods_place_a_new_prefix_on_the_same_upstream() -> None:
    """Two gateway pods that never talked send a new prefix to the same upstream, its
    rendezvous upstream, whatever each has routed before, and keep it there."""
    pod1, pod2 = scorer("prefix-affinity"), scorer("prefix-affinity")
    fleet1, fleet2 = fleet(ours={A: 3}), fleet({C: {"waiting": 9}})
    on_rendezvous = 0
    for i in range(100):
        blocks = prompt(f"system prompt {i}", "tools", "question")
        one = pod1.score(request(fleet1, blocks), URLS)
        two = pod2.score(request(fleet2, blocks), list(reversed(URLS)))
        assert one == two
        (home,) = one
        on_rendezvous += home == fleet1.rendezvous(blocks[0], URLS)
        pod1.dispatched(request(fleet1, blocks), home)
        assert pod1.score(request(fleet1, blocks), URLS) == {home: 1.0}
    assert on_rendezvous == 100


def test_a_prefix_whose_holders_are_not_candidates_counts_as_unseen() -> None:
    """When the only holder of a prefix is passed over, the prefix is placed again by
    rendezvous over the remaining candidates (the same on every pod)."""
    affinity = scorer("prefix-affinity")
    on = fleet()
    blocks = prompt(*SYSTEM, "question")
    affinity.dispatched(request(on, blocks), A)
    rest = [B, C, D]
    assert affinity.score(request(on, blocks), rest) == {on.rendezvous(blocks[0], rest): 1.0}
    assert on.rendezvous(blocks[0], rest) in rest


def test_a_pods_own_first_placement_does_not_pull_a_prefix_back_from_where_it_is_held() -> None:
    """A prefix this pod placed on A, later sent to B while A was passed over, stays with
    B once A's memory of it is gone: only another pod's placement overrides what this pod
    holds (that is how pods agree)."""
    affinity = scorer("prefix-affinity", prefix_index_blocks=4)
    on = fleet()
    blocks = prompt(*SYSTEM, "question")
    home = on.rendezvous(blocks[0], URLS)
    affinity.dispatched(request(on, blocks), home)  # placed there first, by this pod
    other = next(u for u in URLS if u != home)
    affinity.dispatched(request(on, blocks), other)  # the home was not a candidate
    # the home's memory fills up with other prompts, and forgets this one
    for i in range(4):
        affinity.dispatched(request(on, prompt(f"unrelated {i}", "text")), home)
    assert affinity.score(request(on, blocks), URLS) == {other: 1.0}


def test_prefix_affinity_memory_is_bounded_by_prefix_index_blocks() -> None:
    """``prefix_index_blocks`` bounds what is remembered per upstream: the tail goes first."""
    affinity = scorer("prefix-affinity", prefix_index_blocks=2)
    on = fleet()
    blocks = prompt(*SYSTEM, "question")
    affinity.dispatched(request(on, blocks), A)
    assert affinity.score(request(on, blocks), URLS) == {A: 0.5}


def test_a_different_model_does_not_inherit_prefix_affinity() -> None:
    """The same prompt for another model is a new prefix (its blocks are seeded apart)."""
    affinity = scorer("prefix-affinity")
    on = fleet()
    llama = prompt(*SYSTEM, "question")
    qwen = prompt(*SYSTEM, "question", model="qwen")
    placed = on.rendezvous(qwen[0], URLS)
    elsewhere = next(u for u in URLS if u != placed)
    affinity.dispatched(request(on, llama), elsewhere)
    assert affinity.score(request(on, llama), URLS) == {elsewhere: 1.0}
    assert affinity.score(request(on, qwen), URLS) == {placed: 1.0}
