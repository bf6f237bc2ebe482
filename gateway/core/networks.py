"""IP networks as users write them in settings (``trusted_proxies``): parsed and checked,
with a message that says what is wrong with an entry."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from ipaddress import IPv4Network, IPv6Network

Network = IPv4Network | IPv6Network

_EXPECTED = "expected an IP address or a CIDR network, e.g. 10.0.0.0/8 or 192.168.1.7"


class ProxyListError(ValueError):
    """An entry of a trusted-proxy list that is no IP address or network; ``entry`` is it,
    the message says what is wrong with it."""

    def __init__(self, entry: object, why: str) -> None:
        super().__init__(why)
        self.entry = entry


def parse_networks(entries: Iterable[object]) -> tuple[Network, ...]:
    """``entries`` as networks: an address is a network of one (``10.0.0.7`` is
    ``10.0.0.7/32``). Raises ``ProxyListError`` for the first entry that is neither, and
    for a network written with host bits set (``10.0.0.1/8``), which is a typo more often
    than not."""
    networks: list[Network] = []
    for entry in entries:
        if isinstance(entry, IPv4Network | IPv6Network):
            networks.append(entry)
            continue
        if not isinstance(entry, str) or not entry.strip():
            raise ProxyListError(entry, _EXPECTED)
        text = entry.strip()
        try:
            networks.append(ipaddress.ip_network(text))
        except ValueError:
            try:
                loose = ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise ProxyListError(entry, _EXPECTED) from None
            raise ProxyListError(
                entry, f"has host bits set; the network is written {loose}"
            ) from None
    return tuple(networks)
