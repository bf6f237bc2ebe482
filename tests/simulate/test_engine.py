"""``obleth simulate`` in process: the figures a capacity planner reads off a run (fleet size,
saturation, routing, stale readings, admission) and the engine behind them."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.simulate import profiles
from gateway.simulate.profiles import Profile
from gateway.simulate.report import Report, report
from gateway.simulate.run import START, Outcome, Plan, RunResult, simulate
from gateway.simulate.workload import Workload, parse_shares, parse_tokens

#: The tutorial's model: about 17 responses/s per saturated instance at 512/512 tokens.
QWEN = "qwen/qwen3-14b"

#: The prefix-heavy workload: 64 long shared prefixes (system prompts, documents), each
#: followed by a short prompt of its own.
PREFIX_HEAVY: dict[str, Any] = {
    "prefix_tokens": 2048,
    "prefix_groups": 64,
    "input_tokens": "256",
    "output_tokens": "256",
}

#: A bursty workload where token counts vary widely, so instances' loads drift apart and a
#: router that reads their KV usage has something to tell apart.
BURSTY: dict[str, Any] = {
    "num_instances": 4,
    "rate": 150,
    "num_requests": 1000,
    "input_tokens": "exponential:512",
    "output_tokens": "exponential:512",
}


def plan(
    *,
    rate: float,
    num_requests: int,
    num_instances: int = 1,
    input_tokens: str = "512",
    output_tokens: str = "512",
    prefix_tokens: int = 0,
    prefix_groups: int = 1,
    tenants: str | None = None,
    seed: int = 42,
    scrape_interval_s: float = 0.25,
    profile: Profile | None = None,
    **gateway: Any,
) -> Plan:
    """A run as ``obleth simulate``'s flags describe it, with its defaults; ``gateway``
    takes settings by name (``routing_policy``, ``global_max_in_flight``, ...)."""
    return Plan(
        profile=profile if profile is not None else profiles.named(QWEN),
        workload=Workload(
            rate=rate,
            num_requests=num_requests,
            input_tokens=parse_tokens("--input-tokens", input_tokens),
            output_tokens=parse_tokens("--output-tokens", output_tokens),
            prefix_tokens=prefix_tokens,
            prefix_groups=prefix_groups,
            tenants=parse_shares("--tenants", tenants) if tenants else None,
        ),
        num_instances=num_instances,
        seed=seed,
        scrape_interval_s=scrape_interval_s,
        gateway=gateway,
    )


def figures(**kwargs: Any) -> Report:
    """The report of one run of ``plan(**kwargs)``."""
    return report(simulate(plan(**kwargs)))


def most_running_at_once(outcomes: Iterable[Outcome]) -> int:
    """The most requests between their hand-off to an instance and their end at any
    instant; a request that ends at the instant another is handed off does not overlap it."""
    events: list[tuple[float, int]] = []
    for outcome in outcomes:
        if outcome.sequence is not None:
            assert outcome.handed_s is not None
            assert outcome.sequence.finished_at is not None
            events.append((outcome.handed_s, +1))
            events.append((outcome.sequence.finished_at - START, -1))
    running = most = 0
    for _, change in sorted(events):  # at a tie, -1 sorts first: the end frees the seat
        running += change
        most = max(most, running)
    return most


def within(a: float, b: float, share: float) -> bool:
    """``a`` and ``b`` differ by at most ``share`` of the larger."""
    return abs(a - b) <= share * max(abs(a), abs(b))


# -- fleet size: the tutorial's shape ---------------------------------------------------------


@pytest.fixture(scope="module")
def fleet() -> dict[int, Report]:
    """The tutorial's workload (qwen3-14b, 512/512 tokens, 200 req/s, 1000 requests) on 4, 8
    and 12 instances, routed by the default policy."""
    return {n: figures(num_instances=n, rate=200, num_requests=1000) for n in (4, 8, 12)}


@pytest.fixture(scope="module")
def baseline() -> Report:
    """One instance under a trickle of load: the best latency the model gives."""
    return figures(rate=2, num_requests=50)


def test_four_instances_are_overloaded_at_200_requests_per_second(fleet: dict[int, Report]) -> None:
    """Too few instances show as queueing: seconds to the first token, and preemptions or
    requests waiting seconds inside the instances."""
    four = fleet[4]
    assert four["completed"] == 1000
    assert four["ttft_p99_ms"] > 1000
    assert four["preemption_count"] > 0 or four["scheduling_delay_p99_ms"] > 1000


def test_eight_instances_meet_a_500_ms_ttft_objective(fleet: dict[int, Report]) -> None:
    """Doubling the fleet brings the 99th percentile of time to first token under 500 ms."""
    assert fleet[8]["completed"] == 1000
    assert fleet[8]["ttft_p99_ms"] < 500


def test_twelve_instances_come_close_to_the_low_load_baseline(
    fleet: dict[int, Report], baseline: Report
) -> None:
    """Past the knee, more instances buy little: 12 instances answer about as fast as one
    instance with almost no load (its median, and a tail no longer than its)."""
    assert within(fleet[12]["ttft_p50_ms"], baseline["ttft_p50_ms"], 0.10)
    assert fleet[12]["ttft_p99_ms"] <= 1.25 * baseline["ttft_p99_ms"]


def test_more_instances_never_make_the_tail_worse(fleet: dict[int, Report]) -> None:
    """The time to first token falls as the fleet grows, for the same workload."""
    assert fleet[4]["ttft_p99_ms"] > fleet[8]["ttft_p99_ms"] > fleet[12]["ttft_p99_ms"]
    assert fleet[4]["e2e_mean_ms"] > fleet[8]["e2e_mean_ms"] > fleet[12]["e2e_mean_ms"]


def test_a_saturated_instance_serves_its_calibrated_throughput() -> None:
    """One qwen3-14b instance, flooded, serves about 17 responses per second (the profile's
    calibration): the number a planner divides the target rate by."""
    saturated = figures(rate=500, num_requests=2000)
    assert saturated["completed"] == 2000
    assert 15 <= saturated["responses_per_sec"] <= 20


# -- routing ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uniform(fleet: dict[int, Report]) -> dict[str, Report]:
    """The tutorial's 8-instance run under each routing policy."""
    by_policy = {
        policy: figures(num_instances=8, rate=200, num_requests=1000, routing_policy=policy)
        for policy in ("round-robin", "least-loaded")
    }
    by_policy["weighted"] = fleet[8]  # the default policy
    return by_policy


