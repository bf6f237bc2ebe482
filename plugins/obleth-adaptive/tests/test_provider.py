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


def test_the_gateway_follows_each_announced_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every change of the provider's value reaches the gateway's limit (subscribe): the
    end of the first probe, then a window's growth."""
    monkeypatch.setenv("OBLETH_ADAPTIVE_INITIAL", "4")
    clock = Clock()
    settings = Settings(capacity_providers=("static", "adaptive"), global_max_in_flight=10)
    readings = Readings([], stale_after_s=1.0, clock=clock)
    gateway = Gateway(settings, plugins=[plugin], entry_points=False, readings=readings)
    provider = gateway.providers["adaptive"]
    assert isinstance(provider, AdaptiveLimit)
    fed(provider, clock, 0.05, Knobs().probe_samples)
    assert gateway.capacity.current() == 4  # the probe ended, at the initial limit
    fed(provider, clock, 0.05, 4)  # a window of four samples at a limit of 4
    assert gateway.capacity.current() == 6


def probed_at_40() -> tuple[AdaptiveLimit, Clock, list[int]]:
    """A provider past its first probe (no-load time 0.1 s), at its ceiling of 40, and
    the values it announced since (40, at the probe's end)."""
    clock = Clock()
    provider = AdaptiveLimit(
        Knobs(initial=40, window=2, probe_samples=2, probe_every=0), ceiling=40, clock=clock
    )
    seen: list[int] = []
    provider.subscribe(lambda: seen.append(provider.max_in_flight()))
    fed(provider, clock, 0.1, 2)  # the probe ends: 3 -> 40
    return provider, clock, seen


def test_each_change_is_announced_once_and_nothing_else_is() -> None:
    """Subscribers are called once per change of the value, never for a sample that
    leaves it as it was."""
    provider, clock, seen = probed_at_40()
    fed(provider, clock, 0.1, 4)  # at the ceiling: holds
    fed(provider, clock, 0.8, 4)  # 8x: halved twice
    assert seen == [40, 20, 10]


def test_a_stalled_stream_the_gateway_tells_of_cuts_the_limit_and_is_announced() -> None:
    """The gateway's latency feed hands over each stream's longest gap between tokens:
    one past ten times the no-load time cuts the limit at once, and says why."""
    provider, clock, seen = probed_at_40()
    clock.now += 3.0
    provider.longest_gap(0.5, 2.0)  # 5x the no-load time: a slow step, not a stall
    provider.longest_gap(1.5, 2.0)
    assert seen == [40, 28]
    assert provider.explain()["reason"] == (
        "decrease: a stream stalled 1500 ms between two tokens (15.0x the no-load time to "
        "first byte)"
    )


def test_the_operators_limit_bounds_the_provider() -> None:
    """`use_ceiling` hands the provider the operator's limit now: it never answers more."""
    clock = Clock()
    ceiling = [40]
    provider = AdaptiveLimit(Knobs(initial=64, window=2, probe_samples=2), ceiling=99, clock=clock)
    provider.use_ceiling(lambda: ceiling[0])
    fed(provider, clock, 0.1, 2)  # the probe ends: at 64, were it not for the ceiling
    assert provider.max_in_flight() == 40
    ceiling[0] = 12
    assert provider.max_in_flight() == 12


