"""The ``adaptive`` provider as the gateway sees it: selected by name, configured from
``OBLETH_ADAPTIVE_*``, announcing each change, bounded by the operator's limit, and
reading the upstreams' load to tell whether its limit is in use."""

from __future__ import annotations

import asyncio
from importlib.metadata import entry_points

import pytest
from gateway import ConfigError, Gateway, Reading, Readings, Settings

from obleth_adaptive import AdaptiveLimit, Knobs, plugin


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fed(provider: AdaptiveLimit, clock: Clock, seconds: float, count: int) -> None:
    """``count`` requests one after the other, each with a first byte after ``seconds``."""
    for _ in range(count):
        clock.now += seconds
        provider.first_byte(seconds)


def test_adaptive_is_selected_by_name_and_starts_by_probing() -> None:
    """Next to `static`, `adaptive` starts at its probe limit, under the static one."""
    settings = Settings(capacity_providers=("static", "adaptive"), global_max_in_flight=10)
    gateway = Gateway(settings, plugins=[plugin], entry_points=False)
    assert gateway.capacity.current() == Knobs().probe_limit
    assert gateway.provider_limits() == {"static": 10, "adaptive": 3}


def test_the_gateway_follows_each_announced_change() -> None:
    """Every change of the provider's value reaches the gateway's limit (subscribe)."""
    settings = Settings(capacity_providers=("static", "adaptive"), global_max_in_flight=10)
    gateway = Gateway(settings, plugins=[plugin], entry_points=False)
    provider = gateway.providers["adaptive"]
    assert isinstance(provider, AdaptiveLimit)
    for _ in range(Knobs().probe_samples):
        provider.first_byte(0.05)
    assert gateway.capacity.current() == 10  # the probe ended: up to the ceiling


def test_each_change_is_announced_once_and_nothing_else_is() -> None:
    """Subscribers are called once per change of the value, never for a sample that
    leaves it as it was."""
    clock = Clock()
    provider = AdaptiveLimit(
        Knobs(window=2, probe_samples=2, probe_every=0), ceiling=40, clock=clock
    )
    seen: list[int] = []
    provider.subscribe(lambda: seen.append(provider.max_in_flight()))
    fed(provider, clock, 0.1, 2)  # the probe ends: 3 -> 40
    fed(provider, clock, 0.1, 4)  # at the ceiling: holds
    fed(provider, clock, 0.4, 4)  # 4x: halved twice
    assert seen == [40, 20, 10]


def test_the_operators_limit_bounds_the_provider() -> None:
    """`use_ceiling` hands the provider the operator's limit now: it never answers more."""
    clock = Clock()
    ceiling = [40]
    provider = AdaptiveLimit(Knobs(window=2, probe_samples=2), ceiling=99, clock=clock)
    provider.use_ceiling(lambda: ceiling[0])
    fed(provider, clock, 0.1, 2)
    assert provider.max_in_flight() == 40
    ceiling[0] = 12
    assert provider.max_in_flight() == 12


def test_a_value_held_under_a_lowered_ceiling_is_announced() -> None:
    """A decision taken under a lowered operator's limit is announced, so that the gateway
    does not keep the provider's old, higher value once the operator raises it again."""
    clock = Clock()
    ceiling = [40]
    provider = AdaptiveLimit(
        Knobs(window=2, probe_samples=2, probe_every=0), ceiling=99, clock=clock
    )
    provider.use_ceiling(lambda: ceiling[0])
    seen: list[int] = []
    provider.subscribe(lambda: seen.append(provider.max_in_flight()))
    fed(provider, clock, 0.1, 2)
    ceiling[0] = 10
    fed(provider, clock, 0.1, 2)  # held at the operator's limit, now 10
    ceiling[0] = 40
    fed(provider, clock, 0.1, 2)  # grows from 10, not from 40
    assert seen == [40, 10, 13]


def upstream_readings(running: float, *, healthy: bool = True) -> Readings:
    import time

    readings = Readings(["http://up:8000"], stale_after_s=60.0)
    readings.update(
        Reading(
            "http://up:8000", healthy=healthy, running=running, waiting=0.0, at=time.monotonic()
        )
    )
    return readings


@pytest.mark.parametrize(
    ("running", "healthy", "grows"),
    [(8.0, True, True), (2.0, True, False), (8.0, False, False)],
    ids=["in-use", "idle", "unhealthy"],
)
def test_the_limit_grows_only_while_the_upstreams_serve_most_of_it(
    running: float, healthy: bool, grows: bool
) -> None:
    """With upstreams, fast first bytes raise a limit of 8 only when the upstreams run at
    least `use` (0.8) of it; an upstream without a healthy reading shows no use."""
    clock = Clock()
    provider = AdaptiveLimit(
        Knobs(initial=8, window=2, probe_samples=2, probe_every=0), ceiling=64, clock=clock
    )
    provider.use_readings(upstream_readings(running, healthy=healthy))
    fed(provider, clock, 0.1, 2)
    fed(provider, clock, 0.1, 2)
    assert (provider.max_in_flight() > 8) is grows


