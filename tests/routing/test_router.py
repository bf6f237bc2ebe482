"""The router assembled by a real Gateway: filters, policies, load guard, decisions."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gateway import Gateway, Settings, hookimpl
from gateway.errors import Unroutable
from gateway.proxy import route_of
from gateway.routing.readings import Reading
from gateway.routing.request import RouteRequest, blocks_of, parse_body, prompt_text
from gateway.routing.router import Decision, Router

A, B, C, D = URLS = [f"http://vllm-{name}:8000" for name in "abcd"]
LONG_PROMPT = "You are a careful assistant. Answer in English. " * 40  # about 8 blocks


def gateway(
    upstreams: Sequence[str] = URLS, *, plugins: Sequence[object] = (), **settings: Any
) -> Gateway:
    """A gateway whose readings never go stale on their own during a test."""
    settings.setdefault("routing_seed", 1)
    settings.setdefault("upstream_poll_interval_s", 60.0)  # stale after 180 s
    return Gateway(
        Settings(upstreams=list(upstreams), **settings), plugins=plugins, entry_points=False
    )


def router_of(gw: Gateway) -> Router:
    assert gw.router is not None
    return gw.router


def scraped(
    gw: Gateway,
    url: str,
    *,
    healthy: bool = True,
    waiting: float | None = 0.0,
    running: float | None = 0.0,
    kv_usage: float | None = None,
    stale: bool = False,
) -> None:
    """Set the reading of ``url`` by hand, as the poller would after a scrape."""
    at = time.monotonic() - (10_000.0 if stale else 0.0)
    gw.readings.update(
        Reading(url, healthy=healthy, waiting=waiting, running=running, kv_usage=kv_usage, at=at)
    )


def all_scraped(gw: Gateway, urls: Sequence[str] = URLS, **fields: Any) -> None:
    for url in urls:
        scraped(gw, url, **fields)


def route(
    gw: Gateway, prompt: str | None = None, *, model: str | None = None, session: str | None = None
) -> Decision:
    router = router_of(gw)
    payload: dict[str, object] = {} if prompt is None else {"prompt": prompt}
    if model is not None:
        payload["model"] = model
    text = prompt_text(payload)
    request = RouteRequest(
        path="/v1/completions",
        model=model,
        blocks=blocks_of(text, model, gw.settings.prefix_block_bytes) if text else (),
        session_id=session,
        tenant="t",
        fleet=router.fleet,
    )
    return router.route(request)


def in_flight(gw: Gateway) -> dict[str, int]:
    return dict(router_of(gw).in_flight())


# -- filters ------------------------------------------------------------------------------------

MODEL_UPSTREAMS = [f"{A}=llama", f"{B}=qwen", f"{C}=llama|qwen"]


def test_a_request_goes_only_to_upstreams_serving_its_model() -> None:
    """A request naming a model is routed only where that model is served."""
    gw = gateway(MODEL_UPSTREAMS, routing_scorers="queue-depth:1")
    all_scraped(gw, [A, B, C])
    chosen = Counter()
    for _ in range(40):
        decision = route(gw, model="qwen")
        assert set(decision.ranking) == {B, C}
        chosen[decision.upstream] += 1
        decision.finish()
    assert set(chosen) == {B, C}
    for _ in range(40):
        decision = route(gw, model="llama")
        assert set(decision.ranking) == {A, C}
        decision.finish()


def test_without_model_lists_the_models_the_metrics_name_filter_the_upstreams() -> None:
    """Upstreams configured without models are matched against the ``model_name`` labels
    of their metrics: an upstream whose metrics name other models only is left out; one
    whose metrics name none stays; a model no metrics name may go to any (the upstreams
    answer for it), and so may a request naming no model."""
    gw = gateway(routing_scorers="queue-depth:1")
    all_scraped(gw)
    now = time.monotonic()
    for url, models in ((A, {"llama"}), (B, {"qwen"}), (C, {"llama", "qwen"})):
        gw.readings.update(
            Reading(url, healthy=True, waiting=0.0, running=0.0, at=now, models=frozenset(models))
        )
    for model, candidates in (("qwen", {B, C, D}), ("llama", {A, C, D}), ("lora-1", URLS)):
        decision = route(gw, model=model)
        assert set(decision.ranking) == set(candidates), model
        decision.finish()
    assert set(route(gw).ranking) == set(URLS)


def test_a_configured_model_list_wins_over_the_metrics_of_other_upstreams() -> None:
    """An upstream configured for a model stays a candidate for it whatever its metrics
    name (a served alias), beside the upstreams whose metrics name the model."""
    gw = gateway([f"{A}=llama", B, C], routing_scorers="queue-depth:1")
    now = time.monotonic()
    for url, models in ((A, {"llama-3-8b"}), (B, {"llama"}), (C, {"mistral"})):
        gw.readings.update(
            Reading(url, healthy=True, waiting=0.0, running=0.0, at=now, models=frozenset(models))
        )
    decision = route(gw, model="llama")
    assert set(decision.ranking) == {A, B}  # C's metrics name another model only
    decision.finish()
    gw.readings.update(  # B fails its health checks; its last metrics still name llama
        Reading(B, healthy=False, waiting=0.0, running=0.0, at=now, models=frozenset({"llama"}))
    )
    for _ in range(5):
        decision = route(gw, model="llama")
        assert decision.ranking == [A]  # not a 503 while A is healthy, never C
        decision.finish()


def test_a_request_naming_no_model_may_go_anywhere() -> None:
    """Without a model in the body every healthy upstream is a candidate."""
    gw = gateway(MODEL_UPSTREAMS, routing_scorers="queue-depth:1")
    all_scraped(gw, [A, B, C])
    decision = route(gw)
    assert set(decision.ranking) == {A, B, C}


def test_an_unserved_model_is_a_404_naming_the_served_models() -> None:
    """A model no upstream serves is answered 404 model_not_found, listing what is served."""
    gw = gateway(MODEL_UPSTREAMS)
    all_scraped(gw, [A, B, C])
    with pytest.raises(Unroutable) as caught:
        route(gw, model="mistral")
    assert caught.value.status == 404
    assert caught.value.code == "model_not_found"
    message = str(caught.value)
    assert "mistral" in message
    assert "llama" in message
    assert "qwen" in message
    assert in_flight(gw) == dict.fromkeys([A, B, C], 0)


def test_unhealthy_upstreams_are_skipped() -> None:
    """An upstream failing its health checks gets no requests and is not a fallback."""
    gw = gateway()
    all_scraped(gw)
    scraped(gw, B, healthy=False)
    scraped(gw, D, healthy=False)
    chosen = Counter()
    for i in range(40):
        decision = route(gw, f"{i} " + LONG_PROMPT)
        assert set(decision.ranking) == {A, C}
        chosen[decision.upstream] += 1
    assert set(chosen) == {A, C}


@pytest.mark.parametrize("never_scraped", [True, False])
def test_no_healthy_upstream_is_a_503(never_scraped: bool) -> None:
    """When every upstream that serves the request fails its health checks: 503."""
    gw = gateway()
    if not never_scraped:
        all_scraped(gw, healthy=False)
    with pytest.raises(Unroutable) as caught:
        route(gw, LONG_PROMPT)
    assert caught.value.status == 503
    assert caught.value.code == "no_healthy_upstream"
    assert in_flight(gw) == dict.fromkeys(URLS, 0)


def test_a_healthy_upstream_of_another_model_does_not_help() -> None:
    """If the model's upstreams are down the answer is 503, even with others healthy."""
    gw = gateway(MODEL_UPSTREAMS)
    scraped(gw, A)
    scraped(gw, B, healthy=False)
    scraped(gw, C, healthy=False)
    with pytest.raises(Unroutable) as caught:
        route(gw, model="qwen")
    assert (caught.value.status, caught.value.code) == (503, "no_healthy_upstream")