@pytest.mark.parametrize("figure", ["ttft_p50_ms", "e2e_mean_ms", "responses_per_sec"])
def test_routing_policies_agree_on_uniform_load(uniform: dict[str, Report], figure: str) -> None:
    """When every request looks alike, the choice of policy hardly matters: round-robin,
    least-loaded and weighted land within 5 % of each other."""
    values = [uniform[policy][figure] for policy in ("round-robin", "least-loaded", "weighted")]
    assert within(min(values), max(values), 0.05), values


@pytest.fixture(scope="module")
def prefix_heavy() -> dict[str, Report]:
    """Prefix-heavy traffic on 8 instances, spread round-robin and by prefix affinity."""
    common = {"num_instances": 8, "rate": 200, "num_requests": 1000, **PREFIX_HEAVY}
    return {
        "round-robin": figures(**common, routing_policy="round-robin"),
        "affinity": figures(
            **common, routing_policy="weighted", routing_scorers="prefix-affinity:5,queue-depth:1"
        ),
    }


def test_prefix_affinity_finds_more_cached_prefixes_than_round_robin(
    prefix_heavy: dict[str, Report],
) -> None:
    """Sending requests that share a prefix to the instance that holds it raises the prefix
    cache's hit rate."""
    assert (
        prefix_heavy["affinity"]["prefix_cache_hit_rate"]
        > prefix_heavy["round-robin"]["prefix_cache_hit_rate"]
    )


