"""A WSGI request as the gateway's core reads requests: an ASGI HTTP scope built from the
environ, and the JSON body read ahead (bounded) for classifiers and the router."""

from __future__ import annotations

import io
from typing import Any
from wsgiref.types import WSGIEnvironment

from gateway.settings import API_KEY_HEADERS, Settings
from gateway.types import Message, Scope

#: environ keys whose headers WSGI keeps without the ``HTTP_`` prefix
_UNPREFIXED = {"CONTENT_TYPE": b"content-type", "CONTENT_LENGTH": b"content-length"}

_CHUNK = 64 * 1024


def path_of(environ: WSGIEnvironment) -> tuple[bytes, str]:
    """The request path's bytes (WSGI hands them over as latin-1 text) and the path as
    ASGI servers give it, decoded as UTF-8."""
    raw = environ.get("PATH_INFO", "").encode("latin-1")
    return raw, raw.decode("utf-8", "replace")


def classified_headers(settings: Settings) -> frozenset[bytes]:
    """The headers the built-in classifier reads one value of: the tenant header, the
    priority header when trusted, and those an API key is read from."""
    names = {*API_KEY_HEADERS, settings.tenant_header}
    if settings.trust_priority_header:
        names.add(settings.priority_header)
    return frozenset(name.lower().encode("latin-1") for name in names if name)


def scope_of(
    environ: WSGIEnvironment, raw_path: bytes, path: str, unfold: frozenset[bytes] = frozenset()
) -> Scope:
    """The ASGI HTTP scope of ``environ`` (whose path ``path_of`` read): method, path,
    query string, headers (lower-case names, in bytes), client and server.
    Its ``state`` is a new dict, where the gateway puts its record of the request.

    A WSGI server joins a repeated header into one value, with commas. The headers named
    in ``unfold`` (``classified_headers``) are split back into one header per value, so
    that the last of them counts as it does under ASGI: ``x-tenant: gold`` then
    ``x-tenant: free`` is tenant ``free``, never a tenant ``gold,free``."""
    headers: list[tuple[bytes, bytes]] = []
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            name = key[5:].replace("_", "-").lower().encode("latin-1")
        else:
            unprefixed = _UNPREFIXED.get(key)
            if unprefixed is None or not value:
                continue
            name = unprefixed
        if name == b"content-length":
            length = content_length(environ)
            if length is None:
                continue  # as an ASGI server would have refused it: none is declared
            value = str(length)
        encoded = value.encode("latin-1")
        if name in unfold and b"," in encoded:
            headers.extend((name, part.strip()) for part in encoded.split(b","))
        else:
            headers.append((name, encoded))
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


def body_ahead(environ: WSGIEnvironment, limit: int) -> list[Message]:
    """The JSON body, read ahead of the request's flight from ``wsgi.input`` (bounded), as
    the ASGI messages the flight's ``receive()`` hands out in turn:

    - none when the ``Content-Length`` is over ``limit``: the flight refuses the body
      unread (413), as the ASGI middleware does;
    - the whole body, in one message; ``wsgi.input`` is then replaced by a stream of it,
      so that the app reads the same bytes;
    - ``limit + 1`` bytes and more to come: the flight answers 413;
    - what came before the client stopped sending, then ``http.disconnect``, for a body
      shorter than its ``Content-Length`` or a read that failed (the client reset the
      connection): the flight counts the request ``abandoned`` and never admits it on a
      partial prompt.
    """
    length = content_length(environ)
    if length is not None and length > limit:
        return []  # the scope declares the same length (scope_of): the flight refuses it
    if not length and environ.get("wsgi.input_terminated"):
        length = None  # chunked: read to the end of the stream
    elif length is None:
        length = 0
    stream = environ["wsgi.input"]
    wanted = limit + 1 if length is None else length
    chunks = []
    got = 0
    cut = False
    try:
        while got < wanted:
            chunk = stream.read(min(_CHUNK, wanted - got))
            if not chunk:
                cut = length is not None  # a chunked body simply ended
                break
            chunks.append(chunk)
            got += len(chunk)
    except Exception:  # the server's own error for a connection that broke mid-body
        cut = True
    body = b"".join(chunks)
    if cut:
        return [_part(body, more=True), {"type": "http.disconnect"}]
    if got > limit:
        return [_part(body, more=True)]
    environ["wsgi.input"] = io.BytesIO(body)
    return [_part(body, more=False)]


def content_length(environ: WSGIEnvironment) -> int | None:
    """``CONTENT_LENGTH`` as a number of bytes; None when absent, or no whole number of
    at least 0. The one reading of it, for the body read ahead and for the scope the
    flight checks the declared length in, so that the two never disagree."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None
    return length if length >= 0 else None


def _part(body: bytes, *, more: bool) -> Message:
    return {"type": "http.request", "body": body, "more_body": more}


def _address(host: object, port: object) -> list[object] | None:
    if not host:
        return None
    try:
        return [host, int(str(port))]
    except ValueError:
        return [host, 0]
