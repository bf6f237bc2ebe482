"""The provider on the gateway's own ``Readings``: signals from readings, decisions once
per polling round, announced changes, and the knobs read from the environment."""

from __future__ import annotations

import time

import pytest
from gateway import ConfigError, Gateway, Reading, Readings, Settings

from obleth_kv_pressure import Knobs, KvPressureLimit
from obleth_kv_pressure.plugin import knobs_from

A, B = "http://a:8000", "http://b:8000"


def reading(url: str, **numbers: float) -> Reading:
    return Reading(url, healthy=True, at=time.monotonic(), **numbers)


def wired(initial: int | None = None, ceiling: int = 64) -> tuple[KvPressureLimit, Readings]:
    readings = Readings([A, B], stale_after_s=60.0)
    provider = KvPressureLimit(Knobs(), initial)
    provider.use_ceiling(lambda: ceiling)
    provider.use_readings(readings)
    return provider, readings


def poll(readings: Readings, *found: Reading) -> None:
    for each in found:
        readings.update(each)
    readings.notify()


def test_before_any_round_it_admits_the_operators_limit() -> None:
    provider, _ = wired(ceiling=64)
    assert provider.max_in_flight() == 64
    assert wired(initial=16)[0].max_in_flight() == 16


def test_an_initial_limit_or_a_floor_above_the_ceiling_starts_at_the_ceiling() -> None:
    """``INITIAL`` 1000 or ``FLOOR`` 100 under an operator's limit of 64: the provider
    answers 64 (it used to answer 1000 and 100 on status and /metrics)."""
    assert wired(initial=1000, ceiling=64)[0].max_in_flight() == 64
    floored = KvPressureLimit(Knobs(floor=100))
    floored.use_ceiling(lambda: 64)
    assert floored.max_in_flight() == 64


def test_initial_follows_a_ceiling_that_rises_after_wiring() -> None:
    """In cluster mode the pool's ceiling (set by ``PUT /api/v1/capacity``) reaches a pod
    only once it started, after the provider was wired to the static limit: ``INITIAL``
    256 under 64, then 512, is 256, not 64 kept for good."""
    ceiling = [64]
    provider = KvPressureLimit(Knobs(), 256)
    provider.use_ceiling(lambda: ceiling[0])
    assert provider.max_in_flight() == 64
    ceiling[0] = 512
    assert provider.max_in_flight() == 256


def test_a_rise_of_the_preemption_counter_cuts_and_is_announced() -> None:
    provider, readings = wired()
    told: list[int] = []
    provider.subscribe(lambda: told.append(provider.max_in_flight()))
    # the first round only learns where the counters stand
    poll(readings, reading(A, preemptions=40, kv_usage=0.5), reading(B, preemptions=7))
    assert provider.max_in_flight() == 64
    assert told == []
    poll(readings, reading(A, preemptions=43, kv_usage=0.5), reading(B, preemptions=7))

    assert told == [44]
    assert provider.explain()["reason"] == "decrease: 3 preemptions"
    assert provider.explain()["signals"] == {
        "fresh_upstreams": 2,
        "kv_usage": 0.5,
        "preemptions": 3.0,
        "queued": 0.0,
        "serving": 0.0,
    }


def test_a_counter_that_went_down_is_a_restarted_backend_whose_count_is_new() -> None:
    provider, readings = wired()
    poll(readings, reading(A, preemptions=40), reading(B, preemptions=0))
    poll(readings, reading(A, preemptions=2), reading(B, preemptions=0))
    assert provider.last_signals is not None
    assert provider.last_signals.preemptions == 2


def test_stale_and_unhealthy_backends_are_left_out() -> None:
    provider, readings = wired()
    poll(
        readings,
        Reading(A, healthy=True, kv_usage=0.99, at=time.monotonic() - 3600),
        Reading(B, healthy=False, kv_usage=0.99, at=time.monotonic()),
    )
    assert provider.max_in_flight() == 64
    assert provider.explain()["reason"] == "hold: no fresh reading from any backend"


