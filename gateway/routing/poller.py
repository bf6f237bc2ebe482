"""Poller: the background task that scrapes every upstream's /metrics and /health."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace

import httpx

from gateway.routing.httpclient import pooled_limits
from gateway.routing.metricnames import reading_from_text
from gateway.routing.readings import Readings
from gateway.routing.upstreams import parse_upstream

log = logging.getLogger("obleth.routing")

# An engine's /metrics with every histogram is some hundreds of KB; far more is not a
# metrics page, and reading it all would cost the gateway memory each round.
_MAX_BODY_BYTES = 8 * 1024 * 1024


class _Unanswered(Exception):
    """A request that got no 2xx answer; the message says what happened instead."""


class Poller:
    """Keeps ``readings`` up to date by scraping every upstream, one round per interval.

    What callers may rely on:

    - A round sends ``GET <base><metrics_path>`` and ``GET <base><health_path>`` to every
      upstream of ``readings`` at once (``<base>`` keeps its path: ``http://h:8000/v`` is
      scraped at ``http://h:8000/v/metrics``). Each request is abandoned after
      ``timeout_s`` in all, so a round lasts at most about ``timeout_s``, and a slow or
      hanging upstream delays neither the others nor the next round beyond that.
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

    A client passed in is used as it is and left open by ``stop()``; its connection
    limit must allow two requests per upstream at once, or requests wait for the pool
    within their ``timeout_s``. Without one the poller makes and closes its own.
    A poller runs once: ``start()`` after ``start()`` or ``stop()`` raises RuntimeError.
    """

    def __init__(
        self,
        readings: Readings,
        *,
        interval_s: float,
        timeout_s: float,
        health_path: str = "/health",
        metrics_path: str = "/metrics",
        unhealthy_after: int = 2,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s!r}: must be a number of seconds > 0")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r}: must be a number of seconds > 0")
        if isinstance(unhealthy_after, bool) or not (
            isinstance(unhealthy_after, int) and unhealthy_after >= 1
        ):
            raise ValueError(f"unhealthy_after={unhealthy_after!r}: must be an integer >= 1")
        self._readings = readings
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._unhealthy_after = unhealthy_after
        self._urls = {
            upstream: (_join(upstream, metrics_path), _join(upstream, health_path))
            for upstream in readings
        }
        for upstream in self._urls:
            parse_upstream(upstream)
        self._owns_client = client is None
        self._client = client if client is not None else _own_client(len(readings), timeout_s)
        self._failures = dict.fromkeys(self._urls, 0)
        self._scrape_failing: set[str] = set()
        self._round_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._stopped = False

    async def start(self) -> None:
        """Run one round, then keep polling every ``interval_s`` in a background task.

        Returns after the first round, so requests routed right after have numbers for
        every upstream that answered it.
        """
        if self._started or self._stopped:
            raise RuntimeError("a Poller starts once; make a new one to poll again")
        self._started = True
        await self.poll_once()
        self._task = asyncio.create_task(self._loop(), name="obleth-routing-poller")

    async def stop(self) -> None:
        """Stop polling and close the poller's own client; safe to call again, or unstarted."""
        if self._stopped:
            return
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._owns_client:
            await self._client.aclose()

    async def poll_once(self) -> None:
        """Run one round: scrape every upstream, update ``readings``, then notify."""
        async with self._round_lock:
            await asyncio.gather(*(self._poll(upstream) for upstream in self._urls))
            self._readings.notify()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_round = loop.time() + self._interval_s
        failing = False
        while True:
            await asyncio.sleep(max(0.0, next_round - loop.time()))
            # Round start to round start; a round that overran starts the next one at once.
            next_round = loop.time() + self._interval_s
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

    async def _poll(self, upstream: str) -> None:
        metrics_url, health_url = self._urls[upstream]
        scrape, problem = await asyncio.gather(self._scrape(metrics_url), self._check(health_url))
        healthy = self._judge_health(upstream, problem)
        if isinstance(scrape, str):
            self._scrape_failed(upstream, scrape)
            reading = replace(self._readings.get(upstream), healthy=healthy)
        else:
            self._scrape_passed(upstream)
            text, at = scrape
            reading = reading_from_text(upstream, text, at, healthy)
        self._readings.update(reading)

    async def _scrape(self, url: str) -> tuple[str, float] | str:
        """The metrics text and the monotonic time it was read; or why there is none."""
        try:
            body = await self._get(url)
        except _Unanswered as exc:
            return str(exc)
        at = time.monotonic()
        return body.decode("utf-8", errors="replace"), at

    async def _check(self, url: str) -> str | None:
        """None when the health check passes; otherwise why it failed."""
        try:
            await self._get(url)
        except _Unanswered as exc:
            return str(exc)
        return None

    async def _get(self, url: str) -> bytes:
        """The body of a 2xx answer to ``GET url`` within ``timeout_s``, or _Unanswered."""
        try:
            async with asyncio.timeout(self._timeout_s):
                async with self._client.stream("GET", url) as response:
                    # Read the body even of a health check: a connection with an unread
                    # body is closed instead of going back to the pool.
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > _MAX_BODY_BYTES:
                            raise _Unanswered(f"GET {url}: body over {_MAX_BODY_BYTES} bytes")
        except TimeoutError:
            raise _Unanswered(f"GET {url}: no answer within {self._timeout_s} s") from None
        except httpx.HTTPError as exc:
            raise _Unanswered(f"GET {url}: {type(exc).__name__} {exc}".rstrip()) from None
        if not response.is_success:
            raise _Unanswered(f"GET {url}: answered {response.status_code}")
        return bytes(body)

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


def _own_client(upstreams: int, timeout_s: float) -> httpx.AsyncClient:
    # Two requests per upstream per round, and rounds never overlap: with that many
    # connections no request waits for the pool behind a hanging upstream's.
    return httpx.AsyncClient(
        limits=pooled_limits(max(2, 2 * upstreams)),
        timeout=timeout_s,
        trust_env=False,
        follow_redirects=False,
    )
