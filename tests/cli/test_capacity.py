"""``obleth capacity get|set``: the limit of a running gateway, read and changed from the
command line through a real admin API; every failure is one line and a non-zero status."""

from __future__ import annotations

import errno
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from gateway import Gateway, Settings
from gateway.admin import admin_app
from gateway.cli.server_flags import cannot_listen
from gateway.loopback import serve_in_thread
from tests.backends.dial import Dial, DialPlugin
from tests.cluster.pods import free_port

TOKEN = "cli-admin-token-0123456789"


@pytest.fixture
def admin_url() -> Iterator[tuple[str, Gateway]]:
    """An admin API over a gateway with limit 5, on a loopback port."""
    gateway = Gateway(Settings(global_max_in_flight=5, admin_token=TOKEN), entry_points=False)
    with serve_in_thread(admin_app(gateway), lifespan="off") as server:
        yield server.url, gateway


def obleth(*argv: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if token is not None:
        env["OBLETH_ADMIN_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "gateway", "capacity", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_get_and_set_print_the_limit(admin_url: tuple[str, Gateway]) -> None:
    url, gateway = admin_url
    assert obleth("get", "--url", url).stdout == "5\n"
    done = obleth("set", "40", "--url", url)
    assert (done.returncode, done.stdout) == (0, "40\n")
    assert gateway.capacity.current() == 40
    assert obleth("get", "--url", url, "--token", TOKEN, token=None).stdout == "40\n"


def test_a_token_read_from_a_file_with_its_newline_is_accepted(
    admin_url: tuple[str, Gateway],
) -> None:
    """A Kubernetes Secret mounted from a file ends with a newline; the gateway strips it
    from ``OBLETH_ADMIN_TOKEN``, and so does the command."""
    url, gateway = admin_url
    assert obleth("get", "--url", url, token=TOKEN + "\n").stdout == "5\n"
    done = obleth("set", "9", "--url", url, "--token", f" {TOKEN}\n", token=None)
    assert (done.returncode, done.stdout, done.stderr) == (0, "9\n", "")
    assert gateway.capacity.current() == 9


def test_set_prints_the_limit_in_force_and_says_when_it_is_below_the_ceiling() -> None:
    """With a computed capacity provider at 3, ``set 40`` sets the ceiling and prints the
    limit in force, as ``get`` does, with one line on stderr saying why it is lower."""
    settings = Settings(
        global_max_in_flight=5, admin_token=TOKEN, capacity_providers=("static", "dial")
    )
    gateway = Gateway(settings, plugins=[DialPlugin(Dial(3))], entry_points=False)
    with serve_in_thread(admin_app(gateway), lifespan="off") as server:
        done = obleth("set", "40", "--url", server.url)
        read = obleth("get", "--url", server.url)
    assert (done.returncode, done.stdout, read.stdout) == (0, "3\n", "3\n")
    assert done.stderr.count("\n") == 1
    assert "the ceiling is now 40; the limit in force is 3" in done.stderr
    assert gateway.provider_limits() == {"static": 40, "dial": 3}


@pytest.mark.parametrize(
    ("argv", "token", "status", "says"),
    [
        (("set", "-3"), TOKEN, 1, "422 max_in_flight: -3 is outside 0 to"),
        (("get",), "wrong-token-0123456789", 1, "401 a valid admin token is required"),
        (("get",), None, 2, "no admin token"),
        # given and blank, it is no reason to fall back on the variable, nor to say none is set
        (("get", "--token", "  "), TOKEN, 2, "--token is blank"),
        (("get", "--token", ""), TOKEN, 2, "--token is blank"),
        (("set",), TOKEN, 2, "set needs the new limit"),
        (("get",), "ü-token-0123456789", 2, "printable ASCII"),
    ],
)
def test_a_failure_is_one_line_and_a_nonzero_status(
    admin_url: tuple[str, Gateway], argv: tuple[str, ...], token: str | None, status: int, says: str
) -> None:
    url, gateway = admin_url
    done = obleth(*argv, "--url", url, token=token)
    assert done.returncode == status
    assert done.stderr.count("\n") == 1 and says in done.stderr
    assert "Traceback" not in done.stderr
    assert gateway.capacity.current() == 5


def test_nobody_listening_is_one_line() -> None:
    done = obleth("get", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "2")
    assert done.returncode == 1
    assert done.stderr.startswith("obleth capacity: ") and done.stderr.count("\n") == 1
    assert "ConnectError" in done.stderr


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--url", "http://[::1"), "--url 'http://[::1'"),
        (("--url", "notaurl"), "expected an http(s) URL"),
        (("--url", ""), "expected an http(s) URL"),
        # the API's path goes after the URL: a query used to swallow it
        (("--url", "http://127.0.0.1:9090/?q=1"), "no query or fragment"),
        # an empty one, which httpx reads as none: it used to be sent, and 404
        (("--url", "http://127.0.0.1:9090?"), "no query or fragment"),
        (("--url", "http://127.0.0.1:9090#"), "no query or fragment"),
        # httpx would send them as Basic credentials instead of the token (and the error
        # line printed the password)
        (("--url", "http://user:pw@127.0.0.1:9090"), "expected no user or password in it"),
        (("--url", "ftp://user:pw@127.0.0.1:9090"), "expected no user or password in it"),
        (("--url", "http://user:pw@[::1"), "expected no user or password in it"),
        (("--url", "http://127.0.0.1:99999"), "a port from 1 to 65535"),
        (("--timeout", "-1"), "argument --timeout"),
        (("--timeout", "nan"), "argument --timeout"),
        # past what a socket's timeout holds: this used to end in a traceback
        (("--timeout", "1e10"), "argument --timeout"),
    ],
)
def test_a_bad_url_or_timeout_is_a_usage_error_naming_the_flag(
    argv: tuple[str, ...], says: str
) -> None:
    """Caught before anything is sent: status 2, the flag named, no traceback."""
    done = obleth("get", *argv)
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr
    assert ":pw@" not in done.stderr


def test_an_answer_whose_limit_is_a_boolean_is_no_limit() -> None:
    """JSON ``true`` is an ``int`` to Python: the command printed ``True``, status 0."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b'{"max_in_flight": true}'
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    with serve_in_thread(app, lifespan="off") as server:
        done = obleth("get", "--url", server.url)
    assert done.returncode == 1
    assert "the answer holds no max_in_flight" in done.stderr and done.stdout == ""


def test_out_of_file_descriptors_says_so_not_to_change_the_port() -> None:
    """``--workers 300`` under ``ulimit -n 200`` was told to give --port a free port."""
    error = OSError(errno.EMFILE, "Too many open files")
    line = cannot_listen("serve", "127.0.0.1", 8000, "--port", error)
    assert line.endswith("raise the limit on open files (ulimit -n), or give --workers fewer")
    assert "--workers" not in cannot_listen("mock-backend", "127.0.0.1", 8000, "--port", error)
