"""`obleth serve` flags: a bad value is reported under the flag the user typed."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from gateway.cli import main

UPSTREAM = ("--upstream", "http://127.0.0.1:9")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ((*UPSTREAM, "--max-in-flight", "0"), "--max-in-flight=0: expected a whole number"),
        ((*UPSTREAM, "--policy", "random"), "--policy='random': expected weighted"),
        ((*UPSTREAM, "--scorers", "x"), "--scorers='x': 'x' has no ':weight'"),
        ((*UPSTREAM, "--redis-url", "http://x"), "--redis-url='http://x': unknown scheme"),
        ((*UPSTREAM, "--pool", "a b"), "--pool='a b': expected 1 to 64 letters"),
        ((*UPSTREAM, "--pool", "a\n"), "--pool='a\\n': expected 1 to 64 letters"),
        (
            (*UPSTREAM, "--overflow-policy", "drop"),
            "--overflow-policy='drop': no overflow policy by that name",
        ),
        (
            (*UPSTREAM, "--upstream", "http://127.0.0.1:99999"),
            "--upstream='http://127.0.0.1:99999': port 99999 is out of range",
        ),
        (
            (*UPSTREAM, "--upstream", "http://127.0.0.1:9?y=1"),
            "--upstream='http://127.0.0.1:9?y=1': expected an http:// or https:// base URL, "
            "e.g. http://127.0.0.1:8000, without a query or fragment",
        ),
    ],
)
def test_a_bad_flag_value_stops_serve_naming_the_flag(
    argv: tuple[str, ...], said: str, taken_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the user typed is what the message names; nothing is served (the upstream
    port 9 is never asked). On a port in use, a value let through fails at once rather
    than serve for ever."""
    assert main(["serve", "--port", str(taken_port), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"obleth: {said}") and "Traceback" not in err


def test_a_bad_value_from_the_environment_is_named_as_its_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OBLETH_GLOBAL_MAX_IN_FLIGHT", "0")
    assert main(["serve", *UPSTREAM]) == 2
    assert capsys.readouterr().err.startswith("obleth: OBLETH_GLOBAL_MAX_IN_FLIGHT=0:")


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something listens on already: a serve that got past its checks would stop
    there (it cannot listen) rather than serve for ever."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_seconds_variable_over_a_day_stops_serve_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], taken_port: int
) -> None:
    """A huge ``Retry-After`` never reaches a client: startup stops with the variable, its
    value and the bound, one line and no traceback."""
    monkeypatch.setenv("OBLETH_RETRY_AFTER_S", "1e20")
    assert main(["serve", *UPSTREAM, "--port", str(taken_port)]) == 2
    err = capsys.readouterr().err
    assert err == "obleth: OBLETH_RETRY_AFTER_S=1e+20: expected at most 86400 seconds (one day)\n"
