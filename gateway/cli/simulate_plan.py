"""The run ``obleth simulate``'s flags describe: the profile with the instance flags
applied, the workload, the gateway's settings, each value checked with a `BadFlag` that
names its flag; and a plan with one swept flag set to another value."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gateway.errors import ConfigError
from gateway.settings import parsers
from gateway.simulate import profiles
from gateway.simulate.errors import BadFlag
from gateway.simulate.instance import MAX_INSTANCES
from gateway.simulate.numbers import number
from gateway.simulate.profiles import Profile
from gateway.simulate.run import FLAG_OF_SETTING, Plan
from gateway.simulate.sweep import Sweep
from gateway.simulate.workload import (
    MAX_GROUPS,
    MAX_REQUESTS,
    MAX_TOKENS,
    Workload,
    parse_shares,
    parse_tokens,
)

#: What ``--num-instances`` and ``--rate`` come to when they are left out.
DEFAULT_INSTANCES = 1
DEFAULT_RATE = 10.0


def plan_of(args: argparse.Namespace) -> Plan:
    """The run the flags describe; `BadFlag` for the first unusable one."""
    profile = (
        profiles.from_file(args.profile) if args.profile is not None else profiles.named(args.model)
    )
    profile = _engine_flags(profile, args)
    instances = DEFAULT_INSTANCES if args.num_instances is None else args.num_instances
    rate = DEFAULT_RATE if args.rate is None else args.rate
    _within("--num-instances", instances, 1, MAX_INSTANCES)
    _within("--num-requests", args.num_requests, 1, MAX_REQUESTS)
    _within("--prefix-tokens", args.prefix_tokens, 0, MAX_TOKENS)
    groups = 1 if args.prefix_groups is None else args.prefix_groups
    _within("--prefix-groups", groups, 1, MAX_GROUPS)
    if not math.isfinite(rate) or rate <= 0:
        raise BadFlag("--rate", rate, "requests per second, a number above 0")
    _arrive_within_a_day("--rate", rate, args.num_requests)
    if not math.isfinite(args.scrape_interval) or args.scrape_interval < 0:
        raise BadFlag("--scrape-interval", args.scrape_interval, "seconds, 0 or more")
    span = args.num_requests / rate
    # named: the instances, if given, else the interval (the fix names every flag in it)
    flag, value = (
        ("--num-instances", instances)
        if args.num_instances is not None
        else ("--scrape-interval", args.scrape_interval)
    )
    _readings_bounded(flag, value, instances, span, args.scrape_interval, args.num_requests)
    workload = Workload(
        rate=rate,
        num_requests=args.num_requests,
        input_tokens=parse_tokens("--input-tokens", args.input_tokens),
        output_tokens=parse_tokens("--output-tokens", args.output_tokens),
        prefix_tokens=args.prefix_tokens,
        prefix_groups=groups,
        tenants=parse_shares("--tenants", args.tenants) if args.tenants is not None else None,
    )
    gateway: dict[str, Any] = {}
    given: list[tuple[str, Any, Callable[[str, str], Any] | None]] = [
        ("routing_policy", args.routing_policy, None),
        ("routing_scorers", args.routing_scorers, None),
        ("global_max_in_flight", args.max_in_flight, None),
        ("overflow_policy", args.policy, None),
        ("capacity_providers", args.capacity_providers, parsers.env_list),
        ("max_queue", args.max_queue, None),
        ("queue_timeout_s", args.queue_timeout, None),
        ("tenant_weights", args.tenant_weights, parsers.env_weights),
        ("tenant_max_in_flight", args.tenant_max_in_flight, parsers.env_caps),
        ("global_max_tokens_in_flight", args.max_tokens_in_flight, None),
        ("fairness_cost", args.fairness_cost, None),
    ]
    for setting, value, parse in given:
        if value is None:
            continue
        try:
            gateway[setting] = parse(setting, value) if parse is not None else value
        except ConfigError as exc:
            raise BadFlag(FLAG_OF_SETTING[setting], value, exc.expected, told=True) from None
    _tenants_known(args, gateway, set(workload.tenants or {"default": 1.0}))
    return Plan(
        profile=profile,
        workload=workload,
        num_instances=instances,
        seed=args.seed,
        scrape_interval_s=args.scrape_interval,
        gateway=gateway,
    )


def _tenants_known(args: argparse.Namespace, gateway: dict[str, Any], known: set[str]) -> None:
    """`BadFlag` for a blank ``--tenant-weights`` or ``--tenant-max-in-flight``, or one
    naming a tenant the workload does not have: a simulation knows all its tenants, so
    a name it lacks is a slip that would leave the run as if the flag were not given."""
    for setting, text in (
        ("tenant_weights", args.tenant_weights),
        ("tenant_max_in_flight", args.tenant_max_in_flight),
    ):
        if text is None:
            continue
        flag = FLAG_OF_SETTING[setting]
        if not text.strip():
            raise BadFlag(flag, text, "a value; an empty one is an error, not the flag left out")
        named = gateway.get(setting)
        unknown = sorted(set(named) - known - {"*"}) if isinstance(named, dict) else []
        if unknown:
            tenants = ", ".join(sorted(known))
            raise BadFlag(
                flag,
                text,
                f"names of the workload's tenants ({tenants}; set by --tenants); "
                f"{unknown[0]!r} is none of them",
                told=True,
            )


#: The instance flags, each with the profile's engine field it sets.
_ENGINE_FLAGS = {
    "--total-kv-blocks": "kv_cache_blocks",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--block-size-in-tokens": "block_size_tokens",
}


def _engine_flags(profile: Profile, args: argparse.Namespace) -> Profile:
    """``profile`` with the instance flags given applied; `BadFlag` for a value the step
    model cannot use."""
    changes: dict[str, Any] = {}
    for flag, field in _ENGINE_FLAGS.items():
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value is not None:
            changes[field] = value
    if changes.get("kv_cache_blocks", 0) >= 1 and profile.config.prefix_cache_blocks:
        # a cached prefix lives in KV memory no sequence holds: the cache is as large
        # (a bad size is told as itself, below; a profile without prefix caching keeps
        # it off, as a sweep of the size does)
        changes["prefix_cache_blocks"] = changes["kv_cache_blocks"]
    if args.no_enable_prefix_caching:
        changes["prefix_cache_blocks"] = 0
    return _engine(profile, changes)


def _engine(profile: Profile, changes: dict[str, Any]) -> Profile:
    """``profile`` with engine fields ``changes``, a `BadFlag` naming the flag of the first
    unusable one."""
    if not changes:
        return profile
    try:
        return replace(profile, config=replace(profile.config, **changes))
    except ConfigError as exc:
        flags = {field: flag for flag, field in _ENGINE_FLAGS.items()}
        flag = flags.get(exc.setting, "--total-kv-blocks")
        raise BadFlag(flag, exc.value, exc.expected, told=True) from None


def refuse_swept_flag(args: argparse.Namespace, sweep: Sweep) -> None:
    """`BadFlag` when the flag ``sweep`` sets for each run was given too (``--num-instances
    4 --sweep num-instances=2..8``): the sweep would replace it without a word. Every
    sweepable flag is None in ``args`` when left out."""
    given = getattr(args, sweep.flag.replace("-", "_"))
    if given is not None:
        raise BadFlag(
            f"--{sweep.flag}",
            given,
            f"--sweep {args.sweep} sets --{sweep.flag} for each run; give one or the other",
            told=True,
        )


def refuse_flags_without_effect(args: argparse.Namespace, plan: Plan, sweep: Sweep | None) -> None:
    """`BadFlag` for a flag the run would ignore: the queue's flags with nothing that can
    make a request wait (no limit, given or swept, no tenant cap, and no provider but
    ``static``, whose limit is ``--max-in-flight``), shared-prefix groups with no shared
    prefix. Any other capacity provider needs no limit: it may set one of its own
    (``adaptive`` probes at a few seats, ``kv-pressure`` may start from its own)."""
    swept = sweep is not None and sweep.flag == "max-in-flight"
    limited = args.max_in_flight is not None or swept or args.max_tokens_in_flight is not None
    computed = set(plan.gateway.get("capacity_providers", ())) - {"static"}
    if not limited and args.tenant_max_in_flight is None and not computed:
        for flag, value in (
            ("--policy", args.policy),
            ("--max-queue", args.max_queue),
            ("--queue-timeout", args.queue_timeout),
            ("--fairness-cost", args.fairness_cost),
        ):
            if value is not None:
                raise BadFlag(
                    flag,
                    value,
                    "decides what happens when no seat is free, and without --max-in-flight "
                    "(or a sweep of it), --max-tokens-in-flight, --tenant-max-in-flight or "
                    "a capacity provider "
                    "other than static there always is one; give a limit too",
                    told=True,
                )
    if args.prefix_groups is not None and not args.prefix_tokens:
        raise BadFlag(
            "--prefix-groups",
            args.prefix_groups,
            "draws each request's shared prefix among that many, and without "
            "--prefix-tokens there is none; give --prefix-tokens too",
            told=True,
        )


def with_value(plan: Plan, flag: str, value: float) -> Plan:
    """``plan`` with the swept flag set to ``value``."""
    if flag == "total-kv-blocks":
        blocks = int(value)
        changes = {"kv_cache_blocks": blocks}
        if plan.profile.config.prefix_cache_blocks:
            changes["prefix_cache_blocks"] = blocks
        return replace(plan, profile=_engine(plan.profile, changes))
    if flag == "max-num-seqs":
        return replace(plan, profile=_engine(plan.profile, {"max_num_seqs": int(value)}))
    requests = plan.workload.num_requests
    if flag == "num-instances":
        span = requests / plan.workload.rate
        swept = f"{flag}={number(value)}"
        _readings_bounded("--sweep", swept, int(value), span, plan.scrape_interval_s, requests)
        return replace(plan, num_instances=int(value))
    if flag == "rate":
        _arrive_within_a_day("--sweep", value, requests)
        span = requests / value
        instances = plan.num_instances
        swept = f"{flag}={number(value)}"
        _readings_bounded("--sweep", swept, instances, span, plan.scrape_interval_s, requests)
        return replace(plan, workload=replace(plan.workload, rate=value))
    return replace(plan, gateway={**plan.gateway, "global_max_in_flight": int(value)})


MAX_SPAN_S = 86_400.0
"""The longest the arrivals may take, in simulated seconds: the instances are read every
``--scrape-interval`` of it, idle or not, and a constant rate has nothing more to show
after a day. ``--rate 1e-6`` used to keep the command busy for hours."""


def _arrive_within_a_day(flag: str, rate: float, num_requests: int) -> None:
    if num_requests / rate > MAX_SPAN_S:
        least = num_requests / MAX_SPAN_S
        raise BadFlag(
            flag,
            rate,
            f"a rate at which the {num_requests} requests arrive within a simulated day "
            f"(at least {least:.3g} per second), or fewer requests",
        )


MAX_READINGS = 10_000_000
"""The most readings of the instances a run may take (instances times polls over the
arrivals; with ``--scrape-interval 0``, instances times requests): about 30 s of work on
a small machine. Each flag within its own bound, 10 000 instances read every 0.25 s
over a day of arrivals would take hours."""


def _readings_bounded(
    flag: str, value: object, instances: int, span_s: float, interval_s: float, requests: int
) -> None:
    """`BadFlag` (naming ``flag``, given ``value``) when ``instances`` read every
    ``interval_s`` over ``span_s`` seconds of arrivals (or at each of ``requests``
    decisions when the interval is 0) would be more than `MAX_READINGS` readings."""
    if interval_s <= 0:
        readings: float = instances * requests
        how = f"read at each of {requests} requests (--scrape-interval 0)"
        fix = "set a --scrape-interval, or run fewer instances or requests"
    else:
        readings = instances * span_s / interval_s
        how = f"read every {number(interval_s)} s over {span_s:.3g} s of arrivals"
        fix = "raise --scrape-interval or --rate, or run fewer instances"
    if readings > MAX_READINGS:
        raise BadFlag(
            flag,
            value,
            f"{instances} instances {how} come to {readings:.3g} readings, more than the "
            f"{MAX_READINGS:.0e} a run may take (about 30 s of work); {fix}",
            told=True,
        )


def _within(flag: str, value: int, minimum: int, maximum: int | None = None) -> None:
    if value < minimum or (maximum is not None and value > maximum):
        most = "" if maximum is None else f" and at most {maximum}"
        raise BadFlag(flag, value, f"a whole number of at least {minimum}{most}")