def test_a_stale_reading_is_passed_over_while_fresh_ones_exist() -> None:
    """Stale is saturated: an upstream whose numbers are old is tried last, even when its
    last numbers looked best."""
    gw = gateway([A, B], routing_scorers="queue-depth:1")
    scraped(gw, A, waiting=0, stale=True)
    scraped(gw, B, waiting=50)
    for _ in range(10):
        decision = route(gw)
        assert decision.upstream == B
        assert decision.ranking == [B, A]
        decision.finish()


def test_when_every_reading_is_stale_routing_goes_on() -> None:
    """With only stale readings every healthy upstream stays a candidate."""
    gw = gateway([A, B], routing_scorers="queue-depth:1")
    scraped(gw, A, waiting=0, stale=True)
    scraped(gw, B, waiting=50, stale=True)
    decision = route(gw)
    assert decision.upstream == A
    assert decision.ranking == [A, B]


def test_the_load_bound_passes_over_an_upstream_with_too_many_in_flight() -> None:
    """An upstream holding a prefix (and queueing requests) is passed over once its
    requests in flight would exceed ``routing_load_bound`` times the average; with a
    looser bound it keeps them."""
    for bound, expect_home in ((1.5, False), (10.0, True)):
        gw = gateway([A, B], routing_load_bound=bound)
        for _ in range(2):  # a queue is one seen in two scrapes
            all_scraped(gw, [A, B], waiting=2)
        first = route(gw, LONG_PROMPT)
        home = first.upstream
        other = B if home == A else A
        first.finish()
        for _ in range(4):
            router_of(gw).fleet.inflight.add(home)
        decision = route(gw, LONG_PROMPT)
        if expect_home:
            assert decision.upstream == home
        else:
            assert decision.upstream == other
            assert decision.ranking == [other, home]


