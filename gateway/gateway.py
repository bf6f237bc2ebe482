"""``Gateway``: settings, plugins, capacity, policy, counter backend and scheduler, assembled.

Assembly happens in the constructor, so a bad setting or a broken plugin stops the
application at startup with a message that names it, before any request arrives.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import Histogram
from opentelemetry.trace import Tracer

from gateway.backends.memory import MemoryBackend
from gateway.capacity import Capacity, ProviderFailed, ceiling_of
from gateway.core.placement import KEPT, PlacementLog
from gateway.errors import PluginError
from gateway.faults import PASSED_ON, stops_the_caller
from gateway.plugins import Plugins
from gateway.protocols import CapacityProvider, CounterBackend, OverflowPolicy, Snapshot
from gateway.rates.budgets import RateBudgets, rates_for
from gateway.routing.fleet import Fleet
from gateway.routing.inflight import InFlight
from gateway.routing.readings import Readings
from gateway.routing.router import Router, ScorerEntry
from gateway.scheduler import Scheduler
from gateway.settings import Settings
from gateway.telemetry import instruments
from gateway.telemetry.tallies import AnswerTallies, RequestTallies
from gateway.telemetry.tracing import active_tracer

if TYPE_CHECKING:
    from gateway.backends.redis.pool_capacity import PoolCapacity
    from gateway.routing.sharing import SharedRouting

log = logging.getLogger("obleth")

STALE_AFTER_INTERVALS = 3
"""A reading older than this many polling intervals counts as saturated (intervals at the
poller's current pace: longer while the gateway is idle)."""


class Gateway:
    """One gate with everything it needs; shared by the ASGI middleware and the CLI.

    ``plugins`` are extra plugin objects (modules or instances with ``@hookimpl``
    functions) registered next to the built-ins, for applications and tests that do not
    package theirs. ``readings``, when given, are the upstreams' load readings as the
    caller keeps them (``obleth simulate`` feeds them from its simulated instances, on
    its virtual clock): the gateway then polls no upstream itself.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        plugins: Iterable[object] = (),
        entry_points: bool = True,
        readings: Readings | None = None,
    ) -> None:
        self.settings = settings if settings is not None else Settings.from_env()
        self.plugins = Plugins(self.settings, extra=plugins, entry_points=entry_points)
        self._check_scorer_names()
        urls = [upstream.url for upstream in self.settings.upstreams]
        # every selected factory is called before startup stops on the ones that fail
        provider_names = self.settings.capacity_providers
        policy_name = self.settings.overflow_policy
        routed = bool(urls) and self.settings.routing_policy == "weighted"
        scorer_names = list(self.settings.routing_scorers) if routed else []
        built = iter(
            self.plugins.build_each(
                [("capacity provider", name) for name in provider_names]
                + [("overflow policy", policy_name)]
                + [("routing scorer", name) for name in scorer_names]
            )
        )
        self.providers: dict[str, CapacityProvider] = {name: next(built) for name in provider_names}
        policy = next(built)
        scorers = {name: next(built) for name in scorer_names}
        #: whether the gateway polls the upstreams itself (no readings were handed over)
        self._polled = readings is None
        if readings is None:
            readings = Readings(
                urls,
                stale_after_s=STALE_AFTER_INTERVALS * self.settings.upstream_poll_interval_s,
            )
        #: the latest load reading of every upstream (empty without upstreams); capacity
        #: providers with a ``use_readings(readings)`` method are handed it at assembly
        self.readings = readings
        origins = {
            name: self.plugins.origin_text("capacity provider", name) for name in self.providers
        }
        try:
            self._hand_over(self.readings, self._ceiling)
            #: in cluster mode, the providers as the pool sees them: the ceiling shared,
            #: the computed ones answering the leader's values; None in process
            self.pool_capacity = _pool_capacity(self.settings, self.providers, origins)
            listed = (
                self.pool_capacity.listed()
                if self.pool_capacity is not None
                else list(self.providers.items())
            )
            self.capacity = Capacity(listed, origins=origins)
        except ProviderFailed as exc:
            plugin = self.plugins.plugin_of("capacity provider", exc.provider)
            raise PluginError(
                plugin, str(exc), distribution=self.plugins.distribution_of(plugin)
            ) from exc
        self.policy: OverflowPolicy = self.plugins.shielded_policy(policy_name, policy)
        self.backend: CounterBackend = _backend_for(
            self.settings, self.capacity, self.policy, self.pool_capacity
        )
        self.capacity.subscribe(self.backend.limit_changed)
        #: the tenants' rate budgets, kept where the seats are; None when none is set
        self.rates: RateBudgets | None = rates_for(self.settings, self.backend)
        self.scheduler = Scheduler(self.backend, self.settings)
        #: how requests ended (the request path counts, the metrics read)
        self.tallies = RequestTallies(self.settings.telemetry_tenants)
        #: how upstreams answered, counted by the proxy that forwards (``obleth serve``)
        self.answers = AnswerTallies()
        #: the queue-wait histograms of the meter providers watching this gateway
        self.queue_waits: list[Histogram] = []
        #: the tracer of admission spans; None while the process does not trace (set
        #: again at each start, as an application may set up tracing after building us)
        self.tracer: Tracer | None = None
        instruments.watch(self)
        #: routing state shared with the other pods through Redis; None without Redis
        self.sharing: SharedRouting | None = None
        #: chooses an upstream per request; None when no upstreams are configured
        self.router: Router | None = self._router(urls, scorers) if urls else None
        #: what ``start()`` started, with how to stop it, in the order it started
        self._running: list[tuple[str, Callable[[], Awaitable[object]]]] = []
        #: whether ``start()`` has run (and ``stop()`` not since); read on every request,
        #: so a plain attribute: set it only through ``start`` and ``stop``
        self.started = False
        #: the start under way, which callers arriving meanwhile wait for
        self._attempt: asyncio.Task[None] | None = None

    def _hand_over(self, readings: Readings, ceiling: Callable[[], int]) -> None:
        """Give each capacity provider what it asks for with its optional methods:
        ``use_readings(readings)``, the upstreams' latest load readings, and
        ``use_ceiling(ceiling)``, a function answering the operator's limit now (the
        ``static`` provider's, which ``PUT /api/v1/capacity`` sets), above which a
        computed limit has no use. ``ProviderFailed`` names a provider whose method raised."""
        for name, provider in self.providers.items():
            who = f" of capacity provider {name!r}" + self.plugins.origin_text(
                "capacity provider", name
            )
            for method, given in (("use_readings", readings), ("use_ceiling", ceiling)):
                use = getattr(provider, method, None)
                if use is None:
                    continue
                try:
                    with readings.subscribing_as(who):
                        use(given)
                except PASSED_ON:
                    raise
                except BaseException as exc:  # SystemExit too: the provider's fault
                    raise ProviderFailed(name, f"{method}() raised {exc!r}") from exc

    def _ceiling(self) -> int:
        """The operator's limit now: the settable provider's value (``static``'s), else
        ``global_max_in_flight``; in cluster mode the pool's (see ``PoolCapacity``)."""
        return ceiling_of(self.providers.values(), self.settings.global_max_in_flight)

    def _check_scorer_names(self) -> None:
        """A typo in ``routing_scorers`` stops startup even while routing is off."""
        installed = self.plugins.names("routing scorer")
        for name in self.settings.routing_scorers:
            if name not in installed:
                raise self.settings.error(
                    "routing_scorers",
                    name,
                    f"no routing scorer by that name; installed: {', '.join(installed) or 'none'}",
                )

    def _router(self, urls: list[str], scorers_by_name: dict[str, Any]) -> Router:
        """The router over ``urls``, weighing the scorers built for ``routing_scorers``."""
        settings = self.settings
        inflight = InFlight(urls)
        placements = PlacementLog(KEPT, shared=settings.redis_url is not None)
        if settings.redis_url is not None:
            from gateway.routing.sharing import SharedRouting

            self.sharing = SharedRouting(settings, inflight, placements)
        scorers = []
        for name, scorer in scorers_by_name.items():
            plugin = self.plugins.plugin_of("routing scorer", name)
            builtin = self.plugins.is_builtin(plugin)
            weight = settings.routing_scorers[name]
            scorers.append(ScorerEntry(name, plugin, scorer, weight, builtin))
        return Router(
            settings.upstreams,
            Fleet(
                self.readings,
                inflight,
                placements,
                placement_bound=settings.routing_placement_bound,
            ),
            policy=settings.routing_policy,
            scorers=scorers,
            load_bound=settings.routing_load_bound,
            load_slack=settings.routing_load_slack,
            seed=settings.routing_seed,
            complain=self.plugins.complain,
        )

    async def start(self) -> None:
        """Start the backend, routing and providers; safe to call more than once.

        When a part fails to start, the parts already started are stopped again and the
        error is raised (a ``PluginError`` naming a provider that failed): the gateway
        stays closed, with nothing left running, and the next ``start()`` tries afresh.
        Callers that come while a start is under way wait for it and share its outcome:
        a failing start is tried once for all the requests that found the gateway
        closed at the same time, not once each, one after the other.
        """
        if self.started:
            return
        self.tracer = active_tracer()
        attempt = self._attempt
        if attempt is None:
            attempt = asyncio.get_running_loop().create_task(self._start_once())
            attempt.add_done_callback(_retrieved)
            self._attempt = attempt
        await asyncio.shield(attempt)

    async def _start_once(self) -> None:
        try:
            await self._start_parts()
        except BaseException:
            await self._stop_parts()
            raise
        else:
            self.started = True
        finally:
            self._attempt = None

    async def _start_parts(self) -> None:
        """Start every part, the counter backend last: it opens the free seats, and no
        request may take one before the rest has started (or while it fails to)."""
        running = self._running
        if self.router is not None and self._polled:
            # the poller's HTTP client (httptools) loads only when there are upstreams
            from gateway.routing.poller import Poller

            interval = self.settings.upstream_poll_interval_s
            poller = Poller(
                self.readings,
                interval_s=interval,
                idle_interval_s=interval * self.settings.upstream_idle_poll_factor,
                timeout_s=self.settings.upstream_poll_timeout_s,
                activity=self.router.activity,
            )
            running.append(("the upstream poller", poller.stop))
            await poller.start()
        if self.sharing is not None:  # only with a router and Redis
            running.append(("routing shared through Redis", self.sharing.stop))
            await self.sharing.start()
        for name, provider in self.providers.items():
            start = getattr(provider, "start", None)
            if start is not None:
                try:
                    await start()
                except BaseException as exc:
                    if stops_the_caller(exc):
                        raise  # the start itself was cancelled or interrupted, not failed
                    # anything else is the provider's failure, SystemExit and a
                    # CancelledError of its own making included: let through, these would
                    # end the server with no word of the provider
                    plugin = self.plugins.plugin_of("capacity provider", name)
                    why = str(exc) or type(exc).__name__
                    raise PluginError(
                        plugin,
                        f"capacity provider {name!r} failed to start: {why}",
                        distribution=self.plugins.distribution_of(plugin),
                    ) from exc
            stop = getattr(provider, "stop", None)
            if stop is not None:
                label = self.plugins.origin_text("capacity provider", name)
                running.append((f"capacity provider {name!r}{label}", stop))
        await self.backend.start()
        running.append(("the counter backend", self.backend.stop))

    async def stop(self) -> None:
        """Stop providers, routing and the backend; waiters still queued are answered 503
        ``unavailable``. A part that fails to stop is logged and the others still stop."""
        if not self.started:
            return
        self.started = False
        await self._stop_parts()

    async def _stop_parts(self) -> None:
        """Stop what ``_start_parts`` started, last started first."""
        while self._running:
            part, stop = self._running.pop()
            try:
                await stop()
            except BaseException as exc:
                if stops_the_caller(exc):
                    raise
                log.exception("%s failed to stop; stopping the rest", part)

    def set_capacity(self, limit: int) -> None:
        """Change the limit now, through the capacity provider that can be set (one with
        ``set_max_in_flight``, as the built-in ``static`` has); raising it admits waiters
        at once. ``RuntimeError`` when no provider, or more than one, can be set;
        ``ValueError`` when that provider refuses ``limit`` (``static`` refuses one below
        0, or no whole number), saying why; ``PluginError``, naming the provider's plugin,
        when its ``set_max_in_flight`` raises anything else, a subclass of ``ValueError``
        included (a ``JSONDecodeError`` is a bug in the plugin, not a refusal).

        In cluster mode the new value becomes the ceiling of the whole pool: the pool's
        limit is the lowest of it and the computed providers' values, which every pod
        enforces from its next call to Redis (within one heartbeat).
        """
        setters = {
            name: setter
            for name, provider in self.providers.items()
            if (setter := getattr(provider, "set_max_in_flight", None)) is not None
        }
        if len(setters) != 1:
            found = ", ".join(setters) or "none"
            raise RuntimeError(
                "set_capacity needs exactly one capacity provider that can be set (with "
                f"set_max_in_flight, as 'static' has); this gateway uses "
                f"{', '.join(self.providers)}, of which these can be set: {found}"
            )
        ((name, setter),) = setters.items()
        try:
            setter(limit)
        except PASSED_ON:
            raise
        except BaseException as exc:
            if type(exc) is ValueError:  # the value is refused: the caller's to hear
                raise
            plugin = self.plugins.plugin_of("capacity provider", name)
            raise PluginError(
                plugin,
                f"capacity provider {name!r} raised {exc!r} in set_max_in_flight({limit}); "
                "the limit may not have changed",
                distribution=self.plugins.distribution_of(plugin),
            ) from exc

    def snapshot(self) -> Snapshot:
        return self.backend.snapshot()

    def provider_limits(self) -> dict[str, int]:
        """Each capacity provider's value now, as the limit uses it (in cluster mode a
        computed provider's is the pool's, as this pod last heard it); for one that fails
        to answer a whole number ≥ 0, its last good value, which the limit keeps using
        (the log names it). It used to show what the faulty provider answered (-5, say),
        or nothing."""
        return self.capacity.values()


def _pool_capacity(
    settings: Settings, providers: dict[str, CapacityProvider], origins: dict[str, str]
) -> PoolCapacity | None:
    """In cluster mode, the providers as the pool sees them; None in process."""
    if settings.redis_url is None:
        return None
    from gateway.backends.redis.pool_capacity import PoolCapacity

    return PoolCapacity(providers, default_ceiling=settings.global_max_in_flight, origins=origins)


def _backend_for(
    settings: Settings,
    capacity: Capacity,
    policy: OverflowPolicy,
    pool_capacity: PoolCapacity | None,
) -> CounterBackend:
    """In-process by default; the Redis backend when ``redis_url`` is set."""
    if settings.redis_url is None:
        return MemoryBackend(settings, capacity=capacity, policy=policy)
    from gateway.backends.redis import RedisBackend  # redis-py loads only in cluster mode

    assert pool_capacity is not None
    return RedisBackend(settings, limit=capacity.current, capacity=pool_capacity, policy=policy)


def _retrieved(attempt: asyncio.Task[None]) -> None:
    """Marks a start attempt's error as seen: its callers may all have gone (cancelled)."""
    if not attempt.cancelled():
        attempt.exception()


def given(settings: Settings | None, gateway: Gateway | None, plugins: Iterable[object]) -> Gateway:
    """The gateway a middleware was handed (``gateway=``), or one assembled from
    ``settings=`` (else the ``OBLETH_*`` environment) and ``plugins=``; a ``TypeError`` for
    both at once. Raises what assembly raises (``ConfigError``, ``PluginError``)."""
    if gateway is not None:
        if settings is not None or plugins:
            raise TypeError("pass either gateway= or settings=/plugins=, not both")
        return gateway
    return Gateway(settings, plugins=plugins)