def test_room_with_the_limit_in_use_grows_it_up_to_the_ceiling() -> None:
    provider, readings = wired(initial=30, ceiling=32)
    for _ in range(5):
        poll(readings, reading(A, running=20, kv_usage=0.2), reading(B, running=15))
    assert provider.max_in_flight() == 32


def test_a_misspelt_knob_is_an_error_naming_the_right_one() -> None:
    """``OBLETH_KV_PRESSURE_HIHG`` must not leave the high-water mark at its default
    unnoticed: Obleth leaves the plugin's namespace to the plugin, which reports it."""
    with pytest.raises(ConfigError) as caught:
        knobs_from({"OBLETH_KV_PRESSURE_HIHG": "0.5", "OBLETH_KV_PRESSURE_FLOOR": "2"})
    assert str(caught.value).startswith(
        "OBLETH_KV_PRESSURE_HIHG='0.5': no such setting; did you mean OBLETH_KV_PRESSURE_HIGH?"
    )


def test_a_pause_keeps_the_limit_of_before_for_when_admissions_resume() -> None:
    """``PUT 0`` pauses admissions; rounds meanwhile learn nothing (nothing runs) and the
    provider answers 0. A raise finds the limit of before at once: it used to have been
    cut to the paused ceiling, and grew back one step per round while waiters waited."""
    ceiling = [64]
    provider = KvPressureLimit(Knobs(), 30)
    readings = Readings([A, B], stale_after_s=60.0)
    provider.use_ceiling(lambda: ceiling[0])
    provider.use_readings(readings)
    poll(readings, reading(A, running=10, kv_usage=0.85), reading(B, running=10))
    assert provider.max_in_flight() == 30  # held: KV between the marks
    ceiling[0] = 0
    assert provider.max_in_flight() == 0
    for _ in range(3):
        poll(readings, reading(A, running=0, kv_usage=0.0), reading(B, running=0))
    ceiling[0] = 64
    assert provider.max_in_flight() == 30


def test_a_ceiling_lowered_for_a_while_caps_the_limit_learnt_without_changing_it() -> None:
    """The law cut to 44; the operator lowers the ceiling to 20 for a few rounds, then
    raises it to 64: the limit is 44 again at once, and the gateway was told of the cut
    only (it takes the lower of the ceiling and the providers). Holds used to store the
    capped value, so the limit stayed 20 (and, on an idle fleet, a ceiling raised above
    the first one never raised the limit)."""
    ceiling = [64]
    provider = KvPressureLimit(Knobs(), None)
    readings = Readings([A, B], stale_after_s=60.0)
    provider.use_ceiling(lambda: ceiling[0])
    provider.use_readings(readings)
    told: list[int] = []
    provider.subscribe(lambda: told.append(provider.max_in_flight()))
    poll(readings, reading(A, preemptions=1))
    poll(readings, reading(A, preemptions=4))  # a cut: 64 -> 44
    ceiling[0] = 20
    for _ in range(3):
        poll(readings, reading(A, preemptions=4, running=1, kv_usage=0.5))  # holds
    assert provider.max_in_flight() == 20
    ceiling[0] = 64
    assert provider.max_in_flight() == 44
    poll(readings, reading(A, preemptions=4, running=1, kv_usage=0.5))
    assert provider.max_in_flight() == 44
    assert told == [44]
    ceiling[0] = 100
    assert provider.max_in_flight() == 44


def test_on_an_idle_fleet_a_raised_ceiling_raises_the_limit_at_once() -> None:
    """Installing the provider changes nothing until the backends show pressure: without
    a cut, the limit is the ceiling, wherever the operator moves it."""
    ceiling = [100]
    provider = KvPressureLimit(Knobs(), None)
    readings = Readings([A, B], stale_after_s=60.0)
    provider.use_ceiling(lambda: ceiling[0])
    provider.use_readings(readings)
    for _ in range(3):
        poll(readings, reading(A, running=0, kv_usage=0.0), reading(B, running=0))
    ceiling[0] = 200
    assert provider.max_in_flight() == 200