def test_a_value_held_under_a_lowered_ceiling_is_announced() -> None:
    """A decision taken under a lowered operator's limit is announced, so that the gateway
    does not keep the provider's old, higher value once the operator raises it again."""
    clock = Clock()
    ceiling = [40]
    provider = AdaptiveLimit(
        Knobs(initial=40, window=2, probe_samples=2, probe_every=0), ceiling=99, clock=clock
    )
    provider.use_ceiling(lambda: ceiling[0])
    seen: list[int] = []
    provider.subscribe(lambda: seen.append(provider.max_in_flight()))
    fed(provider, clock, 0.1, 2)
    ceiling[0] = 10
    fed(provider, clock, 0.1, 2)  # held at the operator's limit, now 10
    ceiling[0] = 40
    fed(provider, clock, 0.1, 2)  # grows from 10 (by its square root), not from 40
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
    """On the event loop, a probe that nothing answers ends when its time is up, and the
    limit comes back to where it was."""

    async def scenario() -> tuple[bool, bool, list[int]]:
        provider = AdaptiveLimit(
            Knobs(initial=8, window=2, probe_samples=2, probe_every=1, probe_timeout_s=0.05),
            ceiling=8,
        )
        for _ in range(2):  # the first probe: the limit opens to 8, held at the ceiling
            provider.first_byte(0.0)
        changes: list[int] = []
        ended = asyncio.Event()

        def heard() -> None:
            changes.append(provider.max_in_flight())
            if not provider.law.probing:
                ended.set()

        provider.subscribe(heard)
        for _ in range(8):  # one limit's worth of samples: the next probe starts
            provider.first_byte(0.0)
        probing = provider.law.probing
        await asyncio.wait_for(ended.wait(), timeout=10.0)  # a bound, not a measurement
        await provider.stop()
        return probing, provider.law.probing, changes

    probing_before, probing_after, changes = asyncio.run(scenario())
    assert probing_before
    assert not probing_after
    assert changes == [3, 8]


def test_explain_says_what_the_limit_is_and_why() -> None:
    """`explain()` gives the limit, the last decision and the times it was taken on."""
    clock = Clock()
    provider = AdaptiveLimit(Knobs(initial=20, window=2, probe_samples=2), ceiling=30, clock=clock)
    fed(provider, clock, 0.1, 2)
    fed(provider, clock, 0.5, 2)  # 5x the no-load time: 20 * 4/5
    explained = provider.explain()
    assert explained["limit"] == 16
    assert explained["reason"] == "decrease: first bytes take 5.00x the no-load time"
    assert explained["baseline_s"] == pytest.approx(0.1)
    assert explained["window_s"] == pytest.approx(0.5)


def test_without_a_clock_of_its_own_the_provider_takes_the_readings_clock() -> None:
    """Handed the gateway's readings, a provider built without a clock places samples
    on the readings' clock (``obleth simulate``'s virtual one, say): a probe's deadline
    is on that clock."""
    virtual = Clock()
    virtual.now = 5000.0
    knobs = Knobs(initial=8, window=2, probe_samples=2, probe_every=1, probe_timeout_s=10.0)
    provider = AdaptiveLimit(knobs, ceiling=8)
    provider.use_readings(Readings([], stale_after_s=1.0, clock=virtual))
    fed(provider, virtual, 0.1, 2 + 8)  # the first probe, then one limit's worth: a probe
    assert provider.law.probing
    assert provider.law.probe_deadline == pytest.approx(virtual.now + 10.0)


def test_a_clock_passed_in_is_kept_when_the_readings_come() -> None:
    """A provider given its own clock keeps it: the readings' clock does not replace it."""
    own = Clock()
    virtual = Clock()
    virtual.now = 5000.0
    knobs = Knobs(initial=8, window=2, probe_samples=2, probe_every=1, probe_timeout_s=10.0)
    provider = AdaptiveLimit(knobs, ceiling=8, clock=own)
    provider.use_readings(Readings([], stale_after_s=1.0, clock=virtual))
    fed(provider, own, 0.1, 2 + 8)
    assert provider.law.probing
    assert provider.law.probe_deadline == pytest.approx(own.now + 10.0)


def test_a_misspelt_knob_is_an_error_naming_the_right_one() -> None:
    with pytest.raises(ConfigError) as caught:
        plugin.knobs_from({"OBLETH_ADAPTIVE_TOLERENCE": "3"})
    assert str(caught.value).startswith(
        "OBLETH_ADAPTIVE_TOLERENCE='3': no such setting; did you mean OBLETH_ADAPTIVE_TOLERANCE?"
    )


