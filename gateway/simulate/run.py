"""One simulation run: the workload through Obleth's own admission and router, to simulated
instances, on a virtual clock.

What runs is the production code: a `Gateway` assembled from `Settings` (plugins, the
capacity providers, the overflow policy, the in-process counter backend and its fair
queue, the `Router` with its scorers), with each request classified into a `Ticket`,
admitted by `Scheduler.acquire` (waiting, timing out and being refused as in a server),
read into a `RouteRequest` from its JSON body by `RequestReader`, routed, and given
back. Only three things are simulated: the clock (`gateway.simulate.clock`), the
inference servers (`gateway.simulate.instance`, the `gateway.sim` step model) and the
poller, which here copies each instance's gauges into the gateway's `Readings` every
``scrape_interval_s`` (at every decision when 0), so that scorers see numbers as old as
a real poller's. Capacity providers run too: those reading the upstreams are told of
each polling round, and those following time to first byte are fed each request's,
all on the virtual clock (the readings' ``clock``).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.asgi.timing import LatencyFeed
from gateway.complaints import Complaints
from gateway.core.tickets import ticket
from gateway.errors import ConfigError, Rejected, Unroutable
from gateway.gateway import STALE_AFTER_INTERVALS, Gateway
from gateway.rates.estimate import estimate_tokens
from gateway.routing.readings import Readings
from gateway.routing.request import RequestReader
from gateway.settings import Settings
from gateway.sim.kvcache import PromptTooLong
from gateway.sim.records import Sequence
from gateway.sim.tokens import tokenize
from gateway.simulate.clock import run_virtual
from gateway.simulate.errors import BadFlag
from gateway.simulate.instance import Instance
from gateway.simulate.profiles import Profile
from gateway.simulate.workload import CHARS_PER_TOKEN, SimRequest, Workload

#: Where the virtual clock starts: a reading taken at 0.0 would mean "never scraped".
START = 1.0

#: The path the simulated clients post to.
PATH = "/v1/completions"

#: Each setting a flag of ``obleth simulate`` sets, so that the error of a bad value names
#: the flag the user typed rather than the setting behind it.
FLAG_OF_SETTING = {
    "routing_policy": "--routing-policy",
    "routing_scorers": "--routing-scorers",
    "global_max_in_flight": "--max-in-flight",
    "overflow_policy": "--policy",
    "max_queue": "--max-queue",
    "queue_timeout_s": "--queue-timeout",
    "tenant_weights": "--tenant-weights",
    "tenant_max_in_flight": "--tenant-max-in-flight",
    "upstream_poll_interval_s": "--scrape-interval",
    "capacity_providers": "--capacity-providers",
    "global_max_tokens_in_flight": "--max-tokens-in-flight",
    "fairness_cost": "--fairness-cost",
}


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything one run depends on; the same plan gives the same outcome."""

    profile: Profile
    workload: Workload
    num_instances: int
    seed: int
    scrape_interval_s: float
    gateway: Mapping[str, Any] = field(default_factory=dict)
    """Settings of the gateway (routing, admission), by setting name."""


@dataclass(slots=True)
class Outcome:
    """What happened to one request."""

    request: SimRequest
    rejected: str | None = None
    """Why it was refused: the gateway's reason (``queue_full``, ``queue_timeout``, ...),
    or ``prompt_too_long`` when its instance's whole KV cache could not hold its prompt."""
    arrived_at: float = 0.0
    """Virtual clock time it reached the gateway (the clock starts at `START`)."""
    handed_at: float | None = None
    """Virtual clock time it left the gateway for its instance."""
    instance: int | None = None
    sequence: Sequence | None = None
    """Its life in the instance; `Sequence` times are on the virtual clock too."""

    @property
    def handed_s(self) -> float | None:
        """When it left the gateway, in seconds from the start; None if it never did."""
        return None if self.handed_at is None else self.handed_at - START


@dataclass(frozen=True, slots=True)
class RunResult:
    """The outcome of every request, and each instance's counters at the end."""

    plan: Plan
    outcomes: list[Outcome]
    instance_requests: list[int]
    preemptions: int
    steps: int
    """Steps the instances ran, in all."""
    prefix_query_tokens: int
    prefix_hit_tokens: int
    end_s: float
    """When the last request finished (or was refused), from the start."""


def settings_for(plan: Plan) -> Settings:
    """The gateway's settings for ``plan``; a bad value is a `BadFlag` naming its flag."""
    urls = [f"http://instance-{i}.sim:8000" for i in range(plan.num_instances)]
    values: dict[str, Any] = {
        "upstreams": urls,
        "routing_seed": plan.seed,
        "global_max_in_flight": 1_000_000_000,
        "queue_timeout_s": 3600.0,
        **plan.gateway,
    }
    if plan.scrape_interval_s > 0:
        values["upstream_poll_interval_s"] = plan.scrape_interval_s
    try:
        return Settings(**values)
    except ConfigError as exc:
        raise _flag_error(exc) from None


def simulate(plan: Plan) -> RunResult:
    """Run ``plan`` to its end on a virtual clock; raises `BadFlag` for a setting the
    gateway refuses."""
    return run_virtual(_run(plan), start=START)


async def _run(plan: Plan) -> RunResult:
    return await _Run(plan).run()


