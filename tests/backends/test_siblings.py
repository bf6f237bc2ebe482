"""Finding the other processes that serve this one's listening socket, each with an
in-process budget: with real processes that share a real socket, as workers do."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway import Gateway, Settings
from gateway.backends.memory import MemoryBackend
from gateway.backends.siblings import claim_listening_sockets, listening_sockets

HOST = "127.0.0.1"
WAIT_S = 10.0

# A second worker: inherits the listening socket (its descriptor number in argv[1]), claims
# it, says so with the addresses it claimed, then answers each line on stdin with the pids
# it sees sharing the socket; a line "close" first closes the socket, as a draining worker
# does, and "release" first gives the claim up, as a stopping gateway does.
SIBLING = """
import json, os, sys
from gateway.backends.memory import MemoryBackend
from gateway.backends.siblings import claim_listening_sockets
claim = claim_listening_sockets()
print(json.dumps(claim.addresses), flush=True)
for line in sys.stdin:
    if line.strip() == "close":
        os.close(int(sys.argv[1]))
    if line.strip() == "release":
        claim.release()
    print(json.dumps(claim.pids()), flush=True)
"""


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory of the test's own, for this process and its children, so
    that lock files of other test runs never meet these."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return tmp_path


def lock_files() -> list[Path]:
    return sorted((Path(tempfile.gettempdir()) / f"obleth-{os.getuid()}").glob("*.lock"))


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP socket listening on 127.0.0.1, as a server's parent process binds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        sock.listen()
        yield sock


def address_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()
    return f"{host}:{port}"


def read_line(child: subprocess.Popen[bytes], timeout_s: float = WAIT_S) -> str:
    """The child's next line of output; fails the test after ``timeout_s``."""
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], timeout_s)
    assert ready, f"the child (pid {child.pid}) said nothing within {timeout_s} s"
    return child.stdout.readline().decode()


def ask(child: subprocess.Popen[bytes], command: str = "") -> list[int]:
    """The pids the child sees sharing its socket, now (after ``command``, if any)."""
    assert child.stdin is not None
    child.stdin.write(f"{command}\n".encode())
    child.stdin.flush()
    pids: list[int] = json.loads(read_line(child))
    return pids