def test_prefix_affinity_gives_a_shorter_ttft_tail_than_round_robin(
    prefix_heavy: dict[str, Report],
) -> None:
    """Cached prefixes are prefill not computed: the time to first token's tail shrinks."""
    assert prefix_heavy["affinity"]["ttft_p99_ms"] < prefix_heavy["round-robin"]["ttft_p99_ms"]


# -- stale readings --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def by_scrape_interval() -> dict[float, Report]:
    """The bursty workload routed on KV usage alone, read fresh at every decision and every
    2 s, as a slow poller would."""
    return {
        interval: figures(
            **BURSTY,
            routing_policy="weighted",
            routing_scorers="kv-utilization:1",
            scrape_interval_s=interval,
        )
        for interval in (0.0, 2.0)
    }


def test_stale_readings_spread_load_worse_than_fresh_ones(
    by_scrape_interval: dict[float, Report],
) -> None:
    """Between two scrapes the router keeps sending to whichever instance looked emptiest at
    the last one: readings 2 s old leave the load less even than fresh ones."""
    assert by_scrape_interval[2.0]["load_imbalance"] > by_scrape_interval[0.0]["load_imbalance"]
    assert (
        by_scrape_interval[2.0]["instance_requests"] != by_scrape_interval[0.0]["instance_requests"]
    )


def test_stale_readings_lengthen_the_ttft_tail(by_scrape_interval: dict[float, Report]) -> None:
    """The herding that old readings cause shows as a longer time to first token: a planner
    who assumed fresh readings would size the fleet too small."""
    assert by_scrape_interval[2.0]["ttft_p99_ms"] > 2 * by_scrape_interval[0.0]["ttft_p99_ms"]


def test_the_scrape_interval_changes_least_loaded_routing() -> None:
    """Least-loaded ranks instances by their scraped queues plus the gateway's own counts,
    so how old the scrapes are changes where requests go (if only a little here: the
    gateway's own counts are current)."""
    fresh, stale = (
        figures(**BURSTY, routing_policy="least-loaded", scrape_interval_s=interval)
        for interval in (0.0, 2.0)
    )
    assert fresh["instance_requests"] != stale["instance_requests"]
    assert fresh["ttft_mean_ms"] != stale["ttft_mean_ms"]


# -- admission -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rejecting() -> RunResult:
    """Two instances behind a gateway that runs at most 8 requests and refuses the rest."""
    return simulate(
        plan(
            num_instances=2,
            rate=50,
            num_requests=300,
            global_max_in_flight=8,
            overflow_policy="reject",
        )
    )


@pytest.fixture(scope="module")
def two_tenants() -> RunResult:
    """A heavy tenant (a, 3 of every 4 requests) and a light one (b) with equal weights,
    sharing 16 seats in front of two instances."""
    return simulate(
        plan(
            num_instances=2,
            rate=50,
            num_requests=300,
            tenants="a:3,b:1",
            tenant_weights={"a": 1.0, "b": 1.0},
            global_max_in_flight=16,
        )
    )


def test_the_reject_policy_refuses_requests_over_capacity(rejecting: RunResult) -> None:
    """With no seat free and the reject policy, a request is refused as over capacity, and
    every request is either served or refused."""
    figures_ = report(rejecting)
    assert figures_["rejected"] > 0
    assert figures_["rejected_by_reason"] == {"over_capacity": figures_["rejected"]}
    assert figures_["completed"] + figures_["rejected"] == 300
    assert sum(figures_["instance_requests"]) == figures_["completed"]


@pytest.mark.parametrize(("run", "limit"), [("rejecting", 8), ("two_tenants", 16)])
def test_no_more_than_max_in_flight_requests_run_at_once(
    run: str, limit: int, request: pytest.FixtureRequest
) -> None:
    """The gateway's limit holds at every instant, whether it refuses the overflow or
    queues it: the instances never see more than max-in-flight requests of ours."""
    result: RunResult = request.getfixturevalue(run)
    assert most_running_at_once(result.outcomes) == limit


