"""Every ``obleth_*`` hook. These docstrings are the plugin author's manual.

A plugin is a module (or object) with functions marked ``@hookimpl``
(``from gateway import hookimpl``), installed from its own distribution with an entry
point in the ``obleth`` group::

    [project.entry-points.obleth]
    my-capacity = "my_package.plugin"

Hooks are synchronous. Collector hooks run once, when a gateway starts; the others run on
the request path and must not do I/O. An exception raised by a hook is reported with the
plugin's name: at startup it stops the gateway, on the request path it is logged and the
request goes on as if the plugin had answered nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

import pluggy

if TYPE_CHECKING:
    from gateway.protocols import Classification, Factory, RequestInfo
    from gateway.settings import Settings
    from gateway.types import Scope

hookspec = pluggy.HookspecMarker("obleth")


@hookspec
def obleth_capacity_providers() -> Mapping[str, Factory]:
    """Offer capacity providers, as ``{name: factory}``.

    Called once per gateway at startup. Names are what users write in
    ``capacity_providers`` (kebab-case, unique across all installed plugins). Each factory
    is called with the gateway's ``Settings`` only if the user selected its name, and
    returns an object with ``max_in_flight() -> int`` (see
    ``gateway.protocols.CapacityProvider``). Providers selected together combine by
    minimum.
    """


@hookspec
def obleth_overflow_policies() -> Mapping[str, Factory]:
    """Offer overflow policies, as ``{name: factory}``.

    Called once per gateway at startup. The user selects one by name with
    ``overflow_policy``. The factory is called with ``Settings`` and returns an object with
    ``decide(view, ticket) -> "wait" | "queue" | "evict" | "reject"`` (see
    ``gateway.protocols.OverflowPolicy``), called on the request path (no I/O) for a
    request that finds no free seat. The actions differ when the queue (``max_queue``) is
    full:

    - ``"wait"``: wait in the queue; when it is full, wait for room (first come first
      served, outside ``max_queue``), never refused for it. The built-in ``block``.
    - ``"queue"``: wait in the queue while it has room; when it is full, 503
      ``queue_full``. The built-in ``drop-newest``.
    - ``"evict"``: wait in the queue; when it is full, the oldest waiter of the heaviest
      tenant (never one more urgent than the newcomer) is answered 503 ``evicted`` and
      the newcomer takes its place. The built-in ``drop-oldest``.
    - ``"reject"``: never wait: 503 ``over_capacity`` (``queue_full`` when the queue is
      full). The built-in ``reject``.

    Whatever it answers, a waiter waits at most ``queue_timeout_s``. ``background``
    requests and tenants over their cap are decided before the policy is asked.
    """


@hookspec
def obleth_routing_scorers() -> Mapping[str, Factory]:
    """Offer routing scorers, as ``{name: factory}``.

    Called once per gateway at startup. The factory is called with ``Settings`` and returns
    an object with ``score(request, upstreams) -> {upstream: float in [0, 1]}`` (see
    ``gateway.protocols.RoutingScorer``).
    """


@hookspec(firstresult=True)
def obleth_classify_request(
    scope: Scope, headers: Mapping[str, str], body: bytes | None, settings: Settings
) -> Classification | None:
    """Say who sent a request and how urgent it is.

    Called for every admission-controlled request, before admission; no I/O. ``headers``
    has lower-case names; ``body`` is the request body when it was read (JSON requests up
    to ``max_body_bytes``), else None; ``settings`` are the gateway's. Take only the
    arguments you need. Return a ``Classification`` or None to let the next
    plugin decide; the first answer wins and the built-in classifier answers last. Never
    put a raw API key in ``tenant``: it becomes a key and a metric label. Raise
    ``gateway.errors.BadRequest`` to answer 400 with your message.

    A classifier that reads nothing but headers may offer a faster path, used while it is
    the only classifier: set ``HEADER_TICKETS`` on the hook function to a callable that
    takes ``Settings`` and returns an object whose ``ticket(raw_headers)`` answers from
    the ASGI scope's ``(name, value)`` byte pairs with a ``gateway.core.tickets.Ticket``,
    exactly as the hook would (the built-in classifier does).
    """


@hookspec
def obleth_request_admitted(request: RequestInfo, wait_s: float) -> None:
    """Observe a request that got its seats after waiting ``wait_s`` seconds (0 if none).

    Called on the request path; no I/O (hand work to your own queue or thread).
    """


@hookspec
def obleth_request_routed(
    request: RequestInfo, upstream: str, scores: Mapping[str, Mapping[str, float]]
) -> None:
    """Observe where the router sent an admitted request, and why.

    ``upstream`` is the chosen base URL; ``scores`` has, per scorer of the ``weighted``
    policy (plus ``total``), the score of each candidate upstream, or the numbers the
    ``round-robin`` / ``least-loaded`` policy decided on. Called only when upstreams are
    configured, once per request, before the request is forwarded; no I/O. Do not keep
    or change ``scores``: copy what you need.
    """


@hookspec
def obleth_request_rejected(request: RequestInfo, reason: str) -> None:
    """Observe a request answered 503/429 with ``reason`` (``queue_full``,
    ``queue_timeout``, ``evicted``, ``no_wait``, ``tenant_limit``, ``requests_per_minute``,
    ``tokens_per_minute``, ``over_capacity``, ``unavailable``).

    Called on the request path; no I/O.
    """


@hookspec
def obleth_request_finished(request: RequestInfo, duration_s: float, outcome: str) -> None:
    """Observe the end of an admitted request, after its seats were given back.

    ``outcome`` is ``completed``, ``error`` (the app raised, or left a response it began
    unfinished: an upstream that failed mid-stream) or ``cancelled`` (the client went away
    before the response's last chunk, or the task was cancelled). ``duration_s`` runs from
    admission to release.
    Called on the request path; no I/O.
    """


#: The attribute of a classifier's hook function that offers its header-only fast path
#: (see ``obleth_classify_request``).
HEADER_TICKETS: Final = "header_tickets"

HOOK_NAMES: Sequence[str] = tuple(sorted(name for name in dir() if name.startswith("obleth_")))