@pytest.mark.parametrize(
    ("scrapes", "passed_over"),
    [
        ([0, 2], False),  # one scrape caught two requests between two engine steps
        ([2, 0], False),  # the queue is gone
        ([1, 1], False),  # one request kept waiting: not worth a cold prefill elsewhere
        ([2, 3], True),  # a queue of two or more, seen twice: a queue
    ],
)
def test_the_load_guard_acts_on_a_queue_seen_in_two_scrapes_in_a_row(
    scrapes: list[float], passed_over: bool
) -> None:
    """Over the load bound, the holder of a prefix is passed over only when it kept at
    least two requests waiting over its last two scrapes, not on a single scrape."""
    gw = gateway([A, B])
    all_scraped(gw, [A, B], waiting=0)
    first = route(gw, LONG_PROMPT)
    home = first.upstream
    first.finish()
    for waiting in scrapes:
        scraped(gw, home, waiting=waiting)
    assert gw.readings.queued(home) == min(scrapes)
    for _ in range(4):
        router_of(gw).fleet.inflight.add(home)
    decision = route(gw, LONG_PROMPT)
    assert (decision.upstream != home) is passed_over


# -- policies -------------------------------------------------------------------------------------


def test_round_robin_cycles_over_healthy_upstreams_in_order() -> None:
    """``round-robin``: request n goes to healthy upstream n mod k, in configured order."""
    gw = gateway(routing_policy="round-robin")
    all_scraped(gw)
    scraped(gw, B, healthy=False)
    chosen = []
    for i in range(7):
        decision = route(gw, LONG_PROMPT)
        chosen.append(decision.upstream)
        assert B not in decision.ranking
        if i % 2:
            decision.finish()
    assert chosen == [A, C, D, A, C, D, A]


def test_round_robin_walks_each_models_upstreams_when_requests_for_models_interleave() -> None:
    """Requests for two models in alternation: each model's requests take turns over the
    upstreams that serve it (with one turn for all, every qwen request landed on one)."""
    gw = gateway([f"{A}=llama|qwen", f"{B}=llama|qwen", f"{C}=llama"], routing_policy="round-robin")
    all_scraped(gw, [A, B, C])
    chosen: dict[str, list[str]] = {"llama": [], "qwen": []}
    for _ in range(6):
        for model in ("llama", "qwen"):
            decision = route(gw, model=model)
            chosen[model].append(decision.upstream)
            decision.finish()
    assert chosen == {"llama": [A, B, C, A, B, C], "qwen": [A, B, A, B, A, B]}


