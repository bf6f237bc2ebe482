"""Steady load with a timeline: when each answer came, so a test can see admissions stall.

``steady`` keeps ``concurrency`` short completions in flight across the pods until a
deadline and records every answer with its time; ``Timeline.longest_gap`` is then the
longest stretch without a single successful answer, the stall a fault caused.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import httpx

from gateway.routing.httpclient import KEEPALIVE_EXPIRY_S
from tests.cluster.pods import error_code


def longest_gap(times: Iterable[float], after: float, before: float) -> float:
    """The longest stretch of ``after`` .. ``before`` without one of ``times`` in it."""
    inside = sorted(t for t in times if after <= t <= before)
    edges = [after, *inside, before]
    return max(later - earlier for earlier, later in itertools.pairwise(edges))


@dataclass
class Timeline:
    """Every answer of a steady run: (monotonic time sent, time answered, status, error
    code or None)."""

    answers: list[tuple[float, float, int, str | None]] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    """Requests that got no HTTP answer, by exception class."""
    started: float = 0.0
    ended: float = 0.0

    @property
    def statuses(self) -> Counter[int]:
        return Counter(status for _, _, status, _ in self.answers)

    @property
    def error_codes(self) -> Counter[str]:
        return Counter(code for _, _, _, code in self.answers if code is not None)

    def longest_gap(self, after: float, before: float | None = None) -> float:
        """The longest stretch of ``after`` .. ``before`` (default: the end of the run)
        without a successful answer."""
        done = (t for _, t, status, _ in self.answers if status == 200)
        return longest_gap(done, after, self.ended if before is None else before)

    def served_after(self, moment: float) -> int:
        """Successful answers to requests sent after ``moment``: each was admitted after
        it, whatever was running then."""
        return sum(1 for sent, _, status, _ in self.answers if status == 200 and sent > moment)

    def summary(self) -> str:
        return (
            f"{len(self.answers)} answers in {self.ended - self.started:.2f} s: "
            f"{dict(self.statuses)}; codes {dict(self.error_codes)}; "
            f"failures {dict(self.failures)}"
        )


async def steady(
    urls: Sequence[str],
    *,
    duration_s: float,
    concurrency: int = 24,
    max_tokens: int = 4,
    tenants: Sequence[str] = ("gold", "silver", "bronze"),
    request_timeout_s: float = 15.0,
) -> Timeline:
    """Keep ``concurrency`` completions in flight over ``urls`` for ``duration_s``."""
    timeline = Timeline(started=time.monotonic())
    deadline = timeline.started + duration_s
    limits = httpx.Limits(
        max_connections=concurrency,
        max_keepalive_connections=concurrency,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )
    async with httpx.AsyncClient(trust_env=False, timeout=request_timeout_s, limits=limits) as http:

        async def worker(n: int) -> None:
            i = 0
            while time.monotonic() < deadline:
                url = urls[(n + i) % len(urls)] + "/v1/completions"
                tenant = tenants[(n + i) % len(tenants)]
                i += 1
                body = {"prompt": f"steady {n}.{i}", "max_tokens": max_tokens}
                sent = time.monotonic()
                try:
                    answer = await http.post(url, json=body, headers={"x-tenant": tenant})
                except httpx.HTTPError as exc:
                    timeline.failures[type(exc).__name__] += 1
                    await asyncio.sleep(0.01)
                    continue
                code = (
                    None if answer.status_code == 200 else error_code(answer.content) or "malformed"
                )
                timeline.answers.append((sent, time.monotonic(), answer.status_code, code))
                if answer.status_code != 200:
                    await asyncio.sleep(0.01)  # a refusal comes back at once: do not spin

        await asyncio.gather(*(worker(n) for n in range(concurrency)))
    timeline.ended = time.monotonic()
    return timeline
