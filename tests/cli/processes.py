"""What ``/proc`` says about a process tree and its connections, for the tests of
``obleth serve --workers``: a process's children, and which process accepted a connection.
Linux only."""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent pid; None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """The process exists and is no zombie (an exited child its parent has not reaped)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``."""
    found = set()
    for entry in os.listdir(PROC):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[1] == pid and stat[0] != "Z":
                found.add(int(entry))
    return found


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        below = set().union(*(children(p) for p in frontier)) - found
        found |= below
        frontier = below
    return found


def command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


def _accepted_inode(client: socket.socket) -> int | None:
    """The inode of the socket the server side holds for ``client``'s TCP connection (an
    IPv4 loopback one), from ``/proc/net/tcp``; None while it is not accepted yet."""
    client_port = client.getsockname()[1]
    server_port = client.getpeername()[1]
    for line in (PROC / "net" / "tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], int(fields[9])
        if (
            int(local.rpartition(":")[2], 16) == server_port
            and int(remote.rpartition(":")[2], 16) == client_port
            and inode
        ):
            return inode
    return None


def holder(client: socket.socket, candidates: set[int]) -> int | None:
    """Which of ``candidates`` (pids) accepted ``client``'s connection, if one did."""
    inode = _accepted_inode(client)
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in candidates:
        with contextlib.suppress(OSError):
            for fd in os.listdir(PROC / str(pid) / "fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(PROC / str(pid) / "fd" / fd) == target:
                        return pid
    return None


def connections_by_holder(
    host: str, port: int, candidates: set[int], *, each: int, attempts: int = 400
) -> dict[int, list[http.client.HTTPConnection]]:
    """``each`` kept-alive HTTP connections to ``host:port`` accepted by every one of
    ``candidates``: connections are opened (and used once, ``GET /healthz``, so that the
    server has surely accepted them) until each candidate holds ``each``, or ``attempts``
    were made. Surplus connections are closed; the caller closes the ones returned."""
    held: dict[int, list[http.client.HTTPConnection]] = {pid: [] for pid in candidates}
    for _ in range(attempts):
        if all(len(c) >= each for c in held.values()):
            break
        connection = http.client.HTTPConnection(host, port, timeout=30)
        connection.request("GET", "/healthz")
        connection.getresponse().read()
        assert connection.sock is not None
        pid = holder(connection.sock, candidates)
        if pid is not None and len(held[pid]) < each:
            held[pid].append(connection)
        else:
            connection.close()
    return held


def exit_with(status: int, slot: int, sockets: list[socket.socket]) -> None:
    """A worker target (``gateway.server.workers.Workers``) that exits at once with
    ``status``: a crash, or with 3 a failed startup."""
    os._exit(status)
