"""The demo's clients and what they tally: one task per client, bounded by a deadline."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx

from gateway.demo.tenants import TenantLoad
from gateway.hookimpl import hookimpl
from gateway.protocols import RequestInfo


@dataclass
class Tally:
    """What one tenant's clients saw. ``waits`` come from the gateway's own observer hook,
    one per admission: their number is how many requests the tenant had admitted."""

    completed: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    errors: int = 0
    waits: list[float] = field(default_factory=list)
    seat_seconds: float = 0.0


class WaitRecorder:
    """A plugin (registered like any other) that records each admission's wait per tenant."""

    def __init__(self) -> None:
        self.waits: defaultdict[str, list[float]] = defaultdict(list)

    @hookimpl
    def obleth_request_admitted(self, request: RequestInfo, wait_s: float) -> None:
        self.waits[request.tenant].append(wait_s)


async def run_client(
    http: httpx.AsyncClient,
    tenant: TenantLoad,
    tally: Tally,
    *,
    seed: int,
    deadline: float,
    model: str,
) -> None:
    """Send requests back to back until ``deadline`` (loop time); back off when rejected."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    system = f"You are the assistant of {tenant.name}. " * 8
    while loop.time() < deadline:
        roll = rng.random()
        priority = "standard"
        if roll < tenant.critical_share:
            priority = "critical"
        elif roll > 1 - tenant.background_share:
            priority = "background"
        body: dict[str, Any] = {
            "model": model,
            "prompt": system + f"question {rng.randrange(10**6)} " * rng.randint(4, 40),
            "max_tokens": rng.randint(8, 40),
            "stream": rng.random() < 0.3,
        }
        headers = {"x-tenant": tenant.name, "x-priority": priority}
        try:
            status, error_code = await _send(http, body, headers)
        except httpx.HTTPError:
            tally.errors += 1
            await asyncio.sleep(0.1)
            continue
        if status == 200:
            tally.completed += 1
        elif status in (429, 503) and error_code:
            tally.rejected[error_code] += 1
            await asyncio.sleep(0.05 + rng.random() * 0.2)
        else:
            tally.errors += 1


async def _send(
    http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, str | None]:
    if body["stream"]:
        async with http.stream("POST", "/v1/completions", json=body, headers=headers) as response:
            payload = await response.aread()
    else:
        response = await http.post("/v1/completions", json=body, headers=headers)
        payload = response.content
    if response.status_code == 200:
        return 200, None
    try:
        code = httpx.Response(response.status_code, content=payload).json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    return response.status_code, code
