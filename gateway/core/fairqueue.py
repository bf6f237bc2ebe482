"""The fair queue: seats in flight and waiting requests, per tenant and priority class.

Dispatch is weighted max-min fairness in seats held: among the tenants waiting in the most
urgent non-empty class, the next seat goes to the one with the smallest
``(seats in flight + head's seats) / weight`` (with ``fair_by_tokens``, ``tokens in flight
/ weight``: a head's own estimate left out, else a large request would lose to a
backlogged tenant for ever), ties to the tenant whose turn is oldest: its
last grant, or its first request when it has had none (``turns.py``). Ties are common
(with more tenants than seats, most hold none), and going by the oldest head instead gave
a tenant whose requests arrived early seat after seat while tenants whose heads kept
timing out and arriving anew got almost none. No
banked credit (an idle tenant cannot burst past its share later), no estimate of request
duration, FIFO within a tenant, and no skipping past the chosen head when it does not fit.
A head fits when its seats fit under the limit and, with ``max_tokens``, its tokens under
that budget (one estimated above the whole budget fits once no tokens are in flight: it
runs alone rather than never).

Each class keeps a heap of its waiting tenants by that dispatch key and, once a policy
has asked for an eviction victim, a second one by load (``(seats in flight + queued) /
weight``, heaviest first). A tenant's keys change whenever its seats, its queue or its
head change; instead of re-sorting, a fresh entry is pushed with a new version and older
entries are skipped when they surface, so every decision costs O(log tenants) amortized.
While nobody waits, none of this runs.

``max_queue`` bounds the queue. A request whose policy answers ``"wait"`` (``block``) and
finds the queue full waits in the ``Lobby`` instead, outside the bound, and enters the
queue in arrival order as soon as it has room; the lobby is never occupied while the
queue has room. Everything that counts a tenant's waiting requests (its cap, its load for
eviction, snapshots) counts its requests in the lobby too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from gateway.core.lobby import Lobby
from gateway.core.tenantheap import TenantHeap
from gateway.core.tickets import PRIORITIES, Ticket
from gateway.core.turns import Turns

_RANKS = range(len(PRIORITIES))


@dataclass(slots=True, eq=False)
class Waiter:
    """A queued request. ``handle`` belongs to the driver (a future, an id); core never reads it."""

    ticket: Ticket
    order: int
    since: float
    handle: object = None
    alive: bool = field(default=True)


class FairQueue:
    """Seats in flight and waiters; the state every admission decision reads.

    The caller passes the limit into each decision, so a limit that changes between calls
    is honoured at once; lowering it never takes back seats already granted.
    """

    def __init__(
        self,
        *,
        max_queue: int,
        weights: Mapping[str, float] | None = None,
        tenant_caps: Mapping[str, int] | None = None,
        default_weight: float = 1.0,
        default_cap: int | None = None,
        max_tokens: int | None = None,
        fair_by_tokens: bool = False,
    ) -> None:
        self.max_queue = max_queue
        #: the budget of tokens in flight (None: none), and the tokens in flight
        self.max_tokens = max_tokens
        self.tokens_inflight = 0
        #: whether tickets' tokens are counted at all (else grants skip them)
        self.counts_tokens = max_tokens is not None or fair_by_tokens
        self._fair_by_tokens = fair_by_tokens
        self._tenant_tokens: dict[str, int] = {}
        # how many may wait in the queue before a "wait" request goes to the lobby: with
        # max_queue = 0 one still waits at the head (a hand-off, as on a channel without a
        # buffer), else a request under block could never reach a seat
        self._room = max(max_queue, 1)
        self.inflight = 0
        #: waiters in the queue (not in the lobby)
        self.queued = 0
        #: waiters for room in the full queue, first come first served (read-only outside)
        self.lobby = Lobby()
        self._weights = dict(weights or {})
        self._default_weight = default_weight
        self._caps = dict(tenant_caps or {})
        self._default_cap = default_cap
        #: whether any tenant has a cap (else the check is skipped)
        self.capped = bool(self._caps) or default_cap is not None
        self._tenant_inflight: dict[str, int] = {}
        self._tenant_queued: dict[str, int] = {}
        self._rank_queued = [0 for _ in _RANKS]
        self._queues: list[dict[str, deque[Waiter]]] = [{} for _ in _RANKS]
        self._ready = [TenantHeap() for _ in _RANKS]
        #: by load, for eviction; None until the first eviction asks (most policies never do)
        self._heavy: list[TenantHeap] | None = None
        self._next_order = 0
        #: each tenant's turn for ties; the tenants holding or waiting keep theirs
        self._turns = Turns(self._tenant_inflight, self._tenant_queued)

    # -- what policies and snapshots may read -------------------------------------------

    @property
    def queue_full(self) -> bool:
        return self.queued >= self.max_queue

    def weight(self, tenant: str) -> float:
        return self._weights.get(tenant, self._default_weight)

    def cap(self, tenant: str) -> int | None:
        return self._caps.get(tenant, self._default_cap)

    def tenant_inflight(self, tenant: str) -> int:
        return self._tenant_inflight.get(tenant, 0)

    def tenant_queued(self, tenant: str) -> int:
        """The tenant's waiting requests, in the queue and in the lobby."""
        return self._tenant_queued.get(tenant, 0)

    def tenants(self) -> set[str]:
        """Tenants holding seats or waiting right now."""
        return set(self._tenant_inflight) | set(self._tenant_queued)

    def queued_by_class(self, tenant: str) -> dict[str, int]:
        """The tenant's waiting requests by class, in the queue and in the lobby."""
        return {
            PRIORITIES[rank]: sum(1 for w in self._queues[rank].get(tenant, ()) if w.alive)
            + self.lobby.waiting(tenant, rank)
            for rank in _RANKS
        }

    def waiting_at_or_above(self, rank: int) -> bool:
        """Whether anyone of class ``rank`` or more urgent is waiting (no barging past them)."""
        if not self.queued:
            return False
        return any(self._rank_queued[r] for r in range(rank + 1))

    def waiters(self) -> Iterator[Waiter]:
        """Every waiter: the queue's, then the lobby's."""
        for rank in _RANKS:
            for queue in self._queues[rank].values():
                yield from (w for w in queue if w.alive)
        yield from self.lobby

    # -- mutations ------------------------------------------------------------------------

    def fits(self, ticket: Ticket, limit: int) -> bool:
        """Whether ``ticket``'s seats fit under ``limit`` and its tokens under ``max_tokens``."""
        if self.inflight + ticket.seats > limit:
            return False
        budget, held = self.max_tokens, self.tokens_inflight
        return budget is None or not held or held + ticket.tokens <= budget

    def can_grant_now(self, ticket: Ticket, limit: int) -> bool:
        return self.fits(ticket, limit) and not self.waiting_at_or_above(ticket.rank)

    def over_cap(self, ticket: Ticket) -> bool:
        """A tenant's cap counts its seats in flight and its queued seats."""
        if not self.capped:
            return False
        cap = self._caps.get(ticket.tenant, self._default_cap)
        if cap is None:
            return False
        held = self.tenant_inflight(ticket.tenant) + self.tenant_queued(ticket.tenant)
        return held + ticket.seats > cap

    def grant(self, ticket: Ticket) -> None:
        """Count ``ticket``'s seats as in flight (a grant decided by the caller)."""
        tenant, seats = ticket.tenant, ticket.seats
        self.inflight += seats
        held = self._tenant_inflight
        held[tenant] = held.get(tenant, 0) + seats
        if self.counts_tokens:
            self._count_tokens(ticket, 1)
        self._turns.take(tenant)
        if self.queued:  # with nobody waiting there are no keys to update
            self._rekey(tenant)

    def release(self, ticket: Ticket) -> None:
        """Give back the seats of a granted ticket; the caller then dispatches."""
        tenant, seats = ticket.tenant, ticket.seats
        self.inflight -= seats
        if self.counts_tokens:
            self._count_tokens(ticket, -1)
        held = self._tenant_inflight
        left = held[tenant] - seats
        if left:
            held[tenant] = left
        else:
            del held[tenant]
            if tenant not in self._tenant_queued:
                self._turns.went_idle(tenant)
        if self.queued:
            self._rekey(tenant)

    def enqueue(self, ticket: Ticket, since: float, handle: object = None) -> Waiter:
        """Queue ``ticket``, whatever the bound (the caller checked it, or means to pass it)."""
        waiter = self._new_waiter(ticket, since, handle)
        self._file(waiter)
        return waiter

    def wait(self, ticket: Ticket, since: float, handle: object = None) -> Waiter:
        """Queue ``ticket`` while the queue has room, else keep it in the lobby until it
        has (the ``"wait"`` action): never refused for a full queue."""
        if not self.lobby and self.queued < self._room:
            return self.enqueue(ticket, since, handle)
        waiter = self._new_waiter(ticket, since, handle)
        self.lobby.add(waiter)
        if self._heavy is not None:  # the tenant's load for eviction counts it
            self._rekey(ticket.tenant)
        return waiter

    def remove(self, waiter: Waiter, *, refill: bool = True) -> bool:
        """Take a waiter out of the queue or the lobby (timeout, disconnect, eviction).

        Answers False when it was no longer waiting (already granted or removed), so the
        caller knows a grant won the race and the seats must be handed back instead.
        The room it leaves in the queue goes to the lobby's oldest, unless ``refill`` is
        False: an eviction's newcomer takes it.
        """
        if not waiter.alive:
            return False
        waiter.alive = False
        rank, tenant = waiter.ticket.rank, waiter.ticket.tenant
        if self.lobby and self.lobby.discard(waiter):
            self._stop_waiting(tenant)
            if self._heavy is not None:
                self._rekey(tenant)
            return True
        self._forget_waiter(rank, tenant)
        self._drop_dead_heads(rank, tenant)
        self._rekey(tenant)
        if refill and self.lobby:
            self._fill_from_lobby()
        return True

    def pop_grantable(self, limit: int) -> Waiter | None:
        """Grant the next waiter if its seats fit under ``limit``; None when nobody may go."""
        if not self.queued:
            return None
        for rank in _RANKS:
            top = self._ready[rank].top()
            if top is None:
                continue
            tenant = top[1]
            queue = self._queues[rank][tenant]
            head = queue[0]
            if not self.fits(head.ticket, limit):
                return None
            queue.popleft()
            head.alive = False
            self._forget_waiter(rank, tenant)
            self._drop_dead_heads(rank, tenant)
            self.inflight += head.ticket.seats
            held = self._tenant_inflight
            held[tenant] = held.get(tenant, 0) + head.ticket.seats
            if self.counts_tokens:
                self._count_tokens(head.ticket, 1)
            self._turns.take(tenant)
            self._rekey(tenant)
            if self.lobby:
                self._fill_from_lobby()
            return head
        return None

    def eviction_victim(self, rank: int) -> Waiter | None:
        """The oldest waiter of the heaviest tenant, never from a class above ``rank``.

        Heaviest means the largest ``(seats in flight + queued) / weight``; ties go to the
        tenant with more requests waiting, then to the one whose head (in any class it
        may lose from) arrived first, as in ``step.lua``. Among that tenant's classes the
        least urgent one loses first.
        """
        heavy = self._heavy
        if heavy is None:
            heavy = self._heavy = [TenantHeap() for _ in _RANKS]
            for tenant in self._tenant_queued:
                self._rekey(tenant)
        best: tuple[tuple[float, ...], str] | None = None
        for r in range(rank, len(PRIORITIES)):
            top = heavy[r].top()
            if top is not None and (best is None or top < best):
                best = top
        if best is None:
            return None
        tenant = best[1]
        for r in reversed(range(rank, len(PRIORITIES))):
            queue = self._queues[r].get(tenant)
            if queue:
                return queue[0]
        return None

    # -- bookkeeping ----------------------------------------------------------------------

    def _new_waiter(self, ticket: Ticket, since: float, handle: object) -> Waiter:
        waiter = Waiter(ticket, self._next_order, since, handle)
        self._next_order += 1
        tenant = ticket.tenant
        self._tenant_queued[tenant] = self._tenant_queued.get(tenant, 0) + 1
        if tenant not in self._turns.of:  # its first request, or idle for long
            self._turns.take(tenant)
        return waiter

    def _file(self, waiter: Waiter) -> None:
        """Put a waiter in its tenant's FIFO for its class, in arrival order."""
        rank, tenant = waiter.ticket.rank, waiter.ticket.tenant
        queue = self._queues[rank].get(tenant)
        if queue is None:
            queue = self._queues[rank][tenant] = deque()
        if queue and queue[-1].order > waiter.order:
            # from the lobby, behind a later arrival that never went through it (an
            # eviction's newcomer): it goes back to its place in arrival order, as in
            # step.lua, whose queue members sort by arrival
            at = len(queue)
            while at and queue[at - 1].order > waiter.order:
                at -= 1
            queue.insert(at, waiter)
        else:
            queue.append(waiter)
        self.queued += 1
        self._rank_queued[rank] += 1
        self._rekey(tenant)

    def _fill_from_lobby(self) -> None:
        """The lobby's oldest enter the queue while it has room."""
        lobby = self.lobby
        while lobby and self.queued < self._room:
            self._file(lobby.pop_oldest())

    def _forget_waiter(self, rank: int, tenant: str) -> None:
        self.queued -= 1
        self._rank_queued[rank] -= 1
        self._stop_waiting(tenant)

    def _stop_waiting(self, tenant: str) -> None:
        left = self._tenant_queued[tenant] - 1
        if left:
            self._tenant_queued[tenant] = left
        else:
            del self._tenant_queued[tenant]
            if tenant not in self._tenant_inflight:
                self._turns.went_idle(tenant)

    def _count_tokens(self, ticket: Ticket, sign: int) -> None:
        """Count a ticket's tokens in (``sign`` 1) or out (-1) of flight."""
        tokens = sign * ticket.tokens
        self.tokens_inflight += tokens
        if self._fair_by_tokens:
            tenant = ticket.tenant
            left = self._tenant_tokens.get(tenant, 0) + tokens
            if left:
                self._tenant_tokens[tenant] = left
            else:
                self._tenant_tokens.pop(tenant, None)

    def _drop_dead_heads(self, rank: int, tenant: str) -> None:
        queue = self._queues[rank][tenant]
        while queue and not queue[0].alive:
            queue.popleft()
        if not queue:
            del self._queues[rank][tenant]
            self._ready[rank].discard(tenant)
            if self._heavy is not None:
                self._heavy[rank].discard(tenant)

    def _rekey(self, tenant: str) -> None:
        """Re-file ``tenant`` in the heaps of every class it waits in, after its seats or
        queue changed (a class it stopped waiting in dropped it already)."""
        inflight = self._tenant_inflight.get(tenant, 0)
        weight = self._weights.get(tenant, self._default_weight)
        heavy = self._heavy
        queued = self._tenant_queued.get(tenant, 0)
        load = (inflight + queued) / weight
        by_tokens = self._fair_by_tokens
        held = self._tenant_tokens.get(tenant, 0) if by_tokens else inflight
        turn = self._turns.of.get(tenant, 0)
        for rank in _RANKS:
            queue = self._queues[rank].get(tenant)
            if queue is None:
                continue
            head = queue[0]
            # fair by tokens, a head's own estimate does not count: a large request would
            # otherwise wait for ever behind a tenant whose key its releases keep below it
            cost = 0 if by_tokens else head.ticket.seats
            key = ((held + cost) / weight, turn, head.order)
            self._ready[rank].set(tenant, key)
            if heavy is not None:
                heavy[rank].set(tenant, (-load, -queued, head.order))
