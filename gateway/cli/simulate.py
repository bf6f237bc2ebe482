"""``obleth simulate``: capacity planning on a virtual clock, with Obleth's own router."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.cli.defaults import DefaultsShown, setting_default
from gateway.cli.simulate_plan import (
    DEFAULT_INSTANCES,
    DEFAULT_RATE,
    plan_of,
    refuse_flags_without_effect,
    refuse_swept_flag,
    with_value,
)
from gateway.simulate import profiles
from gateway.simulate.errors import BadFlag
from gateway.simulate.numbers import number
from gateway.simulate.render import as_json, run_table, sweep_table
from gateway.simulate.report import (
    add_fitness,
    check_records_path,
    parse_weights,
    report,
    save_records,
)
from gateway.simulate.run import Plan, settings_for, simulate
from gateway.simulate.sweep import Sweep, answer, meets, parse_slo, parse_sweep

DEFAULT_MODEL = "qwen/qwen3-14b"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "simulate",
        help="plan capacity: simulate a fleet behind Obleth's admission and router",
        description="Run a workload through Obleth's own admission control (capacity, fair "
        "queue, overflow policy, tenants) and router (policy, scorers, plugins included) to "
        "simulated inference instances, on a virtual clock: minutes of traffic take "
        "seconds, and the same flags and seed print the same output. Flag names follow "
        "BLIS (inference-sim). See docs/simulate.md.",
        formatter_class=DefaultsShown,
    )
    # every flag that takes a value takes one: given twice, the first would be dropped
    parser.register("action", None, _Once)
    parser.register("action", "store", _Once)
    model = parser.add_argument_group("the instances")
    model.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="a built-in model profile: " + ", ".join(profiles.builtin_profiles()),
    )
    model.add_argument(
        "--profile",
        metavar="FILE",
        default=None,
        help="your own profile, a JSON file (see docs/simulate.md); overrides --model "
        "(default: none, the --model profile)",
    )
    # None when left out (its default applies in plan_of): a sweep over a flag the user
    # gave too is refused, not left to replace it without a word
    model.add_argument(
        "--num-instances",
        type=int,
        default=None,
        help=f"instances of the model (default: {DEFAULT_INSTANCES})",
    )
    model.add_argument(
        "--total-kv-blocks",
        type=int,
        default=None,
        help="KV cache blocks of each instance, its prefix cache too (default: the profile's)",
    )
    model.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="sequences an instance batches at most (default: the profile's)",
    )
    model.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="tokens per step, for chunked prefill (default: the profile's; none: no chunking)",
    )
    model.add_argument(
        "--block-size-in-tokens",
        type=int,
        default=None,
        help="tokens per KV block (default: the profile's)",
    )
    model.add_argument(
        "--no-enable-prefix-caching",
        action="store_true",
        help="instances keep no prefix cache",
    )
    load = parser.add_argument_group("the workload")
    load.add_argument(
        "--rate",
        type=float,
        default=None,
        help=f"requests per second in all (Poisson arrivals) (default: {DEFAULT_RATE:g})",
    )
    load.add_argument("--num-requests", type=int, default=100, help="requests in the run")
    load.add_argument(
        "--input-tokens",
        default="512",
        help="prompt tokens of each request (after the shared prefix): a number, or "
        "uniform:LOW,HIGH, normal:MEAN,STDEV, exponential:MEAN",
    )
    load.add_argument(
        "--output-tokens", default="512", help="tokens each request generates, as --input-tokens"
    )
    load.add_argument(
        "--prefix-tokens",
        type=int,
        default=0,
        help="tokens of shared prefix before each prompt (a system prompt, a document)",
    )
    load.add_argument(
        "--prefix-groups",
        type=int,
        default=None,
        help="how many different shared prefixes; each request draws one (default: 1)",
    )
    load.add_argument(
        "--tenants",
        default=None,
        help="tenants and their shares of the traffic, name:share,... (default: one tenant)",
    )
    load.add_argument("--seed", type=int, default=42, help="seed of the workload and routing")
    route = parser.add_argument_group("the router")
    route.add_argument(
        "--routing-policy",
        default=None,
        help="weighted, round-robin or least-loaded " + _setting("routing_policy"),
    )
    route.add_argument(
        "--routing-scorers",
        default=None,
        help="scorers of the weighted policy, name:weight,... " + _setting("routing_scorers"),
    )
    route.add_argument(
        "--scrape-interval",
        type=float,
        default=0.25,
        help="seconds between two readings of the instances' metrics, as the poller's "
        "upstream_poll_interval_s; 0 reads them fresh for every decision",
    )
    admit = parser.add_argument_group("admission")
    admit.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="global_max_in_flight (default: no limit: every request is admitted at once)",
    )
    admit.add_argument(
        "--capacity-providers",
        default=None,
        help="capacity_providers, comma-separated: the limit is the lowest of theirs (e.g. "
        "static,kv-pressure; --max-in-flight is static's) " + _setting("capacity_providers"),
    )
    admit.add_argument(
        "--policy",
        default=None,
        help="overflow_policy when no seat is free " + _setting("overflow_policy"),
    )
    admit.add_argument(
        "--max-queue", type=int, default=None, help="max_queue " + _setting("max_queue")
    )
    admit.add_argument(
        "--queue-timeout",
        type=float,
        default=None,
        help="queue_timeout_s in seconds (default: 3600)",
    )
    admit.add_argument(
        "--tenant-weights",
        default=None,
        help="tenant_weights, name:weight,... " + _setting("tenant_weights"),
    )
    admit.add_argument(
        "--tenant-max-in-flight",
        default=None,
        help="tenant_max_in_flight, name:cap,... or a cap " + _setting("tenant_max_in_flight"),
    )
    admit.add_argument(
        "--max-tokens-in-flight",
        type=int,
        default=None,
        help="global_max_tokens_in_flight: a budget of the token estimates of the requests "
        "running (prompt + max_tokens) " + _setting("global_max_tokens_in_flight"),
    )
    admit.add_argument(
        "--fairness-cost",
        default=None,
        help="fairness_cost: what the fair queue shares, requests or tokens "
        + _setting("fairness_cost"),
    )
    out = parser.add_argument_group("the report")
    out.add_argument(
        "--fitness-weights",
        default=None,
        help='score runs, e.g. "p99_ttft:3,mean_e2e:1,throughput:2": latencies count '
        "1/(1+ms/1000), rates their share of the best run's (default: none, no score)",
    )
    out.add_argument(
        "--sweep",
        default=None,
        help="one run per value: num-instances=4..16, rate=50..300:50 or max-in-flight=8,16,32 "
        "(default: none, one run)",
    )
    out.add_argument(
        "--slo",
        default=None,
        help="objectives, e.g. ttft_p99_ms=500: a sweep names the value that meets them "
        "(default: none)",
    )
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument(
        "--results-path",
        metavar="FILE",
        default=None,
        help="also write one JSON line per request to FILE (a sweep's lines name their "
        "value) (default: none)",
    )
    parser.set_defaults(run=run)


class _Once(argparse._StoreAction):
    """A flag given at most once (argparse keeps the last value of a flag given twice): a
    report must not answer for a value other than the one the user meant."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: set[str] = namespace.__dict__.setdefault("_flags_given", set())
        if self.dest in given:
            raise argparse.ArgumentError(self, "given twice; give it once")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