def test_least_loaded_picks_the_fewest_waiting_running_and_ours() -> None:
    """``least-loaded``: minimum of waiting + running + our in flight, stale readings last,
    ties to the fewest of ours; our new request counts at once."""
    gw = gateway(routing_policy="least-loaded")
    scraped(gw, A, waiting=3, running=2)  # 5
    scraped(gw, B, waiting=1, running=1)  # 2 + 2 of ours = 4
    scraped(gw, C, waiting=0, running=0, stale=True)  # looks idle, but stale
    scraped(gw, D, waiting=2, running=2)  # 4, none of ours
    router_of(gw).fleet.inflight.add(B)
    router_of(gw).fleet.inflight.add(B)
    first = route(gw)
    assert first.ranking == [D, B, A, C]
    assert first.scores["load"] == {A: 5.0, B: 4.0, C: 0.0, D: 4.0}
    second = route(gw)  # D now has one of ours too: 5
    assert second.upstream == B


# -- decisions ------------------------------------------------------------------------------------


def test_finish_gives_the_in_flight_count_back_once() -> None:
    """``finish()`` decrements once; calling it again neither fails nor decrements."""
    gw = gateway([A])
    scraped(gw, A)
    one, two = route(gw), route(gw)
    assert in_flight(gw) == {A: 2}
    assert one.finish() is True
    assert in_flight(gw) == {A: 1}
    assert one.finish() is False
    assert in_flight(gw) == {A: 1}
    assert two.finish() is True
    assert in_flight(gw) == {A: 0}


def test_reroute_moves_the_request_down_the_ranking() -> None:
    """``reroute()`` moves the request (and its in-flight count) to the next upstream in
    the ranking; at the end of the ranking it returns None and changes nothing."""
    gw = gateway([A, B, C])
    all_scraped(gw, [A, B, C])
    decision = route(gw, LONG_PROMPT)
    first, second, third = decision.ranking
    assert in_flight(gw) == {first: 1, second: 0, third: 0}
    assert decision.reroute() == second
    assert decision.upstream == second
    assert in_flight(gw) == {first: 0, second: 1, third: 0}
    assert decision.reroute() == third
    assert in_flight(gw) == {first: 0, second: 0, third: 1}
    assert decision.reroute() is None
    assert decision.upstream == third
    assert in_flight(gw) == {first: 0, second: 0, third: 1}
    assert decision.finish() is True
    assert in_flight(gw) == dict.fromkeys([A, B, C], 0)


def test_the_decision_is_a_route_the_proxy_follows() -> None:
    """What the router leaves in the scope state is what the proxy reads as the route."""
    gw = gateway([A, B])
    all_scraped(gw, [A, B])
    decision = route(gw, LONG_PROMPT)
    assert route_of({"type": "http", "state": {"obleth": {"route": decision}}}) is decision
    decision.finish()


def test_reroute_after_finish_does_nothing() -> None:
    """A finished request cannot be rerouted: None, and no count appears anywhere."""
    gw = gateway([A, B])
    all_scraped(gw, [A, B])
    decision = route(gw)
    decision.finish()
    assert decision.reroute() is None
    assert in_flight(gw) == {A: 0, B: 0}


def test_a_burst_between_scrapes_spreads_evenly_over_queue_depth() -> None:
    """Counting at decision time: 100 requests routed before any finishes (and before the
    next scrape) land 25 on each of 4 identical upstreams, not all on one."""
    gw = gateway(routing_scorers="queue-depth:1")
    all_scraped(gw, waiting=3, running=5)
    chosen = Counter(route(gw).upstream for _ in range(100))
    assert set(chosen) == set(URLS)
    for url in URLS:
        assert 24 <= chosen[url] <= 26, chosen
    assert in_flight(gw) == dict(chosen)


def test_a_repeated_prompt_stays_on_one_upstream_while_it_keeps_up() -> None:
    """Prefix affinity: the same prompt, one request at a time, always goes to the upstream
    rendezvous hashing picked for it."""
    gw = gateway(routing_scorers="prefix-affinity:5,queue-depth:1")
    all_scraped(gw)
    router = router_of(gw)
    text = prompt_text({"prompt": LONG_PROMPT})
    home = router.fleet.rendezvous(blocks_of(text, None, gw.settings.prefix_block_bytes)[0], URLS)
    for _ in range(30):
        decision = route(gw, LONG_PROMPT)
        assert decision.upstream == home
        decision.finish()


