"""A redis-py asyncio client from ``redis_url``, whatever the deployment shape.

``redis://``, ``rediss://`` and ``unix://`` go to one server through a
``BlockingConnectionPool`` of an explicit size (the default pool of redis-py 8 raises
past 100 connections instead of waiting for one). ``redis+sentinel://`` asks Sentinel for
the current master of a service; ``redis+cluster://`` talks to a Redis Cluster.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

from gateway.errors import ConfigError
from gateway.settings import shown_url
from gateway.settings.cluster import split_hosts

Client = aioredis.Redis | RedisCluster


def connect(url: str, *, pool_size: int, timeout_s: float, setting: str = "redis_url") -> Client:
    """A client for ``url``; connecting happens on first use.

    ``timeout_s`` bounds connecting and every reply: a paused or partitioned Redis must
    surface as an error within the retry budget, never as a hung request. A malformed
    URL raises ``ConfigError`` naming ``setting``.
    """
    scheme = url.split("://", 1)[0].lower()
    common: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "decode_responses": True,
    }
    if scheme.endswith("+cluster"):
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in _hosts(url, setting)],
            max_connections=pool_size,
            ssl=scheme.startswith("rediss"),
            **_credentials(url),
            **common,
        )
    if scheme.endswith("+sentinel"):
        service, db = _sentinel_path(url, setting)
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            _hosts(url, setting),
            sentinel_kwargs={"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s},
            **common,
        )
        master: aioredis.Redis = sentinel.master_for(
            service,
            redis_class=_SentinelMaster,
            db=db,
            ssl=scheme.startswith("rediss"),
            **_credentials(url),
        )
        return master
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=pool_size, timeout=timeout_s, **common
    )
    return aioredis.Redis.from_pool(pool)  # the client owns the pool and closes it


class _SentinelMaster(aioredis.Redis):
    """The master of a Sentinel service, closing with itself the clients it asked
    Sentinel through: redis-py's ``aclose()`` leaves their connections open, one socket
    per Sentinel for as long as the process lives."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for client in getattr(manager, "sentinels", ()):
            await client.aclose()


def _hosts(url: str, setting: str) -> list[tuple[str, int]]:
    netloc = split_hosts(url)[0].rsplit("@", 1)[-1]
    hosts = []
    for part in netloc.split(","):
        try:
            node = urlsplit("//" + part.strip())  # an IPv6 host in brackets, a port or none
            if not node.hostname or node.port == 0:
                raise ValueError(part)
            hosts.append((node.hostname, 6379 if node.port is None else node.port))
        except ValueError:
            raise ConfigError(
                setting,
                shown_url(url),
                f"{part!r} is not host:port; list nodes as host:port,host:port",
            ) from None
    return hosts


def _credentials(url: str) -> dict[str, Any]:
    netloc = split_hosts(url)[0]
    userinfo = netloc.rpartition("@")[0]
    user, _, password = userinfo.partition(":")
    found = {}
    if user:
        found["username"] = unquote(user)
    if password:
        found["password"] = unquote(password)
    return found


def _sentinel_path(url: str, setting: str) -> tuple[str, int]:
    """``redis+sentinel://host:26379,host2:26379/<service>[/<db>]``."""
    rest = split_hosts(url)[1]
    parts = [p for p in rest.path.split("/") if p]
    if not parts:
        raise ConfigError(
            setting,
            shown_url(url),
            "name the Sentinel service: redis+sentinel://host:26379/mymaster/0",
        )
    db = parts[1] if len(parts) > 1 else parse_qs(rest.query).get("db", ["0"])[0]
    try:
        return parts[0], int(db)
    except ValueError:
        raise ConfigError(setting, shown_url(url), f"database {db!r} is not a number") from None