def _setting(name: str) -> str:
    """``(default: X)``: the setting's own default, which a simulation uses when the flag
    is left out (the ``OBLETH_*`` environment plays no part in a simulation)."""
    return f"(default: {setting_default(name)})"


def run(args: argparse.Namespace) -> int:
    plan = plan_of(args)
    weights = parse_weights(args.fitness_weights) if args.fitness_weights is not None else None
    slo = parse_slo(args.slo) if args.slo is not None else None
    if slo is not None and "fitness" in slo and weights is None:
        raise BadFlag("--slo", args.slo, "fitness is scored only with --fitness-weights", told=True)
    sweep = parse_sweep(args.sweep) if args.sweep is not None else None
    if sweep is not None:
        refuse_swept_flag(args, sweep)
    refuse_flags_without_effect(args, plan, sweep)
    plans = [plan] if sweep is None else [with_value(plan, sweep.flag, v) for v in sweep.values]
    # checked first: a path that cannot be written stops the command before it runs
    if args.results_path is not None:
        check_records_path(args.results_path)
    results = [simulate(p) for p in plans]
    reports = [report(r) for r in results]
    status = 0
    if args.results_path is not None:
        values = [None] if sweep is None else list(sweep.values)
        runs = zip(values, results, strict=True)
        try:
            save_records(args.results_path, sweep.flag if sweep else None, runs)
        except OSError as exc:  # the report still follows: the runs are done
            status = 1
            print(
                f"obleth: --results-path {args.results_path!r}: the records could not be "
                f"written ({exc.strerror or exc}); the report follows",
                file=sys.stderr,
            )
    if weights is not None:
        add_fitness(reports, weights)
    if slo is not None:
        for r in reports:
            r["slo_met"] = meets(r, slo)
    heading = _heading(plan, sweep)
    if sweep is None:
        print(as_json(reports[0]) + "\n" if args.json else run_table(reports[0], heading), end="")
        return status
    found = answer(sweep, reports, slo) if slo is not None else None
    if args.json:
        document: dict[str, object] = {
            "sweep": sweep.flag,
            "values": list(sweep.values),
            "slo": slo,
            "answer": found,
            "runs": reports,
        }
        print(as_json(document))
        return status
    verdict = None
    if slo is not None:
        told = ", ".join(f"{k}={number(v)}" for k, v in slo.items())
        verdict = (
            f"{sweep.answer_end} {sweep.flag} meeting {told}: {number(found)}"
            if found is not None
            else f"no {sweep.flag} in the sweep meets {told}"
        )
    print(sweep_table(sweep.flag, sweep.values, reports, heading, verdict), end="")
    return status


