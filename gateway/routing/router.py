"""Router: filters, scorers and picker; the ``Decision`` a routed request carries.

Pipeline for every admitted request, from memory and without I/O:

1. **filters**: upstreams that serve the requested model (none: 404 ``model_not_found``),
   that pass their health checks (none: 503 ``no_healthy_upstream``), and, for the
   ``weighted`` policy, that are not saturated: a reading older than three polling
   intervals, or more requests in flight than ``routing_load_bound`` times the average.
   When every healthy upstream is saturated, all of them stay candidates.
2. **policy**: ``weighted`` sums the scorers' outputs (each clamped to [0, 1], weights
   normalized to sum 1) and takes the highest; ``round-robin`` takes request n mod k;
   ``least-loaded`` the fewest waiting + running + our in flight (stale readings last).
3. **ties** go to the fewest in flight, then a seeded random draw.

The choice is counted in our in-flight numbers at once, and stays counted until
``Decision.finish()``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.core.scoring import normalized, ranked, weighted_totals
from gateway.errors import Unroutable
from gateway.protocols import RoutingScorer
from gateway.routing.fleet import Fleet
from gateway.routing.request import RouteRequest
from gateway.routing.upstreams import Upstream

log = logging.getLogger("obleth.routing")

Scores = dict[str, dict[str, float]]
"""Per scorer (and ``total``), the score of each candidate upstream."""


@dataclass(frozen=True, slots=True)
class ScorerEntry:
    """One selected scorer: its name, the plugin offering it, the object, its weight."""

    name: str
    plugin: str
    scorer: RoutingScorer
    weight: float


class Decision:
    """The router's choice for one request; lives in ``scope["state"]["obleth"]["route"]``.

    What callers may rely on:

    - ``upstream`` is the base URL chosen; ``ranking`` all candidates best first (the
      order retries follow); ``scores`` why, per scorer and upstream.
    - The request counts as in flight on ``upstream`` from the decision until
      ``finish()``, which counts once however often it is called.
    - ``reroute()`` gives up the current upstream for the next one in ``ranking`` and
      moves the in-flight count with it; it returns the new URL, or None when there is
      no other upstream (or the decision is finished).
    """

    __slots__ = ("_finished", "_next", "_request", "_router", "ranking", "scores", "upstream")

    def __init__(
        self,
        router: Router,
        request: RouteRequest,
        ranking: list[str],
        scores: Scores,
    ) -> None:
        self._router = router
        self._request = request
        self.ranking = ranking
        self.scores = scores
        self.upstream = ranking[0]
        self._next = 1
        self._finished = False

    def reroute(self) -> str | None:
        if self._finished or self._next >= len(self.ranking):
            return None
        previous, self.upstream = self.upstream, self.ranking[self._next]
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
    when a scorer raises on the request path (the request is routed without it).
    """

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        fleet: Fleet,
        *,
        policy: str,
        scorers: Sequence[ScorerEntry],
        load_bound: float,
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
        self._rng = random.Random(seed)  # noqa: S311 -- tie-breaking, not secrecy
        self._complain = complain
        self._turn = 0
        self._serving: dict[str | None, list[str]] = {}
        self._urls = list(self.upstreams)

    # -- the decision -------------------------------------------------------------------

    def route(self, request: RouteRequest) -> Decision:
        """Choose; raises ``Unroutable`` when no upstream can take the request."""
        healthy = self._healthy(self._serving_model(request.model), request.model)
        if self.policy == "round-robin":
            ranking, scores = self._round_robin(healthy)
        elif self.policy == "least-loaded":
            ranking, scores = self._least_loaded(healthy)
        else:
            ranking, scores = self._weighted(request, healthy)
        decision = Decision(self, request, ranking, scores)
        self.fleet.inflight.add(decision.upstream)
        self._dispatched(request, decision.upstream)
        return decision

    def _serving_model(self, model: str | None) -> list[str]:
        serving = self._serving.get(model)
        if serving is None:
            serving = [u for u, up in self.upstreams.items() if up.serves(model)]
            if len(self._serving) < 4096:  # bounded: models are few, but names come from clients
                self._serving[model] = serving
        return serving

    def _healthy(self, serving: list[str], model: str | None) -> list[str]:
        if not serving:
            served = sorted({m for u in self.upstreams.values() for m in (u.models or ())})
            raise Unroutable(
                f"no upstream serves model {model!r}; served: {', '.join(served)}",
                status=404,
                code="model_not_found",
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

    def _weighted(self, request: RouteRequest, healthy: list[str]) -> tuple[list[str], Scores]:
        count = self.fleet.inflight.count
        readings = self.fleet.readings
        now = time.monotonic()
        # the load guard: at most load_bound times the average, counting this request
        cap = math.ceil(self._load_bound * (sum(count(u) for u in healthy) + 1) / len(healthy))
        candidates = [u for u in healthy if count(u) < cap and not readings.stale(u, now)]
        if not candidates:
            candidates = healthy
        scores: Scores = {}
        for entry in self._scorers:
            try:
                scores[entry.name] = dict(entry.scorer.score(request, candidates))
            except Exception as exc:
                self._complain(entry.plugin, f"scorer {entry.name!r} raised {exc!r}")
                scores[entry.name] = {}
        totals = weighted_totals(scores, self._weights, candidates)
        scores["total"] = totals
        ranking = ranked(totals, count, self._rng)
        if len(candidates) < len(healthy):
            passed_over = [u for u in healthy if u not in totals]
            ranking += sorted(passed_over, key=count)
        return ranking, scores

    def _round_robin(self, healthy: list[str]) -> tuple[list[str], Scores]:
        turn = self._turn % len(healthy)
        self._turn += 1
        ranking = healthy[turn:] + healthy[:turn]
        return ranking, {"round-robin": {u: 1.0 if u == ranking[0] else 0.0 for u in healthy}}

    def _least_loaded(self, healthy: list[str]) -> tuple[list[str], Scores]:
        fleet = self.fleet
        now = time.monotonic()
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
            except Exception as exc:
                self._complain(plugin, f"a scorer's dispatched() raised {exc!r}")

    def _moved(self, request: RouteRequest, previous: str, upstream: str) -> None:
        inflight = self.fleet.inflight
        inflight.remove(previous)
        inflight.add(upstream)
        self._dispatched(request, upstream)

    def _finished(self, upstream: str) -> None:
        self.fleet.inflight.remove(upstream)

    def in_flight(self) -> Mapping[str, int]:
        """Our requests in flight per upstream, cluster-wide where shared."""
        return {u: self.fleet.inflight.count(u) for u in self.upstreams}
