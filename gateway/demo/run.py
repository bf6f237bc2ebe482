"""Runs the demo: the simulated backend behind the middleware on loopback, tenants' clients
against it, a live table while it runs, and a summary at the end."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

import httpx

from gateway.asgi import GatewayMiddleware
from gateway.core.fairshare import fair_shares
from gateway.demo.load import Tally, WaitRecorder, run_client
from gateway.demo.table import live_table, summary
from gateway.demo.tenants import TenantLoad
from gateway.gateway import Gateway
from gateway.loopback import serve_in_task
from gateway.routing.httpclient import KEEPALIVE_EXPIRY_S
from gateway.settings import Settings
from gateway.sim import SimConfig, create_app

SAMPLE_EVERY_S = 0.05
#: clients that share one HTTP connection pool
CLIENTS_PER_POOL = 32


@dataclass(frozen=True)
class DemoOptions:
    duration_s: float
    limit: int
    policy: str
    tenants: Sequence[TenantLoad]
    queue_timeout_s: float
    #: None: the setting's default
    max_queue: int | None = None
    refresh_s: float = 0.5


def _pool(url: str) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=CLIENTS_PER_POOL,
        max_keepalive_connections=CLIENTS_PER_POOL,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,  # before the server closes an idle one
    )
    return httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0, trust_env=False)


async def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    """Run the demo; 0 when the backend never saw more than the limit and every permit
    was released once, 1 otherwise."""
    settings = Settings(
        global_max_in_flight=options.limit,
        overflow_policy=options.policy,
        queue_timeout_s=options.queue_timeout_s,
        max_queue=Settings.max_queue if options.max_queue is None else options.max_queue,
        tenant_header="x-tenant",
        tenant_weights={t.name: t.weight for t in options.tenants},
        trust_priority_header=True,
    )
    recorder = WaitRecorder()
    # the backend has more batch slots than the limit, so the gateway is what holds it back
    backend = create_app(SimConfig(max_num_seqs=options.limit * 2))
    # assembled here, not by the middleware: built while the loop runs, the middleware
    # would defer a bad setting (an unknown policy) to the server's startup
    gateway = Gateway(settings, plugins=[recorder])
    app = GatewayMiddleware(backend, gateway=gateway)
    stats = backend.state.stats
    tallies = {t.name: Tally() for t in options.tenants}
    live = out.isatty()
    loop = asyncio.get_running_loop()

    async with serve_in_task(app) as server:
        async with contextlib.AsyncExitStack() as pools:
            clients = [(index, tenant, n) for index, tenant in enumerate(options.tenants)
                       for n in range(tenant.clients)]  # fmt: skip
            # a pool per few clients: one pool's bookkeeping grows with its connections, and
            # a thousand clients on one stalled the whole loop for seconds at a time
            https = [
                await pools.enter_async_context(_pool(server.url))
                for _ in range(0, len(clients), CLIENTS_PER_POOL)
            ]
            started = loop.time()
            deadline = started + options.duration_s
            tasks = [
                asyncio.create_task(
                    run_client(
                        https[k // CLIENTS_PER_POOL],
                        tenant,
                        tallies[tenant.name],
                        seed=index * 1000 + n,
                        deadline=deadline,
                        model=backend.state.config.model,
                    )
                )
                for k, (index, tenant, n) in enumerate(clients)
            ]
            try:
                next_draw = sampled = started
                while loop.time() < deadline:
                    await asyncio.sleep(SAMPLE_EVERY_S)
                    snapshot = gateway.snapshot()
                    # the time since the last sample, however late this one runs
                    now = loop.time()
                    elapsed, sampled = now - sampled, now
                    for name, state in snapshot.tenants.items():
                        if name in tallies:
                            tallies[name].seat_seconds += state.inflight * elapsed
                    if loop.time() >= next_draw:
                        next_draw += options.refresh_s if live else 5.0
                        for name, tally in tallies.items():
                            tally.waits = recorder.waits[name]
                        table = live_table(
                            loop.time() - started,
                            options.duration_s,
                            options.tenants,
                            tallies,
                            snapshot,
                            stats.concurrency,
                            stats.max_concurrency,
                            policy=options.policy,
                        )
                        out.write(("\x1b[H\x1b[J" if live else "\n") + table + "\n")
                        out.flush()
            finally:
                # clients stop starting requests at the deadline: the last ones get a
                # moment; none when sampling was cut short (Ctrl-C, a closed pipe)
                grace = 2.0 if loop.time() >= deadline else 0.0
                _, late = await asyncio.wait(tasks, timeout=grace)
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
        for _ in range(100):  # cancelled clients' seats come back as the server sees them go
            if gateway.snapshot().inflight == 0:
                break
            await asyncio.sleep(0.02)

    for name, tally in tallies.items():
        tally.waits = recorder.waits[name]
    demands = {t.name: float(t.clients) for t in options.tenants}
    weights = {t.name: t.weight for t in options.tenants}
    fair = {
        name: share / options.limit
        for name, share in fair_shares(options.limit, demands, weights).items()
    }
    scheduler = gateway.scheduler
    out.write(
        summary(
            options.tenants,
            tallies,
            fair,
            options.limit,
            stats.max_concurrency,
            scheduler.admitted,
            scheduler.released,
        )
        + "\n"
    )
    healthy = stats.max_concurrency <= options.limit and scheduler.admitted == scheduler.released
    return 0 if healthy else 1
