"""``--results-path`` naming a named pipe: the records reach its reader."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from tests.simulate.test_cli import obleth_simulate


def test_a_named_pipe_gets_every_record(tmp_path: Path) -> None:
    """The up-front check that the path can be written opened the pipe and closed it: its
    reader took that for the end and left, and the command then waited for good to write
    the records."""
    pipe = tmp_path / "records"
    os.mkfifo(pipe)
    lines: list[str] = []

    def read() -> None:
        with open(pipe, encoding="utf-8") as source:
            lines.extend(source)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    done = obleth_simulate("--num-requests=5", f"--results-path={pipe}")
    reader.join(30)
    assert done.returncode == 0, done.stderr
    assert len(lines) == 5


def test_a_folder_is_refused_before_the_run(tmp_path: Path) -> None:
    """A folder cannot take the records: refused with status 2 naming the flag, before a
    run whose results would be lost."""
    done = obleth_simulate("--num-requests=5", f"--results-path={tmp_path}")
    assert done.returncode == 2
    assert "--results-path" in done.stderr and "a writable file" in done.stderr
