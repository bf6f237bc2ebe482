"""The `obleth` command line: one module per command, each registering a subparser."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from gateway import __version__
from gateway.cli import capacity, demo, mock_backend, plugins, serve, simulate
from gateway.cli.defaults import DefaultsShown
from gateway.errors import OblethError

COMMANDS = (capacity, demo, mock_backend, plugins, serve, simulate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="obleth",
        description="Admission control, fair queueing and routing for LLM inference services.",
        epilog="obleth COMMAND --help tells what a command does and lists its options.",
        formatter_class=DefaultsShown,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code. Without a
    command, the help goes to stdout and the status is 0: asking for nothing is asking
    what there is."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        code: int = args.run(args)
    except OblethError as exc:
        print(f"obleth: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`obleth demo | head`, `obleth plugins --json | head -1`):
        # stop quietly, and keep what is still buffered for it from failing again at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code
