"""``Settings``: every setting declared once, with its type, default, parser, check and doc.

A setting's environment variable is ``OBLETH_`` + its name in upper case. Its doc line is
Markdown, its row in docs/configuration.md, which ``python -m gateway.settings.doctable``
writes from these declarations. Settings are listed in the order of that table, those of
admission control first (``admission.py``), then cluster mode, routing, the proxy and
operations here; a check may read the settings declared before its own
(``priority_header`` reads ``tenant_header``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gateway.routing.upstreams import Upstream
from gateway.settings import checks, cluster, parsers
from gateway.settings.admission import AdmissionSettings
from gateway.settings.declared import setting, specs_of


@dataclass(frozen=True, kw_only=True)
class Settings(AdmissionSettings):
    """Everything a gateway is configured by; immutable once built.

    ``Settings(...)`` takes keyword arguments only; ``Settings.from_env()`` reads
    ``OBLETH_<NAME>`` for each field (lists comma-separated, weights as ``gold:4,free:1``).
    """

    redis_url: str | None = setting(
        None,
        doc="Cluster mode: every pod with the same Redis and `pool` shares one budget, one "
        "limit and one fair queue. `redis://`, `rediss://`, `unix://`, "
        "`redis+sentinel://host:26379,…/<service>[/<db>]`, `redis+cluster://host:port,…`; "
        "a password's `/`, `?`, `#` and `@` percent-encoded (`%2F`, `%3F`, `%23`, `%40`). "
        "Without it, each worker process (`uvicorn --workers`, gunicorn `-w`) has a budget of "
        "its own, and the gateway logs an error at startup when it finds one beside it. See "
        "[cluster.md](cluster.md).",
        parse=parsers.env_optional_text,
        check=cluster.check_redis_url,
    )
    pool: str = setting(
        "default",
        doc="Name of the shared budget; services with different pools never share seats. 1 to "
        "64 letters, digits, `. _ : -` (it becomes a Redis hash tag).",
        parse=parsers.env_text,
        check=cluster.check_pool,
    )
    redis_failure_mode: Literal["local", "open", "closed"] = setting(
        "local",
        doc="When Redis cannot be reached: `local` (each pod admits up to limit ÷ live pods), "
        "`open` (admit everything), `closed` (503 `unavailable` for new requests).",
        parse=parsers.env_text,
        check=cluster.check_failure_mode,
    )
    lease_ttl_s: float = setting(
        10.0,
        doc="How long Redis keeps a silent pod's seats; pods renew every third of it, and a "
        "crashed pod's seats come back within it. At least 0.5 s, and at least 1.5 times "
        "`redis_retry_budget_s` (a pod retrying Redis must not lose its seats meanwhile).",
        parse=parsers.env_float,
        check=cluster.check_lease_ttl,
    )
    redis_pool_size: int = setting(
        32,
        doc="Connections per pod to Redis (one more carries grant notifications). Whole "
        "number ≥ 2.",
        parse=parsers.env_int,
        check=checks.check_int(2),
    )
    redis_retry_budget_s: float = setting(
        1.0,
        doc="How long a pod retries an unreachable Redis before the failure mode applies.",
        parse=parsers.env_float,
        check=cluster.check_retry_budget,
    )
    learning_window_s: float | None = setting(
        None,
        doc="The fallback of a roll call: after Redis lost count of what runs (lost state, a "
        "failover, pods back from their failure mode), nothing new is granted until every pod "
        "has written back what it holds, or at the latest until this has passed. `0` turns "
        "roll calls off (only if Redis never loses state). See "
        "[cluster.md](cluster.md#after-redis-loses-count-roll-calls).",
        parse=parsers.env_optional_float,
        check=cluster.check_optional_window,
        shown_default="two heartbeats + retry budget",
    )
    upstreams: tuple[Upstream, ...] = setting(
        (),
        doc="Inference servers to route admitted requests to; routing is on when set. Base "
        "URLs (`http://` or `https://`), each optionally with the models it serves: "
        "`http://vllm-0:8000=llama-3|qwen`. Comma- or newline-separated in the environment; "
        "a list in code. See [routing.md](routing.md).",
        parse=parsers.env_upstreams,
        check=checks.check_upstreams,
    )
    routing_policy: Literal["weighted", "round-robin", "least-loaded"] = setting(
        "weighted",
        doc="How an upstream is chosen: `weighted` (the weighted sum of `routing_scorers`), "
        "`round-robin`, or `least-loaded` (fewest waiting + running + the gateway's requests "
        "in flight).",
        parse=parsers.env_text,
        check=checks.check_routing_policy,
    )
    routing_scorers: Mapping[str, float] = setting(
        {"prefix-affinity": 5.0, "queue-depth": 1.0},
        doc="Scorers and weights of the `weighted` policy, `name:weight` pairs in the "
        'environment, `{"prefix-affinity": 5, "queue-depth": 1}` in code. Weights are finite '
        "and above 0; names must be installed scorers.",
        parse=parsers.env_scorers,
        check=checks.check_scorers,
    )
    routing_load_bound: float = setting(
        1.5,
        doc="The load guard of the `weighted` policy: an upstream is passed over while taking "
        "the request would put it above this multiple of the average of the gateway's "
        "requests in flight (rounded up) and it keeps requests queued (scraped `waiting` ≥ 2 "
        "in each of its last two scrapes) or is `routing_load_slack` ahead of the least "
        "loaded. A finite number ≥ 1.",
        parse=parsers.env_multiple,
        check=checks.check_bound(zero_allowed=False),
    )
    routing_load_slack: int = setting(
        8,
        doc="The other half of the load guard: an upstream above the bound is also passed "
        "over, even with no queue scraped yet, once it holds this many more of the gateway's "
        "requests than the least loaded upstream. A whole number ≥ 1.",
        parse=parsers.env_int,
        check=checks.check_int(1),
    )
    routing_placement_bound: float = setting(
        1.25,
        doc="Where a prefix that no upstream holds goes: of the upstreams not above this "
        "multiple of the average in prompt content placed, and within one request of the "
        "fewest of the gateway's requests in flight, the one sent a request longest ago "
        "(ties: the rendezvous order of its first block). `0`: plain rendezvous "
        "hashing. With Redis, pods share their placements; several pods without Redis should "
        "set `0` so that they agree. `0` or a finite number ≥ 1. See "
        "[routing](routing.md#prefix-affinity).",
        parse=parsers.env_multiple,
        check=checks.check_bound(zero_allowed=True),
    )
    routing_seed: int | None = setting(
        None,
        doc="Seed of the random choice between upstreams that tie; unset, a random seed. For "
        "reproducible tests, not production.",
        parse=parsers.env_optional_int,
        check=checks.check_seed,
    )
    session_header: str = setting(
        "x-session-id",
        doc="Request header carrying a session id, for the `session-affinity` scorer.",
        parse=parsers.env_text,
        check=checks.check_required_header,
    )
    upstream_header: bool = setting(
        False,
        doc="Add `X-Obleth-Upstream` (the upstream that answered) to every routed response.",
        parse=parsers.env_bool,
        check=checks.check_bool,
    )
    prefix_block_bytes: int = setting(
        256,
        doc="Size in bytes of the prompt blocks `prefix-affinity` hashes (256 bytes is about "
        "64 tokens). Whole number ≥ 1.",
        parse=parsers.env_int,
        check=checks.check_int(1),
    )
    prefix_index_blocks: int = setting(
        16384,
        doc="How many block hashes `prefix-affinity` remembers per upstream (an LRU). Whole "
        "number ≥ 1.",
        parse=parsers.env_int,
        check=checks.check_int(1),
    )
    upstream_poll_interval_s: float = setting(
        0.25,
        doc="How often each upstream's `/metrics` and `/health` are read while requests come "
        "(see `upstream_idle_poll_factor` for the idle pace). A reading older than three "
        "intervals is stale and counts as saturated. At least 0.01 s.",
        parse=parsers.env_float,
        check=checks.check_seconds_from(0.01),
    )
    upstream_idle_poll_factor: float = setting(
        4.0,
        doc="How many times less often upstreams are read while the gateway is idle: no "
        "request has arrived for four polling intervals (1 s by default) and none is in "
        "flight (in cluster mode, on any pod). While idle, a reading is stale only after "
        "three of the longer intervals. The first request to arrive starts a reading at once, "
        "and the pace is `upstream_poll_interval_s` again. A finite number ≥ 1; 1 keeps one "
        "pace.",
        parse=parsers.env_multiple,
        check=checks.check_bound(zero_allowed=False),
    )
    upstream_poll_timeout_s: float = setting(
        0.2,
        doc="How long one scrape or health check may take before the upstream counts as not "
        "answering.",
        parse=parsers.env_float,
        check=checks.check_seconds,
    )
    upstream_connect_timeout_s: float = setting(
        5.0,
        doc="Proxy (`obleth serve`): how long connecting to an upstream, or waiting for a free "
        "pooled connection, may take.",
        parse=parsers.env_float,
        check=checks.check_seconds,
    )
    upstream_response_timeout_s: float | None = setting(
        300.0,
        doc="Proxy (`obleth serve`): how long an upstream may take, once the request is "
        "written, to send its response headers, and how long it may stop taking the request "
        "body; past it, `504 upstream_timeout`. Empty in the environment (`None` in code): "
        "no limit.",
        parse=parsers.env_optional_float,
        check=checks.check_optional_seconds,
    )
    upstream_read_timeout_s: float | None = setting(
        300.0,
        doc="Proxy (`obleth serve`): the longest silence allowed between two chunks of a "
        "response body; past it, the response is cut short. Empty in the environment (`None` "
        "in code): no limit.",
        parse=parsers.env_optional_float,
        check=checks.check_optional_seconds,
    )
    max_header_bytes: int = setting(
        64 * 1024,
        doc="`obleth serve`: the largest request line plus headers a client may send, in "
        "bytes; a larger head is answered `431 headers_too_large` and its connection closed, "
        "and no more than this (plus one socket read) of it is held in memory. Whole number "
        "≥ 1024. See [routing.md](routing.md#the-streaming-proxy-and-obleth-serve).",
        parse=parsers.env_int,
        check=checks.check_header_bound,
    )
    client_header_timeout_s: float = setting(
        10.0,
        doc="`obleth serve`: how long a client may take to send a request's line and headers, "
        "counted from the connection's opening (its first request) or from the request's "
        "first byte (later requests on a kept-alive connection); past it, `408 "
        "header_timeout` and the connection is closed. A new connection that sends nothing "
        "in that time is closed without an answer.",
        parse=parsers.env_float,
        check=checks.check_seconds,
    )
    client_body_timeout_s: float = setting(
        30.0,
        doc="`obleth serve`: the longest a request body may pause while the gateway waits for "
        "its next chunk; past it, the request is dropped as if the client had left (its seat "
        "given back), the client gets `408 body_timeout` if no response had started, and the "
        "connection is closed. Time spent waiting in the fair queue never counts.",
        parse=parsers.env_float,
        check=checks.check_seconds,
    )
    trusted_proxies: tuple[str, ...] = setting(
        (),
        doc="Proxy: IP addresses and CIDR networks (`10.0.0.0/8,192.168.1.7`, comma-separated "
        "in the environment) of the load balancers or proxies whose `X-Forwarded-*`, "
        "`Forwarded` and `X-Real-IP` headers are believed: the peer's address is appended to "
        "their `X-Forwarded-For`. From any other peer those headers are dropped and the "
        "gateway writes `X-Forwarded-For` (the peer), `X-Forwarded-Host` and "
        "`X-Forwarded-Proto` itself. A network with host bits set (`10.0.0.1/8`) is an error. "
        "See [routing.md](routing.md#the-streaming-proxy-and-obleth-serve).",
        parse=parsers.env_list,
        check=checks.check_trusted_proxies,
    )
    admin_token: str | None = setting(
        None,
        doc="Bearer token of the admin API (`/api/v1/capacity`); without it the API is off "
        "(404). At least 16 characters of printable ASCII, no spaces; never logged. See "
        "[operations.md](operations.md).",
        parse=parsers.env_optional_text,
        check=checks.check_token,
        secret=True,
    )
    telemetry_tenants: int = setting(
        20,
        doc="How many tenants the metrics (`obleth_requests_total`'s `tenant` label) and "
        "`/api/v1/status` name; the rest are counted as `other`, so that a flood of tenant "
        "names cannot grow them without bound. See [operations.md](operations.md#metrics).",
        parse=parsers.env_int,
        check=checks.check_int(1),
    )


def setting_names() -> tuple[str, ...]:
    """Every setting a user may write, in declaration order."""
    return tuple(specs_of(Settings))
