"""Parsing the Prometheus text format: the samples asked for, and nothing raises."""

from __future__ import annotations

import math

import pytest

from gateway.routing.promtext import Sample, parse_samples
from gateway.sim.metrics import render_metrics
from gateway.sim.stats import SimSnapshot

WANTED = ("up", "load")

PARSED = [
    ("up 1", [Sample("up", {}, 1.0)]),
    ("up 1.5e2", [Sample("up", {}, 150.0)]),
    ("up -0.25", [Sample("up", {}, -0.25)]),
    ('up{job="api"} 3', [Sample("up", {"job": "api"}, 3.0)]),
    ('up{job="api",zone="b"} 3', [Sample("up", {"job": "api", "zone": "b"}, 3.0)]),
    ('up{ job = "api" , zone="b", } 3', [Sample("up", {"job": "api", "zone": "b"}, 3.0)]),
    ("up{} 3", [Sample("up", {}, 3.0)]),
    ('up {job="api"} 3', [Sample("up", {"job": "api"}, 3.0)]),
    ("up 3 1700000000000", [Sample("up", {}, 3.0)]),
    ("up 3 -5", [Sample("up", {}, 3.0)]),
    ("up\t3\t\t1700000000000", [Sample("up", {}, 3.0)]),
    ("  up 3", [Sample("up", {}, 3.0)]),
    ("up 3\r", [Sample("up", {}, 3.0)]),
    ("up +Inf", [Sample("up", {}, math.inf)]),
    ("up -Inf", [Sample("up", {}, -math.inf)]),
    ('up{path="C:\\\\dir"} 1', [Sample("up", {"path": "C:\\dir"}, 1.0)]),
    ('up{say="a \\"quote\\""} 1', [Sample("up", {"say": 'a "quote"'}, 1.0)]),
    ('up{lines="one\\ntwo"} 1', [Sample("up", {"lines": "one\ntwo"}, 1.0)]),
    ('up{tricky="\\\\n"} 1', [Sample("up", {"tricky": "\\n"}, 1.0)]),
    ('up{text="}, {a=\\"b\\"} 9"} 1', [Sample("up", {"text": '}, {a="b"} 9'}, 1.0)]),
    ('up{unicode="naïve ✓"} 1', [Sample("up", {"unicode": "naïve ✓"}, 1.0)]),
    ("# HELP up Whether it is up.\n# TYPE up gauge\nup 1", [Sample("up", {}, 1.0)]),
    ("# up 1\n#up 2", []),
    ("", []),
    ("\n\n", []),
    ("upper 1\nup_total 2\nu 3\nother 4", []),
    ("up 1\nload 2\nup 3", [Sample("up", {}, 1.0), Sample("load", {}, 2.0), Sample("up", {}, 3.0)]),
]

MALFORMED = [
    "up",
    "up ",
    "up{} ",
    "up one",
    "up 1_000",
    "up 1 2 3",
    "up 1 1.5",
    "up 1 soon",
    "up{job=api} 1",
    'up{job="api} 1',
    'up{job="api" 1',
    'up{job="api"zone="b"} 1',
    'up{="api"} 1',
    'up{1job="api"} 1',
    'up{job="a\\tb"} 1',
    'up{job="a",job="b"} 1',
    'up{job="api"}} 1',
    "up+1 2",
    "up-1 2",
]


@pytest.mark.parametrize(("text", "expected"), PARSED, ids=[repr(t) for t, _ in PARSED])
def test_samples_of_wanted_names_are_parsed(text: str, expected: list[Sample]) -> None:
    """Each sample line of a wanted metric yields its name, unescaped labels and value."""
    assert list(parse_samples(text, WANTED)) == expected


@pytest.mark.parametrize("line", MALFORMED, ids=repr)
def test_a_malformed_line_is_skipped_and_the_rest_still_counts(line: str) -> None:
    """A bad line of a wanted metric yields nothing, raises nothing, and spares its neighbours."""
    text = f"load 1\n{line}\nload 2\n"
    assert list(parse_samples(text, WANTED)) == [Sample("load", {}, 1.0), Sample("load", {}, 2.0)]


def test_nan_is_a_value() -> None:
    """``NaN`` parses as a float NaN (deciding what it means is the caller's business)."""
    [sample] = parse_samples('up{job="x"} NaN', WANTED)
    assert sample.name == "up" and sample.labels == {"job": "x"} and math.isnan(sample.value)


def test_nothing_wanted_yields_nothing() -> None:
    """An empty set of names matches no line."""
    assert list(parse_samples("up 1", ())) == []


@pytest.mark.parametrize("garbage", ["\x00\x01\x02", "{{{", '"' * 50, "up{" + "a=" * 1000, "\\"])
def test_garbage_never_raises(garbage: str) -> None:
    """Whatever an upstream answers, parsing ends without an exception."""
    assert list(parse_samples(garbage, WANTED)) == []


def test_the_simulators_metrics_page_reads_back_as_rendered() -> None:
    """The text the simulator serves at /metrics parses to the numbers it was rendered from."""
    model = 'we"ird\\model\nname'
    snapshot = SimSnapshot(
        concurrency=5,
        max_concurrency=9,
        requests=40,
        completed=30,
        failed=2,
        disconnected=3,
        running=4,
        waiting=7,
        kv_cache_usage=0.4375,
        prefix_cache_query_tokens=1000,
        prefix_cache_hit_tokens=250,
        requests_finished=30,
    )
    text = render_metrics(model, snapshot)
    names = (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:request_success_total",
    )
    labels = {"model_name": model}

    assert list(parse_samples(text, names)) == [
        Sample("vllm:num_requests_running", labels, 4.0),
        Sample("vllm:num_requests_waiting", labels, 7.0),
        Sample("vllm:kv_cache_usage_perc", labels, 0.4375),
        Sample("vllm:request_success_total", {"finished_reason": "length", **labels}, 30.0),
    ]
