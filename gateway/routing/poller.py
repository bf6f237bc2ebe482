"""Poller: the background task that scrapes every upstream's /metrics and /health."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import replace

from gateway.routing.activity import Activity
from gateway.routing.metricnames import reading_from_text
from gateway.routing.readings import Readings
from gateway.routing.scraper import Scraper, Unanswered
from gateway.tasks import cancel_and_wait

log = logging.getLogger("obleth.routing")

IDLE_AFTER_ROUNDS = 4
"""Polling slows down once this many whole intervals passed without a request."""

# An engine's /metrics with every histogram is some hundreds of KB; far more is not a
# metrics page, and reading it all would cost the gateway memory each round.
_MAX_BODY_BYTES = 8 * 1024 * 1024


class Poller:
    """Keeps ``readings`` up to date by scraping every upstream, one round per interval.

    What callers may rely on:

    - A round sends ``GET <base><metrics_path>`` and ``GET <base><health_path>`` to every
      upstream of ``readings`` at once (``<base>`` keeps its path: ``http://h:8000/v`` is
      scraped at ``http://h:8000/v/metrics``). Each request is abandoned after
      ``timeout_s`` in all, so a round lasts at most about ``timeout_s``, and a slow or
      hanging upstream delays neither the others nor the next round beyond that.
    - Pace: a round starts ``interval_s`` after the previous one started. Once
      ``activity`` has seen no request for ``IDLE_AFTER_ROUNDS`` whole intervals (none
      arrived at the router, none in flight), rounds start ``idle_interval_s`` apart, and
      ``readings.stale_after_s`` grows by the same factor, so that the slower rounds do
      not make readings stale. The first request to arrive ends that: a round starts at
      once, and from its end rounds are ``interval_s`` apart again and
      ``readings.stale_after_s`` is what it was. Without ``idle_interval_s`` (or with it
      equal to ``interval_s``) the pace never changes.
    - Health: a 2xx answer passes; no connection, no answer in time, or another status
      fails. An upstream is unhealthy until its first pass, healthy from any pass, and
      unhealthy again after ``unhealthy_after`` failures in a row.
    - Numbers: a scrape answered 2xx replaces the upstream's numbers and sets ``at`` to
      ``time.monotonic()`` when the body was read. A failed scrape leaves numbers and
      ``at`` as they were, so they age until ``Readings.stale`` says so.
    - After each round every upstream's reading is updated, then ``readings.notify()``
      runs, on the event loop of ``start()``.
    - Rounds never overlap: ``poll_once()`` waits for a round in progress to end.
    - Log lines (logger ``obleth.routing``) mark changes only: a WARNING when an upstream
      turns unhealthy or its scrape starts failing, an INFO when it recovers.

    Requests go out through one ``Scraper`` per upstream (``gateway.routing.scraper``),
    on connections kept alive from one round to the next; ``stop()`` closes them.
    A poller runs once: ``start()`` after ``start()`` or ``stop()`` raises RuntimeError.
    """

    def __init__(
        self,
        readings: Readings,
        *,
        interval_s: float,
        timeout_s: float,
        idle_interval_s: float | None = None,
        activity: Activity | None = None,
        health_path: str = "/health",
        metrics_path: str = "/metrics",
        unhealthy_after: int = 2,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s!r}: must be a number of seconds > 0")
        if idle_interval_s is None:
            idle_interval_s = interval_s
        elif not idle_interval_s >= interval_s:
            raise ValueError(
                f"idle_interval_s={idle_interval_s!r}: must be at least interval_s={interval_s!r}"
            )
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r}: must be a number of seconds > 0")
        if isinstance(unhealthy_after, bool) or not (
            isinstance(unhealthy_after, int) and unhealthy_after >= 1
        ):
            raise ValueError(f"unhealthy_after={unhealthy_after!r}: must be an integer >= 1")
        self._readings = readings
        self._interval_s = interval_s
        self._idle_interval_s = idle_interval_s
        self._activity = activity if activity is not None else Activity()
        self._stale_after_s = readings.stale_after_s
        self._timeout_s = timeout_s
        self._unhealthy_after = unhealthy_after
        self._urls = {
            upstream: (_join(upstream, metrics_path), _join(upstream, health_path))
            for upstream in readings
        }
        self._scrapers = {
            upstream: Scraper(upstream, timeout_s=timeout_s, max_body_bytes=_MAX_BODY_BYTES)
            for upstream in self._urls
        }
        self._failures = dict.fromkeys(self._urls, 0)
        self._scrape_failing: set[str] = set()
        self._round_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._stopped = False
        #: whether rounds are ``idle_interval_s`` apart now, for want of requests
        self.resting = False

    async def start(self) -> None:
        """Run one round, then keep polling in a background task, at the pace above.

        Returns after the first round, so requests routed right after have numbers for
        every upstream that answered it.
        """
        if self._started or self._stopped:
            raise RuntimeError("a Poller starts once; make a new one to poll again")
        self._started = True
        await self.poll_once()
        self._task = asyncio.create_task(self._loop(), name="obleth-routing-poller")

    async def stop(self) -> None:
        """Stop polling and close its connections; safe to call again, or unstarted."""
        if self._stopped:
            return
        self._stopped = True
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        self._pace(resting=False)
        for scraper in self._scrapers.values():
            scraper.close()

    async def poll_once(self) -> None:
        """Run one round: scrape every upstream, update ``readings``, then notify."""
        async with self._round_lock:
            await asyncio.gather(*(self._poll(upstream) for upstream in self._urls))
            self._readings.notify()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        quiet = 0  # rounds in a row before which no request was seen
        failing = False
        while True:
            quiet = 0 if self._activity.seen() else quiet + 1
            interval = self._pace(resting=quiet > IDLE_AFTER_ROUNDS)
            # Round start to round start; a round that overran starts the next one at once.
            await self._sleep_until(started + interval)
            started = loop.time()
            try:
                await self.poll_once()
            except Exception:
                # Only a bug gets here (a subscriber raising, say): say so once, keep polling.
                if not failing:
                    log.exception("a polling round failed; polling goes on")
                failing = True
            else:
                if failing:
                    log.info("polling rounds complete again")
                failing = False

    def _pace(self, *, resting: bool) -> float:
        """Set the pace, and with it how long readings stay fresh; the interval to wait."""
        self.resting = resting and self._idle_interval_s > self._interval_s
        interval = self._idle_interval_s if self.resting else self._interval_s
        # as many rounds as at the full pace, however far apart they are now
        self._readings.stale_after_s = self._stale_after_s * interval / self._interval_s
        return interval

    async def _sleep_until(self, when: float) -> None:
        """Wait until the loop's clock reaches ``when``, or while resting until a request
        arrives, whichever comes first."""
        loop = asyncio.get_running_loop()
        alarm: asyncio.Future[None] = loop.create_future()
        timer = loop.call_at(when, _ring, alarm)
        if self.resting:
            self._activity.wake_with(functools.partial(_ring, alarm))
        try:
            await alarm
        finally:
            timer.cancel()
            self._activity.wake_with(None)

    async def _poll(self, upstream: str) -> None:
        metrics_url, health_url = self._urls[upstream]
        scraper = self._scrapers[upstream]
        scrape, problem = await asyncio.gather(
            _scrape(scraper, metrics_url), _check(scraper, health_url)
        )
        healthy = self._judge_health(upstream, problem)
        if isinstance(scrape, str):
            self._scrape_failed(upstream, scrape)
            reading = replace(self._readings.get(upstream), healthy=healthy)
            self._readings.update(reading, scraped=False)
            return
        self._scrape_passed(upstream)
        text, at = scrape
        self._readings.update(reading_from_text(upstream, text, at, healthy))

    def _judge_health(self, upstream: str, problem: str | None) -> bool:
        """The health verdict after this check, logging a change of state."""
        failures = self._failures[upstream]
        if problem is None:
            if failures >= self._unhealthy_after:
                log.info("upstream %s is healthy again", upstream)
            self._failures[upstream] = 0
            return True
        failures += 1
        self._failures[upstream] = failures
        if failures == self._unhealthy_after:
            log.warning(
                "upstream %s is unhealthy after %d failed health checks in a row; last: %s",
                upstream,
                failures,
                problem,
            )
        was_healthy = self._readings.get(upstream).healthy
        return was_healthy and failures < self._unhealthy_after

    def _scrape_failed(self, upstream: str, problem: str) -> None:
        if upstream not in self._scrape_failing:
            self._scrape_failing.add(upstream)
            log.warning(
                "metrics of upstream %s cannot be scraped, its numbers are aging: %s",
                upstream,
                problem,
            )

    def _scrape_passed(self, upstream: str) -> None:
        if upstream in self._scrape_failing:
            self._scrape_failing.discard(upstream)
            log.info("metrics of upstream %s are scraped again", upstream)


def _join(base: str, path: str) -> str:
    """``base`` with ``path`` appended to its own path: ``http://h/v`` + ``/metrics``."""
    return base.rstrip("/") + "/" + path.lstrip("/")


async def _scrape(scraper: Scraper, url: str) -> tuple[str, float] | str:
    """The metrics text and the monotonic time it was read; or why there is none."""
    try:
        body = await scraper.get(url)
    except Unanswered as exc:
        return str(exc)
    return body.decode("utf-8", errors="replace"), time.monotonic()


async def _check(scraper: Scraper, url: str) -> str | None:
    """None when the health check passes; otherwise why it failed."""
    try:
        await scraper.get(url)
    except Unanswered as exc:
        return str(exc)
    return None


def _ring(alarm: asyncio.Future[None]) -> None:
    if not alarm.done():
        alarm.set_result(None)
