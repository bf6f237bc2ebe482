"""``obleth serve`` bounds each request's line and headers in size (431) and in time (408),
against a real ``obleth serve`` process spoken to over raw sockets."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.errors import ConfigError
from gateway.loopback import serve_in_thread
from gateway.settings import Settings
from tests.cluster.pods import ServePod
from tests.proxy.rawhttp import Answer, connect, read_answer, request_head, send_and_read
from tests.proxy.upstreams import WAIT_S, Echo

MAX = 64 * 1024
"""The default ``max_header_bytes``, which the pod runs with."""

HEADER_TIMEOUT_S = 1.0
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def echo() -> Iterator[tuple[str, Echo]]:
    app = Echo()
    with serve_in_thread(app, lifespan="off") as server:
        yield server.url, app


@pytest.fixture(scope="module")
def pod(echo: tuple[str, Echo]) -> Iterator[ServePod]:
    """``obleth serve`` in front of the echoing upstream, with a 1 s header timeout,
    returned once it routes (its upstream is healthy)."""
    env = {"OBLETH_CLIENT_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S)}
    with ServePod([echo[0]], env=env, name="bounded") as serving:
        for _ in range(int(WAIT_S / 0.02)):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{serving.url}/readyz", trust_env=False).status_code == 200:
                    break
            time.sleep(0.02)
        else:
            pytest.fail(f"the pod never saw its upstream healthy:\n{serving.log_tail()}")
        yield serving


def head_of_size(size: int, tag: str) -> bytes:
    """A GET whose request line and headers take exactly ``size`` bytes."""
    bare = request_head("/version", ("x-test-id", tag), ("x-pad", ""), ("connection", "close"))
    return bare.replace(b"x-pad: ", b"x-pad: " + b"p" * (size - len(bare)))


@pytest.mark.parametrize(("size", "status"), [(MAX, 200), (MAX + 1, 431)])
def test_a_head_over_the_bound_is_answered_431_and_one_at_the_bound_is_forwarded(
    pod: ServePod, echo: tuple[str, Echo], size: int, status: int
) -> None:
    """The bound is exact: a head of max_header_bytes goes through; one byte more is
    answered 431 with an OpenAI-style JSON error, the connection is closed, and the
    upstream never sees the request."""
    tag = f"size-{size}"
    answer = send_and_read(pod.url, head_of_size(size, tag))
    assert answer.status == status, answer.raw[:300]
    assert answer.closed
    assert (tag in echo[1].received) == (status == 200)
    if status == 431:
        assert answer.headers["content-type"] == "application/json"
        assert answer.error_code() == "headers_too_large"
        assert "max_header_bytes" in answer.json()["error"]["message"]


def test_a_large_body_behind_small_headers_is_forwarded(
    pod: ServePod, echo: tuple[str, Echo]
) -> None:
    """Only the head counts: a 2 MiB body sent in the same write as its headers (so that
    the first read holds both) reaches the upstream whole."""
    body = b"b" * (2 * MiB)
    head = request_head(
        "/v1/upload",
        ("content-type", "application/octet-stream"),
        ("content-length", str(len(body))),
        ("connection", "close"),
        method="POST",
    )
    answer = send_and_read(pod.url, head + body)
    assert answer.status == 200, answer.raw[:300]
    assert answer.json()["body_bytes"] == len(body)


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_unfinished_heads_are_cut_off_without_being_buffered(pod: ServePod) -> None:
    """Ten connections each sending 4 MiB of a header that never ends are each answered
    431 and closed, and the server's memory hardly moves (unbounded, it kept all 40 MiB)."""
    assert pod.pid is not None
    for _ in range(3):  # the process's own allocations settle on its first requests
        httpx.get(f"{pod.url}/healthz", trust_env=False).raise_for_status()
    before = vm_rss_kib(pod.pid)
    unfinished = request_head("/version").removesuffix(b"\r\n") + b"x-huge: "
    sockets = [connect(pod.url) for _ in range(10)]
    try:
        for sock in sockets:
            with contextlib.suppress(OSError):  # a reset: cut off while still sending
                sock.sendall(unfinished + b"h" * (4 * MiB))
        grown_kib = vm_rss_kib(pod.pid) - before
        answers = [read_answer(sock) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
    assert grown_kib < 8 * 1024, f"RSS grew by {grown_kib} KiB for 10 unfinished heads"
    for answer in answers:
        assert answer.closed, "a connection holding an unfinished head was left open"
        assert answer.status in (431, None), answer.raw[:300]  # None: reset before reading


def trickle_head(url: str, line_every_s: float, lines: int) -> tuple[Answer, int]:
    """Send a request line, then one header line every ``line_every_s`` (at most
    ``lines`` of them) until the server answers or closes; the answer, and how many header
    lines the server took before it did."""
    with connect(url) as sock:
        sock.sendall(b"GET /version HTTP/1.1\r\n")
        sock.settimeout(line_every_s)
        sent = 0
        for i in range(lines):
            try:
                first = sock.recv(65536)
            except TimeoutError:
                with contextlib.suppress(OSError):
                    sock.sendall(f"x-line-{i}: still coming\r\n".encode())
                    sent += 1
                continue
            except OSError:
                first = b""
            sock.settimeout(WAIT_S)
            rest = read_answer(sock) if first else Answer(b"", closed=True)
            return Answer(first + rest.raw, rest.closed), sent
        return Answer(b"", closed=False), sent


def test_a_client_trickling_its_headers_is_answered_408_and_closed(pod: ServePod) -> None:
    """A slowloris client, one header line every 0.1 s, is answered 408 with a JSON error
    once the header timeout has passed since it connected, and its connection closed."""
    answer, sent = trickle_head(pod.url, line_every_s=0.1, lines=int(WAIT_S / 0.1))
    assert answer.status == 408, answer.raw[:300]
    assert answer.closed
    assert answer.error_code() == "header_timeout"
    # the server kept reading the trickle for a while: no answer before the head stalled
    assert sent >= 3


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
    pod: ServePod,
) -> None:
    """An idle new connection holds no slot for ever: it is closed, without an answer,
    since nothing was asked."""
    with connect(pod.url) as sock:
        answer = read_answer(sock)
    assert answer.closed
    assert answer.raw == b""


