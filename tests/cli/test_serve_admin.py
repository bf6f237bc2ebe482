"""``obleth serve --admin-port``: the admin API on a listener of its own, beside the
gateway's port, in a real ``obleth serve`` process: with the probes and the same bounds on
slow clients as the gateway's port, and a clean stop when it cannot listen."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest

from tests.cluster.pods import HOST, ServePod, free_port

TOKEN = "serve-admin-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
NOWHERE = "http://127.0.0.1:9"  # an upstream nobody answers: the admin API needs none


def test_serve_answers_the_admin_api_on_its_own_port() -> None:
    """With a token, the limit is read and changed on the admin port; the gateway's port
    does not serve the admin API."""
    admin_port = free_port()
    pod = ServePod(
        [NOWHERE],
        args=("--max-in-flight", "7", "--admin-port", str(admin_port)),
        env={"OBLETH_ADMIN_TOKEN": TOKEN},
        name="serve-admin",
    )
    with pod, httpx.Client(trust_env=False, timeout=5) as http:
        admin = f"http://127.0.0.1:{admin_port}/api/v1/capacity"
        assert http.get(admin, headers=BEARER).json() == {"max_in_flight": 7}
        changed = http.put(admin, headers=BEARER, json={"max_in_flight": 12})
        assert changed.json() == {"max_in_flight": 12, "ceiling": 12}
        assert http.get(admin, headers=BEARER).json() == {"max_in_flight": 12}
        assert http.get(admin).status_code == 401
        assert http.get(f"{pod.url}/api/v1/capacity", headers=BEARER).status_code != 200


def test_without_a_token_serve_opens_no_admin_port() -> None:
    admin_port = free_port()
    pod = ServePod([NOWHERE], args=("--admin-port", str(admin_port)), name="serve-no-admin")
    with pod, httpx.Client(trust_env=False, timeout=2) as http:
        assert http.get(f"{pod.url}/healthz").status_code == 200
        try:
            http.get(f"http://127.0.0.1:{admin_port}/api/v1/capacity")
        except httpx.ConnectError:
            return
        raise AssertionError("the admin port answered, though no token is set")


def _whole_answer(port: int, sent: bytes) -> bytes:
    """What the server at ``port`` answers to ``sent`` (a request it never gets whole),
    read until it closes the connection; the socket timeout only bounds a hang."""
    received = b""
    with socket.create_connection((HOST, port), timeout=30) as sock:
        sock.sendall(sent)
        for _ in range(100):
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
    return received


def test_the_admin_port_answers_the_probes_and_cuts_off_slow_clients() -> None:
    """The admin port answers /healthz and /readyz as the gateway's port does, and bounds
    slow clients as it does: a request head that stops half-way gets 408 header_timeout,
    a PUT body that pauses gets 408 body_timeout and changes nothing."""
    admin_port = free_port()
    pod = ServePod(
        [NOWHERE],
        args=("--max-in-flight", "7", "--admin-port", str(admin_port)),
        env={
            "OBLETH_ADMIN_TOKEN": TOKEN,
            "OBLETH_CLIENT_HEADER_TIMEOUT_S": "1",
            "OBLETH_CLIENT_BODY_TIMEOUT_S": "1",
        },
        name="serve-admin-bounds",
    )
    with pod, httpx.Client(trust_env=False, timeout=5) as http:
        admin = f"http://{HOST}:{admin_port}"
        assert http.get(f"{admin}/healthz").json() == {"status": "alive"}
        ready, gateway_ready = http.get(f"{admin}/readyz"), http.get(f"{pod.url}/readyz")
        assert ready.status_code == gateway_ready.status_code == 503  # nothing healthy at :9
        assert ready.json()["not_ready"] == gateway_ready.json()["not_ready"]
        head = _whole_answer(admin_port, b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\n")
        assert head.startswith(b"HTTP/1.1 408 ") and b"header_timeout" in head
        put = (
            b"PUT /api/v1/capacity HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: 30\r\n\r\n{"
        )
        body = _whole_answer(admin_port, put)
        assert body.startswith(b"HTTP/1.1 408 ") and b"body_timeout" in body
        assert http.get(f"{admin}/api/v1/capacity", headers=BEARER).json() == {"max_in_flight": 7}
        # and the API's document says so, for a client generated from it
        paths = http.get(f"{admin}/api/v1/openapi.json").json()["paths"]
        assert "408" in paths["/api/v1/status"]["get"]["responses"]
        assert "408" in paths["/api/v1/capacity"]["put"]["responses"]


def test_an_admin_port_in_use_stops_serve_with_one_line_naming_the_flag() -> None:
    """Both ports are bound before anything is served: a taken admin port is one line
    naming ``--admin-port`` and uvicorn's startup-failure status, no traceback."""
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        admin_port = taken.getsockname()[1]
        done = serve_process("--port", str(free_port()), "--admin-port", str(admin_port))
    assert done.returncode == 3
    assert done.stderr == (
        f"obleth serve: cannot listen on {HOST}:{admin_port}: Address already in use; "
        "give --admin-port a port that is free\n"
    )


@pytest.mark.parametrize(
    ("host", "fix"),
    [
        # .invalid never resolves (RFC 6761)
        ("nosuch.invalid", "give --host an address or a name this machine resolves"),
        # TEST-NET-1 (RFC 5737) is no address of this machine: it used to blame --port
        ("192.0.2.1", "give --host an address of this machine"),
    ],
    ids=["unresolved", "not-ours"],
)
def test_a_host_that_cannot_be_listened_on_is_one_line_naming_host(host: str, fix: str) -> None:
    """Not ``--port``: the host is what cannot be listened on."""
    done = serve_process("--port", str(free_port()), "--host", host)
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert fix in done.stderr and "--port" not in done.stderr


def test_the_gateway_and_the_admin_api_on_one_port_are_refused() -> None:
    """Naming both flags, before anything is built or bound (status 2)."""
    port = str(free_port())
    done = serve_process("--port", port, "--admin-port", port)
    assert done.returncode == 2
    assert done.stderr.startswith(f"obleth: --admin-port={port}: the same port as --port ({port})")
    assert done.stderr.count("\n") == 1
    assert "give --port and --admin-port different ports" in done.stderr


def serve_process(*argv: str) -> subprocess.CompletedProcess[str]:
    """``obleth serve`` with the admin API on, in a process of its own, for a command line
    it refuses at once; the timeout only bounds one that serves instead."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--upstream", NOWHERE, "--host", HOST, *argv],
        env={"PATH": "/usr/bin:/bin", "OBLETH_ADMIN_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=60,
    )
