"""docs/simulate.md shows real output: every ``obleth simulate`` command in its console
blocks that is followed by output prints exactly that output today."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from gateway.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "simulate.md"


def shown() -> list[tuple[str, str, int]]:
    """Each command of the page's console blocks with the output shown after it and the
    status it shows (``$ echo $?``, else 0); commands shown without output are left out."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", DOC.read_text(), flags=re.S):
        lines = block.splitlines(keepends=True)
        i = 0
        while i < len(lines):
            command = lines[i]
            i += 1
            output = []
            while i < len(lines) and not lines[i].startswith("$ "):
                output.append(lines[i])
                i += 1
            status = 0
            if i + 1 < len(lines) and lines[i] == "$ echo $?\n":
                status = int(lines[i + 1])
                i += 2
            text = "".join(output).rstrip("\n")  # a blank line between commands is layout
            if command.startswith("$ obleth simulate") and text:
                found.append((command[2:].strip(), text + "\n", status))
    return found


@pytest.mark.parametrize(("command", "output", "status"), shown(), ids=lambda v: str(v)[:60])
def test_the_page_shows_what_the_command_prints(command: str, output: str, status: int) -> None:
    argv = shlex.split(command)[1:]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == status
    assert (out.getvalue() if status == 0 else err.getvalue()) == output


def test_the_page_shows_output_for_the_tutorial() -> None:
    """The check above has something to check: the tutorial's runs, a sweep, bad input."""
    commands = [command for command, _, _ in shown()]
    assert len(commands) >= 8
    assert any("--sweep" in c for c in commands)
    assert any(status == 2 for _, _, status in shown())
