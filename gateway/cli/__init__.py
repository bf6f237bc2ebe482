"""The `obleth` command line: one module per command, each registering a subparser."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gateway.cli import capacity, demo, mock_backend, plugins, serve
from gateway.errors import OblethError

COMMANDS = (capacity, demo, mock_backend, plugins, serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="obleth",
        description="Admission control, fair queueing and routing for LLM inference services.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except OblethError as exc:
        print(f"obleth: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code
