"""The flags every command that runs a server shares: where it listens and what it logs."""

from __future__ import annotations

import argparse


def add_server_flags(parser: argparse.ArgumentParser, *, port: int) -> None:
    """``--host``, ``--port`` (default ``port``), ``--log-level`` and ``--access-log``."""
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=port, help="TCP port to listen on")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn log level",
    )
    parser.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="log every request",
    )
