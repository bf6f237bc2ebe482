"""Which headers cross the proxy: everything but the hop-by-hop ones, in both directions;
and how the request's are handed to the HTTP client so that their bytes stay the same.

Hop-by-hop headers describe one connection (RFC 9110 section 7.6.1), not the message, so
each side of the proxy writes its own. That includes any header the ``Connection`` header
names. Names are compared in lower case; ASGI hands them over that way already.
"""

from __future__ import annotations

from collections.abc import Iterable

Header = tuple[bytes, bytes]

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade"}
)
"""Dropped in both directions, together with every ``proxy-*`` header."""

_NOT_TO_UPSTREAM = frozenset(
    {
        # the HTTP client writes the upstream's own host and port from the request URL
        b"host",
        # the ASGI server already answered any 100-continue when the body was first read
        b"expect",
    }
)

_NOT_TO_CLIENT = frozenset(
    {
        # the ASGI server serving the proxy writes its own; forwarding the upstream's would
        # send each twice (Date must occur only once)
        b"date",
        b"server",
    }
)


def to_upstream(headers: Iterable[Header]) -> list[Header]:
    """The client's request headers as the upstream should get them (``host`` rewritten by
    the HTTP client from the upstream URL)."""
    return _without(headers, _NOT_TO_UPSTREAM)


def to_client(headers: Iterable[Header]) -> list[Header]:
    """The upstream's response headers as the client should get them, names lower-cased.

    ``content-length`` and ``content-encoding`` stay: the body is relayed undecoded.
    """
    return _without(((name.lower(), value) for name, value in headers), _NOT_TO_CLIENT)


def as_text(headers: Iterable[Header]) -> list[tuple[str, str]]:
    """The headers as the HTTP client (aiohttp) takes them: strings, which it writes as
    their UTF-8 encoding.

    Each name and value is decoded from UTF-8, so that ASCII and UTF-8 (nearly every
    header) reach the upstream byte for byte; decoding ISO-8859-1 instead would send
    ``café`` as ``cafÃ©``. Bytes that are not UTF-8 are ISO-8859-1 text (HTTP's historic
    charset, what browsers' ``fetch`` and Python's ``requests`` send for ``café``): they
    are read as such, and reach the upstream as the same characters in UTF-8. No string
    makes aiohttp write those bytes unchanged (its C serializer drops the lone surrogates
    of ``surrogateescape``, its pure-Python one refuses them), and the text is what the
    client meant.
    """
    return [(_decoded(name), _decoded(value)) for name, value in headers]


def _decoded(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _without(headers: Iterable[Header], also: frozenset[bytes]) -> list[Header]:
    pairs = list(headers)
    named = {
        token.strip().lower()
        for name, value in pairs
        if name == b"connection"
        for token in value.split(b",")
    }
    return [
        (name, value)
        for name, value in pairs
        if name not in HOP_BY_HOP
        and name not in also
        and name not in named
        and not name.startswith(b"proxy-")
    ]
