"""What the gateway knows about each upstream's load: the latest reading, kept in memory.

One ``Readings`` per gateway. The poller (``gateway.routing.poller``) writes it; the
router's scorers and any capacity provider read it, from memory and without I/O. A
metrics-driven capacity provider gets the gateway's ``Readings`` through its optional
``use_readings(readings)`` method, so it needs no poller of its own.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gateway.complaints import Complaints
from gateway.faults import PASSED_ON

log = logging.getLogger("obleth.routing")


@dataclass(frozen=True, slots=True)
class Reading:
    """One upstream as the last scrape saw it.

    ``running``, ``waiting``, ``kv_usage`` and ``preemptions`` are None when the upstream
    did not export them (or could not be scraped yet). ``at`` is the ``Readings.clock()``
    time of the scrape the numbers come from; 0.0 means never scraped. ``healthy`` is the
    health check's verdict, which may be newer than the numbers.
    """

    upstream: str
    healthy: bool = False
    running: float | None = None
    """Requests in the upstream's running batch (``vllm:num_requests_running``)."""
    waiting: float | None = None
    """Requests queued inside the upstream (``vllm:num_requests_waiting``)."""
    kv_usage: float | None = None
    """KV-cache usage as a fraction, 0.0 to 1.0 (``vllm:kv_cache_usage_perc``)."""
    preemptions: float | None = None
    """Sequences preempted for want of KV cache since the upstream started, a counter
    (``vllm:num_preemptions_total``): a rise between two readings means pressure."""
    at: float = 0.0
    engine: str | None = None
    """Which engine's metric names matched: ``vllm``, ``sglang``, or None."""
    models: frozenset[str] | None = None
    """The models the upstream's metrics are labelled with (``model_name``, which vLLM and
    SGLang put on every sample): what it serves under those names. None when no sample
    names one."""

    def age_s(self, now: float) -> float:
        """Seconds since the numbers were scraped; infinite when they never were."""
        return now - self.at if self.at > 0.0 else float("inf")


class Readings:
    """The latest ``Reading`` of every configured upstream.

    What readers may rely on:

    - ``get(url)`` always answers for a configured upstream (a never-scraped one is
      unhealthy with no numbers), from memory.
    - ``stale(url)`` is True when the numbers are older than ``stale_after_s``: routing
      treats such an upstream as saturated, and a capacity provider should not trust it.
      The poller sets ``stale_after_s`` to three polling intervals at its current pace:
      it grows while the gateway is idle and the upstreams are read less often, so that
      no reading goes stale for want of requests.
    - ``clock()`` is the clock that ``Reading.at`` and ages are on: ``time.monotonic``
      for the poller; a simulation on a virtual clock (``obleth simulate``) passes its own.
    - ``subscribe(callback)`` calls ``callback()`` after every polling round, on the
      gateway's event loop, so a provider can recompute its limit when numbers change.
      A callback that raises (``SystemExit`` too) is logged, under the name of the
      provider that subscribed it, at most once a minute; the others are still called.
    """

    def __init__(
        self,
        upstreams: Sequence[str],
        *,
        stale_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stale_after_s = stale_after_s
        self.clock = clock
        self._latest: dict[str, Reading] = {url: Reading(url) for url in upstreams}
        self._queued: dict[str, float] = dict.fromkeys(upstreams, 0.0)
        #: each callback, with whom it is logged under when it raises
        self._subscribers: list[tuple[Callable[[], None], str]] = []
        self._subscribing_as = ""
        self._complaints = Complaints()
        # a bound lookup rather than a method: routing reads it for every upstream, every request
        self.get: Callable[[str], Reading] = self._latest.__getitem__
        """The latest reading of an upstream; KeyError for an unconfigured one."""
        self.queued: Callable[[str], float] = self._queued.__getitem__
        """Requests an upstream kept waiting across its last two scrapes (the smaller
        ``waiting`` of the two): a queue, where one scrape alone may catch a request that
        merely arrived between two engine steps."""

    def __iter__(self) -> Iterator[str]:
        return iter(self._latest)

    def __len__(self) -> int:
        return len(self._latest)

    def all(self) -> Mapping[str, Reading]:
        """Every upstream's latest reading (a snapshot: later updates do not show in it)."""
        return dict(self._latest)

    def stale(self, upstream: str, now: float | None = None) -> bool:
        """Whether the numbers of ``upstream`` are too old to route on."""
        when = self.clock() if now is None else now
        return self._latest[upstream].age_s(when) > self.stale_after_s

    def update(self, reading: Reading, *, scraped: bool = True) -> None:
        """Record a new reading (the poller's job; tests may call it too). ``scraped``
        False: no new numbers (the scrape failed), only the health verdict is new."""
        if reading.upstream not in self._latest:
            raise KeyError(f"{reading.upstream!r} is not a configured upstream")
        previous = self._latest[reading.upstream]
        if scraped:
            # A queue is one seen in two scrapes: a first scrape, or one after a scrape
            # with no figure, has nothing to confirm it.
            waiting = 0.0
            if previous.waiting is not None and reading.waiting is not None:
                waiting = min(reading.waiting, previous.waiting)
            self._queued[reading.upstream] = waiting
        self._latest[reading.upstream] = reading

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every polling round."""
        self._subscribers.append((callback, self._subscribing_as))

    @contextlib.contextmanager
    def subscribing_as(self, who: str) -> Iterator[None]:
        """Callbacks subscribed meanwhile are ``who``'s (``" of capacity provider 'x' from
        plugin 'p' (dist 1.0)"``): the log names it when one raises."""
        self._subscribing_as = who
        try:
            yield
        finally:
            self._subscribing_as = ""

    def notify(self) -> None:
        """Tell subscribers a polling round ended (called by the poller); one subscriber
        that raises is logged and does not keep the others from being told."""
        for index, (callback, who) in enumerate(self._subscribers):
            try:
                callback()
            except PASSED_ON:
                raise
            except BaseException:  # SystemExit too: the subscriber's fault
                if self._complaints.may(index):
                    log.exception(
                        "a subscriber of the upstream readings%s raised (%r); the others "
                        "are still told, and this is logged at most once a minute",
                        who,
                        callback,
                    )
