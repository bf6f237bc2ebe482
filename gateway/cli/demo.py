"""``obleth demo``: the main job on embedded defaults, no Redis needed."""

from __future__ import annotations

import argparse
import asyncio
import sys

from gateway.cli.defaults import DefaultsShown
from gateway.demo.run import DemoOptions, run_demo
from gateway.demo.tenants import parse_tenants
from gateway.errors import ConfigError
from gateway.settings import Settings

#: the demo's flag for each setting it passes on, so that an error names what was typed
_FLAG_OF = {
    "global_max_in_flight": "--limit",
    "overflow_policy": "--policy",
    "queue_timeout_s": "--queue-timeout",
    "max_queue": "--max-queue",
}


MAX_LIMIT = 128
"""The demo's highest ``--limit``: every tenant runs that many clients in this process (the
flooding one three times as many), beside the gateway and a simulated backend whose steps
slow down with every sequence it holds. At 1000 the backend completed nothing in 10 s and
the shares read 100/0/0; at 256 it completes so few in 20 s that they read 76/16/8 against
57/29/14; at 128 they come within a few points of the weights (65/23/11).
``obleth simulate`` plans for larger fleets."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "demo",
        help="run a gateway in front of a simulated backend under multi-tenant load",
        description="Start the simulated inference backend with the Obleth middleware in "
        "front of it on 127.0.0.1, drive a multi-tenant load (one tenant flooding, some "
        "critical and some background requests), show a live table, and end with each "
        "tenant's share of seats against its weighted fair share and the highest "
        "concurrency the backend itself saw. Finishes by itself. The demo is configured "
        "by these flags only: OBLETH_* variables, which obleth serve and the middleware "
        "read, play no part in it, so that its run and its verdict are the same wherever "
        "it is started.",
        formatter_class=DefaultsShown,
    )
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load")
    parser.add_argument(
        "--limit", type=int, default=16, help=f"global_max_in_flight, at most {MAX_LIMIT}"
    )
    parser.add_argument(
        "--policy",
        default="block",
        help="overflow policy: block (waits in the queue, or for room in it when it is full), "
        "drop-newest (queue_full when the queue is full), drop-oldest (evicts the heaviest "
        "tenant's oldest waiter), reject (never waits: over_capacity), or a plugin's policy",
    )
    parser.add_argument(
        "--tenants",
        default="gold:4,silver:2,bronze:1",
        help="the tenants, as a name:weight list",
    )
    parser.add_argument(
        "--flood", default=None, help="the tenant that floods (default: the last one)"
    )
    parser.add_argument(
        "--queue-timeout", type=float, default=5.0, help="queue_timeout_s in seconds"
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=None,
        help="max_queue, the most requests waiting in the queue at once; try 24 to see "
        "block, drop-newest and drop-oldest differ (default: the setting's, "
        f"{Settings.max_queue}, which this load never fills)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.duration <= 3600:  # also refuses nan
        return _usage("--duration: expected seconds between 0 and 3600")
    if not 1 <= args.limit <= MAX_LIMIT:
        return _usage(f"--limit: expected a whole number from 1 to {MAX_LIMIT}")
    names = [part.split(":")[0].strip() for part in args.tenants.split(",") if part.strip()]
    flood = args.flood if args.flood is not None else (names[-1] if names else None)
    tenants = parse_tenants(args.tenants, limit=args.limit, flood=flood)
    options = DemoOptions(
        duration_s=args.duration,
        limit=args.limit,
        policy=args.policy,
        tenants=tenants,
        queue_timeout_s=args.queue_timeout,
        max_queue=args.max_queue,
    )
    try:
        return asyncio.run(run_demo(options))
    except ConfigError as exc:
        flag = _FLAG_OF.get(exc.setting)
        if flag is None:
            raise
        return _usage(f"{flag} {exc.value}: {exc.expected}")
    except KeyboardInterrupt:
        return 130  # stopped by Ctrl-C: the clients were stopped, nothing more to say


def _usage(problem: str) -> int:
    """A bad flag: one line on stderr, and the status of a usage error, as argparse's."""
    print(f"obleth demo: {problem}", file=sys.stderr)
    return 2
