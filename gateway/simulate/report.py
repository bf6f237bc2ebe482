"""The report of a run: the figures a capacity planner reads, as a dict, a table or JSON.

Latencies are from the request's arrival at the gateway, so a wait in the gateway's queue
counts in them as a client feels it. Percentiles interpolate linearly between the two
nearest ranks (numpy's default).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import stat
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TextIO

from gateway.simulate.errors import BadFlag
from gateway.simulate.run import Outcome, RunResult

#: What ``--fitness-weights`` may weigh: a latency is scored 1 / (1 + ms / 1000), a rate
#: by its share of the best rate among the runs compared (1 for a single run).
FITNESS_METRICS = {
    "p99_ttft": "ttft_p99_ms",
    "p50_ttft": "ttft_p50_ms",
    "mean_ttft": "ttft_mean_ms",
    "p99_e2e": "e2e_p99_ms",
    "p50_e2e": "e2e_p50_ms",
    "mean_e2e": "e2e_mean_ms",
    "throughput": "responses_per_sec",
    "tokens_per_sec": "tokens_per_sec",
}

Report = dict[str, object]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, already sorted; NaN for none."""
    if not values:
        return math.nan
    rank = (len(values) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)


def report(result: RunResult) -> Report:
    """The figures of one run, in a fixed order (the JSON keys and the table rows)."""
    plan = result.plan
    done = [o for o in result.outcomes if o.sequence is not None]
    ttft = sorted(_ms(o, "first_token_at") for o in done)
    e2e = sorted(_ms(o, "finished_at") for o in done)
    delay = sorted(_scheduling_delay_ms(o) for o in done)
    gateway_wait = sorted(
        1000 * (o.handed_at - o.arrived_at) for o in done if o.handed_at is not None
    )
    tokens = sum(o.sequence.generated for o in done if o.sequence is not None)
    span = result.end_s if result.end_s > 0 else math.nan
    rejected = Counter(o.rejected for o in result.outcomes if o.rejected is not None)
    counts = result.instance_requests
    mean_count = sum(counts) / len(counts)
    out: Report = {
        "model": plan.profile.model,
        "num_instances": plan.num_instances,
        "rate": plan.workload.rate,
        "num_requests": plan.workload.num_requests,
        "seed": plan.seed,
        "completed": len(done),
        # outputs shorter than asked: prompt and output did not fit an instance's KV
        # cache, which caps the output as a server's context length does
        "outputs_cut": sum(
            1
            for o in done
            if o.sequence is not None and o.sequence.max_tokens < o.request.output_tokens
        ),
        "rejected": sum(rejected.values()),
        "rejected_by_reason": dict(sorted(rejected.items())),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "ttft_mean_ms": _mean(ttft),
        "e2e_mean_ms": _mean(e2e),
        "e2e_p50_ms": percentile(e2e, 50),
        "e2e_p99_ms": percentile(e2e, 99),
        "responses_per_sec": len(done) / span,
        "tokens_per_sec": tokens / span,
        "preemption_count": result.preemptions,
        "scheduling_delay_p99_ms": percentile(delay, 99),
        # like every figure below, NaN (null, and an objective not met) when nothing
        # reached an instance: there is nothing to measure
        "gateway_wait_p99_ms": percentile(gateway_wait, 99),
        "prefix_cache_hit_rate": (
            result.prefix_hit_tokens / result.prefix_query_tokens
            if result.prefix_query_tokens
            else math.nan
        ),
        "instance_requests": list(counts),
        "load_imbalance": max(counts) / mean_count if mean_count else math.nan,
        "duration_s": result.end_s,
    }
    tenants = sorted({o.request.tenant for o in result.outcomes})
    if len(tenants) > 1:
        out["tenants"] = {t: _tenant(result.outcomes, t) for t in tenants}
    return out


def records(result: RunResult) -> list[dict[str, object]]:
    """One record per request, in arrival order: what a planner plots or filters when
    percentiles are not enough. Times in milliseconds from its arrival at the gateway;
    absent for what did not happen (a refused request has no first token)."""
    out = []
    for outcome in result.outcomes:
        request = outcome.request
        record: dict[str, object] = {
            "index": request.index,
            "arrival_s": request.arrival_s,
            "tenant": request.tenant,
            "prompt_tokens": request.prompt_tokens,
            "output_tokens": request.output_tokens,
        }
        if request.group is not None:
            record["prefix_group"] = request.group
        if outcome.rejected is not None:
            record["rejected"] = outcome.rejected
        if outcome.handed_at is not None:
            record["gateway_wait_ms"] = 1000 * (outcome.handed_at - outcome.arrived_at)
            record["instance"] = outcome.instance
        sequence = outcome.sequence
        if sequence is not None:
            record["scheduling_delay_ms"] = _scheduling_delay_ms(outcome)
            record["ttft_ms"] = _ms(outcome, "first_token_at")
            record["e2e_ms"] = _ms(outcome, "finished_at")
            record["generated_tokens"] = sequence.generated
            record["cached_prompt_tokens"] = sequence.cached_prompt_tokens
            record["preemptions"] = sequence.preemptions
        out.append(record)
    return out


