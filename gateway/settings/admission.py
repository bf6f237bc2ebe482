"""``AdmissionSettings``: the settings of admission control (the limit, the fair queue,
tenants and priorities, what the gate reads of a request), the first part of ``Settings``
(``fields.py``), declared as it declares the rest.

It is not used alone: ``Settings`` extends it, so that these come first in declaration
order (and in docs/configuration.md's table), and the checks of later settings may read
them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.core.rates import RateRules
from gateway.core.tickets import Priority
from gateway.settings import checks, parsers
from gateway.settings.declared import Declared, setting


@dataclass(frozen=True, kw_only=True)
class AdmissionSettings(Declared):
    """The admission-control settings; see ``Settings``, which holds them all."""

    global_max_in_flight: int = setting(
        64,
        doc="The static limit on requests in flight (the `static` capacity provider's). "
        "Whole number from 1 to 10^9.",
        parse=parsers.env_int,
        check=checks.check_int(1, checks.MAX_COUNT),
    )
    capacity_providers: tuple[str, ...] = setting(
        ("static",),
        doc="Capacity providers by name, comma-separated in the environment. The effective "
        "limit is the minimum of them all.",
        parse=parsers.env_list,
        check=checks.check_providers,
    )
    overflow_policy: str = setting(
        "block",
        doc="What happens when no seat is free: `block` (wait; when the queue is full, wait "
        "for room), `drop-newest` (wait while the queue has room, else 503 `queue_full`), "
        "`drop-oldest` (evict the oldest waiter of the heaviest tenant when full), `reject` "
        "(503 `over_capacity` at once; nothing waits), or a plugin's policy. See "
        "[overflow policies](#overflow-policies).",
        parse=parsers.env_text,
        check=checks.check_name,
    )
    max_queue: int = setting(
        1024,
        doc="How many requests may wait in the fair queue at once; when it is full, the "
        "overflow policy says what happens. Whole number from 0 to 10^9.",
        parse=parsers.env_int,
        check=checks.check_int(0, checks.MAX_COUNT),
    )
    queue_timeout_s: float = setting(
        30.0,
        doc="How long a request may wait for a seat before it is answered `503 queue_timeout`.",
        parse=parsers.env_float,
        check=checks.check_seconds,
    )
    tenant_header: str | None = setting(
        None,
        doc="Request header naming the tenant (read as UTF-8; a value that is no UTF-8, as "
        "Latin-1; a name over 256 characters is answered `400`). Without it, the tenant is "
        "derived from the API key.",
        parse=parsers.env_optional_text,
        check=checks.check_header,
    )
    tenant_weights: Mapping[str, float] = setting(
        {},
        doc='Fair-share weights, `gold:4,free:1` in the environment, `{"gold": 4, "free": 1}` '
        "in code; finite numbers above 0. Tenants not listed weigh `default_tenant_weight`.",
        parse=parsers.env_weights,
        check=checks.check_weights,
    )
    default_tenant_weight: float = setting(
        1.0,
        doc="Weight of every tenant not listed in `tenant_weights`; a finite number above 0.",
        parse=parsers.env_weight,
        check=checks.check_weight,
    )
    tenant_max_in_flight: int | Mapping[str, int] | None = setting(
        None,
        doc="A per-tenant cap: one number for every tenant, or `free:4,*:16` (`*` for the "
        'rest; `{"free": 4, "*": 16}` in code). It counts a tenant\'s running and waiting '
        "requests; over it, `429 tenant_limit`.",
        parse=parsers.env_caps,
        check=checks.check_caps,
    )
    tenant_rpm: int | Mapping[str, int] | None = setting(
        None,
        doc="Requests per minute a tenant may start: one number for every tenant, or "
        "`free:60,*:600` (`*` for the rest). A tenant may spend its minute at once, then "
        "earns one back every `60 / N` seconds; over it, `429 requests_per_minute` with the "
        "wait in `Retry-After`. Reserved before admission, returned when the gate then "
        "refuses the request. See [rate budgets](#rate-budgets).",
        parse=parsers.env_budgets,
        check=checks.check_budgets,
    )
    tenant_tpm: int | Mapping[str, int] | None = setting(
        None,
        doc="Tokens per minute a tenant may reserve, in the form of `tenant_rpm`. A "
        "request's tokens are estimated before admission from its body (prompt bytes / 4, "
        "plus `n` times `max_tokens` or `default_max_tokens`); over the budget, "
        "`429 tokens_per_minute`. See [rate budgets](#rate-budgets).",
        parse=parsers.env_budgets,
        check=checks.check_budgets,
    )
    default_max_tokens: int = setting(
        256,
        doc="Tokens a request that states no `max_tokens` (nor `max_completion_tokens`) is "
        "expected to generate, in the estimate `tenant_tpm`, `global_max_tokens_in_flight` "
        "and `fairness_cost` count. Whole number from 0 to 10^9.",
        parse=parsers.env_int,
        check=checks.check_int(0, checks.MAX_COUNT),
    )
    global_max_tokens_in_flight: int | None = setting(
        None,
        doc="A budget of tokens in flight: the sum of the token estimates of the requests "
        "running (estimated as for `tenant_tpm`). A request waits in the fair queue until "
        "a seat and its tokens are both free; one estimated above the whole budget runs "
        "alone. Whole number from 1 to 10^12. See [token budgets](#token-budgets).",
        parse=parsers.env_optional_int,
        check=checks.check_optional_count(checks.MAX_TOKENS),
    )
    fairness_cost: str = setting(
        "requests",
        doc="What the fair queue shares among tenants: `requests` (each tenant's requests "
        "in flight, per unit of weight) or `tokens` (the token estimates of its requests "
        "in flight: a tenant of long requests runs fewer of them). See "
        "[token budgets](#token-budgets).",
        parse=parsers.env_text,
        check=checks.check_fairness_cost,
    )
    default_tenant: str = setting(
        "anonymous",
        doc="Tenant of requests that carry neither the tenant header nor an API key.",
        parse=parsers.env_text,
        check=checks.check_name,
    )
    priority_header: str = setting(
        "x-priority",
        doc="Request header carrying `critical`, `standard` or `background`; a header of its "
        "own, not `tenant_header` nor one the API key is read from.",
        parse=parsers.env_text,
        check=checks.check_priority_header,
    )
    trust_priority_header: bool = setting(
        False,
        doc="Whether to read `priority_header` at all. Off by default: any client could claim "
        "`critical`. Turn it on when a trusted proxy sets the header.",
        parse=parsers.env_bool,
        check=checks.check_bool,
    )
    # setting() returns a dataclasses.Field, as field() does: nothing is shared between
    # instances (ruff cannot tell from an alias such as Priority that the type is immutable)
    default_priority: Priority = setting(
        "standard",
        doc="Priority of requests that do not (or may not) state one.",
        parse=parsers.env_text,
        check=checks.check_priority,
    )
    max_body_bytes: int = setting(
        8 * 1024 * 1024,
        doc="Largest JSON request body read (for routing, a classifier plugin that reads "
        "bodies, or a token estimate; the built-in classifier reads none); a larger one "
        "gets `413`, but for a token estimate alone (see [rate budgets](#rate-budgets)). "
        "JSON is "
        "`application/json`, `application/*+json` or, within this length, no "
        "`Content-Type`, as vLLM reads it. "
        "Other bodies stream to the app; of a request waiting in the queue, at most 64 KiB "
        "(or `max_body_bytes`, if lower) is taken off the connection meanwhile and kept for "
        "the app.",
        parse=parsers.env_int,
        check=checks.check_int(1),
    )
    exempt_paths: tuple[str, ...] = setting(
        (
            "/healthz",
            "/readyz",
            "/metrics",
            "/api/v1/capacity",
            "/api/v1/status",
            "/api/v1/openapi.json",
            "/dashboard",
        ),
        doc="Paths that are never admission-controlled, exactly or as a prefix followed by "
        "`/`: the probes, metrics, the admin API and its dashboard, which operators need "
        "during overload. "
        "A path with a `.` or `..` segment (`/healthz/../v1/completions`) never counts. "
        "Matched below the ASGI root path (`uvicorn --root-path /gw`: `/gw/healthz`). "
        "Under `obleth serve`, requests on them that it does not answer itself are still "
        "forwarded to an upstream, without admission.",
        parse=parsers.env_list,
        check=checks.check_paths,
    )
    retry_after_s: float = setting(
        1.0,
        doc="What `Retry-After` tells rejected clients (rounded up to whole seconds).",
        parse=parsers.env_float,
        check=checks.check_seconds,
    )
    disable_plugins: tuple[str, ...] = setting(
        (),
        doc="Plugins not to load, by entry-point or built-in name, such as a broken "
        "third-party one (see [plugins.md](plugins.md)).",
        parse=parsers.env_list,
        check=checks.check_names,
    )

    def tenant_caps(self) -> tuple[dict[str, int], int | None]:
        """``tenant_max_in_flight`` split into the named tenants' caps and everyone else's."""
        return _split(self.tenant_max_in_flight)

    def rate_rules(self) -> RateRules:
        """``tenant_rpm`` and ``tenant_tpm``, each split as ``tenant_caps`` splits caps."""
        rpm, default_rpm = _split(self.tenant_rpm)
        tpm, default_tpm = _split(self.tenant_tpm)
        return RateRules(rpm, default_rpm, tpm, default_tpm)


def _split(caps: int | Mapping[str, int] | None) -> tuple[dict[str, int], int | None]:
    """Per-tenant numbers split into the named tenants' and everyone else's (``*``)."""
    if caps is None or isinstance(caps, int):
        return {}, caps
    named = dict(caps)
    return named, named.pop("*", None)
