"""``PluginKnobs``: a plugin's own ``OBLETH_<NAME>_*`` variables, with Obleth's rules."""

from __future__ import annotations

import pytest

from gateway import ConfigError, PluginKnobs

PREFIX = "OBLETH_MINE_"


def knobs(**variables: str) -> PluginKnobs:
    return PluginKnobs({PREFIX + k: v for k, v in variables.items()}, PREFIX)


def test_an_unset_or_blank_variable_takes_the_default() -> None:
    env = knobs(SIZE="  ")
    assert env.raw("SIZE") is None
    assert env.whole("SIZE", 8, least=1) == 8
    assert env.whole("OTHER", None, least=1) is None
    assert env.number("RATIO", 0.5, least=0.0) == 0.5


def test_values_within_bounds_are_read() -> None:
    env = knobs(SIZE="12", RATIO="0.25", ZERO="0")
    assert env.whole("SIZE", 8, least=1) == 12
    assert env.whole("ZERO", 3, least=0) == 0
    assert env.number("RATIO", 0.5, above=0.0, most=1.0) == 0.25


@pytest.mark.parametrize("text", ["0", "-3", "many", "1.5"])
def test_a_bad_whole_number_names_the_variable_and_its_bound(text: str) -> None:
    with pytest.raises(ConfigError, match=f"OBLETH_MINE_SIZE='{text}'.*at least 1") as caught:
        knobs(SIZE=text).whole("SIZE", 8, least=1)
    assert caught.value.setting == "OBLETH_MINE_SIZE"


@pytest.mark.parametrize("text", ["1.5", "-0.1", "nan", "inf", "half"])
def test_a_number_out_of_bounds_says_what_it_expects_with_an_example(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        knobs(RATIO=text).number("RATIO", 0.5, least=0.0, most=1.0)
    assert str(caught.value) == (
        f"OBLETH_MINE_RATIO='{text}': expected a number at least 0 and at most 1, e.g. 0.5"
    )
    with pytest.raises(ConfigError, match=r"expected a fraction from 0 to 1, e\.g\. 0\.5"):
        knobs(RATIO=text).number(
            "RATIO", 0.5, least=0.0, most=1.0, expected="a fraction from 0 to 1"
        )


def test_done_reports_a_variable_never_asked_for_with_the_closest_name() -> None:
    env = knobs(SIZE="12", SIEZ="4")
    env.whole("SIZE", 8, least=1)
    env.raw("RATIO")
    with pytest.raises(ConfigError) as caught:
        env.done()
    assert caught.value.setting == "OBLETH_MINE_SIEZ"
    assert "did you mean OBLETH_MINE_SIZE?" in str(caught.value)
    assert "known: OBLETH_MINE_RATIO, OBLETH_MINE_SIZE" in str(caught.value)


def test_done_accepts_every_variable_read_and_those_of_other_namespaces() -> None:
    """Variables asked for (set or blank), other plugins' and Obleth's own are not typos,
    nor those of an installed plugin whose name extends this one's (``kv`` and
    ``kv-pressure``: the README's test command installs the latter)."""
    environ = {"OBLETH_KV_PRESSURE_HIGH": "0.9", "OBLETH_KV_SIZE": " ", "OBLETH_MAX_QUEUE": "3"}
    env = PluginKnobs(environ, "OBLETH_KV_")
    assert env.whole("SIZE", 8, least=1) == 8
    env.done()


def test_kubernetes_service_links_under_the_prefix_are_not_the_plugins_typos() -> None:
    """A Service named ``obleth-kv-pressure-exporter`` gives every pod
    ``OBLETH_KV_PRESSURE_EXPORTER_SERVICE_HOST`` and its kin: Obleth's own settings
    leave them alone, and so must a plugin's check of its namespace."""
    env = knobs(EXPORTER_SERVICE_HOST="10.96.0.12", EXPORTER_PORT_9100_TCP_ADDR="10.96.0.12")
    env.done()
    with pytest.raises(ConfigError, match="no such setting"):
        knobs(EXPORTER_PORT="9100").done()  # alone, with no Service: a typo
