"""The ``obleth`` command itself: its version, what a bare ``obleth`` does, and help that
shows every default, read from the parser and the settings rather than a list kept here."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys

import pytest

import gateway
from gateway.cli import build_parser, main
from gateway.cli.server_flags import listen_url
from gateway.settings.declared import specs_of
from gateway.settings.fields import Settings


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


COMMANDS = sorted(commands(build_parser()))


def obleth(*argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m gateway`` (the ``obleth`` console script's code) as a process."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def help_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def entries(help_text: str) -> dict[str, str]:
    """Each option's entry in ``help_text``, by its first option string, whitespace
    removed (argparse wraps lines where it likes, hyphens included)."""
    found: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        if line.startswith("  -"):
            current = line.split()[0].rstrip(",")
            found[current] = line
        elif current is not None and line.startswith("   "):
            found[current] += line
        else:
            current = None
    return {option: "".join(text.split()) for option, text in found.items()}


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options a user sets: not positionals, not ``--help`` nor ``--version``."""
    return [
        action
        for action in parser._actions
        if action.option_strings
        and not isinstance(action, argparse._HelpAction | argparse._VersionAction)
    ]


def test_version_prints_the_installed_distributions_version() -> None:
    """``obleth --version`` prints ``obleth <version>``, the one ``gateway.__version__``
    holds: the installed distribution's."""
    installed = importlib.metadata.version("obleth")
    done = obleth("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"obleth {installed}\n", "")
    assert gateway.__version__ == installed


def test_a_bare_obleth_prints_its_help_and_succeeds() -> None:
    """``obleth`` alone prints the help, every command in it, on stdout, with status 0
    (not argparse's "the following arguments are required")."""
    done = obleth()
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("usage: obleth")
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("    ")}
    assert set(COMMANDS) <= listed


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_shows_its_default_in_the_help(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every option of ``obleth <command> --help`` says its default: the parser's own
    value, or, where the parser has None, what applies when the option is left out."""
    parser = commands(build_parser())[command]
    shown = entries(help_of([command], capsys))
    for action in options(parser):
        entry = shown[action.option_strings[0]]
        if action.default is None:
            assert "(default:" in entry, entry
        else:
            assert f"(default:{action.default})".replace(" ", "") in entry, entry


def test_a_flag_standing_for_a_setting_shows_its_variable_and_the_settings_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A flag left out leaves its setting to the ``OBLETH_*`` variable, else to the
    setting's default: the help names that variable and gives that default."""
    specs = {spec.env: spec for spec in specs_of(Settings).values()}
    said = []
    for command in COMMANDS:
        for entry in entries(help_of([command], capsys)).values():
            said += re.findall(r"\(default:\$(OBLETH_\w+)ifset,else(.*)\)$", entry)
    assert said  # obleth serve has such flags
    for variable, default in said:
        spec = specs[variable]
        if default == "none":
            assert spec.default in (None, ()), variable
        else:
            assert spec.parse(variable, default) == spec.default, variable


@pytest.mark.parametrize(
    ("argv", "told"),
    [
        (["demo", "--duration", "0"], "--duration"),
        (["demo", "--limit", "0"], "--limit"),
        # a million clients in one process: it used to try
        (["demo", "--limit", "200000"], "--limit: expected a whole number from 1 to 128"),
        (["demo", "--policy", "nope"], "--policy nope"),
    ],
)
def test_a_bad_demo_flag_exits_2_with_one_line(argv: list[str], told: str) -> None:
    """A usage error of ``obleth demo`` exits 2, as argparse's own do, not 1."""
    done = obleth(*argv)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"obleth demo: {told}") and len(done.stderr.splitlines()) == 1


def test_demo_help_says_obleth_variables_play_no_part(capsys: pytest.CaptureFixture[str]) -> None:
    """Someone whose shell carries ``OBLETH_*`` for ``obleth serve`` learns from the demo's
    help that they do not reach the demo, which runs on its flags alone."""
    text = " ".join(help_of(["demo"], capsys).split())
    assert "configured by these flags only: OBLETH_* variables" in text
    assert "play no part in it" in text


def test_the_demo_runs_on_its_flags_whatever_obleth_variables_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the help promises: a variable that would stop ``obleth serve`` (a limit of 0)
    changes nothing in the demo, whose summary holds to its own --limit."""
    monkeypatch.setenv("OBLETH_GLOBAL_MAX_IN_FLIGHT", "0")
    monkeypatch.setenv("OBLETH_TENANT_HEADER", "x-team")
    done = obleth("demo", "--duration", "0.3", "--limit", "3")
    assert done.returncode == 0, done.stderr
    assert "(limit 3): never above the limit" in done.stdout


def test_output_piped_into_a_reader_that_leaves_ends_quietly() -> None:
    """``obleth simulate --json --sweep ... | head -1``: the reader closes the pipe after
    its line, with more to come than a pipe holds; the command stops with the status of
    SIGPIPE (141), no traceback."""
    sweep = ["simulate", "--json", "--num-requests=5", "--sweep=rate=1..100"]
    command = [sys.executable, "-m", "gateway", *sweep]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.read(1)
        process.stdout.close()  # the reader leaves with the rest unread
        errors = process.stderr.read().decode()
        status = process.wait(timeout=60)
    assert "Traceback" not in errors and "BrokenPipe" not in errors
    assert status == 141


@pytest.mark.parametrize(
    "argv", [["serve", "--upstream", "http://127.0.0.1:9"], ["mock-backend"]], ids=str
)
def test_an_empty_host_is_refused_naming_the_flag(argv: list[str]) -> None:
    """uvicorn would take an empty host for every interface, unasked."""
    done = obleth(*argv, "--host", "")
    assert done.returncode == 2
    assert "argument --host: an empty host" in done.stderr


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8080"),
        ("localhost", "http://localhost:8080"),
        ("::1", "http://[::1]:8080"),
        ("::", "http://[::]:8080"),
    ],
)
def test_the_address_a_server_announces_is_one_a_client_can_use(host: str, url: str) -> None:
    """``obleth serve --host ::1`` announced ``http://::1:8080``, which no client reads as
    a URL; an IPv6 address goes in brackets."""
    assert listen_url(host, 8080) == url
