"""Names in Redis: one pool's keys under one hash tag, pod ids, and escaped tenant ids.

Every key of a pool is ``obleth:{<pool>}:<name>``, so Redis Cluster puts the whole pool in
one slot and every script call touches that slot only. Tenant ids come from request
headers: they reach Redis only escaped (no separator our scripts use can appear in them)
and, when long, hashed.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import secrets
import socket
from dataclasses import dataclass
from urllib.parse import quote, unquote

#: Names of the keys the step script reads and writes, in the order it expects them.
KEY_NAMES = (
    "state",
    "leases",
    "lmeta",
    "tin",
    "tq",
    "wq",
    "wmeta",
    "wdl",
    "ready:0",
    "ready:1",
    "rmem",
    "pods",
    "weights",
    "caps",
    "await",
    "asserted",
    "members",
    "unready",
    "lobby",
    "computed",
    "leader",
    "turns",
    "idle",
    "ttok",
)

_LONG_TENANT = 96


@dataclass(frozen=True, slots=True)
class PoolKeys:
    """The keys and channels of one pool (one shared budget)."""

    pool: str

    @property
    def prefix(self) -> str:
        return f"obleth:{{{self.pool}}}:"

    @property
    def keys(self) -> list[str]:
        return [self.prefix + name for name in KEY_NAMES]

    def key(self, name: str) -> str:
        return self.prefix + name

    @property
    def leader(self) -> str:
        """The leader lease: the id of the pod that computes the computed capacity
        providers, with a TTL on Redis' clock (see ``leader.py``)."""
        return self.prefix + "leader"

    @property
    def channel_prefix(self) -> str:
        """A pod's grant notifications arrive on ``channel_prefix + pod id``."""
        return self.prefix + "pod:"

    def channel(self, pod: str) -> str:
        return self.channel_prefix + pod


@functools.lru_cache(maxsize=4096)
def escape_tenant(tenant: str) -> str:
    """The tenant as it may appear in Redis: reversible unless longer than 96 characters.

    Cached: it runs for every request, and a service sees the same tenants again and again.
    """
    escaped = quote(tenant, safe="-._~")
    if len(escaped) <= _LONG_TENANT:
        return escaped
    digest = hashlib.blake2b(tenant.encode(), digest_size=16).hexdigest()
    return "~h" + digest


def escape_name(name: str) -> str:
    """A capacity provider's name as it may appear in Redis (no space, no ``|``)."""
    return quote(name, safe="-._~")


def unescape_tenant(escaped: str) -> str:
    """The tenant back from Redis (a long one stays its hash: ``~h<hex>``)."""
    if escaped.startswith("~h"):
        return escaped
    return unquote(escaped)


def new_pod_id() -> str:
    """A pod id unique across restarts: host, process and a random part, safe in members."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:24] or "pod"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"