def test_prefix_free_traffic_is_spread_like_round_robin_within_one_of_the_least_loaded() -> None:
    """Uniform traffic (every prompt new) under ``prefix-affinity:5,queue-depth:1``, the
    default: a new prompt misses the cache wherever it goes, so load decides. Each request
    goes to an upstream within one request of the fewest of ours in flight, and a burst
    with nothing finishing covers all four upstreams every four requests, as round-robin
    does. (Each prompt used to go to its rendezvous upstream whenever that was within 1.25x
    the average: a random pick, whose TTFT p99 was 2.4x round-robin's.)"""
    gw = gateway(routing_scorers="prefix-affinity:5,queue-depth:1")
    all_scraped(gw)
    burst = [route(gw, f"burst {i}: " + LONG_PROMPT) for i in range(40)]
    for i in range(len(burst) - 3):
        assert {d.upstream for d in burst[i : i + 4]} == set(URLS), i
    for decision in burst:
        decision.finish()
    rng = random.Random(3)
    open_: list[Decision] = []
    above = []
    for i in range(600):
        before = in_flight(gw)
        decision = route(gw, f"request {i}: " + LONG_PROMPT)
        if before[decision.upstream] > min(before.values()) + 1:
            above.append(i)
        open_.append(decision)
        while len(open_) > 10 or (open_ and rng.random() < 0.5):
            open_.pop(rng.randrange(len(open_))).finish()
    assert above == []


def test_a_system_prompt_every_request_shares_is_spread_over_every_upstream() -> None:
    """One system prompt, then a distinct question, in every request, six in flight at a
    time (no queue builds, so the load guard never acts): once the prompt brings more
    than one upstream's fair share of the traffic it gains holders until all four hold
    it, and from then on load decides among them. (It used to stay on one upstream, which
    then took every request: vLLM production-stack's issue #957.)"""
    gw = gateway(routing_scorers="prefix-affinity:5,queue-depth:1")
    all_scraped(gw)
    chosen = []
    open_: list[Decision] = []
    for i in range(600):
        decision = route(gw, LONG_PROMPT + f" question {i}")
        chosen.append(decision.upstream)
        open_.append(decision)
        if len(open_) > 6:
            open_.pop(0).finish()
    assert len(set(chosen[:8])) == 1, "a prompt seen a few times stays where it is cached"
    late = Counter(chosen[300:])
    assert set(late) == set(URLS)
    assert max(late.values()) <= 1.5 * 300 / len(URLS), late


def test_a_popular_prompt_whose_upstream_keeps_up_is_not_copied() -> None:
    """The same prompt in every request, each finished before the next: its upstream is
    never busier than the others, so the prompt is not copied anywhere (a copy costs a
    cold prefill, and nothing would be gained)."""
    gw = gateway(routing_scorers="prefix-affinity:5,queue-depth:1")
    all_scraped(gw)
    chosen = set()
    for i in range(300):
        decision = route(gw, LONG_PROMPT + f" question {i}")
        chosen.add(decision.upstream)
        decision.finish()
    assert len(chosen) == 1


def test_sixteen_system_prompts_chosen_at_random_each_stay_on_one_upstream() -> None:
    """Prompts no more popular than a fair share are never copied to a second upstream
    by chance: each of sixteen, chosen at random, eight requests in flight at a time,
    stays where it was placed."""
    gw = gateway(routing_scorers="prefix-affinity:5,queue-depth:1")
    all_scraped(gw)
    rng = random.Random(8)
    systems = [f"system prompt {n}: " + LONG_PROMPT for n in range(16)]
    where: dict[int, set[str]] = {}
    open_: list[Decision] = []
    for i in range(2000):
        n = rng.randrange(16)
        decision = route(gw, systems[n] + f" question {i}")
        where.setdefault(n, set()).add(decision.upstream)
        open_.append(decision)
        if len(open_) > 8:
            open_.pop(rng.randrange(len(open_))).finish()
    assert all(len(upstreams) == 1 for upstreams in where.values()), where


