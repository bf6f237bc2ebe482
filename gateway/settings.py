"""Settings: keyword arguments or ``OBLETH_*`` environment variables, validated at startup.

Every bad value raises ``ConfigError`` naming the setting as the user wrote it (the keyword
or the environment variable), the value, and what would be accepted. Names that depend on
installed plugins (providers, policies) are checked when a gateway assembles its plugins.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from gateway.core.networks import ProxyListError, parse_networks
from gateway.core.numbers import finite
from gateway.core.tickets import PRIORITIES, Priority
from gateway.core.weights import (
    WeightSyntaxError,
    check_weights,
    named_entries,
    parse_pairs,
    parse_weights,
)
from gateway.errors import ConfigError
from gateway.routing.upstreams import Upstream, UpstreamSyntaxError, parse_upstream_entry

ENV_PREFIX = "OBLETH_"
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9a-z]+$")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything a gateway is configured by; immutable once built.

    ``Settings(...)`` takes keyword arguments only; ``Settings.from_env()`` reads
    ``OBLETH_<NAME>`` for each field (lists comma-separated, weights as ``gold:4,free:1``).
    """

    global_max_in_flight: int = 64
    """The static limit on requests in flight (the ``static`` capacity provider)."""
    capacity_providers: tuple[str, ...] = ("static",)
    """Capacity providers by name; the effective limit is the minimum of them all."""
    overflow_policy: str = "block"
    """What happens when no seat is free: ``block``, ``drop-newest``, ``drop-oldest``."""
    max_queue: int = 1024
    """How many requests may wait at once; past it the policy's queue-full rule applies."""
    queue_timeout_s: float = 30.0
    """How long a request may wait for a seat before it is answered 503 ``queue_timeout``."""
    tenant_header: str | None = None
    """Request header naming the tenant; without it, the tenant is a hash of the API key."""
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    """Fair-share weights by tenant; tenants not listed weigh ``default_tenant_weight``."""
    default_tenant_weight: float = 1.0
    """Weight of every tenant missing from ``tenant_weights``."""
    tenant_max_in_flight: int | Mapping[str, int] | None = None
    """Cap on one tenant's requests in the gateway (running or waiting): a number for
    every tenant, or ``{tenant: cap}`` with ``"*"`` for the rest. Over it: 429."""
    default_tenant: str = "anonymous"
    """Tenant of requests with neither the tenant header nor an API key."""
    priority_header: str = "x-priority"
    """Request header carrying ``critical``, ``standard`` or ``background``."""
    trust_priority_header: bool = False
    """Read ``priority_header`` at all; off by default, since clients could claim ``critical``."""
    default_priority: Priority = "standard"
    """Priority class of requests that do not (or may not) say theirs."""
    max_body_bytes: int = 8 * 1024 * 1024
    """Largest JSON body read for classification; a larger one is answered 413."""
    exempt_paths: tuple[str, ...] = ("/healthz", "/readyz", "/metrics")
    """Paths never admission-controlled (exact, or as a prefix followed by ``/``)."""
    retry_after_s: float = 1.0
    """What ``Retry-After`` tells rejected clients, in seconds (rounded up)."""
    disable_plugins: tuple[str, ...] = ()
    """Plugins (entry-point or built-in names) not to load, e.g. a broken third-party one."""
    redis_url: str | None = None
    """Cluster mode: every pod using this Redis and ``pool`` shares one budget, one limit and
    one fair queue. ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://`` or
    ``redis+cluster://``; unset, the budget lives in this process."""
    pool: str = "default"
    """Name of the shared budget in Redis: services with different names never share seats."""
    redis_failure_mode: Literal["local", "open", "closed"] = "local"
    """When Redis cannot be reached: ``local`` admits up to ``limit / live pods`` on each pod,
    ``open`` admits everything, ``closed`` answers 503 to new requests."""
    lease_ttl_s: float = 10.0
    """How long Redis keeps a pod's seats without hearing from it; pods renew every third of
    it, and a crashed pod's seats come back within it."""
    redis_pool_size: int = 32
    """Connections per pod to Redis (one more is used for grant notifications)."""
    redis_retry_budget_s: float = 1.0
    """How long a pod retries an unreachable Redis before ``redis_failure_mode`` applies."""
    learning_window_s: float | None = None
    """The longest a roll call lasts (after Redis lost count, nothing new is granted until
    every pod has re-asserted what it holds); default two heartbeats plus
    ``redis_retry_budget_s``; 0 turns roll calls off."""
    upstreams: tuple[Upstream, ...] = ()
    """Inference servers to route admitted requests to: base URLs, each optionally with the
    models it serves (``http://vllm-0:8000=llama-3|qwen``). Empty: no routing."""
    routing_policy: Literal["weighted", "round-robin", "least-loaded"] = "weighted"
    """How an upstream is chosen: the weighted sum of ``routing_scorers``, ``round-robin``,
    or ``least-loaded`` (fewest waiting + running + our requests in flight)."""
    routing_scorers: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({"prefix-affinity": 5.0, "queue-depth": 1.0})
    )
    """Scorers and weights of the ``weighted`` policy: ``prefix-affinity:5,queue-depth:1``."""
    routing_load_bound: float = 1.5
    """The ``weighted`` policy passes over an upstream that queues requests while it has more
    than this multiple of the average in flight (the guard that keeps affinity from piling on)."""
    routing_load_slack: int = 8
    """With no queue scraped yet, the guard applies once an upstream is this many requests
    ahead of the least loaded (a burst between two scrapes cannot pile onto one)."""
    routing_placement_bound: float = 1.25
    """A prefix no upstream holds goes to the first upstream in its rendezvous order that is
    not above this multiple of the average in prompt content placed and in requests in
    flight; 0: plain rendezvous hashing. Pods agree through Redis; several pods without
    Redis should set 0."""
    routing_seed: int | None = None
    """Seed of the random choice between upstreams that tie; unset, a random seed."""
    session_header: str = "x-session-id"
    """Request header carrying a session id, for the ``session-affinity`` scorer."""
    upstream_header: bool = False
    """Add ``X-Obleth-Upstream`` (the chosen upstream) to every routed response."""
    prefix_block_bytes: int = 256
    """Size of the prompt blocks ``prefix-affinity`` hashes (256 bytes is ~64 tokens)."""
    prefix_index_blocks: int = 16384
    """How many block hashes ``prefix-affinity`` remembers per upstream (an LRU)."""
    upstream_poll_interval_s: float = 0.25
    """How often each upstream's ``/metrics`` and ``/health`` are read; a reading older
    than three intervals counts as saturated."""
    upstream_poll_timeout_s: float = 0.2
    """How long one scrape may take before the upstream counts as not answering."""
    upstream_connect_timeout_s: float = 5.0
    """Proxy: how long connecting to an upstream (or waiting for a pooled connection) may take."""
    upstream_response_timeout_s: float | None = 300.0
    """Proxy: how long an upstream may take to start its response before the client gets 504."""
    upstream_read_timeout_s: float | None = 300.0
    """Proxy: the longest silence allowed inside a streamed response before it is cut."""
    max_header_bytes: int = 64 * 1024
    """``obleth serve``: the largest request line plus headers a client may send; a larger
    head is answered 431 and its connection closed, and no more of it is kept in memory."""
    client_header_timeout_s: float = 10.0
    """``obleth serve``: how long a client may take to send a request's line and headers,
    from the connection's opening (first request) or the request's first byte (later ones)."""
    client_body_timeout_s: float = 30.0
    """``obleth serve``: the longest a request body may pause while the gateway waits for
    its next chunk; exceeded, 408 (if nothing was answered yet) and the connection closes."""
    trusted_proxies: tuple[str, ...] = ()
    """Proxy: peers (IP addresses or CIDR networks) whose ``X-Forwarded-*`` and
    ``Forwarded`` headers are believed and extended; from any other peer they are replaced."""
    env_names: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    """The settings read from ``OBLETH_*`` variables (by ``from_env``; the others were given
    as keywords, such as a command's flags), so that errors name what the user wrote."""

    def __post_init__(self) -> None:
        for spec in _SPECS.values():
            raw = getattr(self, spec.name)
            object.__setattr__(self, spec.name, spec.check(self, raw))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``OBLETH_*`` variables; keyword ``overrides`` win over them.

        An ``OBLETH_*`` variable that is no setting is an error (a typo must not be
        silently ignored).
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for key, text in env.items():
            if not key.startswith(ENV_PREFIX):
                continue
            name = key[len(ENV_PREFIX) :].lower()
            spec = _SPECS.get(name)
            if spec is None:
                known = [ENV_PREFIX + n.upper() for n in _SPECS]
                near = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {near[0]}? " if near else ""
                raise ConfigError(key, text, f"no such setting; {hint}known: {', '.join(known)}")
            values[name] = spec.parse_env(key, text)
        from_env = frozenset(values) - frozenset(overrides)
        values.update(overrides)
        return cls(**values, env_names=from_env)

    def label(self, name: str) -> str:
        """The setting as the user wrote it: the environment variable or the keyword."""
        return ENV_PREFIX + name.upper() if name in self.env_names else name

    def error(self, name: str, value: object, expected: str) -> ConfigError:
        return ConfigError(self.label(name), value, expected)

    def tenant_caps(self) -> tuple[dict[str, int], int | None]:
        """``tenant_max_in_flight`` split into the named tenants' caps and everyone else's."""
        caps = self.tenant_max_in_flight
        if caps is None or isinstance(caps, int):
            return {}, caps
        named = dict(caps)
        return named, named.pop("*", None)

    def replace(self, **changes: Any) -> Settings:
        """These settings with ``changes``, given as keywords (an error names them so)."""
        return dataclasses.replace(self, **changes, env_names=self.env_names - set(changes))


