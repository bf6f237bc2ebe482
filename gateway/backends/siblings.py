"""Sibling processes: others that serve this process's listening sockets, each with an
in-process budget of its own.

``uvicorn --workers N`` and gunicorn bind the listening socket in a parent and start the
workers with it, so when a worker's gateway starts it already holds the socket, shared
with every other worker. A single ``uvicorn app:app`` binds only after its startup, so it
holds none then (an app started without lifespan starts its gateway on the first request,
alone on its socket all the same).

Each in-process gateway claims the listening sockets its process holds: for each address
it takes a shared POSIX record lock (``fcntl.lockf``) on
``<tempdir>/obleth-<uid>/listen-<address>-<hash>.lock`` and keeps it until released (the
last process to release a file removes it). Which other processes hold a lock on the same
file, the kernel tells in ``/proc/locks``; a process that dies drops its locks with it, so
a crashed worker is never reported, and one that has closed the socket (an old worker
draining in a graceful reload) is not counted either. Record locks belong to the process,
so several gateways of one process never see each other.

Linux only (``/proc``); elsewhere, and whenever the look fails with an ``OSError``, the
claim is empty and nobody is reported. Blocking file I/O, a few milliseconds: for startup
and for operators, never for the request path.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

try:
    import fcntl
except ImportError:  # not a POSIX system
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("obleth")

PROC = Path("/proc")
_LOCK_TOKEN = re.compile(r"^[0-9a-f]+:[0-9a-f]+:\d+$")
"""``major:minor:inode`` as ``/proc/locks`` names a locked file."""
_ATTEMPTS = 5
"""How often a claim opens a lock file that another process is removing, before it gives
up on that address."""
_TCP_CLOSE = 7
"""Linux's ``TCP_CLOSE``: the state of a TCP socket bound but neither listening nor
connected (``include/net/tcp_states.h``)."""


def listening_sockets() -> dict[str, frozenset[int]]:
    """The TCP and UNIX stream sockets this process holds to serve on, by address (sorted):
    ``127.0.0.1:8000``, ``[::]:8000``, ``unix:/run/app.sock``, each with the inode numbers
    of its sockets (one, unless ``SO_REUSEPORT`` bound several to the address).

    A socket counts when it listens, and also when it is bound and neither listening nor
    connected yet: ``uvicorn --workers`` hands its workers the socket so, and the first
    worker calls ``listen()`` only after its own startup. Empty where ``/proc/self/fd`` is
    missing; descriptors that close while they are looked at are skipped.
    """
    try:
        names = os.listdir(PROC / "self" / "fd")
    except OSError:
        return {}
    found: dict[str, set[int]] = {}
    for name in names:
        try:
            fd = int(name)
            info = os.fstat(fd)
            address = _server_address(fd) if stat.S_ISSOCK(info.st_mode) else None
        except (OSError, ValueError):
            continue
        if address is not None:
            found.setdefault(address, set()).add(info.st_ino)
    return {address: frozenset(found[address]) for address in sorted(found)}


def _server_address(fd: int) -> str | None:
    # a socket object of our own over a duplicate: closing it leaves ``fd`` untouched
    with socket.socket(fileno=os.dup(fd)) as sock:
        if sock.type != socket.SOCK_STREAM or not _waits_for_clients(sock):
            return None
        name = sock.getsockname()
        if sock.family == socket.AF_INET and name[1]:
            return f"{name[0]}:{name[1]}"
        if sock.family == socket.AF_INET6 and name[1]:
            return f"[{name[0]}]:{name[1]}"
        if sock.family == socket.AF_UNIX and name:
            path = name.decode(errors="backslashreplace") if isinstance(name, bytes) else name
            return "unix:" + path.replace("\0", "@")  # "@" marks an abstract socket
    return None


def _waits_for_clients(sock: socket.socket) -> bool:
    """Listening, or bound for it: not connected, nor connecting (a client's socket)."""
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return True
    if sock.family in (socket.AF_INET, socket.AF_INET6) and hasattr(socket, "TCP_INFO"):
        # the first byte of struct tcp_info is the state; a client's socket is past CLOSE
        state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
        if state != _TCP_CLOSE:
            return False
    try:
        sock.getpeername()
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


@dataclass
class Siblings:
    """This process's claim on the listening sockets it held when it was made.

    ``addresses`` are the sockets claimed (empty when none were held, or on a platform
    where nothing can be found). The claim lasts until ``release()``, also when the
    gateway that made it has no requests.
    """

    addresses: tuple[str, ...] = ()
    _paths: list[str] = field(default_factory=list, repr=False)
    _sockets: frozenset[int] = field(default=frozenset(), repr=False)

    def pids(self) -> tuple[int, ...]:
        """The other live processes that claim one of these sockets and still hold it now,
        sorted.

        Each in-process gateway of those processes holds a claim; a process that exited
        or released its claim is not listed, nor one that has closed the socket (an old
        worker finishing its requests in a graceful reload). Reads ``/proc``: empty when
        it cannot.
        """
        if not self._paths:
            return ()
        try:
            claimants = _LOCK_FILES.holders(self._paths) - {os.getpid()}
        except OSError as exc:
            log.debug("could not read which processes share the listening sockets: %s", exc)
            return ()
        return tuple(sorted(pid for pid in claimants if _holds_any(pid, self._sockets)))

    def release(self) -> None:
        """Give the claim up (once; later calls do nothing)."""
        paths, self._paths = self._paths, []
        _LOCK_FILES.release(paths)


def _holds_any(pid: int, sockets: frozenset[int]) -> bool:
    """Whether process ``pid`` has one of these sockets (by inode) open. True when its
    descriptors cannot be read: better a needless warning than a missed one."""
    links = {f"socket:[{inode}]" for inode in sockets}
    descriptors = PROC / str(pid) / "fd"
    try:
        names = os.listdir(descriptors)
    except FileNotFoundError:
        return False  # it has exited since
    except OSError:
        return True
    for name in names:
        with contextlib.suppress(OSError):
            if os.readlink(descriptors / name) in links:
                return True
    return False


def claim_listening_sockets() -> Siblings:
    """Claim every listening socket this process holds, until ``release()``.

    Never raises ``OSError``: a socket, directory or lock that cannot be used is logged at
    debug level and left out, so that nothing here can stop a gateway from starting.
    """
    if fcntl is None:
        return Siblings()
    sockets = listening_sockets()
    if not sockets:
        return Siblings()
    try:
        directory = _lock_directory()
    except OSError as exc:
        log.debug("not looking for processes sharing %s: %s", ", ".join(sockets), exc)
        return Siblings()
    namespace = _network_namespace()
    claimed: list[str] = []
    paths: list[str] = []
    inodes: set[int] = set()
    for address, sockets_there in sockets.items():
        path = str(directory / _lock_file_name(address, namespace))
        try:
            _LOCK_FILES.acquire(path)
        except OSError as exc:
            log.debug("could not claim listening socket %s with %s: %s", address, path, exc)
            continue
        claimed.append(address)
        paths.append(path)
        inodes |= sockets_there
    return Siblings(tuple(claimed), paths, frozenset(inodes))


def _lock_directory() -> Path:
    """``<tempdir>/obleth-<uid>``, created private; refused unless it is ours alone (the
    temporary directory is everyone's: another user could have put something there)."""
    uid = os.getuid()
    directory = Path(tempfile.gettempdir()) / f"obleth-{uid}"
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o077:
        raise PermissionError(f"{directory} is not a directory private to user {uid}")
    return directory


def _network_namespace() -> str:
    """Which network namespace this process is in: the same address in two containers
    names two sockets."""
    try:
        return os.readlink(PROC / "self" / "ns" / "net")
    except OSError:
        return ""


def _lock_file_name(address: str, namespace: str) -> str:
    """``listen-127.0.0.1-8000-<hash>.lock``: readable, and unique through the hash."""
    readable = re.sub(r"[^A-Za-z0-9.]+", "-", address).strip("-")[:48]
    digest = hashlib.sha256(f"{namespace}\n{address}".encode()).hexdigest()[:12]
    return f"listen-{readable}-{digest}.lock"


@dataclass
class _Held:
    fd: int
    token: str
    claims: int = 1


class _LockFiles:
    """The lock files this process holds, each opened once and counted.

    A POSIX record lock belongs to the process, and closing *any* descriptor of the file
    drops it: a second gateway opening the file on its own, then closing it, would drop
    the first gateway's claim. So the process keeps one descriptor per file, shared by its
    claims, and closes it with the last one. A forked child holds no locks, and forgets
    the parent's (``os.register_at_fork``).
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held: dict[str, _Held] = {}

    def acquire(self, path: str) -> None:
        with self._mutex:
            held = self._held.get(path)
            if held is not None:
                held.claims += 1
                return
            for attempt in range(_ATTEMPTS):
                fd = _open_shared(path)
                if fd is not None:
                    break
                time.sleep(0.001 * (attempt + 1))  # another process is removing the file
            else:
                raise BlockingIOError(f"{path} was being removed at each of {_ATTEMPTS} tries")
            try:
                token = _lock_token(fd)
            except BaseException:
                os.close(fd)
                raise
            self._held[path] = _Held(fd, token)

    def release(self, paths: Iterable[str]) -> None:
        with self._mutex:
            for path in paths:
                held = self._held.get(path)
                if held is None:
                    continue
                held.claims -= 1
                if held.claims == 0:
                    del self._held[path]
                    _close_removing_if_alone(path, held.fd)

    def holders(self, paths: Iterable[str]) -> set[int]:
        """The pids holding a POSIX lock on any of ``paths`` (this process's included)."""
        with self._mutex:
            tokens = {self._held[path].token for path in paths if path in self._held}
        if not tokens:
            return set()
        pids = set()
        with (PROC / "locks").open() as locks:
            for line in locks:
                fields = line.split()
                # "->" marks a waiter; flock and open-file-description locks are not ours
                if "->" in fields or "POSIX" not in fields:
                    continue
                for i, token in enumerate(fields[1:], start=1):
                    if token in tokens and fields[i - 1].isdigit():
                        pids.add(int(fields[i - 1]))
        return pids

    def forget(self) -> None:
        """In a forked child: the locks stayed with the parent; close our copies."""
        self._mutex = threading.Lock()
        held, self._held = self._held, {}
        for entry in held.values():
            _close_quietly(entry.fd)


def _open_shared(path: str) -> int | None:
    """``path`` opened and share-locked; None when another process was removing it
    meanwhile (see ``_close_removing_if_alone``), so that the caller opens it afresh."""
    assert fcntl is not None
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        # shared: every claimant holds one at once; only a remover holds it exclusively
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        if os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False)):
            return fd
    except (BlockingIOError, PermissionError, FileNotFoundError):
        pass  # EAGAIN or EACCES: held exclusively; ENOENT: removed since we opened it
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def _close_removing_if_alone(path: str, fd: int) -> None:
    """Close our last descriptor of ``path``, removing the file first when no other process
    holds it, so that lock files do not pile up. The exclusive lock proves nobody else
    holds the file, and keeps a newcomer out until it is gone; the newcomer then finds
    it removed and opens a fresh one."""
    assert fcntl is not None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False)):
            os.unlink(path)
    except OSError:
        pass  # held by another process (or already gone): it stays theirs
    _close_quietly(fd)


def _lock_token(fd: int) -> str:
    """How ``/proc/locks`` names the file under ``fd``: ``major:minor:inode``.

    Taken from the kernel's own line for our lock in ``/proc/self/fdinfo`` where there is
    one: on overlay file systems ``fstat`` can name the file differently.
    """
    pid = str(os.getpid())
    with contextlib.suppress(OSError):
        text = (PROC / "self" / "fdinfo" / str(fd)).read_text()
        for line in text.splitlines():
            fields = line.split()
            if fields[:1] == ["lock:"] and pid in fields:
                for token in fields:
                    if _LOCK_TOKEN.match(token):
                        return token
    info = os.fstat(fd)
    return f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError as exc:
        log.debug("could not close lock file descriptor %d: %s", fd, exc)


_LOCK_FILES = _LockFiles()
"""Process-wide, as the record locks it tracks are."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_LOCK_FILES.forget)