def test_a_probe_that_gets_no_first_byte_ends_on_its_timer() -> None:
    """On the event loop, a probe that nothing answers ends when its time is up."""

    async def scenario() -> tuple[bool, bool, int]:
        provider = AdaptiveLimit(
            Knobs(initial=8, window=2, probe_samples=2, probe_every=1, probe_timeout_s=0.05),
            ceiling=64,
        )
        changes: list[int] = []
        provider.subscribe(lambda: changes.append(provider.max_in_flight()))
        for _ in range(2 + 8):  # the first probe, then 8 samples: the next probe starts
            provider.first_byte(0.0)
        probing = provider.law.probing
        await asyncio.sleep(0.3)
        await provider.stop()
        return probing, provider.law.probing, changes[-1]

    probing_before, probing_after, last = asyncio.run(scenario())
    assert probing_before
    assert not probing_after
    assert last > 3


def test_explain_says_what_the_limit_is_and_why() -> None:
    """`explain()` gives the limit, the last decision and the times it was taken on."""
    clock = Clock()
    provider = AdaptiveLimit(Knobs(window=2, probe_samples=2), ceiling=30, clock=clock)
    fed(provider, clock, 0.1, 2)
    fed(provider, clock, 0.5, 2)
    explained = provider.explain()
    assert explained["limit"] == 15
    assert str(explained["reason"]).startswith("decrease")
    assert explained["baseline_s"] == pytest.approx(0.1)
    assert explained["window_s"] == pytest.approx(0.5)


def test_knobs_come_from_the_environment() -> None:
    """Each `OBLETH_ADAPTIVE_*` variable sets its knob; unset or blank ones keep defaults."""
    knobs = plugin.knobs_from(
        {
            "OBLETH_ADAPTIVE_FLOOR": "2",
            "OBLETH_ADAPTIVE_INITIAL": "16",
            "OBLETH_ADAPTIVE_TOLERANCE": "3",
            "OBLETH_ADAPTIVE_GROW_WITHIN": "1.2",
            "OBLETH_ADAPTIVE_WINDOW": "20",
            "OBLETH_ADAPTIVE_USE": "0.5",
            "OBLETH_ADAPTIVE_PROBE_EVERY": "0",
            "OBLETH_ADAPTIVE_PROBE_LIMIT": "4",
            "OBLETH_ADAPTIVE_PROBE_SAMPLES": "7",
            "OBLETH_ADAPTIVE_PROBE_TIMEOUT_S": "2.5",
        }
    )
    assert knobs == Knobs(
        floor=2,
        initial=16,
        tolerance=3.0,
        grow_within=1.2,
        window=20,
        use=0.5,
        probe_every=0,
        probe_limit=4,
        probe_samples=7,
        probe_timeout_s=2.5,
    )
    assert plugin.knobs_from({"OBLETH_ADAPTIVE_WINDOW": " "}) == Knobs()


@pytest.mark.parametrize(
    ("variables", "named", "says"),
    [
        ({"OBLETH_ADAPTIVE_FLOOR": "0"}, "FLOOR", "at least 1"),
        ({"OBLETH_ADAPTIVE_FLOOR": "many"}, "FLOOR", "whole number"),
        ({"OBLETH_ADAPTIVE_FLOOR": "4", "OBLETH_ADAPTIVE_INITIAL": "2"}, "INITIAL", "at least 4"),
        ({"OBLETH_ADAPTIVE_TOLERANCE": "1"}, "TOLERANCE", "above 1"),
        ({"OBLETH_ADAPTIVE_TOLERANCE": "nan"}, "TOLERANCE", "above 1"),
        ({"OBLETH_ADAPTIVE_GROW_WITHIN": "2.5"}, "GROW_WITHIN", "OBLETH_ADAPTIVE_TOLERANCE"),
        ({"OBLETH_ADAPTIVE_USE": "1.5"}, "USE", "at most 1"),
        ({"OBLETH_ADAPTIVE_PROBE_TIMEOUT_S": "0"}, "PROBE_TIMEOUT_S", "above 0"),
        ({"OBLETH_ADAPTIVE_PROBE_EVERY": "-1"}, "PROBE_EVERY", "at least 0"),
    ],
)
def test_a_bad_variable_is_named_with_what_would_do(
    variables: dict[str, str], named: str, says: str
) -> None:
    """A value the law cannot use stops startup with a `ConfigError` naming the variable."""
    with pytest.raises(ConfigError, match=says) as caught:
        plugin.knobs_from(variables)
    assert caught.value.setting == "OBLETH_ADAPTIVE_" + named


def test_a_bad_variable_stops_the_gateway_from_being_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The factory reads the environment, so the error comes when the gateway is built."""
    monkeypatch.setenv("OBLETH_ADAPTIVE_WINDOW", "0")
    settings = Settings(capacity_providers=("static", "adaptive"))
    with pytest.raises(ConfigError, match="OBLETH_ADAPTIVE_WINDOW"):
        Gateway(settings, plugins=[plugin], entry_points=False)


def test_the_installed_distribution_declares_its_entry_point() -> None:
    """pip installed the `obleth` entry point that Obleth finds the plugin by."""
    (found,) = entry_points(group="obleth", name="adaptive")
    assert found.load() is plugin
