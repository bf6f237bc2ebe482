"""A WSGI request as the gateway's core reads requests: an ASGI HTTP scope built from the
environ, and the JSON body read ahead (bounded) for classifiers and the router."""

from __future__ import annotations

import io
from typing import Any
from wsgiref.types import WSGIEnvironment

from gateway.types import Scope

#: environ keys whose headers WSGI keeps without the ``HTTP_`` prefix
_UNPREFIXED = {"CONTENT_TYPE": b"content-type", "CONTENT_LENGTH": b"content-length"}

_CHUNK = 64 * 1024


def path_of(environ: WSGIEnvironment) -> tuple[bytes, str]:
    """The request path's bytes (WSGI hands them over as latin-1 text) and the path as
    ASGI servers give it, decoded as UTF-8."""
    raw = environ.get("PATH_INFO", "").encode("latin-1")
    return raw, raw.decode("utf-8", "replace")


def scope_of(environ: WSGIEnvironment, raw_path: bytes, path: str) -> Scope:
    """The ASGI HTTP scope of ``environ`` (whose path ``path_of`` read): method, path,
    query string, headers (lower-case names, in bytes), client and server.
    Its ``state`` is a new dict, where the gateway puts its record of the request."""
    headers: list[tuple[bytes, bytes]] = []
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            name = key[5:].replace("_", "-").lower().encode("latin-1")
        else:
            unprefixed = _UNPREFIXED.get(key)
            if unprefixed is None or not value:
                continue
            name = unprefixed
        headers.append((name, value.encode("latin-1")))
    root = environ.get("SCRIPT_NAME", "").encode("latin-1").decode("utf-8", "replace")
    protocol = environ.get("SERVER_PROTOCOL", "HTTP/1.1")
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": protocol.partition("/")[2] or "1.1",
        "method": environ.get("REQUEST_METHOD", "GET").upper(),
        "scheme": environ.get("wsgi.url_scheme", "http"),
        "path": path,
        "raw_path": raw_path,
        "root_path": root,
        "query_string": environ.get("QUERY_STRING", "").encode("latin-1"),
        "headers": headers,
        "client": _address(environ.get("REMOTE_ADDR"), environ.get("REMOTE_PORT")),
        "server": _address(environ.get("SERVER_NAME"), environ.get("SERVER_PORT")),
        "state": {},
    }
    return scope


def read_body_ahead(environ: WSGIEnvironment, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of the request body (one more than the gateway takes, so
    that an oversized body is told apart), read from ``wsgi.input``; when that is the
    whole body, ``wsgi.input`` is replaced by a stream of it for the app."""
    try:
        length: int | None = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if not length and environ.get("wsgi.input_terminated"):
        length = None  # chunked: read to the end of the stream
    stream = environ["wsgi.input"]
    wanted = limit + 1 if length is None else min(length, limit + 1)
    chunks = []
    got = 0
    while got < wanted:
        chunk = stream.read(min(_CHUNK, wanted - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    body = b"".join(chunks)
    if got <= limit:
        environ["wsgi.input"] = io.BytesIO(body)
    return body


def _address(host: object, port: object) -> list[object] | None:
    if not host:
        return None
    try:
        return [host, int(str(port))]
    except ValueError:
        return [host, 0]