@pytest.mark.parametrize("bound", [1.0, 1.5, 2.0, 3.0])
def test_the_load_guard_keeps_a_hot_prefix_from_piling_onto_one_upstream(bound: float) -> None:
    """A burst of one prompt to busy upstreams starts on the prompt's upstream, then spreads
    once the load guard passes it over: no upstream ever holds more than
    ceil(bound x average)."""
    gw = gateway(routing_scorers="prefix-affinity:5,queue-depth:1", routing_load_bound=bound)
    for _ in range(2):  # a queue is one seen in two scrapes
        all_scraped(gw, waiting=2, running=8)
    first = route(gw, LONG_PROMPT).upstream
    for sent in range(2, 101):
        route(gw, LONG_PROMPT)
        counts = in_flight(gw)
        assert sum(counts.values()) == sent
        assert max(counts.values()) <= math.ceil(bound * sent / len(URLS)), (sent, counts)
    counts = in_flight(gw)
    assert counts[first] > 0
    assert len([u for u in URLS if counts[u] > 0]) >= 2


def test_a_burst_between_scrapes_does_not_pile_a_hot_prefix_onto_an_idle_upstream() -> None:
    """Count at decision time (ROUTING.md): 100 requests of one prompt sent before the
    next scrape, to upstreams whose last scrape showed them idle, are held to
    ceil(routing_load_bound x average) per upstream like any other burst; the guard does
    not wait for a scrape to show the queue it let build up."""
    gw = gateway(routing_scorers="prefix-affinity:5,queue-depth:1", routing_load_bound=1.5)
    all_scraped(gw, waiting=0, running=0)
    for _ in range(100):
        route(gw, LONG_PROMPT)
    counts = in_flight(gw)
    assert sum(counts.values()) == 100
    assert max(counts.values()) <= math.ceil(1.5 * 100 / len(URLS)), counts


def test_decision_scores_name_every_scorer_and_the_total_within_zero_one() -> None:
    """``decision.scores`` has one entry per configured scorer plus ``total``, each score
    in [0, 1], and the chosen upstream has the best total."""
    scorers = "prefix-affinity:5,queue-depth:1,kv-utilization:1,load-balance:1,session-affinity:1"
    gw = gateway(routing_scorers=scorers)
    for i, url in enumerate(URLS):
        scraped(gw, url, waiting=i, running=2 * i, kv_usage=i / 4)
    for i in range(20):
        decision = route(gw, f"{i % 3} " + LONG_PROMPT, session=f"s{i % 5}")
        assert set(decision.scores) == {
            "prefix-affinity",
            "queue-depth",
            "kv-utilization",
            "load-balance",
            "session-affinity",
            "total",
        }
        for per_upstream in decision.scores.values():
            assert set(per_upstream) <= set(URLS)
            assert all(0.0 <= score <= 1.0 for score in per_upstream.values())
        totals = decision.scores["total"]
        # the candidates: upstreams the load guard passed over are not scored
        assert decision.upstream in totals
        assert totals[decision.upstream] == max(totals.values())


def test_the_same_seed_breaks_ties_the_same_way() -> None:
    """Two gateways with the same ``routing_seed`` make the same choices among ties; the
    choices still spread over every upstream."""

    def choices(seed: int) -> list[str]:
        gw = gateway(routing_scorers="queue-depth:1", routing_seed=seed)
        all_scraped(gw)
        result = []
        for _ in range(60):
            decision = route(gw)
            result.append(decision.upstream)
            decision.finish()  # every decision is a full tie
        return result

    first = choices(7)
    assert choices(7) == first
    assert set(first) == set(URLS)
    assert any(choices(seed) != first for seed in (8, 9, 10))


