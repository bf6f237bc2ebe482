"""Which value a sweep answers: the runs it may count as meeting the objective, and the
end of the swept range it picks for each flag."""

from __future__ import annotations

import json
import random
from pathlib import Path

from gateway.simulate.workload import MAX_TOKENS, parse_tokens
from tests.simulate.test_cli import simulate_in_process, table_rows

#: 20 requests of 512 prompt and 512 output tokens, one at a time: 40 blocks of 16 tokens
#: hold 640 tokens, so each output is cut to 129 tokens; 8192 blocks hold them whole
SMALL_CACHE = ("--num-requests=20", "--rate=0.2")


def test_a_run_that_cut_outputs_short_meets_no_objective() -> None:
    """Outputs cut to fit a small KV cache finish sooner: the 40-block run's end-to-end
    latency is under the objective, which the whole outputs of 8192 blocks miss. Counted
    as met, it made the sweep answer a cache that cannot hold one request."""
    table = simulate_in_process(
        *SMALL_CACHE, "--sweep=total-kv-blocks=40,8192", "--slo=e2e_p99_ms=2000"
    )
    lines = table.splitlines()
    assert lines[-1] == "no total-kv-blocks in the sweep meets e2e_p99_ms=2000"
    assert (
        "total-kv-blocks=40: 20 outputs cut short (prompt and output over an instance's KV "
        "cache); that run meets no objective"
    ) in lines
    small = json.loads(simulate_in_process(*SMALL_CACHE, "--total-kv-blocks=40", "--json"))
    whole = json.loads(simulate_in_process(*SMALL_CACHE, "--total-kv-blocks=8192", "--json"))
    assert (small["outputs_cut"], whole["outputs_cut"]) == (20, 0)
    assert small["e2e_p99_ms"] < 2000 < whole["e2e_p99_ms"]
    shown = table_rows(simulate_in_process(*SMALL_CACHE, "--total-kv-blocks=40"))
    assert shown["outputs_cut"].startswith("20 (")
    assert "outputs_cut" not in table_rows(simulate_in_process(*SMALL_CACHE))


def test_a_limit_sweep_answers_the_highest_limit_that_meets_the_objective() -> None:
    """A limit costs nothing: of the limits that meet the objective, the highest admits
    the most. The sweep used to answer the lowest."""
    document = json.loads(
        simulate_in_process(
            "--num-instances=2",
            "--rate=40",
            "--num-requests=200",
            "--sweep=max-in-flight=8,16,32",
            "--slo=rejected=0",
            "--json",
        )
    )
    met = [v for v, run in zip(document["values"], document["runs"], strict=True) if run["slo_met"]]
    assert len(met) >= 2
    assert document["answer"] == max(met) == 32


def test_values_are_printed_with_every_digit_they_were_given() -> None:
    """Six significant digits printed 1048576 and 1048577 both as 1.04858e+06, in the rows
    and in the answer, which then could not be pasted back into a command."""
    table = simulate_in_process(
        "--num-requests=5",
        "--rate=10.1234567",
        "--sweep=total-kv-blocks=1048576,1048577",
        "--slo=rejected=0",
    )
    lines = table.splitlines()
    assert "10.1234567 req/s" in table
    assert [line.split()[0] for line in lines[-4:-2]] == ["1048576", "1048577"]
    assert lines[-1] == "smallest total-kv-blocks meeting rejected=0: 1048576"


def test_a_kv_size_reads_alike_as_a_flag_and_as_a_swept_value(tmp_path: Path) -> None:
    """``--total-kv-blocks`` turned on the prefix cache a profile had off, so the same
    size gave another hit rate (and TTFT) as a flag than as a value of a sweep."""
    profile = tmp_path / "uncached.json"
    profile.write_text(json.dumps({"model": "mine", "engine": {"prefix_cache_blocks": 0}}))
    workload = (
        f"--profile={profile}",
        "--prefix-tokens=1024",
        "--prefix-groups=2",
        "--num-requests=40",
        "--rate=20",
        "--json",
    )
    flagged = json.loads(simulate_in_process(*workload, "--total-kv-blocks=8192"))
    swept = json.loads(simulate_in_process(*workload, "--sweep=total-kv-blocks=8192"))
    assert swept["runs"][0]["prefix_cache_hit_rate"] == 0.0
    assert flagged["prefix_cache_hit_rate"] == 0.0
    assert flagged["ttft_p50_ms"] == swept["runs"][0]["ttft_p50_ms"]


def test_a_drawn_count_stays_within_the_bound_of_a_fixed_one() -> None:
    """``exponential:1e7`` drew prompts of 11 million tokens, past the 10 million a fixed
    count may be; the tail is cut at the bound."""
    drawn = parse_tokens("--input-tokens", "exponential:1e7")
    rng = random.Random(42)
    counts = [drawn.draw(rng) for _ in range(200)]
    assert max(counts) == MAX_TOKENS
    assert min(counts) >= 1
