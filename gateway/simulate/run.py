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
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.asgi.plan import FirstByteFeed
from gateway.complaints import Complaints
from gateway.core.tickets import ticket
from gateway.errors import ConfigError, Rejected, Unroutable
from gateway.gateway import STALE_AFTER_INTERVALS, Gateway
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
    loop = asyncio.get_running_loop()
    settings = settings_for(plan)
    interval = plan.scrape_interval_s
    urls = [u.url for u in settings.upstreams]
    readings = Readings(
        urls,
        stale_after_s=STALE_AFTER_INTERVALS * interval if interval > 0 else math.inf,
        clock=loop.time,
    )
    try:
        gateway = Gateway(settings, readings=readings)
    except ConfigError as exc:
        raise _flag_error(exc) from None
    router = gateway.router
    assert router is not None  # there are upstreams
    # capacity providers that follow time to first byte hear it as in a server: from the
    # moment the request is handed to its instance to its first token
    feed = FirstByteFeed.of(gateway, Complaints())
    first_token = None
    if feed is not None:
        fed = feed

        def first_token(sequence: Sequence) -> None:
            assert sequence.first_token_at is not None
            fed(sequence.first_token_at - sequence.arrived_at)

    instances = [Instance(url, plan.profile.config, first_token=first_token) for url in urls]
    by_url = {instance.url: n for n, instance in enumerate(instances)}
    reader = RequestReader(
        router.fleet,
        block_bytes=settings.prefix_block_bytes,
        session_header=settings.session_header,
    )
    config = plan.profile.config
    model = plan.profile.model

    def scrape() -> None:
        now = loop.time()
        for instance in instances:
            readings.update(instance.reading(now))
        readings.notify()

    async def scraper() -> None:
        while True:
            scrape()
            await asyncio.sleep(interval)

    async def serve(request: SimRequest, outcome: Outcome) -> None:
        outcome.arrived_at = loop.time()
        try:
            permit = await gateway.scheduler.acquire(ticket(request.tenant))
        except Rejected as exc:
            outcome.rejected = exc.reason
            return
        try:
            if interval <= 0:
                scrape()
            body = request.body(model)
            decision = router.route(reader.read(PATH, (), body, request.tenant, None))
            try:
                outcome.handed_at = loop.time()
                outcome.instance = by_url[decision.upstream]
                prompt = tokenize(
                    request.prompt,
                    chars_per_token=CHARS_PER_TOKEN,
                    block_size_tokens=config.block_size_tokens,
                )
                instance = instances[outcome.instance]
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

    requests = plan.workload.requests(plan.seed)
    outcomes = [Outcome(r) for r in requests]
    await gateway.start()
    polling = loop.create_task(scraper()) if interval > 0 else None
    try:
        tasks = []
        for request, outcome in zip(requests, outcomes, strict=True):
            delay = START + request.arrival_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(loop.create_task(serve(request, outcome)))
        await asyncio.gather(*tasks)
    finally:
        if polling is not None:
            polling.cancel()
        await gateway.stop()
    end = loop.time() - START
    return RunResult(
        plan=plan,
        outcomes=outcomes,
        instance_requests=[i.requests for i in instances],
        preemptions=sum(i.batch.counters.preemptions for i in instances),
        steps=sum(i.batch.counters.steps for i in instances),
        prefix_query_tokens=sum(i.batch.counters.prefix_cache_query_tokens for i in instances),
        prefix_hit_tokens=sum(i.batch.counters.prefix_cache_hit_tokens for i in instances),
        end_s=end,
    )


def _flag_error(exc: ConfigError) -> BadFlag:
    """A setting's error, told as the flag that set it."""
    setting = exc.setting.removeprefix("OBLETH_").lower()
    return BadFlag(FLAG_OF_SETTING.get(setting, setting), exc.value, exc.expected, told=True)