@contextlib.contextmanager
def sibling(sock: socket.socket) -> Iterator[subprocess.Popen[bytes]]:
    """A child process holding ``sock`` and its claim on it; killed and reaped on exit."""
    argv = [sys.executable, "-c", SIBLING, str(sock.fileno())]
    with subprocess.Popen(
        argv, pass_fds=[sock.fileno()], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as child:
        try:
            assert json.loads(read_line(child)) == [address_of(sock)]
            yield child
        finally:
            child.kill()


def in_process(gateway: Gateway) -> MemoryBackend:
    backend = gateway.backend
    assert isinstance(backend, MemoryBackend)
    return backend


def crash(child: subprocess.Popen[bytes]) -> None:
    """``kill -9`` the child, as a worker that crashes, and reap it."""
    child.kill()
    child.wait(timeout=WAIT_S)


def test_listening_sockets_counts_sockets_bound_to_serve_and_not_clients_or_datagrams(
    listener: socket.socket, tmp_path: Path
) -> None:
    """Listening sockets count, and bound ones not listening yet (as uvicorn hands them to
    its workers); connected and datagram sockets do not."""
    with contextlib.ExitStack() as stack:
        unix = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        unix.bind(str(tmp_path / "app.sock"))
        unix.listen()
        bound = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        bound.bind((HOST, 0))
        udp = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        udp.bind((HOST, 0))
        client = stack.enter_context(socket.create_connection(listener.getsockname()))
        wanted = {address_of(listener), address_of(bound), f"unix:{tmp_path / 'app.sock'}"}
        unwanted = {address_of(udp), address_of(client)}

        found = set(listening_sockets())

    assert wanted <= found
    assert not unwanted & found


def test_a_process_serving_the_same_socket_is_found_by_pid_from_either_side(
    listener: socket.socket,
) -> None:
    """Two processes holding one listening socket each name the other."""
    claim = claim_listening_sockets()
    try:
        with sibling(listener) as child:
            assert claim.addresses == (address_of(listener),)
            assert claim.pids() == (child.pid,)
            assert ask(child) == [os.getpid()]
    finally:
        claim.release()


def test_a_sibling_that_exits_is_no_longer_reported(listener: socket.socket) -> None:
    """A worker that exited (or crashed) drops its claim with it."""
    claim = claim_listening_sockets()
    try:
        with sibling(listener) as child:
            assert claim.pids() == (child.pid,)
            crash(child)
            assert claim.pids() == ()
    finally:
        claim.release()


def test_a_sibling_that_closed_the_socket_is_no_longer_reported(
    listener: socket.socket,
) -> None:
    """An old worker still finishing its requests in a graceful reload no longer serves the
    socket: the new worker does not count it."""
    claim = claim_listening_sockets()
    try:
        with sibling(listener) as child:
            assert claim.pids() == (child.pid,)
            assert ask(child, "close") == [os.getpid()]  # it still holds its claim
            assert claim.pids() == ()
    finally:
        claim.release()


def test_the_last_process_to_release_a_claim_removes_its_lock_file(
    listener: socket.socket,
) -> None:
    """Lock files do not pile up: the file stays while a worker holds it, then goes."""
    claim = claim_listening_sockets()
    try:
        [lock_file] = lock_files()
        assert lock_file.name.startswith(f"listen-127.0.0.1-{listener.getsockname()[1]}-")
        with sibling(listener) as child:
            claim.release()
            assert lock_file.exists()
            assert ask(child, "release") == []
            assert not lock_file.exists()
    finally:
        claim.release()


def test_claims_of_one_process_never_see_each_other(listener: socket.socket) -> None:
    """Several gateways in one process hold one budget each, but no sibling process."""
    first, second = claim_listening_sockets(), claim_listening_sockets()
    try:
        assert first.pids() == second.pids() == ()
    finally:
        first.release()
        second.release()


def test_a_second_claim_in_the_process_outlives_the_release_of_the_first(
    listener: socket.socket,
) -> None:
    """Releasing one gateway's claim leaves the process's other claim in place."""
    first, second = claim_listening_sockets(), claim_listening_sockets()
    try:
        with sibling(listener) as child:
            first.release()
            assert ask(child) == [os.getpid()]
            second.release()
            assert ask(child) == []
    finally:
        first.release()
        second.release()


@pytest.mark.anyio
async def test_an_unusable_lock_directory_never_stops_a_gateway_from_starting(
    listener: socket.socket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no lock file can be made, the gateway starts all the same and reports nobody."""
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(not_a_directory))
    gateway = Gateway(Settings(), entry_points=False)

    await gateway.start()
    try:
        assert gateway.started
        assert in_process(gateway).shared_with_pids() == ()
    finally:
        await gateway.stop()
    assert claim_listening_sockets().addresses == ()


@pytest.mark.anyio
async def test_gateway_logs_an_error_naming_redis_url_when_a_worker_shares_its_socket(
    listener: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    """The error names the other pid, the doubled limit, and redis_url as the fix."""
    gateway = Gateway(Settings(global_max_in_flight=3), entry_points=False)
    with sibling(listener) as child:
        with caplog.at_level(logging.ERROR, logger="obleth"):
            await gateway.start()
        try:
            assert in_process(gateway).shared_with_pids() == (child.pid,)
        finally:
            await gateway.stop()

    [record] = [r for r in caplog.records if r.name == "obleth" and r.levelno == logging.ERROR]
    message = record.getMessage()
    assert f"pid {child.pid} " in message and f"(pid {os.getpid()})" in message
    assert address_of(listener) in message
    assert "3 x 2 = 6" in message
    assert "redis_url (OBLETH_REDIS_URL)" in message and "one worker per pod" in message


@pytest.mark.anyio
async def test_stopped_in_process_gateway_gives_its_claim_up(listener: socket.socket) -> None:
    """Once a gateway stops, the other workers no longer count it."""
    gateway = Gateway(Settings(), entry_points=False)
    await gateway.start()
    try:
        with sibling(listener) as child:
            assert ask(child) == [os.getpid()]
            await gateway.stop()
            assert ask(child) == []
    finally:
        await gateway.stop()
