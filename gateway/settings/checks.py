"""Checks of setting values: each takes what the user gave (a keyword's value or what a
parser read from ``OBLETH_*``) and returns it normalised, or raises ``ConfigError``.

A check is called as ``check(settings, name, value)`` while ``Settings`` is being built,
in declaration order, so it may read settings declared before its own (already checked).
Its error comes from ``settings.error(name, ...)``: it names the setting as the user wrote
it, keyword or variable. The checks of cluster-mode settings are in ``cluster.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gateway.core import weights as core_weights
from gateway.core.networks import ProxyListError, parse_networks
from gateway.core.numbers import finite
from gateway.core.tickets import PRIORITIES
from gateway.core.weights import WeightSyntaxError, named_entries, parse_weights
from gateway.routing.upstreams import (
    Upstream,
    UpstreamSyntaxError,
    parse_upstream,
    parse_upstream_entry,
    server_of,
)
from gateway.settings.parsers import SCORERS_EXPECTED, env_list, env_upstreams

if TYPE_CHECKING:
    from gateway.settings.fields import Settings

_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9a-z]+$")


#: The largest limit, queue bound or cap: Redis' scripts hold counts as Lua numbers,
#: which are written in exponent notation from 10^14 on; no fleet comes near this.
MAX_COUNT = 10**9


def check_int(minimum: int, maximum: int | None = None) -> Callable[[Settings, str, Any], int]:
    def check(settings: Settings, name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise settings.error(name, value, f"expected a whole number of at least {minimum}")
        if maximum is not None and value > maximum:
            raise settings.error(name, value, f"expected a whole number of at most {maximum}")
        return value

    return check


#: The longest any seconds setting may be: one day. Each is a wait within one request's
#: life, a pause between two readings, or how long a lost pod's seats stay taken; none has
#: a use beyond a day. Larger values were taken as given: 1e20 became a 21-digit
#: ``Retry-After``, a lease that never lets a crashed pod's seats go, and from about 1e305
#: an overflow (a traceback at startup) where the Redis backend turns them into
#: milliseconds. Where "no limit" is meaningful (the upstream timeouts) it is spelled None.
MAX_SECONDS = 86_400

#: The message of a seconds setting over ``MAX_SECONDS``.
AT_MOST_A_DAY = f"expected at most {MAX_SECONDS} seconds (one day)"


def check_seconds(settings: Settings, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise settings.error(name, value, "expected a number of seconds")
    if not finite(value) or value <= 0:
        raise settings.error(name, value, "expected a finite number of seconds above 0")
    if value > MAX_SECONDS:
        raise settings.error(name, value, AT_MOST_A_DAY)
    return float(value)


def check_seconds_from(least: float) -> Callable[[Settings, str, Any], float]:
    """``check_seconds``, and at least ``least``: for an interval that a loop waits
    between rounds, where a typo like 1e-6 would make it spin."""

    def check(settings: Settings, name: str, value: Any) -> float:
        seconds = check_seconds(settings, name, value)
        if seconds < least:
            raise settings.error(name, value, f"expected at least {least:g} s")
        return seconds

    return check


def check_name(settings: Settings, name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise settings.error(name, value, "expected a non-empty name")
    return value.strip()


def check_names(settings: Settings, name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = env_list(name, value)
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise settings.error(name, value, "expected a list of names")
    names = tuple(v.strip() for v in value if v.strip())
    if len(set(names)) != len(names):
        raise settings.error(name, value, "a name is listed twice")
    return names


def check_providers(settings: Settings, name: str, value: Any) -> tuple[str, ...]:
    names = check_names(settings, name, value)
    if not names:
        raise settings.error(name, value, "expected at least one capacity provider, e.g. static")
    return names


def check_header(settings: Settings, name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _HEADER_NAME.match(value.strip().lower()):
        raise settings.error(name, value, "expected an HTTP header name, e.g. x-tenant")
    return value.strip().lower()


#: the shortest admin token accepted: guessing one of 16 random characters is hopeless
MIN_TOKEN_CHARS = 16


def check_token(settings: Settings, name: str, value: Any) -> str | None:
    """A bearer token, or None; an error never shows the token itself."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value.strip()) < MIN_TOKEN_CHARS:
        # counted as it is used: without the white space around it
        shown = (
            f"<{len(value.strip())} characters>" if isinstance(value, str) else type(value).__name__
        )
        raise settings.error(
            name,
            shown,
            f"expected a token of at least {MIN_TOKEN_CHARS} characters, e.g. the output of "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`",
        )
    token: str = value.strip()
    if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        # an HTTP header carries it: beyond ASCII, clients (a browser's fetch, the CLI)
        # would send other bytes than curl does, or none at all
        raise settings.error(
            name, "<hidden>", "expected a token of printable ASCII, without spaces or controls"
        )
    return token


def check_required_header(settings: Settings, name: str, value: Any) -> str:
    header = check_header(settings, name, value)
    if header is None:
        raise settings.error(name, value, "expected an HTTP header name, e.g. x-priority")
    return header


def check_weights(settings: Settings, name: str, value: Any) -> Mapping[str, float]:
    if not isinstance(value, Mapping):
        raise settings.error(name, value, "expected a mapping like {'gold': 4, 'free': 1}")
    try:
        return MappingProxyType(core_weights.check_weights(value))
    except WeightSyntaxError as exc:
        raise settings.error(
            name, dict(value), f"{exc}; weights are finite numbers above 0"
        ) from None


def check_weight(settings: Settings, name: str, value: Any) -> float:
    try:
        return core_weights.check_weights({name: value})[name]
    except WeightSyntaxError as exc:
        raise settings.error(name, value, f"{exc}; a weight is a finite number above 0") from None


PerTenantCheck = Callable[["Settings", str, Any], "int | Mapping[str, int] | None"]


def _check_per_tenant(noun: str, few: int, many: int) -> PerTenantCheck:
    """The check of a whole number per tenant, a ``noun`` (a cap, a budget), from 1 to
    ``MAX_COUNT``; ``few`` and ``many`` make the example the message shows."""
    expected = (
        f"expected a whole number of at least 1 and at most {MAX_COUNT}, or such {noun}s by "
        f"tenant: {{'free': {few}, '*': {many}}}, or free:{few},*:{many} in the environment"
    )

    def check(settings: Settings, name: str, value: Any) -> int | Mapping[str, int] | None:
        if value is None or (
            isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_COUNT
        ):
            return value
        if not isinstance(value, Mapping):
            raise settings.error(name, value, expected)
        try:
            amounts = named_entries(value)
        except WeightSyntaxError as exc:
            raise settings.error(name, dict(value), f"{exc}; {expected}") from None
        for tenant, amount in amounts.items():
            if (
                isinstance(amount, bool)
                or not isinstance(amount, int)
                or not 1 <= amount <= MAX_COUNT
            ):
                raise settings.error(name, dict(value), f"{tenant}: {noun} {amount!r}; {expected}")
        return MappingProxyType(amounts)

    return check


check_caps = _check_per_tenant("cap", 4, 16)
check_budgets = _check_per_tenant("budget", 60, 600)


#: The largest token budget taken: well above any fleet's KV cache, well within a double.
MAX_TOKENS = 10**12


def check_optional_count(maximum: int) -> Callable[[Settings, str, Any], int | None]:
    """A whole number from 1 to ``maximum``, or None (unset)."""

    def check(settings: Settings, name: str, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
            raise settings.error(
                name, value, f"expected a whole number from 1 to {maximum}, or unset"
            )
        return value

    return check


def check_fairness_cost(settings: Settings, name: str, value: Any) -> str:
    if value not in ("requests", "tokens"):
        raise settings.error(name, value, "expected requests or tokens")
    return str(value)


def check_priority(settings: Settings, name: str, value: Any) -> str:
    if value not in PRIORITIES:
        raise settings.error(name, value, f"expected one of {', '.join(PRIORITIES)}")
    return str(value)


#: Where the built-in classifier looks for an API key, in this order.
API_KEY_HEADERS = ("authorization", "x-api-key", "api-key")


def check_priority_header(settings: Settings, name: str, value: Any) -> str:
    header = check_required_header(settings, name, value)
    if header == settings.tenant_header and not settings.chose(name):
        label = settings.label(name, like="tenant_header")
        raise settings.error(
            "tenant_header",
            settings.tenant_header,
            f"{header!r} is the priority header ({label}'s default); choose another tenant "
            f"header, e.g. x-tenant, or set {label} to a header of its own",
        )
    if header == settings.tenant_header or header in API_KEY_HEADERS:
        other = "x-priority" if header != "x-priority" else "x-request-priority"
        raise settings.error(
            name,
            value,
            f"{header!r} already names the tenant; choose a header of its own, e.g. {other}",
        )
    return header


def check_bool(settings: Settings, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise settings.error(name, value, "expected True or False")
    return value


def check_paths(settings: Settings, name: str, value: Any) -> tuple[str, ...]:
    paths = check_names(settings, name, value)
    for path in paths:
        if not path.startswith("/"):
            raise settings.error(name, value, f"{path!r} is not a path; paths start with '/'")
        if any(c.isspace() for c in path) or "?" in path or "#" in path:
            # a request's path is matched without its query; white space is most likely
            # two paths written with a space between them
            raise settings.error(
                name,
                value,
                f"{path!r} is no path a request can have: separate paths with commas, and "
                "leave out any query",
            )
    normalised = tuple(path.rstrip("/") or "/" for path in paths)
    if len(set(normalised)) != len(normalised):
        raise settings.error(
            name, value, "a path is listed twice (a trailing '/' makes no difference)"
        )
    return normalised


def check_upstreams(settings: Settings, name: str, value: Any) -> tuple[Upstream, ...]:
    expected = "expected base URLs like http://vllm-0:8000, each optionally =model|model"
    if isinstance(value, str):
        value = env_upstreams(name, value)
    if not isinstance(value, list | tuple):
        raise settings.error(name, value, expected)
    upstreams: list[Upstream] = []
    for entry in value:
        try:
            upstream = parse_upstream_entry(entry)
        except UpstreamSyntaxError as exc:
            raise settings.error(name, entry, f"{exc}; {expected}") from None
        server = server_of(parse_upstream(upstream.url, settings.label(name)))
        twin = next((known for known in upstreams if server_of(known.url) == server), None)
        if twin is not None:
            said = upstream.url if twin.url == upstream.url else f"{upstream.url} ({twin.url})"
            raise settings.error(name, entry, f"{said} is listed twice")
        upstreams.append(upstream)
    return tuple(upstreams)


def check_routing_policy(settings: Settings, name: str, value: Any) -> str:
    if value not in ("weighted", "round-robin", "least-loaded"):
        raise settings.error(name, value, "expected weighted, round-robin or least-loaded")
    return str(value)


def check_scorers(settings: Settings, name: str, value: Any) -> Mapping[str, float]:
    """Syntax here; whether each scorer is installed is checked when plugins are loaded."""
    try:
        if isinstance(value, str):
            weights = parse_weights(value)
        elif isinstance(value, Mapping):
            weights = core_weights.check_weights(value)
        else:
            raise settings.error(name, value, SCORERS_EXPECTED)
    except WeightSyntaxError as exc:
        raise settings.error(name, value, f"{exc}; {SCORERS_EXPECTED}") from None
    if not weights:
        raise settings.error(name, value, f"no scorer given; {SCORERS_EXPECTED}")
    return MappingProxyType(weights)


def check_bound(*, zero_allowed: bool) -> Callable[[Settings, str, Any], float]:
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


def check_seed(settings: Settings, name: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise settings.error(name, value, "expected a whole number, or unset")
    return value


def check_optional_seconds(settings: Settings, name: str, value: Any) -> float | None:
    """``check_seconds``, or None for no limit (what an empty variable reads as)."""
    if value is None:
        return None
    if finite(value) and value > MAX_SECONDS:
        unset = "leave it empty" if name in settings.env_names else "None"
        raise settings.error(name, value, f"{AT_MOST_A_DAY}, or {unset} for no limit")
    return check_seconds(settings, name, value)


#: The smallest ``max_header_bytes``: a request line and a handful of ordinary headers.
MIN_HEADER_BYTES = 1024


def check_header_bound(settings: Settings, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_HEADER_BYTES:
        raise settings.error(
            name,
            value,
            f"expected a number of bytes of at least {MIN_HEADER_BYTES}, e.g. 65536 (64 KiB)",
        )
    return value


def check_trusted_proxies(settings: Settings, name: str, value: Any) -> tuple[str, ...]:
    """Each entry an IP address or a CIDR network, kept in its canonical spelling."""
    if isinstance(value, str):
        value = env_list(name, value)
    if not isinstance(value, list | tuple):
        raise settings.error(
            name, value, "expected IP addresses or networks like 10.0.0.0/8,192.168.1.7"
        )
    try:
        return tuple(str(network) for network in parse_networks(value))
    except ProxyListError as exc:
        raise settings.error(name, exc.entry, str(exc)) from None
