"""What a WSGI request that is not well-formed gets, as an ASGI one does: a JSON body the
client cut short is never admitted on a partial prompt and counts ``abandoned``; one whose
``Content-Length`` is over the bound is refused unread; a repeated classification header
counts by its last value, though WSGI servers join repeated headers with commas.

Served by the standard library's threaded server and driven over raw sockets."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from gateway import Classification, Settings, hookimpl
from gateway.wsgi import WSGIGatewayMiddleware
from tests.proxy.rawhttp import connect, read_answer, request_head
from tests.wsgi.heldapp import CHAT, WAIT_S, HeldApp, post
from tests.wsgi.serving import serving


class BodyReader:
    """A classifier plugin that takes the body, so the gateway reads JSON bodies ahead;
    it names no class itself, so the headers decide."""

    def __init__(self) -> None:
        self.bodies: list[bytes | None] = []

    @hookimpl
    def obleth_classify_request(self, body: bytes | None) -> Classification | None:
        self.bodies.append(body)
        return None


def reading_bodies(app: HeldApp, reader: BodyReader) -> WSGIGatewayMiddleware:
    settings = Settings(tenant_header="x-tenant", max_body_bytes=1024)
    return WSGIGatewayMiddleware(app, settings=settings, plugins=[reader])


def upload_head(length: int, *extra: tuple[str, str]) -> bytes:
    """acme's POST of a JSON body announcing ``length`` bytes."""
    headers = (
        ("x-tenant", "acme"),
        ("content-type", "application/json"),
        ("content-length", str(length)),
        *extra,
    )
    return request_head(CHAT, *headers, method="POST")


def counted(middleware: WSGIGatewayMiddleware) -> dict[tuple[str, str, str], int]:
    """Every count so far, once there is one: ``(tenant, outcome, reason)``."""
    tallies = middleware.gateway.tallies
    deadline = time.monotonic() + WAIT_S
    while not tallies.totals():
        assert time.monotonic() < deadline, "nothing was counted"
        time.sleep(0.01)
    return {(t, outcome, reason): n for (t, _, outcome, reason), n in tallies.totals().items()}


@pytest.mark.parametrize("how", ["half-closed", "reset"])
def test_a_json_body_the_client_cuts_short_is_never_admitted_and_counts_abandoned(
    how: str,
) -> None:
    """The client announces 900 bytes of JSON and sends 200. Half-closed (it stopped
    sending, it still reads): a 400 saying so. Reset: nobody to answer. Either way the
    classifier never sees a partial prompt, the app never runs, and the request counts
    ``abandoned`` (under ``default_tenant``: the classifier that reads bodies never got
    one), with nothing held."""
    app, reader = HeldApp(), BodyReader()
    app.release.set()
    middleware = reading_bodies(app, reader)
    with serving(middleware) as url:
        sock = connect(url)
        sock.sendall(upload_head(900) + b'{"messages": "' + b"x" * 186)
        if how == "half-closed":
            sock.shutdown(socket.SHUT_WR)
            answer = read_answer(sock)
            assert answer.status == 400, answer.raw[:300]
            assert "Content-Length" in answer.json()["error"]["message"]
        else:
            # SO_LINGER of 0: close() resets the connection
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        assert counted(middleware) == {("anonymous", "abandoned", ""): 1}
        assert post(url, headers={"x-tenant": "acme"}).status_code == 200  # nothing held
    middleware.close()

    assert app.peak == 1  # only the request after
    assert reader.bodies == [b'{"messages":[]}']  # the request after's, whole
    assert middleware.gateway.snapshot().inflight == 0


@pytest.mark.parametrize("declared", ["100000000", "100000000 ", "+100000000"])
def test_a_json_body_declared_over_the_bound_is_refused_before_any_of_it_is_read(
    declared: str,
) -> None:
    """``Content-Length`` says 100 MB, and the client waits for ``100 Continue`` before
    sending it (the standard library's server sends none): the 413 comes at once, before
    a byte of the body, as under ASGI. The server passes the header on as it came: a
    length the read-ahead and the flight read differently left the worker waiting."""
    app, reader = HeldApp(), BodyReader()
    middleware = reading_bodies(app, reader)
    head = request_head(
        CHAT,
        ("x-tenant", "acme"),
        ("content-type", "application/json"),
        ("content-length", declared),
        ("expect", "100-continue"),
        method="POST",
    )
    with serving(middleware) as url, connect(url) as sock:
        sock.sendall(head)
        first = sock.recv(65536)  # bounded by the socket's WAIT_S timeout
        assert first.startswith(b"HTTP/1.0 413") or first.startswith(b"HTTP/1.1 413"), first
        assert counted(middleware) == {("anonymous", "bad_request", "413"): 1}
    middleware.close()

    assert app.peak == 0 and reader.bodies == []


@pytest.mark.parametrize(
    ("headers", "tenant", "priority"),
    [
        ([("x-tenant", "gold"), ("x-tenant", "free")], "free", "standard"),
        ([("x-tenant", "gold"), ("x-tenant", "gold")], "gold", "standard"),
        ([("x-priority", "background"), ("x-priority", "critical")], "anonymous", "critical"),
    ],
    ids=["tenant", "tenant-twice", "priority"],
)
def test_a_repeated_classification_header_counts_by_its_last_value(
    headers: list[tuple[str, str]], tenant: str, priority: str
) -> None:
    """The server hands the app ``HTTP_X_TENANT: gold,free``; the gateway classifies it
    as ASGI does two headers: by the last, never as a tenant ``gold,free``."""
    app = HeldApp()
    app.release.set()
    settings = Settings(tenant_header="x-tenant", trust_priority_header=True)
    middleware = WSGIGatewayMiddleware(app, settings=settings)
    with serving(middleware) as url, connect(url) as sock:
        body = b'{"messages": []}'
        head = request_head(
            CHAT,
            *headers,
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("connection", "close"),
            method="POST",
        )
        sock.sendall(head + body)
        answer = read_answer(sock)
    middleware.close()

    assert answer.status == 200, answer.raw[:300]
    record = answer.json()["record"]
    assert (record["tenant"], record["priority"]) == (tenant, priority)
