"""Prometheus text exposition of the simulator's state, under vLLM's metric names."""

from __future__ import annotations

from gateway.sim.stats import SimSnapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (name, type, help, snapshot field). Counters carry `_total` in the family name as
# vLLM's prometheus_client output does, so scrapers written against vLLM match as-is.
_METRICS: tuple[tuple[str, str, str, str], ...] = (
    (
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        "running",
    ),
    (
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        "waiting",
    ),
    (
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        "kv_cache_usage",
    ),
    (
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        "prefix_cache_query_tokens",
    ),
    (
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        "prefix_cache_hit_tokens",
    ),
    (
        "vllm:num_preemptions_total",
        "counter",
        "Running sequences preempted to free KV-cache blocks, recomputed when re-admitted.",
        "preemptions",
    ),
    (
        "obleth_sim_concurrency",
        "gauge",
        "Requests inside a completion endpoint of the simulator (ground truth).",
        "concurrency",
    ),
    (
        "obleth_sim_max_concurrency",
        "gauge",
        "Highest obleth_sim_concurrency since start or the last POST /sim/reset.",
        "max_concurrency",
    ),
)


def render_metrics(model: str, snapshot: SimSnapshot) -> str:
    """The Prometheus text (format 0.0.4) for `snapshot`, every sample labelled with `model`."""
    labels = f'model_name="{_escape_label(model)}"'
    lines: list[str] = []
    for name, kind, help_text, field in _METRICS:
        value: int | float = getattr(snapshot, field)
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines.append(f"{name}{{{labels}}} {_number(value)}")
    # vLLM labels successes by finish reason; the simulator only ever stops on length.
    name = "vllm:request_success_total"
    lines += [f"# HELP {name} Count of successfully processed requests.", f"# TYPE {name} counter"]
    lines.append(f'{name}{{finished_reason="length",{labels}}} {snapshot.requests_finished}')
    return "\n".join(lines) + "\n"


def _number(value: int | float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


def _escape_label(value: str) -> str:
    # The exposition format escapes exactly these three characters in label values.
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
