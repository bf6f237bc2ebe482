"""Checks of the cluster-mode settings: the Redis URL, the pool, leases, roll calls and
what happens when Redis cannot be reached; and ``shown_url``, a URL without its password.

Checks are called as those of ``checks.py`` are (see there).
"""

from __future__ import annotations

import math
import re
import urllib.parse
from typing import TYPE_CHECKING, Any

import redis.connection

from gateway.core.numbers import finite
from gateway.settings.checks import AT_MOST_A_DAY, MAX_SECONDS, check_seconds

if TYPE_CHECKING:
    from gateway.settings.fields import Settings

#: The shortest lease TTL: renewing more often than every 0.17 s costs Redis calls for
#: nothing, and under load the renewals fall behind and seats are given away.
MIN_LEASE_TTL_S = 0.5


def check_lease_ttl(settings: Settings, name: str, value: Any) -> float:
    ttl = check_seconds(settings, name, value)
    if ttl < MIN_LEASE_TTL_S:
        raise settings.error(
            name, value, f"expected at least {MIN_LEASE_TTL_S} seconds (pods renew every third)"
        )
    return ttl


def check_retry_budget(settings: Settings, name: str, value: Any) -> float:
    """The budget, checked against ``lease_ttl_s`` (checked before it): a pod that keeps
    retrying a silent Redis for the budget must not have lost its leases meanwhile."""
    budget = check_seconds(settings, name, value)
    ttl = settings.lease_ttl_s
    ttl_name = settings.label("lease_ttl_s", like=name)
    if ttl < 1.5 * budget and not settings.chose("lease_ttl_s"):
        raise settings.error(
            name,
            value,
            f"a pod retrying Redis this long would lose its leases meanwhile ({ttl_name} is "
            f"{ttl:g} s); expected at most {ttl / 1.5:.3g} s (a TTL of 1.5 x the budget at "
            f"least), or a longer {ttl_name}",
        )
    if ttl < 1.5 * budget:
        raise settings.error(
            "lease_ttl_s",
            ttl,
            f"a pod retrying Redis for {settings.label(name)}={budget:g} s would lose its "
            f"leases meanwhile; expected at least 1.5 x that ({1.5 * budget:g} s), or a "
            "shorter budget",
        )
    return budget


