"""The forwarding headers the proxy writes for the upstream, and whose word it takes for them.

A client can send any ``X-Forwarded-For`` it likes; an upstream that logs it, rate-limits
by it or checks it against an allow-list must only see addresses that a proxy we trust
wrote. So, per request, with ``peer`` the address the connection came from (the ASGI
``scope["client"]``):

- ``X-Forwarded-For``: from a trusted peer, its value(s) with ``peer`` appended
  (``client, proxy-1, peer``); from any other peer, ``peer`` alone: what the client wrote
  is dropped.
- ``X-Forwarded-Host`` and ``X-Forwarded-Proto``: a trusted peer's own values are kept;
  otherwise the gateway writes them, from the request's ``Host`` and the scheme it was
  served on (``scope["scheme"]``).
- ``Forwarded`` (RFC 7239), ``X-Real-IP`` and every other ``X-Forwarded-*`` header go
  through as sent from a trusted peer and are dropped from any other. The gateway writes
  no ``Forwarded`` header of its own: one chain per request, in the ``X-Forwarded-*``
  headers, which is what inference servers and their proxies read.

A peer the server could not name (a Unix socket) is trusted by nobody and gets no
``X-Forwarded-For``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from gateway.core.memo import Memo
from gateway.core.networks import Network
from gateway.proxy.headers import Header, to_upstream
from gateway.types import Scope

#: How many peers' verdicts are remembered before the memory starts over: a gateway
#: behind load balancers sees a handful of them, and each verdict is a parse and a scan.
_REMEMBERED = 1024

_FOR = b"x-forwarded-for"
_HOST = b"x-forwarded-host"
_PROTO = b"x-forwarded-proto"
_FROM_TRUSTED_ONLY = frozenset({b"forwarded", b"x-real-ip"})


class TrustedProxies:
    """The peers whose forwarding headers are believed: ``trusts(address)`` answers from
    memory, without I/O. An empty set trusts nobody."""

    __slots__ = ("_networks", "_verdicts")

    def __init__(self, networks: Iterable[Network] = ()) -> None:
        self._networks = tuple(networks)
        self._verdicts: Memo[str, bool] = Memo(_REMEMBERED)

    def __bool__(self) -> bool:
        return bool(self._networks)

    def trusts(self, peer: str) -> bool:
        """Whether ``peer`` (an address as the server reports it: ``10.0.0.7``, ``::1``,
        an IPv4-mapped ``::ffff:10.0.0.7``) lies in one of the networks."""
        if not self._networks:
            return False
        verdict = self._verdicts.get(peer)
        if verdict is None:
            verdict = self._verdicts.keep(peer, self._judge(peer))
        return verdict

    def _judge(self, peer: str) -> bool:
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self._networks)


def upstream_headers(scope: Scope, trusted: TrustedProxies) -> list[Header]:
    """The request headers of ``scope`` as the upstream gets them: those that cross the
    proxy (``gateway.proxy.headers.to_upstream``) with this hop's forwarding headers, as
    the module docstring describes."""
    client = scope.get("client")
    peer: str | None = client[0] if client else None
    believed = peer is not None and trusted.trusts(peer)
    headers: list[Header] = []
    prior_for: list[bytes] = []
    has_host = has_proto = False
    for name, value in to_upstream(scope["headers"]):
        if name == _FOR:
            if believed and value.strip():
                prior_for.append(value.strip())
        elif name.startswith(b"x-forwarded-") or name in _FROM_TRUSTED_ONLY:
            if believed:
                has_host = has_host or name == _HOST
                has_proto = has_proto or name == _PROTO
                headers.append((name, value))
        else:
            headers.append((name, value))
    if peer is not None:
        prior_for.append(peer.encode("latin-1"))
        headers.append((_FOR, b", ".join(prior_for)))
    if not has_host:
        host = _host_of(scope)
        if host is not None:
            headers.append((_HOST, host))
    if not has_proto:
        headers.append((_PROTO, str(scope.get("scheme") or "http").encode("latin-1")))
    return headers


def _host_of(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"host":
            return bytes(value)
    return None