def test_the_fair_queue_serves_the_lighter_tenant_sooner(two_tenants: RunResult) -> None:
    """With equal weights, the tenant that sends a quarter of the traffic is not stuck
    behind the one that sends the rest: its tail to first token is shorter."""
    tenants = report(two_tenants)["tenants"]
    assert isinstance(tenants, Mapping)
    assert set(tenants) == {"a", "b"}
    assert tenants["a"]["requests"] + tenants["b"]["requests"] == 300
    assert tenants["a"]["requests"] > tenants["b"]["requests"]
    assert tenants["a"]["completed"] == tenants["a"]["requests"]
    assert tenants["b"]["completed"] == tenants["b"]["requests"]
    assert tenants["b"]["ttft_p99_ms"] < tenants["a"]["ttft_p99_ms"]


# -- the engine ------------------------------------------------------------------------------


def test_every_request_generates_exactly_its_output_tokens() -> None:
    """A request that fits in the KV cache ends after exactly the tokens it asked for, so
    tokens_per_sec counts what clients would receive."""
    result = simulate(
        plan(
            num_instances=2,
            rate=40,
            num_requests=200,
            input_tokens="uniform:16,1024",
            output_tokens="uniform:1,800",
        )
    )
    done = [o for o in result.outcomes if o.sequence is not None]
    assert len(done) == 200
    assert all(o.sequence.generated == o.request.output_tokens for o in done)
    assert len({o.request.output_tokens for o in done}) > 100  # the counts really vary


def write_profile(path: Path, model: str, **engine: Any) -> Profile:
    """A profile file of one's own, read back as ``--profile FILE`` reads it."""
    path.write_text(json.dumps({"model": model, "about": "a test's", "engine": engine}))
    return profiles.from_file(str(path))


def test_generation_stops_when_the_kv_cache_is_full(tmp_path: Path) -> None:
    """A request asking for more tokens than its instance's KV cache holds after its prompt
    stops there, as a server's context length stops it."""
    tiny = write_profile(tmp_path / "tiny.json", "tiny", kv_cache_blocks=40, block_size_tokens=16)
    result = simulate(
        plan(rate=1, num_requests=3, input_tokens="100", output_tokens="1000", profile=tiny)
    )
    assert [o.sequence.generated for o in result.outcomes if o.sequence] == [40 * 16 - 100 + 1] * 3


def test_a_profile_of_ones_own_changes_the_results(tmp_path: Path) -> None:
    """A profile file with a slower step (an older accelerator, say) lengthens every
    request: the simulation runs the profile it is given."""
    engine = json.loads(
        (Path(profiles.__file__).parent / "profiles" / "qwen3-14b-h100.json").read_text()
    )["engine"]
    same = write_profile(tmp_path / "same.json", "mine", **engine)
    slower = write_profile(tmp_path / "slow.json", "mine", **{**engine, "step_s": 0.014})
    load = {"num_instances": 2, "rate": 10, "num_requests": 100}
    builtin = figures(**load)
    assert figures(**load, profile=same)["e2e_mean_ms"] == builtin["e2e_mean_ms"]
    slow = figures(**load, profile=slower)
    assert slow["e2e_mean_ms"] > 1.5 * builtin["e2e_mean_ms"]
    assert slow["ttft_p50_ms"] > builtin["ttft_p50_ms"]


def test_a_prompt_larger_than_the_kv_cache_is_refused_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    """An instance refuses a prompt its whole KV cache cannot hold, as vLLM refuses one
    over its context length; the other requests are served, and the refusal is counted."""
    tiny = write_profile(tmp_path / "tiny.json", "tiny", kv_cache_blocks=40, block_size_tokens=16)
    figures_ = figures(
        rate=5, num_requests=40, input_tokens="uniform:100,1000", output_tokens="8", profile=tiny
    )
    refused = figures_["rejected_by_reason"]
    assert isinstance(refused, Mapping)
    assert set(refused) == {"prompt_too_long"}
    assert 0 < refused["prompt_too_long"] < 40
    assert figures_["completed"] + figures_["rejected"] == 40


