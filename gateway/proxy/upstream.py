"""Which upstream a request goes to, the URL it is sent to there, and the router's handle.

The choice is one small function of the ASGI scope (``UpstreamChoice``), so that a router
can replace it without touching the forwarding code. The default reads what the gateway's
router left in ``scope["state"]["obleth"]``: ``["upstream"]``, the base URL it chose, and
``["route"]``, a ``Reroutable`` the proxy asks for the next-best upstream when the chosen
one fails before answering.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote

import httpx
from yarl import URL

from gateway.types import Scope

UpstreamChoice = Callable[[Scope], str | None]
"""Returns the base URL of the upstream for one request, or None when there is none (the
proxy then answers 503 ``no_upstream``). Called once per request, on the request path: it
must answer from memory, without I/O."""

ROUTED_UPSTREAM_KEY = "upstream"
"""Key under ``scope["state"]["obleth"]`` where a router puts its choice."""

ROUTE_KEY = "route"
"""Key under ``scope["state"]["obleth"]`` where a router puts its ``Reroutable``."""


@runtime_checkable
class Reroutable(Protocol):
    """The router's decision for one request, as the proxy needs it.

    The proxy calls ``reroute()`` at most once per request, on the event loop serving it,
    and only before anything of the response reached the client. Both members answer from
    memory, without I/O.
    """

    @property
    def upstream(self) -> str:
        """The base URL currently chosen for the request."""
        ...

    def reroute(self) -> str | None:
        """Give up the current upstream (the router counts the request as finished there)
        and switch to the next-best one; return its base URL, or None when there is no
        other. After a switch, ``upstream`` is the new base URL."""
        ...


def routed_upstream(scope: Scope) -> str | None:
    """The upstream a router chose for this request, or None when no router chose one."""
    chosen = _routed(scope, ROUTED_UPSTREAM_KEY)
    return chosen if isinstance(chosen, str) and chosen else None


def route_of(scope: Scope) -> Reroutable | None:
    """The router's ``Reroutable`` for this request, or None when there is none (no router,
    or something in its place that does not have ``upstream`` and ``reroute``)."""
    route = _routed(scope, ROUTE_KEY)
    if route is None:
        return None
    kind = type(route)
    fits = _REROUTABLE_TYPES.get(kind)
    if fits is None:  # a runtime-checkable protocol's isinstance is slow: once per type
        fits = _REROUTABLE_TYPES[kind] = isinstance(route, Reroutable)
    return route if fits else None


#: whether objects of each type seen in a scope's route are ``Reroutable`` (few types)
_REROUTABLE_TYPES: dict[type, bool] = {}


def _routed(scope: Scope, key: str) -> Any:
    state = scope.get("state")
    if not isinstance(state, Mapping):
        return None
    obleth = state.get("obleth")
    if not isinstance(obleth, Mapping):
        return None
    return obleth.get(key)


def unforwardable_path(scope: Scope) -> str | None:
    """Why the request target of ``scope`` cannot be forwarded, or None when it can.

    A target that is no path (``OPTIONS *``, an authority) names no resource of an
    upstream. A path with a ``.`` or ``..`` segment would be resolved on the way (by the
    HTTP client, or by an upstream that decodes first) and could climb out of the path an
    upstream's base URL puts in front of it: it is refused rather than resolved, and a
    client sends the path it means. Segments are what lies between ``/`` or ``\\`` (some
    servers take a backslash for a slash) once ``%2e``, ``%2f`` and ``%5c`` (either case)
    are decoded, so ``/v1/..%2f..%2fstats`` and ``/v1/%2e%2e\\admin`` are refused too.
    """
    path: bytes = scope.get("raw_path") or (scope.get("path") or "").encode("latin-1")
    if not path.startswith(b"/"):
        return (
            f"the request target {path.decode('latin-1')[:100]!r} is not a path; the gateway "
            "forwards requests for paths such as /v1/completions"
        )
    if b"." not in path and b"%" not in path and b"\\" not in path:
        return None  # most paths: no dot, written or escaped, and no backslash to look at
    if _has_dot_segment(path):
        return (
            f"the path {path.decode('latin-1')[:100]!r} has a '.' or '..' segment, which the "
            "gateway does not forward; send the path it stands for"
        )
    return None


# What an upstream may decode before it splits a path into segments: the escapes of the
# dot, the slash and the backslash. Decoding yields none of '%', '2', '5' or a hex letter,
# so one pass of replacements cannot make a new escape.
_SEGMENT_ESCAPES = (
    (b"%2e", b"."),
    (b"%2E", b"."),
    (b"%2f", b"/"),
    (b"%2F", b"/"),
    (b"%5c", b"/"),
    (b"%5C", b"/"),
    (b"\\", b"/"),
)


def _has_dot_segment(path: bytes) -> bool:
    for escape, meaning in _SEGMENT_ESCAPES:
        path = path.replace(escape, meaning)
    segments = set(path.split(b"/"))
    return b"." in segments or b".." in segments


def target_url(base: httpx.URL, scope: Scope) -> URL:
    """Where to send the request of ``scope`` on the upstream at ``base``.

    The path goes as the client sent it (``raw_path``, so percent-escapes such as ``%2F``
    survive) behind the base URL's own path, and the query string byte for byte.
    """
    target = _prefix_of(base) + _client_path(scope)
    query: bytes = scope.get("query_string", b"")
    if query:
        target += "?" + query.decode("latin-1")
    return URL(target, encoded=True)


@functools.lru_cache(maxsize=256)
def _prefix_of(base: httpx.URL) -> str:
    """``scheme://host:port/path`` of an upstream's base URL, without a trailing slash:
    what every forwarded path is put behind (built once per upstream, not per request)."""
    path = base.raw_path.decode("ascii").rstrip("/")
    return f"{base.scheme}://{base.netloc.decode('ascii')}{path}"


def client_location(location: bytes, url: URL, scope: Scope) -> bytes:
    """The ``Location`` an upstream answered the request of ``scope``, sent to ``url``,
    as the client should get it: an absolute URL on the upstream itself (``http://vllm-0:8000
    /v1/models``, a framework's redirect to the canonical path) becomes the same path on
    the gateway (``/v1/models``, without the upstream base URL's own path), so that the
    client follows it through the gateway and never learns the upstream's address. Any
    other value (a relative one, another host's, one that is not a URL) is kept."""
    try:
        target = URL(location.decode("latin-1"), encoded=True)
    except ValueError:
        return location
    if not target.absolute or target.origin() != url.origin():
        return location
    base_path = url.raw_path.removesuffix(_client_path(scope))
    path = target.raw_path
    if base_path and base_path != "/":
        if path != base_path and not path.startswith(base_path.rstrip("/") + "/"):
            return location  # outside the upstream's base: not one of the gateway's paths
        path = path[len(base_path.rstrip("/")) :] or "/"
    relative = path
    if target.raw_query_string:
        relative += "?" + target.raw_query_string
    if target.raw_fragment:
        relative += "#" + target.raw_fragment
    return relative.encode("latin-1")


def _client_path(scope: Scope) -> str:
    """The path of ``scope`` as the client sent it, percent-escapes kept."""
    path: bytes | None = scope.get("raw_path")
    if not path:
        path = quote(scope.get("path") or "/").encode("ascii")
    return path.decode("latin-1")