class BrokenScorer:
    def __init__(self, where: str) -> None:
        self.where = where

    def score(self, request: object, upstreams: list[str]) -> Mapping[str, float]:
        if self.where == "score":
            raise RuntimeError("score exploded")
        if self.where == "score-exits":
            raise SystemExit("score exploded")
        if self.where == "appends":
            upstreams.append("http://elsewhere:1")
            return {"http://elsewhere:1": 1.0}
        if self.where == "clears":
            upstreams.clear()
            return {}
        return dict.fromkeys(upstreams, 0.5)

    def dispatched(self, request: object, upstream: str) -> None:
        if self.where == "dispatched":
            raise RuntimeError("dispatched exploded")
        if self.where == "dispatched-exits":
            raise SystemExit("dispatched exploded")
        if self.where == "dispatched-cancelled":
            raise asyncio.CancelledError


class BrokenScorerPlugin:
    """An application plugin offering a scorer that fails on the request path."""

    def __init__(self, where: str) -> None:
        self.__name__ = "broken-scorer-plugin"
        self.where = where

    @hookimpl
    def obleth_routing_scorers(self) -> Mapping[str, Any]:
        return {"broken": lambda settings: BrokenScorer(self.where)}


@pytest.mark.parametrize("where", ["score", "dispatched", "score-exits", "dispatched-exits"])
def test_a_raising_scorer_plugin_is_named_in_the_log_and_the_request_still_routed(
    where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A third-party scorer that raises (``SystemExit`` included) does not fail the
    request: it is routed without that scorer, counted in flight, and the log names the
    plugin."""
    gw = gateway(routing_scorers="broken:1,queue-depth:1", plugins=[BrokenScorerPlugin(where)])
    all_scraped(gw)
    with caplog.at_level(logging.ERROR):
        decision = route(gw, LONG_PROMPT)
    assert decision.upstream in URLS
    assert in_flight(gw)[decision.upstream] == 1
    assert "broken" in decision.scores
    if where.startswith("score"):
        assert decision.scores["broken"] == {}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("broken-scorer-plugin" in message for message in errors), errors
    assert any("exploded" in message for message in errors), errors
    # and the next request is routed too
    route(gw, LONG_PROMPT)
    assert sum(in_flight(gw).values()) == 2


def test_a_request_a_scorer_cancels_in_dispatched_is_not_left_in_flight() -> None:
    """A cancellation raised from a scorer's ``dispatched()`` is passed on, and the
    request it ends, which no one will finish, is not counted in flight for good."""
    gw = gateway(
        routing_scorers="broken:1,queue-depth:1",
        plugins=[BrokenScorerPlugin("dispatched-cancelled")],
    )
    all_scraped(gw)
    for _ in range(3):
        with pytest.raises(asyncio.CancelledError):
            route(gw, LONG_PROMPT)
    assert sum(in_flight(gw).values()) == 0


@pytest.mark.parametrize("where", ["appends", "clears"])
def test_a_scorer_plugin_that_changes_its_list_of_upstreams_changes_nothing_else(
    where: str,
) -> None:
    """A scorer gets its own copy of the candidates: one that adds an upstream of its own,
    or empties the list, used to fail every request with a bare 500 (and the built-in
    scorer after it was blamed). Its answer counts for the candidates only."""
    gw = gateway(routing_scorers="broken:1,queue-depth:1", plugins=[BrokenScorerPlugin(where)])
    all_scraped(gw)
    decision = route(gw, LONG_PROMPT)
    assert decision.upstream in URLS
    assert in_flight(gw)[decision.upstream] == 1
    assert decision.scores["broken"] == {}  # nothing it named is a candidate
    assert set(decision.scores["queue-depth"]) == set(URLS)  # the next scorer saw them all


class WrongScorer:
    """A scorer that gives the first upstream 1.0 and answers ``rest`` for the others, or
    answers ``whole`` instead of a mapping when one is given."""

    def __init__(self, rest: object, whole: object = None) -> None:
        self.rest = rest
        self.whole = whole

    def score(self, request: object, upstreams: list[str]) -> object:
        if self.whole is not None:
            return self.whole(upstreams) if callable(self.whole) else self.whole
        return {u: 1.0 if u == A else self.rest for u in upstreams}


class WrongScorerPlugin:
    """An application plugin offering ``WrongScorer`` as ``wrong``."""

    __name__ = "wrong-scorer-plugin"

    def __init__(self, scorer: WrongScorer) -> None:
        self.scorer = scorer

    @hookimpl
    def obleth_routing_scorers(self) -> Mapping[str, Any]:
        return {"wrong": lambda settings: self.scorer}


@pytest.mark.parametrize(
    ("scorer", "complaint"),
    [
        (WrongScorer("0.5"), "scored 'http://vllm-b:8000' '0.5', not a finite number"),
        (WrongScorer(None), "scored 'http://vllm-b:8000' None, not a finite number"),
        (WrongScorer(math.nan), "scored 'http://vllm-b:8000' nan, not a finite number"),
        (WrongScorer(math.inf), "scored 'http://vllm-b:8000' inf, not a finite number"),
        (WrongScorer([0.5]), "scored 'http://vllm-b:8000' [0.5], not a finite number"),
        (WrongScorer(0.0, whole=list), "returned ['http://vllm-a:8000', "),
        (WrongScorer(0.0, whole=lambda us: [(u, 0.5) for u in us]), "not a mapping"),
        (WrongScorer(0.0, whole="http://vllm-a:8000"), "returned 'http://vllm-a:8000', not a"),
        (WrongScorer(0.0, whole=0.7), "returned 0.7, not a mapping of upstream to score"),
    ],
    ids=["strings", "none", "nan", "infinity", "list-score", "list", "pairs", "str", "float"],
)
def test_a_scorer_plugin_answering_the_wrong_type_is_named_and_left_out(
    scorer: WrongScorer, complaint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A scorer whose answer is no mapping of upstream to a finite number is a faulty
    plugin: its whole answer is left out of the request (not counted as 0 where wrong and
    as given elsewhere), the other scorers choose, and the log names the plugin and what
    was wrong, once for a run of such requests."""
    gw = gateway(routing_scorers="wrong:5,queue-depth:1", plugins=[WrongScorerPlugin(scorer)])
    all_scraped(gw)
    scraped(gw, A, waiting=8.0)  # queue-depth would send nothing to A
    with caplog.at_level(logging.ERROR, logger="obleth"):
        decisions = [route(gw, LONG_PROMPT) for _ in range(3)]
    for decision in decisions:
        assert decision.scores["wrong"] == {}
        assert decision.upstream != A  # what the scorer said of A counts for nothing
        assert decision.scores["total"][decision.upstream] == max(decision.scores["total"].values())
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors  # rate-limited: one line for the three requests
    assert "'wrong-scorer-plugin'" in errors[0]
    assert "scorer 'wrong'" in errors[0]
    assert complaint in errors[0]


def test_a_scorer_plugin_answering_numbers_out_of_range_is_clamped_not_faulted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Finite numbers outside [0, 1] (ints, floats, bools) are a scorer's answer, clamped
    into [0, 1] as documented; nothing is logged."""
    answers = {A: 7, B: -3.5, C: True, D: 0.25}

    class Clamped(WrongScorer):
        def score(self, request: object, upstreams: list[str]) -> object:
            return answers

    gw = gateway(routing_scorers="wrong:1,queue-depth:1", plugins=[WrongScorerPlugin(Clamped(0.0))])
    all_scraped(gw)
    with caplog.at_level(logging.ERROR, logger="obleth"):
        decision = route(gw, LONG_PROMPT)
    assert decision.scores["wrong"] == {A: 1.0, B: 0.0, C: 1.0, D: 0.25}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_prompt_nested_as_deep_as_the_parser_goes_is_routed_without_a_prefix() -> None:
    """JSON the parser only just takes may be too deep to write out again for the prefix
    (a few calls deeper): the request then has no prefix to share, never a RecursionError
    (which its client would get as a 500). Every depth from well under the parser's
    limit to past it."""
    for depth in range(600, 1100):
        nested = "[" * depth + "]" * depth
        chat = f'{{"messages": [{{"role": "user", "content": [{nested}]}}]}}'.encode()
        completion = f'{{"prompt": [{nested}]}}'.encode()
        for raw in (chat, completion):
            text = prompt_text(parse_body(raw))
            assert text == b"" or text.count(b"[") in (depth, depth + 1), depth