class _Run:
    """One run's gateway, instances and readings; built on the (virtual) loop it runs on."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.loop = asyncio.get_running_loop()
        settings = settings_for(plan)
        interval = plan.scrape_interval_s
        urls = [u.url for u in settings.upstreams]
        self.readings = Readings(
            urls,
            stale_after_s=STALE_AFTER_INTERVALS * interval if interval > 0 else math.inf,
            clock=self.loop.time,
        )
        try:
            self.gateway = Gateway(settings, readings=self.readings)
        except ConfigError as exc:
            raise _flag_error(exc) from None
        router = self.gateway.router
        assert router is not None  # there are upstreams
        self.router = router
        self.reader = RequestReader(
            router.fleet,
            block_bytes=settings.prefix_block_bytes,
            session_header=settings.session_header,
        )
        #: each request's token estimate, as the middleware makes it, when the gate counts
        #: tokens (a token budget, or fairness by tokens); None otherwise
        self.tokens_of: Callable[[bytes | None], int] | None = None
        if settings.global_max_tokens_in_flight is not None or settings.fairness_cost == "tokens":
            self.tokens_of = functools.partial(
                estimate_tokens, default_max_tokens=settings.default_max_tokens
            )
        # providers that follow the backends' latency hear it as in a server: from the
        # moment the request is handed to its instance to its first token, and each
        # stream's longest wait between two tokens whenever it grows
        self.feed = LatencyFeed.of(self.gateway, Complaints())
        feed = self.feed
        first_token = self._first_token if feed is not None else None
        longer_gap = self._longer_gap if feed is not None and feed.follows_gaps else None
        self.instances = [
            Instance(url, plan.profile.config, first_token=first_token, longer_gap=longer_gap)
            for url in urls
        ]
        self.by_url = {instance.url: n for n, instance in enumerate(self.instances)}

    async def run(self) -> RunResult:
        """Every request of the workload, from its arrival to its end."""
        plan, loop = self.plan, self.loop
        requests = plan.workload.requests(plan.seed)
        outcomes = [Outcome(r) for r in requests]
        await self.gateway.start()
        polling = None
        if plan.scrape_interval_s > 0:
            polling = loop.create_task(self._poll(plan.scrape_interval_s))
        try:
            tasks = []
            for request, outcome in zip(requests, outcomes, strict=True):
                delay = START + request.arrival_s - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(loop.create_task(self._serve(request, outcome)))
            await asyncio.gather(*tasks)
        finally:
            if polling is not None:
                polling.cancel()
            await self.gateway.stop()
        counters = [instance.batch.counters for instance in self.instances]
        return RunResult(
            plan=plan,
            outcomes=outcomes,
            instance_requests=[instance.requests for instance in self.instances],
            preemptions=sum(c.preemptions for c in counters),
            steps=sum(c.steps for c in counters),
            prefix_query_tokens=sum(c.prefix_cache_query_tokens for c in counters),
            prefix_hit_tokens=sum(c.prefix_cache_hit_tokens for c in counters),
            end_s=loop.time() - START,
        )

    def _scrape(self) -> None:
        """One polling round: every instance's gauges as they are now."""
        now = self.loop.time()
        for instance in self.instances:
            self.readings.update(instance.reading(now))
        self.readings.notify()

    async def _poll(self, interval_s: float) -> None:
        while True:
            self._scrape()
            await asyncio.sleep(interval_s)

    def _first_token(self, sequence: Sequence) -> None:
        assert self.feed is not None
        assert sequence.first_token_at is not None
        self.feed.first_byte(sequence.first_token_at - sequence.arrived_at)

    def _longer_gap(self, sequence: Sequence) -> None:
        """A stream's longest wait between two tokens so far, as ``ResponseTimer`` times
        it in a server, for the providers that follow it."""
        assert self.feed is not None
        assert sequence.last_token_at is not None
        lasted = sequence.last_token_at - sequence.arrived_at
        self.feed.longest_gap(sequence.last_gap_s, lasted)

    async def _serve(self, request: SimRequest, outcome: Outcome) -> None:
        """One request through the gateway to its instance, as the ASGI middleware takes
        it: a seat, a route, the instance's answer, and the seat given back once."""
        loop, plan = self.loop, self.plan
        outcome.arrived_at = loop.time()
        body = request.body(plan.profile.model)
        tokens = 0 if self.tokens_of is None else self.tokens_of(body)
        try:
            permit = await self.gateway.scheduler.acquire(ticket(request.tenant, tokens=tokens))
        except Rejected as exc:
            outcome.rejected = exc.reason
            return
        try:
            if plan.scrape_interval_s <= 0:
                self._scrape()
            route = self.reader.read(PATH, (), body, request.tenant, None)
            decision = self.router.route(route)
            try:
                outcome.handed_at = loop.time()
                outcome.instance = self.by_url[decision.upstream]
                prompt = tokenize(
                    request.prompt,
                    chars_per_token=CHARS_PER_TOKEN,
                    block_size_tokens=plan.profile.config.block_size_tokens,
                )
                instance = self.instances[outcome.instance]
                outcome.sequence = await instance.submit(prompt, request.output_tokens)
            finally:
                decision.finish()
        except Unroutable as exc:
            outcome.rejected = exc.code
        except PromptTooLong:
            # the instance answers 400, as vLLM does for a prompt over its context
            outcome.rejected = "prompt_too_long"
        finally:
            permit.release()


def _flag_error(exc: ConfigError) -> BadFlag:
    """A setting's error, told as the flag that set it."""
    setting = exc.setting.removeprefix("OBLETH_").lower()
    return BadFlag(FLAG_OF_SETTING.get(setting, setting), exc.value, exc.expected, told=True)