def test_through_the_gateway_a_raised_ceiling_raises_the_limit_in_force() -> None:
    """The operator's limit lowered to 4 and raised to 500 through ``set_capacity`` (as
    ``PUT /api/v1/capacity`` does): the provider follows the ceiling without announcing
    it, and the gateway kept enforcing 4 while its status showed both providers at 500."""
    gateway = Gateway(
        Settings(
            capacity_providers=["static", "kv-pressure"],
            upstreams=[A],
            global_max_in_flight=64,
        )
    )
    gateway.set_capacity(4)
    assert gateway.snapshot().limit == 4
    gateway.set_capacity(500)
    assert gateway.provider_limits() == {"static": 500, "kv-pressure": 500}
    assert gateway.snapshot().limit == 500


def test_selected_without_upstreams_it_stops_startup_saying_why() -> None:
    """Without upstreams the gateway polls no backend: kv-pressure would hold the
    operator's limit for good, unseen. Startup stops, naming what to set."""
    with pytest.raises(ConfigError) as caught:
        Gateway(Settings(capacity_providers=["static", "kv-pressure"]))
    assert str(caught.value).startswith("capacity_providers='static,kv-pressure': kv-pressure")
    assert "set upstreams (OBLETH_UPSTREAMS)" in str(caught.value)


def test_knobs_come_from_the_environment_and_bad_ones_are_named() -> None:
    knobs, initial = knobs_from(
        {"OBLETH_KV_PRESSURE_HIGH": "0.95", "OBLETH_KV_PRESSURE_INITIAL": "12"}
    )
    assert (knobs.high, knobs.low, knobs.cooldown_rounds, initial) == (0.95, 0.80, 2, 12)
    assert knobs_from({"OBLETH_KV_PRESSURE_COOLDOWN_ROUNDS": "0"})[0].cooldown_rounds == 0
    with pytest.raises(ConfigError, match=r"OBLETH_KV_PRESSURE_HIGH='lots'.*fraction"):
        knobs_from({"OBLETH_KV_PRESSURE_HIGH": "lots"})
    with pytest.raises(ConfigError, match=r"OBLETH_KV_PRESSURE_LOW=0\.9: must not be above"):
        knobs_from({"OBLETH_KV_PRESSURE_LOW": "0.9", "OBLETH_KV_PRESSURE_HIGH": "0.8"})
    with pytest.raises(ConfigError) as caught:  # HIGH alone, under LOW's default
        knobs_from({"OBLETH_KV_PRESSURE_HIGH": "0.5"})
    assert str(caught.value).startswith("OBLETH_KV_PRESSURE_HIGH=0.5: is below")
    assert "set OBLETH_KV_PRESSURE_LOW too" in str(caught.value)
    with pytest.raises(ConfigError, match="OBLETH_KV_PRESSURE_DECREASE"):
        knobs_from({"OBLETH_KV_PRESSURE_DECREASE": "1"})
    with pytest.raises(ConfigError, match="OBLETH_KV_PRESSURE_FLOOR='0'"):
        knobs_from({"OBLETH_KV_PRESSURE_FLOOR": "0"})


def test_readings_are_judged_fresh_on_the_readings_own_clock() -> None:
    """On a virtual clock (``obleth simulate``) a reading taken a moment ago in virtual
    time is fresh, however long ago that is for ``time.monotonic``; one taken longer ago
    than ``stale_after_s`` on that clock is not."""
    now = [5.0]
    readings = Readings([A, B], stale_after_s=1.0, clock=lambda: now[0])
    provider = KvPressureLimit(Knobs(), None)
    provider.use_ceiling(lambda: 64)
    provider.use_readings(readings)
    poll(readings, Reading(A, healthy=True, at=4.5, kv_usage=0.5), Reading(B, healthy=True, at=2.0))
    assert provider.explain()["signals"]["fresh_upstreams"] == 1
    now[0] = 10.0
    assert provider.signals(readings).fresh == 0
