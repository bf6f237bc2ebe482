"""Router: filters, scorers and picker; the ``Decision`` a routed request carries.

Pipeline for every admitted request, from memory and without I/O:

1. **filters**: upstreams that serve the requested model (none: 404 ``model_not_found``),
   that pass their health checks (none: 503 ``no_healthy_upstream``), and, for the
   ``weighted`` policy, that are not saturated: a reading older than three polling
   intervals, or an upstream with more of ours in flight than ``routing_load_bound``
   times the average that also kept two requests queued over its last two scrapes or is
   ``routing_load_slack`` requests ahead of the least loaded.
   When every healthy upstream is saturated, all of them stay candidates.
2. **policy**: ``weighted`` sums the scorers' outputs (each clamped to [0, 1], weights
   normalized to sum 1) and takes the highest; a plugin scorer that raises, or answers
   anything but a mapping of upstream to finite number, is left out of that request
   (and named in the log); ``round-robin`` takes request n mod k;
   ``least-loaded`` the fewest waiting + running + our in flight (stale readings last).
3. **ties** go to the fewest in flight, then a seeded random draw.

The choice is counted in our in-flight numbers at once, and stays counted until
``Decision.finish()``.
"""

from __future__ import annotations

import logging
import math
import numbers
import random
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.core.memo import Memo
from gateway.core.scoring import best, clamp, normalized, ranked, weighted_totals
from gateway.errors import Unroutable
from gateway.faults import PASSED_ON
from gateway.protocols import RoutingScorer
from gateway.routing.activity import Activity
from gateway.routing.decisions import REROUTED, ROUTED, DecisionLog
from gateway.routing.fleet import Fleet
from gateway.routing.request import RouteRequest
from gateway.routing.upstreams import Upstream

log = logging.getLogger("obleth.routing")

GUARD_QUEUE = 2.0
"""The load guard's sign of a queue: this many requests waiting in each of an upstream's
last two scrapes. One request waiting, or one scrape, is often just a request that
arrived between two engine steps; passing a cached prefix over for that costs a whole
prefill elsewhere."""

#: How many sets of candidates round-robin keeps a turn for (one per model, in practice).
_TURNS_KEPT = 1024

Scores = dict[str, dict[str, float]]
"""Per scorer (and ``total``), the score of each candidate upstream."""


@dataclass(frozen=True, slots=True)
class ScorerEntry:
    """One selected scorer: its name, the plugin offering it, the object, its weight."""

    name: str
    plugin: str
    scorer: RoutingScorer
    weight: float
    builtin: bool = False
    """Built-in scorers answer in [0, 1] already; other plugins' answers are clamped."""


class Decision:
    """The router's choice for one request; lives in ``scope["state"]["obleth"]["route"]``.

    What callers may rely on:

    - ``upstream`` is the base URL chosen; ``scores`` says why, per scorer and upstream;
      ``ranking`` lists every healthy candidate best first (the order retries follow),
      ``upstream`` first. It is worked out on first use: most requests never need it.
    - The request counts as in flight on ``upstream`` from the decision until
      ``finish()``, which counts once however often it is called.
    - ``reroute()`` gives up the current upstream for the next one in ``ranking`` and
      moves the in-flight count with it; it returns the new URL, or None when there is
      no other upstream (or the decision is finished).
    """

    __slots__ = (
        "_finished",
        "_next",
        "_rank",
        "_ranking",
        "_request",
        "_router",
        "scores",
        "upstream",
    )

    def __init__(
        self,
        router: Router,
        request: RouteRequest,
        upstream: str,
        scores: Scores,
        rank: Callable[[], list[str]],
    ) -> None:
        self._router = router
        self._request = request
        self.upstream = upstream
        self.scores = scores
        self._rank = rank
        self._ranking: list[str] | None = None
        self._next = 1
        self._finished = False

    @property
    def ranking(self) -> list[str]:
        if self._ranking is None:
            first = self.upstream
            self._ranking = [first, *(u for u in self._rank() if u != first)]
        return self._ranking

    def reroute(self) -> str | None:
        ranking = self.ranking
        if self._finished or self._next >= len(ranking):
            return None
        previous, self.upstream = self.upstream, ranking[self._next]
        self._next += 1
        self._router._moved(self._request, previous, self.upstream)
        return self.upstream

    def finish(self) -> bool:
        """Stop counting the request as in flight; True for the one call that did."""
        if self._finished:
            return False
        self._finished = True
        self._router._finished(self.upstream)
        return True