_REDIS_SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
)
_HOST = re.compile(r"^[A-Za-z0-9_.:%-]+$")
_POOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def check_redis_url(settings: Settings, name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or "://" not in value:
        raise settings.error(
            name, value, "expected a URL like redis://redis:6379/0 (or leave it unset)"
        )
    scheme = value.split("://", 1)[0].lower()
    if scheme not in _REDIS_SCHEMES:
        raise settings.error(
            name,
            shown_url(value),
            f"unknown scheme {scheme!r}; expected one of {', '.join(_REDIS_SCHEMES)}",
        )
    netloc, _ = split_hosts(value.strip())
    if _cut_credentials(value.strip()):
        raise settings.error(
            name,
            shown_url(value.strip()),
            "a '/', '?' or '#' comes before the '@', and it ends the host part: the "
            "password would be read as a host and port; percent-encode them in a password "
            "(/ as %2F, ? as %3F, # as %23)",
        )
    if scheme.endswith(("+sentinel", "+cluster")):
        # parsed where the client is built (connect.py), several hosts and all
        if not any(part.strip() for part in netloc.rsplit("@", 1)[-1].split(",")):
            raise settings.error(
                name,
                shown_url(value.strip()),
                f"expected at least one host: {scheme}://host:port,host:port/...",
            )
        return value.strip()
    shown = shown_url(value.strip())
    try:
        url = urllib.parse.urlsplit(value.strip())
    except ValueError as exc:  # an unclosed "[" of an IPv6 host, say
        raise settings.error(
            name,
            shown,
            f"not a URL that parses ({exc}); expected one like redis://redis:6379/0, "
            "an IPv6 host in brackets: redis://[::1]:6379/0",
        ) from None
    if scheme == "unix":
        return _with_options(settings, name, value.strip(), shown)
    try:
        port = url.port
    except ValueError:
        port = -1
    if port is not None and not 0 < port < 65536:
        raise settings.error(name, shown, "the port must be a number from 1 to 65535")
    if url.hostname is not None and not _HOST.match(url.hostname):
        raise settings.error(name, shown, f"{url.hostname!r} is no host name or address")
    database = url.path.strip("/")
    if database and not database.isdigit():
        raise settings.error(name, shown, "the path must be a database number, such as /0")
    return _with_options(settings, name, value.strip(), shown)


def _with_options(settings: Settings, name: str, value: str, shown: str) -> str:
    """``value``, once redis-py has read the options of its query (``db=``,
    ``socket_timeout=``, ...) as it will when it connects."""
    try:
        options = redis.connection.parse_url(value)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise settings.error(
            name, shown, f"{str(exc).rstrip('.')}; expected a URL like redis://redis:6379/0"
        ) from None
    # what parses and still cannot connect: the pod would start, then admit nothing
    if value.lower().startswith("unix") and not options.get("path"):
        raise settings.error(
            name, shown, "a unix socket URL names its socket: unix:///run/redis/redis.sock"
        )
    for option in _SECONDS_OPTIONS:
        seconds = options.get(option)
        if seconds is not None and not 0 < seconds < math.inf:
            raise settings.error(name, shown, f"{option} must be a number of seconds above 0")
    database = options.get("db")
    if database is not None and not 0 <= int(database) <= _MAX_DATABASE:
        raise settings.error(
            name,
            shown,
            f"no Redis database is numbered {database}: they count from 0 up to the "
            "server's `databases` setting (16 by default)",
        )
    return value


#: query options of a Redis URL that are times, in seconds
_SECONDS_OPTIONS = ("socket_timeout", "socket_connect_timeout")

#: the largest database number Redis can take (its index is a C int)
_MAX_DATABASE = 2**31 - 1


def shown_url(url: str) -> str:
    """``url`` for a message or a log line, as written but for passwords, replaced by
    ``***``: the one before the ``@`` and those of the query (``password=``,
    ``sentinel_password=``), whether or not the rest of it parses (a list of hosts
    included). A password holding a raw ``/``, ``?`` or ``#`` ends the host part early
    (see ``_cut_credentials``): everything up to the last ``@`` is then taken for the
    credentials, so that none of it is shown."""
    scheme, _, rest = url.partition("://")
    netloc, _ = split_hosts(url)
    userinfo, at, _ = netloc.rpartition("@")
    if not at and (scheme.lower() == "unix" or _cut_credentials(url)):
        # a unix socket's path follows the "@": a password's raw "/" ends no host part
        # there, and what precedes the last "@" is masked if it holds a ":"
        userinfo, at, _ = rest.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if at and colon:
        rest = f"{user}:***@{rest[len(userinfo) + 1 :]}"
    return scheme + "://" + _QUERY_PASSWORD.sub(r"\1***", rest)


#: a password among a Redis URL's query options, which redis-py hands to its client
_QUERY_PASSWORD = re.compile(r"([?&][A-Za-z_]*password=)[^&#]*", re.IGNORECASE)


def _cut_credentials(url: str) -> bool:
    """Whether a password with a raw ``/``, ``?`` or ``#`` cut the host part short: no
    ``@`` in it, one after it, and a node whose port is no number (``app:pa`` of
    ``redis://app:pa/ss@redis:6379``). An ``@`` in a path or a query is legal; a
    password cut after digits alone (``app:123/ss@...``) cannot be told from a port."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() == "unix":
        return False
    netloc, _ = split_hosts(url)
    if "@" in netloc or "@" not in rest[len(netloc) :]:
        return False
    for node in netloc.split(","):
        port = node.strip().rpartition("]")[2]
        if ":" in port and not port.rpartition(":")[2].isdigit():
            return True
    return False


def split_hosts(url: str) -> tuple[str, urllib.parse.SplitResult]:
    """``(netloc, the rest)`` of a URL naming several hosts (``redis+cluster://``,
    ``redis+sentinel://``): the netloc as written, ``user:password@`` included, and the
    path, query and fragment parsed. ``urlsplit`` cannot be given the whole URL: Python
    releases with the fix of CVE-2024-11168 refuse a netloc where anything precedes
    ``[``, as in ``h1:7000,[::2]:7000``."""
    scheme, _, rest = url.partition("://")
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    return rest[:end], urllib.parse.urlsplit(f"{scheme}://hosts{rest[end:]}")


def check_pool(settings: Settings, name: str, value: Any) -> str:
    if not isinstance(value, str) or not _POOL_NAME.fullmatch(value):
        raise settings.error(
            name, value, "expected 1 to 64 letters, digits or . _ : - (it becomes a Redis hash tag)"
        )
    return value


def check_failure_mode(settings: Settings, name: str, value: Any) -> str:
    if value not in ("local", "open", "closed"):
        raise settings.error(name, value, "expected local, open or closed")
    return str(value)


def check_optional_window(settings: Settings, name: str, value: Any) -> float | None:
    if value is None:
        return None
    if not finite(value) or value < 0:
        raise settings.error(name, value, "expected a number of seconds (0 or more), or unset")
    if value > MAX_SECONDS:
        raise settings.error(name, value, f"{AT_MOST_A_DAY}, or unset")
    return float(value)
