"""The flags every command that runs a server shares: where it listens and what it logs."""

from __future__ import annotations

import argparse
import errno
import socket

#: how long a stopping server command lets the requests in progress finish (uvicorn's
#: graceful shutdown); under ``obleth serve --workers`` the parent waits that and a
#: little more
GRACEFUL_S = 30


def add_server_flags(parser: argparse.ArgumentParser, *, port: int) -> None:
    """``--host``, ``--port`` (default ``port``), ``--log-level`` and ``--access-log``."""
    parser.add_argument(
        "--host", type=listen_host, default="127.0.0.1", help="interface to listen on"
    )
    parser.add_argument("--port", type=tcp_port, default=port, help="TCP port to listen on")
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


def listen_host(text: str) -> str:
    """An interface to listen on; an empty one is refused (uvicorn would take it for every
    interface, unasked: write 0.0.0.0 for that)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty host; give an address, or 0.0.0.0 for all")
    return text.strip()


def tcp_port(text: str) -> int:
    """A port to listen on, 1 to 65535; argparse reports anything else against the flag
    (a server asked for port 70000 would otherwise announce it and stop at once)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a port number from 1 to 65535")
    return port


def worker_count(text: str) -> int:
    """How many processes serve: a whole number, at least 1."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a whole number of processes, 1 or more"
        )
    return count


def listen_url(host: str, port: int) -> str:
    """``http://host:port`` as a client writes it: an IPv6 address in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def cannot_listen(command: str, host: str, port: int, flag: str, error: OSError) -> str:
    """The one line a server command prints when it cannot listen on ``host:port``: what
    failed, and the flag to change (``flag`` for a taken port, ``--host`` for a name that
    does not resolve or an address this machine does not have)."""
    fix = f"give {flag} a port that is free"
    if isinstance(error, socket.gaierror):  # the name, not the port
        fix = "give --host an address or a name this machine resolves"
    elif error.errno == errno.EADDRNOTAVAIL:  # an address of another machine
        fix = "give --host an address of this machine (127.0.0.1, 0.0.0.0, or one it has)"
    elif error.errno in (errno.EMFILE, errno.ENFILE):  # out of descriptors, not of ports
        fix = "raise the limit on open files (ulimit -n)" + (
            ", or give --workers fewer" if command == "serve" else ""
        )
    return f"obleth {command}: cannot listen on {host}:{port}: {error.strerror or error}; {fix}"