class Router:
    """Chooses an upstream for each admitted request; one per gateway.

    ``scorers`` are used by the ``weighted`` policy; ``complain(plugin, problem)`` is told
    when a scorer raises on the request path (anything but ``gateway.faults.PASSED_ON``),
    or a plugin's scorer answers what ``_usable`` refuses: the request is routed without
    that scorer.
    """

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        fleet: Fleet,
        *,
        policy: str,
        scorers: Sequence[ScorerEntry],
        load_bound: float,
        load_slack: int,
        seed: int | None,
        complain: Callable[[str, str], None],
    ) -> None:
        if not upstreams:
            raise ValueError("a router needs at least one upstream")
        self.upstreams = {u.url: u for u in upstreams}
        self.fleet = fleet
        self.policy = policy
        self._scorers = list(scorers)
        weights = normalized({entry.name: entry.weight for entry in scorers})
        self._weights = weights
        self._dispatch_hooks: list[tuple[str, Callable[[RouteRequest, str], Any]]] = [
            (entry.plugin, hook)
            for entry in scorers
            if (hook := getattr(entry.scorer, "dispatched", None)) is not None
        ]
        self._load_bound = load_bound
        self._load_slack = load_slack
        self._rng = random.Random(seed)  # noqa: S311 -- tie-breaking, not secrecy
        self._complain = complain
        self._turns: Memo[tuple[str, ...], int] = Memo(_TURNS_KEPT)
        self._serving: dict[str | None, list[str]] = {}
        self._urls = list(self.upstreams)
        #: counts per upstream and the latest choices, for operators
        self.decisions = DecisionLog(self._urls)
        #: told of every request to route, so that the poller polls faster while they come
        self.activity = Activity(busy=fleet.inflight.busy)

    # -- the decision -------------------------------------------------------------------

    def route(self, request: RouteRequest) -> Decision:
        """Choose; raises ``Unroutable`` when no upstream can take the request."""
        self.activity.arrived()  # first: a request refused for want of health counts too
        serving = self._listing(self._serving_model(request.model), request.model)
        healthy = self._healthy(serving, request.model)
        if self.policy == "round-robin":
            ranking, scores = self._round_robin(healthy)
            decision = Decision(self, request, ranking[0], scores, lambda: ranking)
        elif self.policy == "least-loaded":
            ranking, scores = self._least_loaded(healthy)
            decision = Decision(self, request, ranking[0], scores, lambda: ranking)
        else:
            upstream, scores, rank = self._weighted(request, healthy)
            decision = Decision(self, request, upstream, scores, rank)
        self.fleet.inflight.add(decision.upstream)
        self.decisions.chose(decision.upstream, ROUTED, decision.scores)
        try:
            self._dispatched(request, decision.upstream)
        except BaseException:  # passed on: no one holds the decision to finish it
            self.fleet.inflight.remove(decision.upstream)
            raise
        return decision

    def _serving_model(self, model: str | None) -> list[str]:
        serving = self._serving.get(model)
        if serving is None:
            serving = [u for u, up in self.upstreams.items() if up.serves(model)]
            if len(self._serving) < 4096:  # bounded: models are few, but names come from clients
                self._serving[model] = serving
        return serving

    def _listing(self, serving: list[str], model: str | None) -> list[str]:
        """``serving`` without the upstreams whose metrics name other models but not
        ``model`` (``Reading.models``), when some upstream's metrics do name it: a fleet
        where each upstream serves its own model routes by model with no list
        configured. Upstreams whose metrics name no model stay, and so do those with a
        configured model list (it wins over their metrics). When no metrics name
        ``model``, ``serving`` as it is: a model may be served under a name the metrics
        do not show (a LoRA adapter, an alias), and the upstreams are the ones to say."""
        if model is None or len(serving) < 2:
            return serving
        readings, listed = self.fleet.readings, self.upstreams
        named = [readings.get(u).models for u in serving]
        if not any(models and model in models for models in named):
            return serving
        # a configured list wins over the metrics: such an upstream stays
        return [
            u
            for u, models in zip(serving, named, strict=True)
            if not models or model in models or listed[u].models is not None
        ]

    def _healthy(self, serving: list[str], model: str | None) -> list[str]:
        if not serving:
            served = sorted({m for u in self.upstreams.values() for m in (u.models or ())})
            raise Unroutable(
                f"no upstream serves model {model!r}; served: {', '.join(served)}",
                status=404,
                code="model_not_found",
                param="model",
            )
        readings = self.fleet.readings
        healthy = [u for u in serving if readings.get(u).healthy]
        if not healthy:
            raise Unroutable(
                "every upstream that could serve this request is failing its health checks; "
                "retry later",
                status=503,
                code="no_healthy_upstream",
            )
        return healthy

    def _weighted(
        self, request: RouteRequest, healthy: list[str]
    ) -> tuple[str, Scores, Callable[[], list[str]]]:
        fleet = self.fleet
        count = fleet.inflight.count
        latest = fleet.readings.get
        queued = fleet.readings.queued
        fresh_since = fleet.readings.clock() - fleet.readings.stale_after_s
        # The load guard, on our own counts (they are current; scrapes lag): an upstream
        # with more than load_bound times the average of ours in flight is passed over
        # when it also keeps requests queued (two scrapes in a row) or is load_slack ahead of
        # the least loaded. Below that, affinity costs no waiting time and stays.
        counts = [count(u) for u in healthy]
        cap = math.ceil(self._load_bound * (sum(counts) + 1) / len(healthy))
        ahead = min(counts) + self._load_slack
        candidates = []
        for upstream, n in zip(healthy, counts, strict=True):
            reading = latest(upstream)
            if reading.at < fresh_since:
                continue
            if n >= cap and (n >= ahead or queued(upstream) >= GUARD_QUEUE):
                continue
            candidates.append(upstream)
        if not candidates:
            candidates = healthy
        scores: Scores = {}
        for entry in self._scorers:
            try:
                if entry.builtin:
                    scores[entry.name] = dict(entry.scorer.score(request, candidates))
                    continue
                # its own copy: a plugin changing the list changes no one else's
                usable = _usable(entry.scorer.score(request, list(candidates)), candidates)
            except PASSED_ON:
                raise
            except BaseException as exc:  # SystemExit too: a plugin's fault like any other
                self._complain(entry.plugin, f"scorer {entry.name!r} raised {exc!r}")
                usable = {}
            if isinstance(usable, str):
                self._complain(entry.plugin, f"scorer {entry.name!r} {usable}")
                usable = {}
            scores[entry.name] = usable
        totals = weighted_totals(scores, self._weights, candidates)
        scores["total"] = totals
        rng = self._rng

        def rank() -> list[str]:
            passed_over = sorted((u for u in healthy if u not in totals), key=count)
            return ranked(totals, count, rng) + passed_over

        return best(totals, count, rng), scores, rank

    def _round_robin(self, healthy: list[str]) -> tuple[list[str], Scores]:
        # a turn per set of candidates: with one counter for all, requests for two models
        # served by different upstreams in alternation would each keep landing on one
        candidates = tuple(healthy)
        turns = self._turns
        turn = turns.get(candidates, 0)
        turns.keep(candidates, turn + 1)
        turn %= len(healthy)
        ranking = healthy[turn:] + healthy[:turn]
        return ranking, {"round-robin": {u: 1.0 if u == ranking[0] else 0.0 for u in healthy}}

    def _least_loaded(self, healthy: list[str]) -> tuple[list[str], Scores]:
        fleet = self.fleet
        now = fleet.readings.clock()
        draw = self._rng.random
        load: dict[str, float] = {}
        for u in healthy:
            reading = fleet.reading(u)
            load[u] = (reading.waiting or 0.0) + (reading.running or 0.0) + fleet.in_flight(u)
        stale = {u: fleet.readings.stale(u, now) for u in healthy}
        ranking = sorted(healthy, key=lambda u: (stale[u], load[u], fleet.in_flight(u), draw()))
        return ranking, {"load": load}

    # -- bookkeeping, through Decision ------------------------------------------------------

    def _dispatched(self, request: RouteRequest, upstream: str) -> None:
        for plugin, hook in self._dispatch_hooks:
            try:
                hook(request, upstream)
            except PASSED_ON:
                raise
            except BaseException as exc:
                self._complain(plugin, f"a scorer's dispatched() raised {exc!r}")

    def _moved(self, request: RouteRequest, previous: str, upstream: str) -> None:
        inflight = self.fleet.inflight
        inflight.remove(previous)
        inflight.add(upstream)
        self.decisions.chose(upstream, REROUTED, {})
        self._dispatched(request, upstream)

    def _finished(self, upstream: str) -> None:
        self.fleet.inflight.remove(upstream)

    def in_flight(self) -> Mapping[str, int]:
        """Our requests in flight per upstream, cluster-wide where shared."""
        return {u: self.fleet.inflight.count(u) for u in self.upstreams}


def _usable(given: object, candidates: list[str]) -> dict[str, float] | str:
    """A plugin scorer's answer as the router uses it: the candidates' scores, forced into
    [0, 1] (an upstream it names that is no candidate is left out, one it does not name
    scores 0). An answer that is no mapping, or gives a candidate anything but a finite
    real number (a string, None, NaN, infinity), is unusable as a whole: what is wrong
    with it is returned instead, for the log."""
    if not isinstance(given, Mapping):
        return f"returned {reprlib.repr(given)}, not a mapping of upstream to score"
    usable = {}
    for upstream in candidates:
        if upstream not in given:
            continue
        score = given[upstream]
        if not isinstance(score, numbers.Real) or not math.isfinite(score):
            return f"scored {upstream!r} {reprlib.repr(score)}, not a finite number"
        usable[upstream] = clamp(float(score))
    return usable