def check_records_path(path: str) -> None:
    """`BadFlag` when ``path`` (``--results-path``) cannot be written; else nothing changes:
    an existing file keeps its content until `write_records` has records for it (a run
    that stops on a bad flag must not empty it), and a missing one is not left behind
    (nor the missing target of a link)."""
    existed = os.path.exists(path)  # through a link, as open() goes
    mode = os.stat(path).st_mode if existed else 0
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        # a pipe or a device: opening it to try would be a read's end of file (a FIFO's
        # reader takes the close for the end and leaves) or would wait for a reader
        if not os.access(path, os.W_OK):
            raise BadFlag("--results-path", path, "a writable file (permission denied)")
        return
    try:
        open(path, "a", encoding="utf-8").close()
    except OSError as exc:
        raise BadFlag("--results-path", path, f"a writable file ({exc.strerror})") from None
    if not existed:
        os.remove(os.path.realpath(path))


def save_records(
    path: str, flag: str | None, runs: Iterable[tuple[float | None, RunResult]]
) -> None:
    """`write_records` into the file at ``path``, whole or not at all: a regular file (or a
    new one) is written beside it and then moved into place, with the old file's mode, so
    that a failure (a full disk) leaves what was there before. Anything else is written
    through ``open()``: a pipe, and a symbolic link, whose target gets the records while
    the link stays (``/dev/stdout`` is one: to a pipe or to the file the shell opened for
    the report). Raises ``OSError``."""
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
        with open(path, "w", encoding="utf-8") as sink:
            write_records(sink, flag, runs)
        return
    folder, name = os.path.split(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as sink:
            write_records(sink, flag, runs)
        if os.path.exists(path):
            shutil.copymode(path, temporary)
        else:  # as open() would have made it
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


def write_records(
    out: TextIO, flag: str | None, runs: Iterable[tuple[float | None, RunResult]]
) -> None:
    """Each request's record of each run as a JSON object per line; in a sweep over
    ``flag``, each line starts with the run's value of it."""
    for value, result in runs:
        for record in records(result):
            line = record if flag is None else {flag: value, **record}
            out.write(json.dumps(line, separators=(",", ":")) + "\n")


def parse_weights(text: str) -> dict[str, float]:
    """``--fitness-weights "p99_ttft:3,mean_e2e:1,throughput:2"``; `BadFlag` when a name is
    not one of `FITNESS_METRICS` or a weight is not a number above 0."""
    weights: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.strip().partition(":")
        if name not in FITNESS_METRICS:
            raise BadFlag(
                "--fitness-weights",
                text,
                f"name:weight pairs; names: {', '.join(FITNESS_METRICS)}",
            )
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight) or weight <= 0:
            raise BadFlag("--fitness-weights", text, f"a weight above 0 for {name}")
        if name in weights:
            raise BadFlag(
                "--fitness-weights", text, f"each name once; {name} is given twice", told=True
            )
        weights[name] = weight
    return weights


def add_fitness(reports: Sequence[Report], weights: Mapping[str, float]) -> None:
    """Score each report (``fitness``, higher is better, at most the sum of the weights)
    against the others: rates are shares of the best among ``reports``."""
    best = {
        key: max((_number(r[key]) for r in reports), default=0.0)
        for name, key in FITNESS_METRICS.items()
        if not key.endswith("_ms")
    }
    for r in reports:
        score = 0.0
        for name, weight in weights.items():
            key = FITNESS_METRICS[name]
            value = _number(r[key])
            if key.endswith("_ms"):
                score += weight / (1 + value / 1000) if math.isfinite(value) else 0.0
            else:
                score += weight * (value / best[key] if best[key] > 0 else 0.0)
        r["fitness"] = score


def _tenant(outcomes: Sequence[Outcome], tenant: str) -> dict[str, object]:
    mine = [o for o in outcomes if o.request.tenant == tenant]
    done = [o for o in mine if o.sequence is not None]
    ttft = sorted(_ms(o, "first_token_at") for o in done)
    return {
        "requests": len(mine),
        "completed": len(done),
        "rejected": sum(1 for o in mine if o.rejected is not None),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
    }


def _ms(outcome: Outcome, stamp: str) -> float:
    """Milliseconds from the request's arrival at the gateway to one of its sequence's
    times (both on the virtual clock)."""
    sequence = outcome.sequence
    assert sequence is not None
    at: float = getattr(sequence, stamp)
    return 1000 * (at - outcome.arrived_at)


def _scheduling_delay_ms(outcome: Outcome) -> float:
    """Milliseconds the request waited inside its instance before its first step."""
    sequence = outcome.sequence
    assert sequence is not None
    assert sequence.admitted_at is not None
    return 1000 * (sequence.admitted_at - sequence.arrived_at)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else math.nan
