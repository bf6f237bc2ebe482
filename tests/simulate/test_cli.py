"""The ``obleth simulate`` command: its errors, its repeatability, and the report and sweep
it prints, read as a user reads them."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main

#: The repository root: ``python -m gateway`` must import this checkout even when pytest
#: runs from elsewhere.
REPO = Path(__file__).resolve().parents[2]

#: A run that goes through every part whose order could depend on hashing: varied token
#: counts, shared prefixes, two tenants in a fair queue, several scorers, fitness.
BUSY = (
    "--num-instances=4",
    "--rate=150",
    "--num-requests=400",
    "--input-tokens=exponential:300",
    "--output-tokens=uniform:50,400",
    "--prefix-tokens=256",
    "--prefix-groups=8",
    "--tenants=a:2,b:1",
    "--tenant-weights=a:1,b:2",
    "--max-in-flight=64",
    "--routing-scorers=prefix-affinity:3,queue-depth:1,kv-utilization:1",
    "--fitness-weights=p99_ttft:3,mean_e2e:1,throughput:2",
)

#: The figures a capacity planner reads, each in both the JSON and the table.
FIGURES = (
    "ttft_p50_ms",
    "ttft_p99_ms",
    "e2e_mean_ms",
    "e2e_p99_ms",
    "responses_per_sec",
    "preemption_count",
    "scheduling_delay_p99_ms",
    "prefix_cache_hit_rate",
    "load_imbalance",
    "fitness",
)


def simulate_process(*argv: str, hash_seed: str = "0") -> subprocess.Popen[str]:
    """``obleth simulate ARGV`` started as its own process, with ``PYTHONHASHSEED``."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONHASHSEED": hash_seed}
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "simulate", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finished(process: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    """What ``process`` printed and its status, once it has ended."""
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def obleth_simulate(*argv: str) -> subprocess.CompletedProcess[str]:
    """``obleth simulate ARGV`` as a process, run to its end."""
    return finished(simulate_process(*argv))


def simulate_in_process(*argv: str) -> str:
    """What ``obleth simulate ARGV`` prints, run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["simulate", *argv]) == 0
    return out.getvalue()


def table_rows(table: str) -> dict[str, str]:
    """A run's table as ``{figure: what follows it}``, for the lines of one figure each."""
    rows = {}
    for line in table.splitlines():
        name, _, rest = line.partition(" ")
        if name and rest.startswith(" ") and not name.endswith(":"):
            rows[name] = rest.strip()
    return rows


def shows(printed: str, value: float) -> bool:
    """``printed`` is ``value`` rounded to the decimals it shows."""
    decimals = len(printed.partition(".")[2])
    return abs(float(printed) - value) <= 0.5 * 10**-decimals + 1e-9


# -- bad input -------------------------------------------------------------------------------


def missing_file(tmp_path: Path) -> str:
    return str(tmp_path / "missing.json")


def unknown_engine_key(tmp_path: Path) -> str:
    path = tmp_path / "typo.json"
    path.write_text(json.dumps({"model": "mine", "engine": {"step_z": 0.01}}))
    return str(path)


def nested_too_deep(tmp_path: Path) -> str:
    path = tmp_path / "deep.json"
    path.write_text('{"model": "m", "about": ' + "[" * 30_000 + "]" * 30_000 + ', "engine": {}}')
    return str(path)


def endless_step(tmp_path: Path) -> str:
    """A step of 1e17 s: the virtual clock plus a 0.25 s polling interval stays put."""
    path = tmp_path / "slow.json"
    path.write_text(json.dumps({"model": "mine", "engine": {"step_s": 1e17}}))
    return str(path)


BAD_FLAGS: list[tuple[str, Any, list[str]]] = [
    ("--rate", "0", []),
    ("--num-requests", "0", []),
    ("--num-instances", "0", []),
    ("--max-in-flight", "0", []),
    ("--tenants", "a:0", []),
    ("--input-tokens", "normal:abc", []),
    ("--sweep", "bogus=1..2", ["num-instances", "rate", "max-in-flight"]),
    ("--slo", "nope=1", ["ttft_p99_ms"]),
    ("--fitness-weights", "p99_ttft:-1", ["p99_ttft"]),
    ("--profile", missing_file, ["missing.json"]),
    ("--profile", unknown_engine_key, ["engine.step_z", "step_s"]),
    ("--routing-policy", "bogus", ["round-robin", "least-loaded", "weighted"]),
    ("--policy", "bogus", ["reject", "block"]),
    ("--routing-scorers", "nosuch:1", ["nosuch", "prefix-affinity", "queue-depth"]),
    ("--model", "nosuch", ["qwen/qwen3-14b", "meta-llama/llama-3.1-8b-instruct"]),
    ("--total-kv-blocks", "0", ["1"]),
    ("--total-kv-blocks", "-5", [">= 1"]),  # it used to say >= 0, the prefix cache's bound
    ("--max-num-batched-tokens", "8", ["max_num_seqs"]),
    ("--sweep", "total-kv-blocks=0,8", []),
    ("--results-path", "/nonexistent/dir/requests.jsonl", ["writable"]),
    # sizes built in memory: these used to end in MemoryError, or use gigabytes
    ("--input-tokens", "99999999999", ["from 1 to 10000000"]),
    ("--prefix-tokens", "99999999999", ["at most 10000000"]),
    ("--prefix-groups", "1000000000", ["at most 100000"]),
    # counted before they are built: these used to overflow, or hang building the range
    ("--sweep", "rate=1..inf", ["between 1 and 200 values"]),
    ("--sweep", "num-instances=1..1000000000", ["between 1 and 200 values"]),
    ("--sweep", "rate=1..10:1e-300", ["between 1 and 200 values"]),
    # above 0, and 0 once the sweep's values are rounded: this ended in ZeroDivisionError
    ("--sweep", "rate=1e-10", ["each at least 1e-9"]),
    ("--num-instances", "20000", ["at most 10000"]),
    ("--num-requests", "2000000", ["at most 1000000"]),
    ("--sweep", "num-instances=1,20000", ["at most 10000"]),
    # a device or a huge file by mistake: this used to read until memory ran out
    ("--profile", "/dev/zero", ["at most 64 KiB"]),
    # an empty value is a mistake to tell, not the flag left out
    ("--profile", "", ["the name of a JSON file"]),
    ("--results-path", "", ["writable"]),
    ("--sweep", "", ["NAME=LOW..HIGH"]),
    ("--slo", "", ["figure=bound"]),
    ("--fitness-weights", "", ["name:weight"]),
    # a day of simulated arrivals at most: this used to run for hours, reading idle instances
    ("--rate", "1e-6", ["within a simulated day"]),
    ("--sweep", "rate=1e-6,1", ["within a simulated day"]),
    # shares that overflow their sum used to end in a traceback
    ("--tenants", "a:1e308,b:1e308", ["add up to a finite number"]),
    ("--tenants", "", ["name:share"]),
    ("--tenants", "a\nb:1", ["name:share"]),
    # this used to spin for good
    ("--profile", endless_step, ["step_s", "from 0 to 60"]),
    # under 64 KiB, nested past the JSON parser: this ended in RecursionError
    ("--profile", nested_too_deep, ["nests deeper than Python reads"]),
    # which one was meant? these used to keep the last without a word
    ("--slo", "ttft_p99_ms=1,ttft_p99_ms=100000", ["ttft_p99_ms is given twice"]),
    ("--fitness-weights", "p99_ttft:1,p99_ttft:5", ["p99_ttft is given twice"]),
    # these used to be accepted, and the run went on as if the flag were not given
    ("--slo", "fitness=0.1", ["--fitness-weights"]),
    ("--tenant-weights", "", ["empty"]),
    ("--tenant-max-in-flight", " ", ["empty"]),
    ("--tenant-weights", "gld:4", ["default", "'gld' is none of them"]),
    ("--tenant-max-in-flight", "fre:2,*:4", ["default", "'fre' is none of them"]),
]


@pytest.mark.parametrize(
    ("flag", "value", "told"),
    BAD_FLAGS,
    ids=[f"{flag}={getattr(value, '__name__', value)}" for flag, value, _ in BAD_FLAGS],
)
def test_a_bad_flag_exits_2_with_one_line_naming_it(
    flag: str, value: Any, told: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value the command cannot use stops it before anything runs: status 2, nothing on
    stdout, and one line on stderr that names the flag and what it accepts, not a
    traceback (run in this process, where one would fail the test)."""
    given = value(tmp_path) if callable(value) else value
    few = [] if flag == "--num-requests" else ["--num-requests=5"]
    if flag == "--policy":
        few.append("--max-in-flight=4")  # without a limit, no policy has anything to do
    assert main(["simulate", *few, flag, given]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"obleth: {flag} ")
    assert "expected expected" not in lines[0]
    for word in told:
        assert word in lines[0]


def test_records_that_cannot_be_written_exit_1_with_one_line_and_the_report() -> None:
    """A disk that fills under the records (``/dev/full`` here) is no traceback: one line
    naming ``--results-path`` and why, status 1, and the report of the runs, which are
    done."""
    done = obleth_simulate("--num-requests=5", "--results-path=/dev/full")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("obleth: --results-path '/dev/full': ") and "No space left" in line
    assert "responses_per_sec" in done.stdout


def test_a_bad_flag_leaves_an_existing_results_file_as_it_was(tmp_path: Path) -> None:
    """The results file is written once the runs are done: a command stopped by a bad
    flag found later (an unknown scorer is checked as the gateway is assembled) must not
    empty the file of an earlier run, nor leave a new empty one behind."""
    kept = tmp_path / "kept.jsonl"
    kept.write_text('{"earlier": 1}\n')
    done = obleth_simulate("--num-requests=5", f"--results-path={kept}", "--routing-scorers=x:1")
    assert done.returncode == 2 and "--routing-scorers" in done.stderr
    assert kept.read_text() == '{"earlier": 1}\n'
    fresh = tmp_path / "fresh.jsonl"
    done = obleth_simulate("--num-requests=5", f"--results-path={fresh}", "--policy=nope")
    assert done.returncode == 2 and not fresh.exists()


@pytest.mark.parametrize(
    ("argv", "flag", "told"),
    [
        # the instances would be read 3.4e7 times over a day of arrivals: minutes
        (["--num-instances=100", "--num-requests=2", "--rate=2.32e-5"], "--num-instances", []),
        (["--num-instances=100", "--num-requests=2", "--sweep=rate=2.32e-5,1"], "--sweep",
         ["'rate=2.32e-05'"]),
        # one instance, but read every millisecond: the flag named is the interval
        (["--num-requests=100000", "--rate=2", "--scrape-interval=0.001"], "--scrape-interval",
         []),
        (["--num-instances=10000", "--num-requests=2000", "--scrape-interval=0"],
         "--num-instances", ["--scrape-interval 0"]),
        # 3e8 tokens of prompt text, 1.2 GB built before the run
        (["--num-requests=30", "--input-tokens=10000000"], "--num-requests", ["250,000,000"]),
    ],
    ids=[
        "readings",
        "readings-in-a-sweep",
        "readings-every-millisecond",
        "readings-at-each-request",
        "prompt-text",
    ],
)  # fmt: skip
def test_flags_each_within_bounds_whose_product_is_not_exit_2_before_running(
    argv: list[str], flag: str, told: list[str]
) -> None:
    """Each flag within its own bound, together they would run for minutes to hours or
    fill the memory: refused at once, as a single flag out of bounds is."""
    done = obleth_simulate(*argv)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"obleth: {flag} ")
    for word in told:
        assert word in line


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("--sweep=num-instances=1,2", "--sweep=rate=1,2"),
        ("--rate=3", "--rate=2"),
        ("--slo=ttft_p99_ms=1", "--slo=ttft_p99_ms=100000"),
    ],
    ids=["--sweep", "--rate", "--slo"],
)
def test_a_flag_given_twice_exits_2_naming_it(first: str, second: str) -> None:
    """argparse keeps the last of a flag given twice (a sweep over rates only, the looser
    objective); a report must answer for the value meant, so the command refuses, as it
    does a bad value."""
    done = obleth_simulate("--num-requests=5", first, second)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    name = first.split("=")[0]
    assert done.stderr.splitlines()[-1].endswith(f"argument {name}: given twice; give it once")


def test_figures_with_nothing_to_measure_are_null_and_meet_no_objective() -> None:
    """No request reaches an instance (each prompt is longer than its KV cache): the gateway
    wait, the prefix hit rate and the load imbalance have nothing to measure, so they are
    null like the latencies, and an objective on them is not met; they used to read 0.0,
    0.0 and 1.0, and a sweep could name a setting that served no one."""
    done = obleth_simulate(
        "--num-requests=20", "--total-kv-blocks=1", "--json",
        "--slo=gateway_wait_p99_ms=10,load_imbalance=1.05",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["completed"] == 0
    for figure in ("gateway_wait_p99_ms", "prefix_cache_hit_rate", "load_imbalance"):
        assert report[figure] is None, figure
    assert report["slo_met"] is False
    done = obleth_simulate(
        "--num-requests=20", "--sweep=total-kv-blocks=1,100", "--slo=gateway_wait_p99_ms=10"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(
        "smallest total-kv-blocks meeting gateway_wait_p99_ms=10: 100"
    )


def test_a_results_path_that_is_a_link_writes_its_target(tmp_path: Path) -> None:
    """As ``open()`` and a shell's ``>`` do: the records go to the link's target and the
    link stays a link (it used to be replaced by a file, the target left as it was)."""
    target = tmp_path / "target.jsonl"
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target.name)
    done = obleth_simulate("--num-requests=5", f"--results-path={link}")
    assert done.returncode == 0, done.stderr
    assert link.is_symlink()
    assert [json.loads(line)["index"] for line in target.read_text().splitlines()] == list(range(5))
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to("nowhere.jsonl")
    done = obleth_simulate("--num-requests=5", f"--results-path={dangling}", "--policy=nope")
    assert done.returncode == 2 and not (tmp_path / "nowhere.jsonl").exists()


def test_records_go_to_stdout_through_a_pipe() -> None:
    """``--results-path /dev/stdout`` with stdout a pipe (``| jq``): the records, then the
    report. (Resolving the link to its target named a pipe no path reaches.)"""
    done = obleth_simulate("--num-requests=3", "--results-path=/dev/stdout")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [json.loads(line)["index"] for line in lines[:3]] == [0, 1, 2]
    assert any(line.startswith("completed") for line in lines[3:])


@pytest.mark.parametrize("flag", ["--rate", "--num-instances", "--scrape-interval"])
def test_a_value_of_the_wrong_type_exits_2_naming_the_flag(flag: str) -> None:
    """argparse's own check of a number also exits with status 2 and names the flag."""
    done = obleth_simulate(flag, "abc")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert f"argument {flag}: invalid" in done.stderr.splitlines()[-1]


#: A flag and a sweep that sets it for each run; the flag's value is its default for
#: --num-instances (given, it is still the user's word the sweep would overrule).
SWEPT_AND_GIVEN = [
    ("--num-instances", "1", "num-instances=2,3"),
    ("--rate", "5", "rate=1,2"),
    ("--max-in-flight", "8", "max-in-flight=4,8"),
    ("--total-kv-blocks", "9000", "total-kv-blocks=8192,32768"),
    ("--max-num-seqs", "8", "max-num-seqs=4,8"),
]


@pytest.mark.parametrize(
    ("flag", "value", "sweep"), SWEPT_AND_GIVEN, ids=[s[0] for s in SWEPT_AND_GIVEN]
)
def test_a_flag_the_sweep_sets_is_refused_naming_both(
    flag: str, value: str, sweep: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--num-instances 1 --sweep num-instances=2,3`` would never run the one instance
    asked for: like any bad flag, status 2 and one line naming both flags, before any run."""
    assert main(["simulate", "--num-requests=5", flag, value, f"--sweep={sweep}"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(f"obleth: {flag} ")
    assert line.endswith(f"--sweep {sweep} sets {flag} for each run; give one or the other")


# -- determinism -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def printed() -> dict[str, subprocess.CompletedProcess[str]]:
    """The busy run as a table and as JSON, each from two processes with different hash
    seeds, and the JSON with another workload seed; all started at once."""
    started = {
        "table 1": simulate_process(*BUSY, hash_seed="1"),
        "table 2": simulate_process(*BUSY, hash_seed="2"),
        "json 1": simulate_process(*BUSY, "--json", hash_seed="1"),
        "json 2": simulate_process(*BUSY, "--json", hash_seed="2"),
        "json seed 7": simulate_process(*BUSY, "--json", "--seed=7", hash_seed="1"),
    }
    done = {name: finished(process) for name, process in started.items()}
    for name, process in done.items():
        assert process.returncode == 0, f"{name}: {process.stderr}"
    return done


@pytest.mark.parametrize("form", ["table", "json"])
def test_the_same_flags_and_seed_print_the_same_bytes(
    printed: dict[str, subprocess.CompletedProcess[str]], form: str
) -> None:
    """Two runs of the same command print identical output, even in processes that hash
    strings differently: a result can be reproduced and two configurations compared."""
    assert printed[f"{form} 1"].stdout == printed[f"{form} 2"].stdout
    assert printed[f"{form} 1"].stdout


def test_another_seed_draws_another_workload(
    printed: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    """The seed is what the result depends on: a different one gives different figures."""
    one = json.loads(printed["json 1"].stdout)
    seven = json.loads(printed["json seed 7"].stdout)
    assert seven["seed"] == 7
    assert one["ttft_p99_ms"] != seven["ttft_p99_ms"]
    assert one["e2e_mean_ms"] != seven["e2e_mean_ms"]


# -- the report ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def busy_json(printed: dict[str, subprocess.CompletedProcess[str]]) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(printed["json 1"].stdout)
    return document


def test_the_json_report_has_every_figure(busy_json: dict[str, Any]) -> None:
    """A program reading --json finds each figure as a number, and the per-instance counts
    that add up to the requests completed."""
    for figure in FIGURES:
        assert isinstance(busy_json[figure], int | float), figure
    counts = busy_json["instance_requests"]
    assert len(counts) == 4
    assert sum(counts) == busy_json["completed"] == 400
    assert busy_json["load_imbalance"] == pytest.approx(max(counts) / (sum(counts) / 4))
    assert set(busy_json["tenants"]) == {"a", "b"}


def test_the_table_shows_the_figures_of_the_json(
    printed: dict[str, subprocess.CompletedProcess[str]], busy_json: dict[str, Any]
) -> None:
    """The table a person reads and the JSON a program reads tell the same run."""
    table = printed["table 1"].stdout
    rows = table_rows(table)
    for figure in FIGURES:
        assert shows(rows[figure], busy_json[figure]), (figure, rows[figure], busy_json[figure])
    assert rows["completed"] == "400 of 400"
    assert rows["instance_requests"].split() == [str(c) for c in busy_json["instance_requests"]]
    for tenant, numbers in busy_json["tenants"].items():
        line = next(line for line in table.splitlines() if line.startswith(f"{tenant} "))
        assert shows(line.split()[-1], numbers["ttft_p99_ms"])


def test_fitness_of_one_run_follows_its_documented_normalisation(busy_json: dict[str, Any]) -> None:
    """A latency of weight w scores w / (1 + ms / 1000); throughput scores its share of the
    best run's, the whole weight for a single run."""
    expected = 3 / (1 + busy_json["ttft_p99_ms"] / 1000) + 1 / (1 + busy_json["e2e_mean_ms"] / 1000)
    assert busy_json["fitness"] == pytest.approx(expected + 2)


def test_fitness_in_a_sweep_scores_throughput_against_the_best_run() -> None:
    """In a sweep, a run's throughput scores its share of the fastest run's, so fitness
    ranks the runs against each other."""
    document = json.loads(
        simulate_in_process(
            "--num-requests=100",
            "--sweep=rate=5,20",
            "--fitness-weights=throughput:2,p99_ttft:1",
            "--json",
        )
    )
    runs = document["runs"]
    best = max(r["responses_per_sec"] for r in runs)
    assert runs[0]["responses_per_sec"] < best
    for r in runs:
        expected = 2 * r["responses_per_sec"] / best + 1 / (1 + r["ttft_p99_ms"] / 1000)
        assert r["fitness"] == pytest.approx(expected)


# -- the sweep -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sweep_table() -> tuple[list[dict[str, str]], str]:
    """The tutorial's sweep, 4 to 12 instances against a 500 ms objective: its table's rows,
    by column, and its verdict."""
    table = simulate_in_process(
        "--rate=200",
        "--num-requests=1000",
        "--sweep=num-instances=4..12",
        "--slo=ttft_p99_ms=500",
    )
    lines = table.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["num-instances"])
    names = lines[header].split()
    end = lines.index("", header)
    rows = [dict(zip(names, line.split(), strict=True)) for line in lines[header + 1 : end]]
    return rows, lines[-1]


def test_a_sweep_names_the_fewest_instances_that_meet_the_objective(
    sweep_table: tuple[list[dict[str, str]], str],
) -> None:
    """The verdict names the smallest fleet whose row meets the objective."""
    rows, verdict = sweep_table
    assert [r["num-instances"] for r in rows] == [str(n) for n in range(4, 13)]
    assert "fitness" not in rows[0]  # scored only when --fitness-weights asks
    meeting = [int(r["num-instances"]) for r in rows if r["slo"] == "yes"]
    assert rows[0]["slo"] == "no"  # 4 instances are overloaded
    assert verdict == f"smallest num-instances meeting ttft_p99_ms=500: {min(meeting)}"


def test_each_sweep_row_says_whether_its_own_ttft_meets_the_objective(
    sweep_table: tuple[list[dict[str, str]], str],
) -> None:
    """The slo column agrees with the row's 99th-percentile time to first token."""
    rows, _ = sweep_table
    for row in rows:
        assert row["slo"] == ("yes" if float(row["ttft_p99_ms"]) <= 500 else "no"), row


def test_the_results_file_has_a_record_per_request_that_agrees_with_the_report(
    tmp_path: Path,
) -> None:
    """``--results-path``: one JSON line per request, served or refused, whose times give
    back the report's percentiles; in a sweep, each line names its run's value."""
    path = tmp_path / "requests.jsonl"
    done = obleth_simulate(
        "--num-instances=2", "--rate=40", "--num-requests=200", "--max-in-flight=40",
        "--policy=reject", "--json", f"--results-path={path}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(200))
    served = [line for line in lines if "ttft_ms" in line]
    refused = [line for line in lines if "rejected" in line]
    assert len(served) == figures["completed"]
    assert len(refused) == figures["rejected"] > 0
    ttft = sorted(line["ttft_ms"] for line in served)
    assert ttft[len(ttft) // 2] == pytest.approx(figures["ttft_p50_ms"], rel=0.05)
    assert max(line["e2e_ms"] for line in served) >= figures["e2e_p99_ms"]

    swept = tmp_path / "sweep.jsonl"
    done = obleth_simulate(
        "--num-requests=20", "--sweep=num-instances=1,2", f"--results-path={swept}"
    )
    assert done.returncode == 0, done.stderr
    values = [json.loads(line)["num-instances"] for line in swept.read_text().splitlines()]
    assert values == [1] * 20 + [2] * 20
