"""Engine metric names become Reading fields: vLLM old and new, SGLang, several label sets."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from gateway.routing.metricnames import METRIC_NAMES, reading_from_text
from gateway.routing.readings import Reading
from gateway.sim.metrics import render_metrics
from gateway.sim.stats import SimSnapshot

URL = "http://127.0.0.1:8000"
AT = 123.5

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="llama"} 0.25
"""

VLLM_OLD = """\
vllm:num_requests_running{model_name="llama"} 1.0
vllm:num_requests_waiting{model_name="llama"} 0.0
vllm:gpu_cache_usage_perc{model_name="llama"} 0.75
"""

VLLM_BOTH_KV_NAMES = """\
vllm:gpu_cache_usage_perc{model_name="llama"} 0.9
vllm:kv_cache_usage_perc{model_name="llama"} 0.1
"""

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",engine_type="unified",tp_rank="0"} 8.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen",engine_type="unified",tp_rank="0"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen",engine_type="unified",tp_rank="0"} 0.5
"""

SEVERAL_LABEL_SETS = """\
vllm:num_requests_running{engine="0",model_name="llama"} 2
vllm:num_requests_running{engine="1",model_name="llama"} 3
vllm:num_requests_waiting{engine="0",model_name="llama"} 1
vllm:num_requests_waiting{engine="1",model_name="llama"} 4
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.6
"""

# (id, metrics text, expected engine, running, waiting, kv_usage)
CASES = [
    ("vllm", VLLM, "vllm", 3.0, 5.0, 0.25),
    ("vllm-old-kv-name", VLLM_OLD, "vllm", 1.0, 0.0, 0.75),
    ("vllm-new-kv-name-wins", VLLM_BOTH_KV_NAMES, "vllm", None, None, 0.1),
    ("sglang", SGLANG, "sglang", 8.0, 2.0, 0.5),
    ("sums-and-max-over-label-sets", SEVERAL_LABEL_SETS, "vllm", 5.0, 5.0, 0.6),
    ("kv-above-one-clamped", "vllm:kv_cache_usage_perc 1.5", "vllm", None, None, 1.0),
    ("kv-below-zero-clamped", "sglang:token_usage -0.1", "sglang", None, None, 0.0),
    ("kv-infinite-clamped", "vllm:kv_cache_usage_perc +Inf", "vllm", None, None, 1.0),
    (
        "nan-ignored",
        'vllm:num_requests_running{a="1"} NaN\nvllm:num_requests_running{a="2"} 2\n'
        'vllm:kv_cache_usage_perc{a="1"} NaN\nvllm:kv_cache_usage_perc{a="2"} 0.3',
        "vllm",
        2.0,
        None,
        0.3,
    ),
    (
        "nan-only-new-kv-name-falls-back-to-old",
        "vllm:kv_cache_usage_perc NaN\nvllm:gpu_cache_usage_perc 0.4",
        "vllm",
        None,
        None,
        0.4,
    ),
    ("infinite-count-ignored", "vllm:num_requests_waiting +Inf", "vllm", None, None, None),
    ("negative-count-is-zero", "sglang:num_queue_reqs -3", "sglang", None, 0.0, None),
    (
        "a-negative-sample-cancels-nothing",
        'vllm:num_requests_waiting{a="1"} 6\nvllm:num_requests_waiting{a="2"} -2',
        "vllm",
        None,
        6.0,
        None,
    ),
    (
        "a-sum-too-large-for-a-float-is-the-largest",
        'vllm:num_requests_waiting{model_name="a"} 1e308\n'
        'vllm:num_requests_waiting{model_name="b"} 1e308',
        "vllm",
        None,
        sys.float_info.max,
        None,
    ),
    ("unknown-names", "process_cpu_seconds_total 12\nup 1\n", None, None, None, None),
    ("only-nan", "vllm:num_requests_running NaN", None, None, None, None),
    ("empty", "", None, None, None, None),
    ("garbage", "<html>502 Bad Gateway</html>", None, None, None, None),
]


@pytest.mark.parametrize(
    ("text", "engine", "running", "waiting", "kv_usage"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_metrics_text_becomes_a_reading(
    text: str,
    engine: str | None,
    running: float | None,
    waiting: float | None,
    kv_usage: float | None,
) -> None:
    """Each engine's names land in the right fields, with the engine named (the models
    their labels name are the next test's)."""
    reading = dataclasses.replace(reading_from_text(URL, text, AT, True), models=None)
    assert reading == Reading(
        URL,
        healthy=True,
        running=running,
        waiting=waiting,
        kv_usage=kv_usage,
        at=AT,
        engine=engine,
    )


def test_the_model_name_labels_say_what_the_upstream_serves() -> None:
    """``models`` gathers the ``model_name`` labels of the engine's samples (the names
    routing matches a request's model against), of that engine only; None without any."""
    assert reading_from_text(URL, VLLM, AT, True).models == {"llama"}
    several = (
        'vllm:num_requests_running{model_name="llama"} 1\n'
        'vllm:num_requests_waiting{model_name="qwen",engine="0"} 2\n'
        'sglang:num_running_reqs{model_name="mistral"} 4\n'
        'process_cpu_seconds_total{model_name="other"} 9\n'
    )
    assert reading_from_text(URL, several, AT, True).models == {"llama", "qwen"}
    sglang = 'sglang:num_running_reqs{model_name="mistral"} 4\n'
    assert reading_from_text(URL, sglang, AT, True).models == {"mistral"}
    assert reading_from_text(URL, "vllm:num_requests_running 3\n", AT, True).models is None
    assert reading_from_text(URL, "garbage", AT, True).models is None


def test_health_verdict_and_scrape_time_are_carried_as_given() -> None:
    """``healthy`` and ``at`` come from the caller, whatever the text says."""
    reading = reading_from_text(URL, VLLM, 7.0, False)
    assert (reading.upstream, reading.healthy, reading.at) == (URL, False, 7.0)


def test_the_first_engine_with_samples_supplies_every_number() -> None:
    """Text with both engines' names is read as vLLM's, not as a mix of the two."""
    reading = reading_from_text(URL, "sglang:num_running_reqs 9\n" + VLLM_OLD, AT, True)
    assert (reading.engine, reading.running, reading.kv_usage) == ("vllm", 1.0, 0.75)


def test_the_simulators_metrics_are_read_as_vllm() -> None:
    """The simulator's /metrics text gives the numbers of the snapshot it renders."""
    snapshot = SimSnapshot(
        concurrency=6,
        max_concurrency=6,
        requests=6,
        completed=0,
        failed=0,
        disconnected=0,
        running=4,
        waiting=2,
        kv_cache_usage=0.125,
        prefix_cache_query_tokens=0,
        prefix_cache_hit_tokens=0,
        requests_finished=0,
        preemptions=3,
    )
    reading = reading_from_text(URL, render_metrics("m", snapshot), AT, True)
    assert (reading.engine, reading.running, reading.waiting, reading.kv_usage) == (
        "vllm",
        4.0,
        2.0,
        0.125,
    )
    assert reading.preemptions == 3.0  # the counter the kv-pressure provider reads


def test_every_mapped_name_is_parsed() -> None:
    """The names a scrape parses are exactly the engines' names."""
    assert {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:num_preemptions_total",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
    } == METRIC_NAMES
