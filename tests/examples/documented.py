"""The commands an example's docstring tells a user to run, run as written.

A command is a docstring line (continued by a trailing backslash) made of ``NAME=value``
settings followed by ``uvicorn`` or ``gunicorn``. ``Documented`` starts it from the
repository's root, the server run as ``python -m <server>`` of this interpreter, with only
the address added (``--host/--port`` or ``--bind``) on a free port of 127.0.0.1.
"""

from __future__ import annotations

import ast
import re
import shlex
import sys
from pathlib import Path

from tests.cluster.pods import HOST, REPO_ROOT, _Server

SERVERS = ("uvicorn", "gunicorn")
_COMMAND = re.compile(r"^(?:[A-Z][A-Z0-9_]*=\S+\s+)*(?:" + "|".join(SERVERS) + r")\s")


def commands_of(path: Path) -> list[str]:
    """The server commands in the module docstring of ``path``, continuations joined."""
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    joined = re.sub(r"\\\n\s*", " ", docstring)
    return [line.strip() for line in joined.splitlines() if _COMMAND.match(line.strip())]


class Documented(_Server):
    """One documented command, served; ``env`` holds the command's own settings."""

    health_path = "/healthz"

    def __init__(self, command: str) -> None:
        words = shlex.split(command)
        env = {}
        while "=" in words[0]:
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        self.command = command
        self.server, *self.args = words
        super().__init__(self.server, env=env)

    def _argv(self, port: int) -> list[str]:
        if self.server == "uvicorn":
            address = ["--host", HOST, "--port", str(port)]
        else:
            address = ["--bind", f"{HOST}:{port}"]
        return [sys.executable, "-m", self.server, *self.args, *address]


def example_path(name: str) -> Path:
    return REPO_ROOT / "examples" / name