def _heading(plan: Plan, sweep: Sweep | None) -> list[str]:
    """What was simulated, as the settings the gateway ran with (defaults included)."""
    w = plan.workload
    swept = sweep.flag if sweep is not None else None
    instances = "swept" if swept == "num-instances" else str(plan.num_instances)
    rate = "swept" if swept == "rate" else number(w.rate)
    prefix = (
        f", shared prefix {w.prefix_tokens} in {w.prefix_groups} group(s)"
        if w.prefix_tokens
        else ""
    )
    settings = settings_for(plan)
    routing: str = settings.routing_policy
    if routing == "weighted":
        routing += " " + ",".join(f"{k}:{number(v)}" for k, v in settings.routing_scorers.items())
    lines = [
        f"{plan.profile.model}: instances {instances}, {w.num_requests} requests at {rate} "
        f"req/s, seed {plan.seed}",
        f"tokens: input {w.input_tokens}, output {w.output_tokens}{prefix}",
        f"routing: {routing}; readings every {number(plan.scrape_interval_s)} s",
    ]
    if swept == "max-in-flight" or {
        "global_max_in_flight",
        "capacity_providers",
        "global_max_tokens_in_flight",
    } & set(plan.gateway):
        limit = "swept" if swept == "max-in-flight" else settings.global_max_in_flight
        lines.append(
            f"admission: max in flight {limit} ({','.join(settings.capacity_providers)}), "
            f"policy {settings.overflow_policy}, "
            f"max queue {settings.max_queue}, queue timeout {number(settings.queue_timeout_s)} s"
            + (
                ""
                if settings.global_max_tokens_in_flight is None
                else f", max tokens in flight {settings.global_max_tokens_in_flight}"
            )
        )
    if settings.fairness_cost != "requests":
        lines.append(f"fairness: by {settings.fairness_cost}")
    return lines