# -- per-setting parsing and checking -------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    name: str
    parse_env: Callable[[str, str], Any]
    check: Callable[[Settings, Any], Any]


def _env_int(key: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ConfigError(key, text, "expected a whole number, e.g. 64") from None


def _env_number(expected: str) -> Callable[[str, str], float]:
    """A parser of one number whose error says what was ``expected``."""

    def parse(key: str, text: str) -> float:
        try:
            return float(text.strip())
        except ValueError:
            raise ConfigError(key, text, expected) from None

    return parse


_env_float = _env_number("expected a number of seconds, e.g. 30 or 0.5")
_env_weight = _env_number("expected a weight, a number above 0, e.g. 1 or 2.5")
_env_multiple = _env_number("expected a number, e.g. 1.5")


def _env_bool(key: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ConfigError(key, text, "expected true or false")


def _env_text(key: str, text: str) -> str:
    return text.strip()


def _env_optional_text(key: str, text: str) -> str | None:
    return text.strip() or None


def _env_list(key: str, text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _env_pairs(expected: str) -> Callable[[str, str], dict[str, float]]:
    """A parser of ``name:weight,...`` whose error says what was ``expected``."""

    def parse(key: str, text: str) -> dict[str, float]:
        try:
            return parse_weights(text)
        except WeightSyntaxError as exc:
            raise ConfigError(key, text, f"{exc}; {expected}") from None

    return parse


_env_weights = _env_pairs("expected tenant:weight pairs like gold:4,free:1")


_CAPS_EXPECTED = "expected a whole number (for every tenant), or tenant:cap pairs like free:4,*:16"


def _env_caps(key: str, text: str) -> int | dict[str, int] | None:
    """``16`` (every tenant) or ``free:4,*:16``; the values are checked by ``_check_caps``."""
    text = text.strip()
    if not text:
        return None
    if ":" not in text:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(key, text, _CAPS_EXPECTED) from None
    try:
        return parse_pairs(text, _parse_cap, what="cap")
    except WeightSyntaxError as exc:
        raise ConfigError(key, text, f"{exc}; {_CAPS_EXPECTED}") from None


def _parse_cap(name: str, text: str) -> int:
    """A cap as written in the environment; whether it is at least 1 is ``_check_caps``'s
    to say, for keywords and variables alike."""
    try:
        return int(text)
    except ValueError:
        raise WeightSyntaxError(f"{name}: cap {text!r} is not a whole number") from None


def _check_int(minimum: int) -> Callable[[Settings, str, Any], int]:
    def check(settings: Settings, name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise settings.error(name, value, f"expected a whole number of at least {minimum}")
        return value

    return check


def _check_seconds(settings: Settings, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise settings.error(name, value, "expected a number of seconds")
    if not finite(value) or value <= 0:
        raise settings.error(name, value, "expected a finite number of seconds above 0")
    return float(value)


#: The shortest lease TTL: renewing more often than every 0.17 s costs Redis calls for
#: nothing, and under load the renewals fall behind and seats are given away.
MIN_LEASE_TTL_S = 0.5


def _check_lease_ttl(settings: Settings, name: str, value: Any) -> float:
    ttl = _check_seconds(settings, name, value)
    if ttl < MIN_LEASE_TTL_S:
        raise settings.error(
            name, value, f"expected at least {MIN_LEASE_TTL_S} seconds (pods renew every third)"
        )
    return ttl


def _check_retry_budget(settings: Settings, name: str, value: Any) -> float:
    """The budget, checked against ``lease_ttl_s`` (checked before it): a pod that keeps
    retrying a silent Redis for the budget must not have lost its leases meanwhile."""
    budget = _check_seconds(settings, name, value)
    ttl = settings.lease_ttl_s
    if ttl < 1.5 * budget:
        raise settings.error(
            "lease_ttl_s",
            ttl,
            f"a pod retrying Redis for {settings.label(name)}={budget:g} s would lose its "
            f"leases meanwhile; expected at least 1.5 x that ({1.5 * budget:g} s), or a "
            "shorter budget",
        )
    return budget


def _check_name(settings: Settings, name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise settings.error(name, value, "expected a non-empty name")
    return value.strip()


def _check_names(settings: Settings, name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = _env_list(name, value)
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise settings.error(name, value, "expected a list of names")
    names = tuple(v.strip() for v in value if v.strip())
    if len(set(names)) != len(names):
        raise settings.error(name, value, "a name is listed twice")
    return names


def _check_providers(settings: Settings, name: str, value: Any) -> tuple[str, ...]:
    names = _check_names(settings, name, value)
    if not names:
        raise settings.error(name, value, "expected at least one capacity provider, e.g. static")
    return names


def _check_header(settings: Settings, name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _HEADER_NAME.match(value.strip().lower()):
        raise settings.error(name, value, "expected an HTTP header name, e.g. x-tenant")
    return value.strip().lower()


def _check_required_header(settings: Settings, name: str, value: Any) -> str:
    header = _check_header(settings, name, value)
    if header is None:
        raise settings.error(name, value, "expected an HTTP header name, e.g. x-priority")
    return header


def _check_weights(settings: Settings, name: str, value: Any) -> Mapping[str, float]:
    if not isinstance(value, Mapping):
        raise settings.error(name, value, "expected a mapping like {'gold': 4, 'free': 1}")
    try:
        return MappingProxyType(check_weights(value))
    except WeightSyntaxError as exc:
        raise settings.error(
            name, dict(value), f"{exc}; weights are finite numbers above 0"
        ) from None


def _check_weight(settings: Settings, name: str, value: Any) -> float:
    try:
        return check_weights({name: value})[name]
    except WeightSyntaxError as exc:
        raise settings.error(name, value, f"{exc}; a weight is a finite number above 0") from None


def _check_caps(settings: Settings, name: str, value: Any) -> int | Mapping[str, int] | None:
    expected = (
        "expected a whole number of at least 1, or caps of at least 1 by tenant: "
        "{'free': 4, '*': 16}, or free:4,*:16 in the environment"
    )
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    if not isinstance(value, Mapping):
        raise settings.error(name, value, expected)
    try:
        caps = named_entries(value)
    except WeightSyntaxError as exc:
        raise settings.error(name, dict(value), f"{exc}; {expected}") from None
    for tenant, cap in caps.items():
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise settings.error(name, dict(value), f"{tenant}: cap {cap!r}; {expected}")
    return MappingProxyType(caps)


def _check_priority(settings: Settings, name: str, value: Any) -> str:
    if value not in PRIORITIES:
        raise settings.error(name, value, f"expected one of {', '.join(PRIORITIES)}")
    return str(value)


#: Where the built-in classifier looks for an API key, in this order.
API_KEY_HEADERS = ("authorization", "x-api-key", "api-key")


def _check_priority_header(settings: Settings, name: str, value: Any) -> str:
    header = _check_required_header(settings, name, value)
    if header == settings.tenant_header or header in API_KEY_HEADERS:
        raise settings.error(
            name,
            value,
            f"{header!r} already names the tenant; choose a header of its own, e.g. x-priority",
        )
    return header


def _check_bool(settings: Settings, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise settings.error(name, value, "expected True or False")
    return value


def _check_paths(settings: Settings, name: str, value: Any) -> tuple[str, ...]:
    paths = _check_names(settings, name, value)
    for path in paths:
        if not path.startswith("/"):
            raise settings.error(name, value, f"{path!r} is not a path; paths start with '/'")
    normalised = tuple(path.rstrip("/") or "/" for path in paths)
    if len(set(normalised)) != len(normalised):
        raise settings.error(
            name, value, "a path is listed twice (a trailing '/' makes no difference)"
        )
    return normalised


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
_POOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def _check_redis_url(settings: Settings, name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or "://" not in value:
        raise settings.error(
            name, value, "expected a URL like redis://redis:6379/0 (or leave it unset)"
        )
    scheme = value.split("://", 1)[0].lower()
    if scheme not in _REDIS_SCHEMES:
        raise settings.error(
            name, value, f"unknown scheme {scheme!r}; expected one of {', '.join(_REDIS_SCHEMES)}"
        )
    if scheme not in ("redis", "rediss"):
        return value.strip()  # checked where sentinel and cluster URLs, several hosts, are parsed
    url = urllib.parse.urlsplit(value.strip())
    shown = _without_password(url)
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
    return value.strip()


def shown_url(url: str) -> str:
    """``url`` for a message or a log line: a password in it is replaced by ``***``."""
    return _without_password(urllib.parse.urlsplit(url))


def _without_password(url: urllib.parse.SplitResult) -> str:
    """The URL for an error message: a password in it is replaced by ``***``."""
    if url.password is None:
        return url.geturl()
    user, _, host = url.netloc.rpartition("@")
    name = user.split(":", 1)[0]
    return url._replace(netloc=f"{name}:***@{host}").geturl()


def _check_pool(settings: Settings, name: str, value: Any) -> str:
    if not isinstance(value, str) or not _POOL_NAME.match(value):
        raise settings.error(
            name, value, "expected 1 to 64 letters, digits or . _ : - (it becomes a Redis hash tag)"
        )
    return value


def _check_failure_mode(settings: Settings, name: str, value: Any) -> str:
    if value not in ("local", "open", "closed"):
        raise settings.error(name, value, "expected local, open or closed")
    return str(value)


def _check_optional_window(settings: Settings, name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not finite(value):
        raise settings.error(name, value, "expected a number of seconds (0 or more), or unset")
    if value < 0:
        raise settings.error(name, value, "expected a number of seconds (0 or more), or unset")
    return float(value)


def _env_upstreams(key: str, text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.replace("\n", ",").split(",") if part.strip())


def _check_upstreams(settings: Settings, name: str, value: Any) -> tuple[Upstream, ...]:
    from gateway.proxy.upstream import parse_upstream

    expected = "expected base URLs like http://vllm-0:8000, each optionally =model|model"
    if isinstance(value, str):
        value = _env_upstreams(name, value)
    if not isinstance(value, list | tuple):
        raise settings.error(name, value, expected)
    upstreams: list[Upstream] = []
    for entry in value:
        try:
            upstream = parse_upstream_entry(entry)
        except UpstreamSyntaxError as exc:
            raise settings.error(name, entry, f"{exc}; {expected}") from None
        parse_upstream(upstream.url, settings.label(name))
        if any(known.url == upstream.url for known in upstreams):
            raise settings.error(name, entry, f"{upstream.url} is listed twice")
        upstreams.append(upstream)
    return tuple(upstreams)


def _check_routing_policy(settings: Settings, name: str, value: Any) -> str:
    if value not in ("weighted", "round-robin", "least-loaded"):
        raise settings.error(name, value, "expected weighted, round-robin or least-loaded")
    return str(value)


_SCORERS_EXPECTED = "expected scorer:weight pairs like prefix-affinity:5,queue-depth:1"
_env_scorers = _env_pairs(_SCORERS_EXPECTED)


def _check_scorers(settings: Settings, name: str, value: Any) -> Mapping[str, float]:
    """Syntax here; whether each scorer is installed is checked when plugins are loaded."""
    try:
        if isinstance(value, str):
            weights = parse_weights(value)
        elif isinstance(value, Mapping):
            weights = check_weights(value)
        else:
            raise settings.error(name, value, _SCORERS_EXPECTED)
    except WeightSyntaxError as exc:
        raise settings.error(name, value, f"{exc}; {_SCORERS_EXPECTED}") from None
    if not weights:
        raise settings.error(name, value, f"no scorer given; {_SCORERS_EXPECTED}")
    return MappingProxyType(weights)


def _check_bound(*, zero_allowed: bool) -> Callable[[Settings, str, Any], float]:
    """A multiple of an average: finite and at least 1 (or 0, meaning off, where allowed)."""
    accepted = (
        "0 (off) or a finite number of at least 1, e.g. 1.25"
        if zero_allowed
        else "a finite number of at least 1, e.g. 1.5"
    )

    def check(settings: Settings, name: str, value: Any) -> float:
        valid = isinstance(value, int | float) and not isinstance(value, bool)
        if not valid or not finite(value) or (value < 1 and not (zero_allowed and value == 0)):
            raise settings.error(name, value, f"expected {accepted}")
        return float(value)

    return check


def _check_seed(settings: Settings, name: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise settings.error(name, value, "expected a whole number, or unset")
    return value


def _env_optional_int(key: str, text: str) -> int | None:
    return _env_int(key, text) if text.strip() else None


def _check_optional_seconds(settings: Settings, name: str, value: Any) -> float | None:
    return None if value is None else _check_seconds(settings, name, value)


def _env_optional_float(key: str, text: str) -> float | None:
    return _env_float(key, text) if text.strip() else None


#: The smallest ``max_header_bytes``: a request line and a handful of ordinary headers.
MIN_HEADER_BYTES = 1024


def _check_header_bound(settings: Settings, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_HEADER_BYTES:
        raise settings.error(
            name,
            value,
            f"expected a number of bytes of at least {MIN_HEADER_BYTES}, e.g. 65536 (64 KiB)",
        )
    return value


def _check_trusted_proxies(settings: Settings, name: str, value: Any) -> tuple[str, ...]:
    """Each entry an IP address or a CIDR network, kept in its canonical spelling."""
    if isinstance(value, str):
        value = _env_list(name, value)
    if not isinstance(value, list | tuple):
        raise settings.error(
            name, value, "expected IP addresses or networks like 10.0.0.0/8,192.168.1.7"
        )
    try:
        return tuple(str(network) for network in parse_networks(value))
    except ProxyListError as exc:
        raise settings.error(name, exc.entry, str(exc)) from None


def _spec(
    name: str, parse_env: Callable[[str, str], Any], check: Callable[[Settings, str, Any], Any]
) -> _Spec:
    return _Spec(name, parse_env, lambda settings, value: check(settings, name, value))


_SPECS: dict[str, _Spec] = {
    spec.name: spec
    for spec in (
        _spec("global_max_in_flight", _env_int, _check_int(1)),
        _spec("capacity_providers", _env_list, _check_providers),
        _spec("overflow_policy", _env_text, _check_name),
        _spec("max_queue", _env_int, _check_int(0)),
        _spec("queue_timeout_s", _env_float, _check_seconds),
        _spec("tenant_header", _env_optional_text, _check_header),
        _spec("tenant_weights", _env_weights, _check_weights),
        _spec("default_tenant_weight", _env_weight, _check_weight),
        _spec("tenant_max_in_flight", _env_caps, _check_caps),
        _spec("default_tenant", _env_text, _check_name),
        _spec("priority_header", _env_text, _check_priority_header),
        _spec("trust_priority_header", _env_bool, _check_bool),
        _spec("default_priority", _env_text, _check_priority),
        _spec("max_body_bytes", _env_int, _check_int(1)),
        _spec("exempt_paths", _env_list, _check_paths),
        _spec("retry_after_s", _env_float, _check_seconds),
        _spec("disable_plugins", _env_list, _check_names),
        _spec("redis_url", _env_optional_text, _check_redis_url),
        _spec("pool", _env_text, _check_pool),
        _spec("redis_failure_mode", _env_text, _check_failure_mode),
        _spec("lease_ttl_s", _env_float, _check_lease_ttl),
        _spec("redis_pool_size", _env_int, _check_int(2)),
        _spec("redis_retry_budget_s", _env_float, _check_retry_budget),
        _spec("learning_window_s", _env_optional_float, _check_optional_window),
        _spec("upstreams", _env_upstreams, _check_upstreams),
        _spec("routing_policy", _env_text, _check_routing_policy),
        _spec("routing_scorers", _env_scorers, _check_scorers),
        _spec("routing_load_bound", _env_multiple, _check_bound(zero_allowed=False)),
        _spec("routing_load_slack", _env_int, _check_int(1)),
        _spec("routing_placement_bound", _env_multiple, _check_bound(zero_allowed=True)),
        _spec("routing_seed", _env_optional_int, _check_seed),
        _spec("session_header", _env_text, _check_required_header),
        _spec("upstream_header", _env_bool, _check_bool),
        _spec("prefix_block_bytes", _env_int, _check_int(1)),
        _spec("prefix_index_blocks", _env_int, _check_int(1)),
        _spec("upstream_poll_interval_s", _env_float, _check_seconds),
        _spec("upstream_poll_timeout_s", _env_float, _check_seconds),
        _spec("upstream_connect_timeout_s", _env_float, _check_seconds),
        _spec("upstream_response_timeout_s", _env_optional_float, _check_optional_seconds),
        _spec("upstream_read_timeout_s", _env_optional_float, _check_optional_seconds),
        _spec("max_header_bytes", _env_int, _check_header_bound),
        _spec("client_header_timeout_s", _env_float, _check_seconds),
        _spec("client_body_timeout_s", _env_float, _check_seconds),
        _spec("trusted_proxies", _env_list, _check_trusted_proxies),
    )
}


def setting_names() -> tuple[str, ...]:
    """Every setting a user may write, in declaration order."""
    return tuple(_SPECS)


def _unknown_setting(name: str, value: object) -> ConfigError:
    near = difflib.get_close_matches(name, _SPECS, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    return ConfigError(name, value, f"no such setting; {hint}known: {', '.join(_SPECS)}")


_dataclass_init = Settings.__init__


@functools.wraps(_dataclass_init)
def _init_naming_unknown_settings(self: Settings, **kwargs: Any) -> None:
    for name, value in kwargs.items():
        if name == "env_names":
            if not isinstance(value, frozenset) or not value <= _SPECS.keys():
                raise ConfigError(
                    name,
                    value,
                    "is set by Settings.from_env (a frozenset of setting names); leave it out",
                )
        elif name not in _SPECS:
            raise _unknown_setting(name, value)
    _dataclass_init(self, **kwargs)


Settings.__init__ = _init_naming_unknown_settings  # type: ignore[method-assign]