@pytest.mark.parametrize(
    "head",
    [
        b"GARBAGE /v1/models\r\n\r\n",  # no HTTP version
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",  # space in a name
        # a method the parser knows, with no version: httptools reads it as HTTP/0.9
        b"POST /v1/completions\r\n\r\n",
        b"GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n",  # HTTP/2 is not spoken as text
    ],
    ids=["request-line", "header-name", "no-version", "http-2"],
)
def test_bytes_that_are_no_http_request_get_a_json_400_and_a_closed_connection(
    pod: ServePod, echo: tuple[str, Echo], head: bytes
) -> None:
    """A head the parser cannot read is answered 400 with the gateway's OpenAI-style JSON
    error, as its other refusals are (not the server's plain text), the connection is
    closed, and nothing reaches the upstream."""
    before = len(echo[1].received)
    answer = send_and_read(pod.url, head)
    assert answer.status == 400, answer.raw[:300]
    assert answer.closed
    assert answer.headers["content-type"] == "application/json"
    assert answer.error_code() == "invalid_http"
    assert len(echo[1].received) == before


def test_a_bound_below_one_kibibyte_is_a_config_error_naming_the_setting() -> None:
    """max_header_bytes must leave room for a request line and ordinary headers; the
    error names the variable as the user wrote it."""
    with pytest.raises(ConfigError, match=r"OBLETH_MAX_HEADER_BYTES.*at least 1024"):
        Settings.from_env({"OBLETH_MAX_HEADER_BYTES": "512"})
    with pytest.raises(ConfigError, match=r"client_header_timeout_s.*above 0"):
        Settings(client_header_timeout_s=0)
    assert Settings().max_header_bytes == MAX


def test_a_body_whose_chunked_framing_breaks_closes_the_connection_without_an_answer(
    pod: ServePod,
) -> None:
    """A chunk size that is no number, in a request being read: the connection closes,
    as docs/routing.md says. The server's plain-text 400 was written instead, and into
    the stream of a response already under way when there was one."""
    head = request_head(
        "/v1/completions", ("transfer-encoding", "chunked"), ("x-test-id", "broken"), method="POST"
    )
    answer = send_and_read(pod.url, head + b"5\r\nhello\r\nzz\r\n")
    assert answer.closed and answer.raw == b"", answer.raw[:300]