def test_knobs_come_from_the_environment() -> None:
    """Each `OBLETH_ADAPTIVE_*` variable sets its knob; unset or blank ones keep defaults."""
    knobs = plugin.knobs_from(
        {
            "OBLETH_ADAPTIVE_FLOOR": "2",
            "OBLETH_ADAPTIVE_INITIAL": "16",
            "OBLETH_ADAPTIVE_TOLERANCE": "3",
            "OBLETH_ADAPTIVE_STALL_WITHIN": "12",
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
        stall_within=12.0,
        grow_within=1.2,
        window=20,
        use=0.5,
        probe_every=0,
        probe_limit=4,
        probe_samples=7,
        probe_timeout_s=2.5,
    )
    assert plugin.knobs_from({"OBLETH_ADAPTIVE_WINDOW": " "}) == Knobs()


def test_unset_variables_leave_the_documented_defaults() -> None:
    """Without variables: a tolerance of 4, no band where the limit holds, a slow start
    from the probe limit, windows of 10 and a probe every 30 limits' worth of samples."""
    knobs = plugin.knobs_from({})
    assert knobs == Knobs()
    assert knobs.tolerance == 4.0
    assert knobs.grow_within is None
    assert knobs.initial is None
    assert (knobs.window, knobs.probe_every, knobs.probe_limit) == (10, 30, 3)


@pytest.mark.parametrize(
    ("variables", "grow_within"),
    [
        ({}, None),
        ({"OBLETH_ADAPTIVE_GROW_WITHIN": " "}, None),
        ({"OBLETH_ADAPTIVE_GROW_WITHIN": "1.5"}, 1.5),
        ({"OBLETH_ADAPTIVE_GROW_WITHIN": "4"}, 4.0),
        ({"OBLETH_ADAPTIVE_TOLERANCE": "6", "OBLETH_ADAPTIVE_GROW_WITHIN": "5"}, 5.0),
    ],
    ids=["unset", "blank", "below", "at-the-tolerance", "below-a-raised-tolerance"],
)
def test_grow_within_sets_a_hold_band_only_when_given(
    variables: dict[str, str], grow_within: float | None
) -> None:
    """Unset (or blank), `GROW_WITHIN` leaves no band where the limit holds (None: the
    tolerance); set, it may be anything from 1 up to the tolerance."""
    assert plugin.knobs_from(variables).grow_within == grow_within


@pytest.mark.parametrize(
    ("variables", "named", "says"),
    [
        ({"OBLETH_ADAPTIVE_FLOOR": "0"}, "FLOOR", "at least 1"),
        ({"OBLETH_ADAPTIVE_FLOOR": "many"}, "FLOOR", "whole number"),
        ({"OBLETH_ADAPTIVE_FLOOR": "4", "OBLETH_ADAPTIVE_INITIAL": "2"}, "INITIAL", "at least 4"),
        ({"OBLETH_ADAPTIVE_TOLERANCE": "1"}, "TOLERANCE", "above 1"),
        ({"OBLETH_ADAPTIVE_TOLERANCE": "nan"}, "TOLERANCE", "above 1"),
        ({"OBLETH_ADAPTIVE_GROW_WITHIN": "4.5"}, "GROW_WITHIN", "OBLETH_ADAPTIVE_TOLERANCE"),
        (
            {"OBLETH_ADAPTIVE_TOLERANCE": "3", "OBLETH_ADAPTIVE_GROW_WITHIN": "3.5"},
            "GROW_WITHIN",
            r"OBLETH_ADAPTIVE_TOLERANCE \(3\)",
        ),
        ({"OBLETH_ADAPTIVE_GROW_WITHIN": "0.5"}, "GROW_WITHIN", "at least 1"),
        ({"OBLETH_ADAPTIVE_USE": "1.5"}, "USE", "at most 1"),
        ({"OBLETH_ADAPTIVE_PROBE_TIMEOUT_S": "0"}, "PROBE_TIMEOUT_S", "above 0"),
        ({"OBLETH_ADAPTIVE_PROBE_TIMEOUT_S": "1e20"}, "PROBE_TIMEOUT_S", "at most 86400"),
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


@pytest.mark.parametrize(("raw", "expected"), [("0", 0.0), ("1.5", 1.5), (" ", 10.0)])
def test_stall_within_is_above_1_or_0_for_off(raw: str, expected: float) -> None:
    assert plugin.knobs_from({"OBLETH_ADAPTIVE_STALL_WITHIN": raw}).stall_within == expected


def test_a_stall_within_that_every_step_would_pass_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        plugin.knobs_from({"OBLETH_ADAPTIVE_STALL_WITHIN": "0.5"})
    assert str(caught.value).startswith("OBLETH_ADAPTIVE_STALL_WITHIN='0.5': must be above 1")
