"""`obleth mock-backend` flags: every SimConfig knob, in the units the flags name."""

from __future__ import annotations

import argparse
import socket

import pytest

from gateway.cli import main, mock_backend
from gateway.errors import ConfigError
from gateway.sim import SimConfig


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="obleth")
    mock_backend.register(parser.add_subparsers())
    return parser.parse_args(["mock-backend", *argv])


def test_without_flags_the_backend_uses_simconfig_defaults() -> None:
    """No flags means the documented defaults, listening on 127.0.0.1:8001."""
    args = parse()
    assert mock_backend.config_from_args(args) == SimConfig()
    assert (args.host, args.port) == ("127.0.0.1", 8001)


def test_flags_set_every_knob_with_milliseconds_converted_to_seconds() -> None:
    """Each flag reaches its SimConfig field; *-ms flags are milliseconds."""
    args = parse(
        *("--model", "m", "--max-num-seqs", "4", "--block-size-tokens", "8"),
        *("--chars-per-token", "2", "--prefix-cache-blocks", "0", "--kv-cache-blocks", "64"),
        *("--prefill-ms-per-token", "0.5", "--step-ms", "20", "--step-ms-per-seq", "1"),
        *("--default-max-tokens", "3"),
    )
    config = mock_backend.config_from_args(args)
    assert (config.model, config.max_num_seqs, config.default_max_tokens) == ("m", 4, 3)
    assert (config.block_size_tokens, config.chars_per_token) == (8, 2)
    assert (config.prefix_cache_blocks, config.kv_cache_blocks) == (0, 64)
    assert config.prefill_s_per_token == pytest.approx(0.0005)
    assert config.step_s == pytest.approx(0.020)
    assert config.step_s_per_seq == pytest.approx(0.001)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [(("--max-num-seqs", "0"), "--max-num-seqs"), (("--step-ms", "-1"), "--step-ms")],
)
def test_a_bad_flag_value_is_reported_under_the_flag_name(argv: tuple[str, str], flag: str) -> None:
    """The error names the flag the user typed, not the internal field."""
    with pytest.raises(ConfigError) as caught:
        mock_backend.config_from_args(parse(*argv))
    assert caught.value.setting == flag


def test_a_step_over_a_minute_is_refused_in_the_flags_unit() -> None:
    """The bound is a minute of seconds in the config; the flag is in milliseconds."""
    with pytest.raises(ConfigError) as caught:
        mock_backend.config_from_args(parse("--step-ms", "100000"))
    assert caught.value.setting == "--step-ms"
    assert caught.value.expected == "must be a number of milliseconds from 0 to 60000"


@pytest.mark.parametrize("port", ["0", "65536", "70000", "http"])
def test_a_port_no_server_can_listen_on_is_refused_under_the_flag(
    port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every server command shares --port: out of range, it stops before serving."""
    with pytest.raises(SystemExit) as stopped:
        parse("--port", port)

    assert stopped.value.code == 2
    assert f"argument --port: '{port}': expected a port number from 1 to 65535" in (
        capsys.readouterr().err
    )


def test_the_highest_port_is_accepted() -> None:
    assert parse("--port", "65535").port == 65535


def test_a_port_taken_stops_it_with_one_line_naming_the_flag_and_status_3(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Another server holds the port: one line saying so and naming --port, status 3 (as
    ``obleth serve``), not a log of a server that starts, fails and exits 0."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        assert main(["mock-backend", "--port", str(port)]) == 3

    err = capsys.readouterr().err
    assert err == (
        f"obleth mock-backend: cannot listen on 127.0.0.1:{port}: Address already in use; "
        "give --port a port that is free\n"
    )