def test_more_kv_cache_ends_the_preemptions_of_an_overloaded_fleet() -> None:
    """The tutorial's memory bottleneck and its remedy (``--total-kv-blocks``): four
    instances at 200 req/s preempt with the profile's cache and not with four times it,
    and their tail to first token falls under the 500 ms objective; a sweep names the
    smallest cache that meets it."""
    from gateway.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            [
                "simulate",
                *("--num-instances", "4", "--rate", "200", "--num-requests", "1000"),
                *("--sweep", "total-kv-blocks=8192,32768", "--slo", "ttft_p99_ms=500", "--json"),
            ]
        )
    assert code == 0
    sweep = json.loads(out.getvalue())
    small, large = sweep["runs"]
    assert small["preemption_count"] > 0
    assert small["ttft_p99_ms"] > 1000
    assert large["preemption_count"] == 0
    assert large["ttft_p99_ms"] < 500
    assert sweep["answer"] == 32768


def test_no_prefix_caching_turns_the_hits_off() -> None:
    """``--no-enable-prefix-caching``: shared prefixes are computed every time."""
    from gateway.cli.simulate import plan_of, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["simulate", "--num-requests=50", "--prefix-tokens=512", "--no-enable-prefix-caching"]
    )
    off = report(simulate(plan_of(args)))
    on = report(
        simulate(
            plan_of(parser.parse_args(["simulate", "--num-requests=50", "--prefix-tokens=512"]))
        )
    )
    assert off["prefix_cache_hit_rate"] == 0.0
    assert on["prefix_cache_hit_rate"] > 0.4


def test_a_token_budget_the_size_of_the_kv_cache_ends_the_preemptions() -> None:
    """``--max-tokens-in-flight``: requests of very different lengths, an instance in
    overload. A limit in requests cannot tell a 5 000-token request from a 50-token one;
    a budget of the cache's tokens (8192 blocks of 16) admits by what each may grow to,
    and nothing is sent back to be recomputed."""
    from gateway.cli import main

    def run(*extra: str) -> dict[str, Any]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(
                [
                    "simulate",
                    *("--rate", "20", "--num-requests", "400", "--json"),
                    *("--input-tokens", "exponential:1000", "--output-tokens", "exponential:400"),
                    *extra,
                ]
            )
        assert code == 0
        result: dict[str, Any] = json.loads(out.getvalue())
        return result

    unbounded, budgeted = run(), run("--max-tokens-in-flight", str(8192 * 16))
    assert unbounded["preemption_count"] > 0
    assert budgeted["preemption_count"] == 0
    assert budgeted["completed"] == unbounded["completed"] == 400


def test_a_simulated_stream_tells_its_longest_gap_only_when_it_grows() -> None:
    """As ``ResponseTimer`` in a server: steps that lengthen a little as the sequence
    grows tell its first gap only, not one per token."""
    from gateway.sim.tokens import tokenize
    from gateway.simulate.clock import run_virtual
    from gateway.simulate.instance import Instance

    config = profiles.named(QWEN).config
    told: list[tuple[int, float, float]] = []

    def longer_gap(sequence: Any) -> None:
        told.append((sequence.seq_id, sequence.longest_gap_s, sequence.last_token_at))

    async def scenario() -> None:
        instance = Instance("http://sim-0", config, longer_gap=longer_gap)
        prompt = tokenize("x" * 400, chars_per_token=4, block_size_tokens=16)
        await instance.submit(prompt, 40)

    run_virtual(scenario())  # on the simulator's own clock: no step waits on a busy machine
    assert len(told) == 1  # 39 gaps of one decode step each: told at the second token only
    assert told[0][1] > 0
