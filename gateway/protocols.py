"""The roles plugins and backends fill, and the small records they exchange.

A plugin's factory is called once, at gateway start, with the gateway's ``Settings``; the
object it returns must satisfy one of these Protocols. The gateway checks that when it
assembles, and names the plugin when the check fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from gateway.core.admission import OverflowAction, QueueView
from gateway.core.tickets import PRIORITIES, Priority, Ticket

if TYPE_CHECKING:
    from gateway.settings import Settings


@runtime_checkable
class CapacityProvider(Protocol):
    """Says how many requests may be in flight.

    ``max_in_flight()`` must answer from memory, at once, without I/O: without
    ``subscribe()`` it is called on every admission decision. A provider whose value depends
    on the outside world (backend metrics, a control plane) refreshes it in a background
    task started by an optional ``async start()`` and ended by ``async stop()``. A provider
    whose value can change offers ``subscribe(callback)`` and calls ``callback()`` (on the
    gateway's event loop) after each change: it is then read again whenever any provider
    announces a change, and that value holds until the next, so a raised limit admits
    waiters at once and a change no one announces is never seen (a value capped by
    ``use_ceiling`` moves with the ceiling, whose provider announces). Two more optional
    methods are called once, when the gateway is assembled: ``use_readings(readings)`` hands
    a provider the upstreams' load readings (``gateway.Readings``), and
    ``use_ceiling(ceiling)`` a function answering the operator's limit now (the ``static``
    provider's), which a computed limit never needs to exceed. A provider that follows the
    backends' latency may define ``first_byte(seconds)``: the ASGI middleware calls it on
    the event loop, once per admitted request answered 2xx, with the time from the request's
    hand-over to the app or proxy (its queue wait left out) to its first non-empty body
    chunk; and ``longest_gap(seconds, lasted)``: for a streamed 2xx response, its longest
    wait between two non-empty body chunks as it grows (more than twice the last told),
    with the time since the hand-over (``gateway.asgi.timing``). They must return at
    once, without I/O, and an exception from one is logged while the request goes on. In
    cluster mode a provider that cannot be set (one without ``set_max_in_flight``: every
    provider but ``static``) is *computed*: it runs on every pod, but only the value of the
    pod holding the pool's leader lease counts; that pod writes it to Redis and every pod,
    itself included, uses it. Its value must therefore depend only on what every pod can
    observe, never on which pod computes it. Several providers combine by minimum."""

    def max_in_flight(self) -> int: ...


@runtime_checkable
class OverflowPolicy(Protocol):
    """Decides what happens to a request that finds no free seat.

    ``decide`` is called on the request path, so no I/O. The four actions differ in what
    happens when the queue (bounded by ``max_queue``) is full: ``"wait"`` waits for room,
    first come first served, and is never refused for it (``block``); ``"queue"`` is
    answered 503 ``queue_full`` (``drop-newest``); ``"evict"`` drops the oldest waiter of
    the heaviest tenant, never one of a more urgent class than the newcomer's
    (``drop-oldest``); ``"reject"`` never waits at all (``reject``: 503 ``over_capacity``).
    Every waiter gives up after ``queue_timeout_s``. A ``background`` request and a tenant
    over its cap never reach the policy.
    """

    def decide(self, view: QueueView, ticket: Ticket) -> OverflowAction: ...


@runtime_checkable
class RoutingScorer(Protocol):
    """Scores upstreams for a request: each value in [0, 1], higher is better.

    Called on the request path for every routed request: no I/O; read scraped backend
    readings from memory. A finite number outside [0, 1] is clamped; an answer that is no
    mapping, or scores a candidate with anything but a finite real number (a string,
    None, NaN, infinity), is the plugin's fault: logged under its name and dropped whole
    for that request, as when ``score`` raises.
    """

    def score(self, request: object, upstreams: list[str]) -> Mapping[str, float]: ...


Factory = Callable[["Settings"], object]


class Classification(NamedTuple):
    """What ``obleth_classify_request`` answers: who sends a request and how urgent it is.

    ``tenant`` is used as a key and a label: never a raw credential. ``routing_key`` and
    ``session_id`` are for the router.
    """

    tenant: str
    priority: Priority = "standard"
    routing_key: bytes | None = None
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What observers learn about a request."""

    tenant: str
    priority: Priority
    method: str
    path: str


# -- the counter backend: where seats are counted (in-process now, Redis in cluster mode) --


class PermitOwner(Protocol):
    """Who takes a permit's seats back: the scheduler that handed it out, or the free
    seats it was taken from."""

    def _release(self, permit: Permit) -> None: ...


class FreeSeats(PermitOwner, Protocol):
    """The fast path of a backend that decides in process: seats free right now.

    ``take(ticket)`` counts the ticket's seats as in flight and answers True when they fit
    under the limit, nobody waits (no barging past the queue), the tenant's cap allows and
    the backend is started; else False, and nothing changed (the caller goes on to
    ``CounterBackend.acquire``, after starting the gateway if it is not).
    ``give_back(ticket)`` returns seats ``take`` granted and hands them on to waiters; the
    caller guarantees one call per grant. Both are synchronous and never suspend, so the
    request path needs no ``Permit`` for them. ``taken`` and ``given_back`` count the
    calls that moved seats; a Permit whose owner is this object gives back on release.
    """

    taken: int
    given_back: int

    def take(self, ticket: Ticket) -> bool: ...
    def give_back(self, ticket: Ticket) -> None: ...


class Permit:
    """Seats granted to one request; ``release()`` counts once, whoever calls it.

    A backend creates it (``token`` identifies the grant to that backend); the scheduler
    that hands it out becomes its owner. ``waited_s`` is the time spent queued.
    """

    __slots__ = ("owner", "released", "ticket", "token", "waited_s")

    def __init__(
        self, ticket: Ticket, token: object = None, owner: PermitOwner | None = None
    ) -> None:
        self.released = False
        self.ticket = ticket
        self.token = token
        self.waited_s = 0.0
        self.owner = owner

    def release(self) -> bool:
        """Give the seats back; True for the one call that did, False for any other."""
        if self.released:
            return False
        self.released = True
        if self.owner is not None:
            self.owner._release(self)
        return True


@dataclass(slots=True, eq=False)
class Pending:
    """A request waiting for seats; ``future`` resolves to its Permit, or raises Rejected."""

    ticket: Ticket
    future: asyncio.Future[Permit]
    token: object = None


@dataclass(frozen=True, slots=True)
class TenantState:
    inflight: int
    queued: Mapping[str, int]
    weight: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The gate's state at one instant, for status pages, metrics and the demo."""

    limit: int
    inflight: int
    queued: int
    max_queue: int
    tenants: Mapping[str, TenantState] = field(default_factory=dict)
    #: with ``global_max_tokens_in_flight``: the token estimates of the requests in flight
    #: and the budget; None otherwise
    tokens_inflight: int | None = None
    max_tokens: int | None = None

    def queued_by_priority(self) -> dict[str, int]:
        """Requests waiting in each priority class, every class listed (0 when none)."""
        totals: dict[str, int] = dict.fromkeys(PRIORITIES, 0)
        for tenant in self.tenants.values():
            for priority, count in tenant.queued.items():
                totals[priority] = totals.get(priority, 0) + count
        return totals


class CounterBackend(Protocol):
    """Counts seats and keeps the fair queue; the scheduler drives it.

    The in-process backend is the default; the Redis backend makes one budget and one
    queue for every pod. Contract, for both:

    - ``free_seats`` is the fast path, tried first and synchronously (see ``FreeSeats``);
      None for a backend that cannot grant without I/O.
    - ``acquire`` returns a Permit when seats are free now, a Pending when the request
      waits, or raises ``Rejected``. It reads the limit on every call. Before ``start``
      and after ``stop`` it raises ``Rejected`` (``unavailable``) at once, never waits.
    - ``release`` gives seats back exactly as often as it is called; it never blocks and
      never raises (the caller guarantees one call per Permit).
    - ``cancel`` means the waiter gave up: the backend will not grant it, and if it had
      already granted it (even if the grant has not reached this pod yet) it takes the
      seats back itself.
    - ``limit_changed`` re-reads the limit and grants waiters that now fit.
    - ``settled`` returns once the pool has heard what this pod had to tell it (a new
      ceiling, say) and answered; in process, at once. It may wait as long as the pod keeps
      talking to the pool: callers bound it.
    """

    @property
    def free_seats(self) -> FreeSeats | None: ...

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def acquire(self, ticket: Ticket) -> Permit | Pending: ...
    def release(self, permit: Permit) -> None: ...
    def cancel(self, pending: Pending) -> None: ...
    def limit_changed(self) -> None: ...
    async def settled(self) -> None: ...
    def snapshot(self) -> Snapshot: ...
