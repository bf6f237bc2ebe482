"""The reports as a person reads them (tables) and as a program does (one JSON object).

Both are fully determined by the reports: numbers are printed with fixed decimals, keys
in a fixed order, so the same run prints the same bytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

from gateway.simulate.numbers import number
from gateway.simulate.report import Report

#: Why an output is shorter than asked, as the tables say it.
CUT = "prompt and output over an instance's KV cache"

#: The figures of a single run's table, in order, with their decimals.
_ROWS = (
    ("ttft_p50_ms", 1),
    ("ttft_p99_ms", 1),
    ("ttft_mean_ms", 1),
    ("e2e_mean_ms", 1),
    ("e2e_p50_ms", 1),
    ("e2e_p99_ms", 1),
    ("responses_per_sec", 2),
    ("tokens_per_sec", 1),
    ("preemption_count", 0),
    ("scheduling_delay_p99_ms", 1),
    ("gateway_wait_p99_ms", 1),
    ("prefix_cache_hit_rate", 3),
    ("load_imbalance", 3),
    ("duration_s", 2),
    ("fitness", 4),
)

#: The columns of a sweep's table.
_COLUMNS = (
    ("ttft_p50_ms", 1),
    ("ttft_p99_ms", 1),
    ("e2e_mean_ms", 1),
    ("e2e_p99_ms", 1),
    ("responses_per_sec", 2),
    ("preemption_count", 0),
    ("scheduling_delay_p99_ms", 1),
    ("prefix_cache_hit_rate", 3),
    ("load_imbalance", 3),
    ("rejected", 0),
)


def as_json(document: Mapping[str, object]) -> str:
    """One JSON object; a figure with no value (NaN: nothing completed) is null."""
    return json.dumps(_nulls(document), indent=2)


def run_table(report: Report, heading: Sequence[str]) -> str:
    """One run: a heading, then a figure per line."""
    lines = [*heading, ""]
    lines.append(f"{'completed':<26}{report['completed']} of {report['num_requests']}")
    if report["rejected"]:
        reasons = report["rejected_by_reason"]
        assert isinstance(reasons, Mapping)
        told = ", ".join(f"{k} {v}" for k, v in reasons.items())
        lines.append(f"{'rejected':<26}{report['rejected']} ({told})")
    if report.get("outputs_cut"):
        lines.append(f"{'outputs_cut':<26}{report['outputs_cut']} ({CUT})")
    for key, decimals in _ROWS:
        if key in report:
            lines.append(f"{key:<26}{_number(report[key], decimals)}")
    counts = report["instance_requests"]
    assert isinstance(counts, list)
    lines.append(f"{'instance_requests':<26}{' '.join(str(c) for c in counts)}")
    if "slo_met" in report:
        lines.append(f"{'slo_met':<26}{'yes' if report['slo_met'] else 'no'}")
    tenants = report.get("tenants")
    if isinstance(tenants, Mapping):
        lines += [
            "",
            f"{'tenant':<16}{'requests':>10}{'completed':>11}{'rejected':>10}"
            f"{'ttft_p50_ms':>13}{'ttft_p99_ms':>13}",
        ]
        for name, t in tenants.items():
            lines.append(
                f"{name:<16}{t['requests']:>10}{t['completed']:>11}{t['rejected']:>10}"
                f"{_number(t['ttft_p50_ms'], 1):>13}{_number(t['ttft_p99_ms'], 1):>13}"
            )
    return "\n".join(lines) + "\n"


def sweep_table(
    flag: str,
    values: Sequence[float],
    reports: Sequence[Report],
    heading: Sequence[str],
    verdict: str | None,
) -> str:
    """A sweep: a row per value, and the verdict on the objective when there is one."""
    columns = list(_COLUMNS)
    if reports and "fitness" in reports[0]:
        columns.append(("fitness", 4))
    has_slo = bool(reports) and "slo_met" in reports[0]
    first = max(14, len(flag) + 1)
    header = f"{flag:>{first}}" + "".join(f"{key:>{_width(key)}}" for key, _ in columns)
    if has_slo:
        header += f"{'slo':>5}"
    lines = [*heading, "", header]
    for value, report in zip(values, reports, strict=True):
        row = f"{number(value):>{first}}" + "".join(
            f"{_number(report[key], decimals):>{_width(key)}}" for key, decimals in columns
        )
        if has_slo:
            row += f"{'yes' if report['slo_met'] else 'no':>5}"
        lines.append(row)
    cut = [
        f"{flag}={number(value)}: {report['outputs_cut']} outputs cut short ({CUT}); that run "
        "meets no objective"
        for value, report in zip(values, reports, strict=True)
        if report.get("outputs_cut")
    ]
    if cut:
        lines += ["", *cut]
    if verdict is not None:
        lines += ["", verdict]
    return "\n".join(lines) + "\n"


def _width(key: str) -> int:
    return max(len(key) + 2, 10)


def _number(value: object, decimals: int) -> str:
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{decimals}f}"


def _nulls(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nulls(v) for v in value]
    return value
