"""The counter backend contract, run against both backends: in-process and Redis.

Whatever backend counts the seats, a user sees the same gate: a waiter runs when a seat
frees, fair shares by weight, strict priority, ``background`` never waits, caps answer
429, the overflow policies behave alike (``block`` waits for room in a full queue first
come first served, ``drop-newest`` answers ``queue_full``, ``drop-oldest`` evicts,
``reject`` never queues), a grant racing a timeout or a cancel is never lost, the limit
can move both ways live, and every permit comes back exactly once.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gateway import Gateway, Rejected, Settings
from gateway.core.tickets import Ticket
from gateway.errors import Disconnected
from gateway.protocols import Permit, Snapshot

pytestmark = pytest.mark.anyio

Make = Callable[..., Awaitable[Gateway]]


@pytest.fixture(params=["memory", "redis"])
async def make(request: pytest.FixtureRequest) -> AsyncIterator[Make]:
    """Started gateways on the backend under test, stopped after the test."""
    made: list[Gateway] = []
    extra: dict[str, Any] = {}
    if request.param == "redis":
        extra = {
            "redis_url": request.getfixturevalue("redis_url"),
            "pool": request.getfixturevalue("pool_name"),
            "learning_window_s": 0,
        }

    async def make(*, start: bool = True, **settings: Any) -> Gateway:
        gateway = Gateway(Settings(**extra, **settings), entry_points=False)
        if start:
            await gateway.start()
        made.append(gateway)
        return gateway

    yield make
    for gateway in made:
        await gateway.stop()


async def settle(gateway: Gateway) -> None:
    """Let everything the gateway has to say reach its backend and come back."""
    settled = getattr(gateway.backend, "settled", None)
    for _ in range(3):
        await asyncio.sleep(0)
        if settled is not None:
            await settled()


async def state(gateway: Gateway) -> Snapshot:
    """The backend's own view: the pool in Redis, or the in-process queue."""
    await settle(gateway)
    read = getattr(gateway.backend, "cluster_snapshot", None)
    return await read() if read is not None else gateway.snapshot()


async def assert_drained(gateway: Gateway) -> None:
    snap = await state(gateway)
    assert (snap.inflight, snap.queued) == (0, 0)
    assert all(t.inflight == 0 and not any(t.queued.values()) for t in snap.tenants.values())
    assert gateway.scheduler.admitted == gateway.scheduler.released


async def waiters(gateway: Gateway) -> tuple[int, int]:
    """(waiting in the queue, waiting in all): the queue is bounded by ``max_queue``,
    requests waiting for room in it (``block``) are not."""
    await settle(gateway)
    in_queue = gateway.snapshot().queued
    snap = await state(gateway)
    return in_queue, sum(sum(t.queued.values()) for t in snap.tenants.values())


async def waiting(gateway: Gateway, *tickets: Ticket) -> list[asyncio.Task[Permit]]:
    """Start one acquire per ticket, in order, each queued before the next arrives."""
    tasks = []
    for ticket in tickets:
        tasks.append(asyncio.create_task(gateway.scheduler.acquire(ticket)))
        await settle(gateway)
    return tasks


async def test_waiter_gets_the_seat_when_the_holder_releases(make: Make) -> None:
    gateway = await make(global_max_in_flight=1)
    holder = await gateway.scheduler.acquire(Ticket("a"))
    [waiter] = await waiting(gateway, Ticket("b"))
    assert not waiter.done() and (await state(gateway)).queued == 1
    holder.release()
    permit = await asyncio.wait_for(waiter, 2)
    assert permit.ticket == Ticket("b") and (await state(gateway)).queued == 0
    permit.release()
    await assert_drained(gateway)


async def test_a_gateway_that_is_not_running_answers_unavailable_at_once(make: Make) -> None:
    """Before start and after stop nothing would ever grant or time out a waiter: the
    request is answered 503 ``unavailable`` there and then (a client retries elsewhere)."""
    gateway = await make(start=False, global_max_in_flight=1)
    with pytest.raises(Rejected) as caught:
        await asyncio.wait_for(gateway.scheduler.acquire(Ticket("a")), 2)
    assert caught.value.reason == "unavailable" and caught.value.status == 503
    await gateway.start()
    held = await gateway.scheduler.acquire(Ticket("a"))
    await gateway.stop()
    for ticket in (Ticket("b"), Ticket("a", "critical")):
        with pytest.raises(Rejected) as caught:
            await asyncio.wait_for(gateway.scheduler.acquire(ticket), 2)
        assert caught.value.reason == "unavailable"
    assert gateway.scheduler.rejected["unavailable"] == 3
    assert held.release() is True
    assert gateway.scheduler.admitted == gateway.scheduler.released == 1


async def test_release_counts_once_however_often_it_is_called(make: Make) -> None:
    gateway = await make(global_max_in_flight=2)
    permit = await gateway.scheduler.acquire(Ticket("a"))
    other = await gateway.scheduler.acquire(Ticket("a"))
    assert permit.release() is True
    assert permit.release() is False
    assert (await state(gateway)).inflight == 1
    other.release()
    await assert_drained(gateway)


async def test_queue_timeout_answers_503_and_frees_the_queue_slot(make: Make) -> None:
    gateway = await make(global_max_in_flight=1, queue_timeout_s=0.05)
    holder = await gateway.scheduler.acquire(Ticket("a"))
    with pytest.raises(Rejected) as caught:
        await gateway.scheduler.acquire(Ticket("b"))
    assert caught.value.reason == "queue_timeout" and caught.value.status == 503
    assert (await state(gateway)).queued == 0
    holder.release()
    await assert_drained(gateway)


async def test_no_seat_is_lost_when_grants_race_with_timeouts(make: Make) -> None:
    """Many waiters with 10 ms timeouts while seats free up: every seat comes back."""
    gateway = await make(global_max_in_flight=3, queue_timeout_s=0.01, max_queue=10_000)
    rng = random.Random(3)
    outcomes: Counter[str] = Counter()

    async def client(i: int) -> None:
        await asyncio.sleep(rng.random() * 0.05)
        try:
            permit = await gateway.scheduler.acquire(Ticket(f"t{i % 4}"))
        except Rejected as exc:
            outcomes[exc.reason] += 1
            return
        await asyncio.sleep(rng.random() * 0.004)
        permit.release()
        outcomes["ran"] += 1

    await asyncio.gather(*(client(i) for i in range(600)))
    assert set(outcomes) == {"ran", "queue_timeout"}
    await assert_drained(gateway)


async def test_cancelled_waiter_leaves_the_queue(make: Make) -> None:
    gateway = await make(global_max_in_flight=1)
    holder = await gateway.scheduler.acquire(Ticket("a"))
    [waiter] = await waiting(gateway, Ticket("b"))
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (await state(gateway)).queued == 0
    holder.release()
    await assert_drained(gateway)


async def test_seat_granted_to_a_cancelled_waiter_goes_to_the_next(make: Make) -> None:
    """A grant that reaches a task just as it is cancelled is handed on, not lost."""
    gateway = await make(global_max_in_flight=1)
    holder = await gateway.scheduler.acquire(Ticket("a"))
    first, second = await waiting(gateway, Ticket("b"), Ticket("c"))
    holder.release()  # grants `first` (now, or when the release reaches Redis)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    permit = await asyncio.wait_for(second, 2)
    permit.release()
    await assert_drained(gateway)


async def test_client_that_disconnects_while_waiting_leaves_the_queue(make: Make) -> None:
    gateway = await make(global_max_in_flight=1)
    holder = await gateway.scheduler.acquire(Ticket("a"))
    gone = asyncio.Event()

    async def disconnected() -> bool:
        await gone.wait()
        return True

    waiter = asyncio.create_task(gateway.scheduler.acquire(Ticket("b"), disconnected=disconnected))
    await settle(gateway)
    gone.set()
    with pytest.raises(Disconnected):
        await waiter
    assert (await state(gateway)).queued == 0
    holder.release()
    await assert_drained(gateway)


async def test_weighted_tenants_share_seats_by_weight(make: Make) -> None:
    """Backlogged gold (weight 3) and free (weight 1): grants go 3 to 1."""
    gateway = await make(global_max_in_flight=4, tenant_weights={"gold": 3})
    holders = [await gateway.scheduler.acquire(Ticket("x")) for _ in range(4)]
    queued = await waiting(gateway, *[Ticket("free")] * 8, *[Ticket("gold")] * 8)
    for holder in holders:
        holder.release()
    await settle(gateway)
    running = [t for t in queued if t.done()]
    shares = Counter(t.result().ticket.tenant for t in running)
    assert shares == {"gold": 3, "free": 1}
    for task in queued:
        (await asyncio.wait_for(task, 2)).release()
    await assert_drained(gateway)


async def test_tenants_holding_alike_take_turns_whoever_queued_first(make: Make) -> None:
    """With more tenants than seats most hold none, so the fair share ties: a seat goes
    to the tenant served least recently. It went to the oldest head, so a tenant that
    queued many requests early took every seat before the next one had any (a, a, a, b,
    b, b), and with queue timeouts some tenants got next to nothing."""
    gateway = await make(global_max_in_flight=1)
    holder = await gateway.scheduler.acquire(Ticket("x"))
    queued = await waiting(gateway, *[Ticket("a")] * 3, *[Ticket("b")] * 3)
    holder.release()
    served = []
    for _ in queued:
        await settle(gateway)
        [running] = [t for t in queued if t.done() and t not in served]
        served.append(running)
        running.result().release()
    assert [t.result().ticket.tenant for t in served] == ["a", "b", "a", "b", "a", "b"]
    await assert_drained(gateway)


async def test_a_tenant_whose_waiter_left_keeps_its_turn(make: Make) -> None:
    """A tenant keeping one request waiting, which times out or is cancelled before its
    turn comes and is sent again, went to the back of the turns every time: with more
    tenants than seats such a tenant got a few seats, those keeping many waiting the
    rest. It keeps its place now."""
    gateway = await make(global_max_in_flight=1)
    holder = await gateway.scheduler.acquire(Ticket("x"))
    first_b, second_b = await waiting(gateway, Ticket("b"), Ticket("b"))
    [left] = await waiting(gateway, Ticket("a"))
    holder.release()
    granted = await asyncio.wait_for(first_b, 2)  # b's turn was older; it is newest now
    left.cancel()
    await settle(gateway)
    [again] = await waiting(gateway, Ticket("a"))
    granted.release()
    await settle(gateway)
    # a's turn predates b's last grant
    assert (again.done(), second_b.done()) == (True, False)
    again.result().release()
    (await asyncio.wait_for(second_b, 2)).release()
    await assert_drained(gateway)


async def test_critical_is_served_before_standard_and_background_never_waits(
    make: Make,
) -> None:
    gateway = await make(global_max_in_flight=1)
    holder = await gateway.scheduler.acquire(Ticket("a"))
    with pytest.raises(Rejected) as caught:
        await gateway.scheduler.acquire(Ticket("b", "background"))
    assert caught.value.reason == "no_wait"
    standard, critical = await waiting(gateway, Ticket("s"), Ticket("c", "critical"))
    holder.release()
    permit = await asyncio.wait_for(critical, 2)
    assert not standard.done()
    permit.release()
    (await asyncio.wait_for(standard, 2)).release()
    await assert_drained(gateway)


async def test_newcomer_does_not_barge_past_waiters(make: Make) -> None:
    """A seat freed while others wait goes to the queue's head, not to a new arrival."""
    gateway = await make(global_max_in_flight=1)
    holder = await gateway.scheduler.acquire(Ticket("a"))
    [first] = await waiting(gateway, Ticket("b"))
    holder.release()
    late = asyncio.create_task(gateway.scheduler.acquire(Ticket("c")))
    (await asyncio.wait_for(first, 2)).release()
    (await asyncio.wait_for(late, 2)).release()
    await assert_drained(gateway)


async def test_drop_oldest_evicts_the_flooders_oldest_waiter(make: Make) -> None:
    gateway = await make(global_max_in_flight=1, max_queue=2, overflow_policy="drop-oldest")
    holder = await gateway.scheduler.acquire(Ticket("flood"))
    flood = await waiting(gateway, Ticket("flood"), Ticket("flood"))
    [light] = await waiting(gateway, Ticket("light"))
    with pytest.raises(Rejected) as caught:
        await asyncio.wait_for(flood[0], 2)
    assert caught.value.reason == "evicted"
    holder.release()
    (await asyncio.wait_for(flood[1], 2)).release()  # the older head goes first
    (await asyncio.wait_for(light, 2)).release()
    await assert_drained(gateway)


async def test_drop_oldest_between_tenants_as_heavy_evicts_the_older_head(make: Make) -> None:
    """Tied in load and in requests waiting, the tenant whose head came first loses it,
    in process and in Redis alike, whatever order their turns are in."""
    gateway = await make(global_max_in_flight=2, max_queue=2, overflow_policy="drop-oldest")
    held_b = await gateway.scheduler.acquire(Ticket("b"))
    held_a = await gateway.scheduler.acquire(Ticket("a"))  # a's turn is now the later one
    [a_waits] = await waiting(gateway, Ticket("a"))
    [b_waits] = await waiting(gateway, Ticket("b"))
    [newcomer] = await waiting(gateway, Ticket("c"))
    with pytest.raises(Rejected) as caught:
        await asyncio.wait_for(a_waits, 2)
    assert caught.value.reason == "evicted"
    assert not b_waits.done()
    held_a.release()
    held_b.release()
    for task in (b_waits, newcomer):
        (await asyncio.wait_for(task, 2)).release()
    await assert_drained(gateway)


async def test_block_waits_for_room_in_a_full_queue_and_admits_in_arrival_order(
    make: Make,
) -> None:
    """Under block a full queue never refuses the newcomer: it waits for room, and the
    waiters for room reach their seats in arrival order, whatever their tenants."""
    gateway = await make(global_max_in_flight=1, max_queue=1, overflow_policy="block")
    holder = await gateway.scheduler.acquire(Ticket("x"))
    arrivals = [Ticket(tenant) for tenant in ("a", "b", "a", "c", "b")]
    tasks = await waiting(gateway, *arrivals)
    assert not any(task.done() for task in tasks)
    assert await waiters(gateway) == (1, 5)  # the queue keeps its bound
    holder.release()
    served = []
    for task in tasks:
        permit = await asyncio.wait_for(task, 2)
        served.append(permit.ticket.tenant)
        assert not any(t.done() for t in tasks[len(served) :]), "a later arrival ran first"
        permit.release()
    assert served == ["a", "b", "a", "c", "b"]
    assert gateway.scheduler.rejected == {}
    await assert_drained(gateway)


async def test_block_waiter_for_room_that_gives_up_is_never_granted(make: Make) -> None:
    """A request waiting for room in the full queue can leave (a client disconnect); the
    ones after it keep their order."""
    gateway = await make(global_max_in_flight=1, max_queue=1)
    holder = await gateway.scheduler.acquire(Ticket("x"))
    first, gone, last = await waiting(gateway, Ticket("a"), Ticket("b"), Ticket("c"))
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert await waiters(gateway) == (1, 2)
    holder.release()
    (await asyncio.wait_for(first, 2)).release()
    permit = await asyncio.wait_for(last, 2)
    assert permit.ticket == Ticket("c")
    permit.release()
    await assert_drained(gateway)


async def test_block_waiters_for_room_time_out_like_queued_ones(make: Make) -> None:
    """``queue_timeout_s`` is the only thing that ends a wait under block, in the queue or
    waiting for room in it: 503 ``queue_timeout``, and nothing is left behind."""
    gateway = await make(global_max_in_flight=1, max_queue=1, queue_timeout_s=0.05)
    holder = await gateway.scheduler.acquire(Ticket("x"))
    outcomes = await asyncio.gather(
        *(gateway.scheduler.acquire(Ticket(t)) for t in "abc"), return_exceptions=True
    )
    assert [getattr(o, "reason", o) for o in outcomes] == ["queue_timeout"] * 3
    holder.release()
    await assert_drained(gateway)


async def test_a_tenant_cap_counts_requests_waiting_for_room(make: Make) -> None:
    """Under block, a tenant's requests waiting for room count against its cap (429)."""
    gateway = await make(global_max_in_flight=1, max_queue=1, tenant_max_in_flight={"t": 3})
    holder = await gateway.scheduler.acquire(Ticket("t"))
    tasks = await waiting(gateway, Ticket("t"), Ticket("t"))  # in the queue, waiting for room
    with pytest.raises(Rejected) as caught:
        await gateway.scheduler.acquire(Ticket("t"))
    assert (caught.value.reason, caught.value.status) == ("tenant_limit", 429)
    holder.release()
    for task in tasks:
        (await asyncio.wait_for(task, 2)).release()
    await assert_drained(gateway)


async def test_drop_newest_queues_while_there_is_room_then_answers_queue_full(
    make: Make,
) -> None:
    """drop-newest lets a request wait while the queue has room and refuses the newcomer
    with 503 ``queue_full`` once it is full."""
    gateway = await make(global_max_in_flight=1, max_queue=2, overflow_policy="drop-newest")
    holder = await gateway.scheduler.acquire(Ticket("a"))
    queued = await waiting(gateway, Ticket("b"), Ticket("c"))
    assert not any(task.done() for task in queued)
    with pytest.raises(Rejected) as caught:
        await gateway.scheduler.acquire(Ticket("d"))
    assert (caught.value.reason, caught.value.status) == ("queue_full", 503)
    holder.release()
    for task in queued:
        (await asyncio.wait_for(task, 2)).release()
    await assert_drained(gateway)


@pytest.mark.parametrize("max_queue", [4096, 0])
async def test_reject_answers_over_capacity_and_nothing_waits(make: Make, max_queue: int) -> None:
    """reject never queues: with no free seat the newcomer gets 503 ``over_capacity``,
    ``max_queue=0`` included (it used to answer ``queue_full`` there)."""
    gateway = await make(global_max_in_flight=1, overflow_policy="reject", max_queue=max_queue)
    holder = await gateway.scheduler.acquire(Ticket("a"))
    with pytest.raises(Rejected) as caught:
        await gateway.scheduler.acquire(Ticket("b"))
    assert (caught.value.reason, caught.value.status) == ("over_capacity", 503)
    assert await waiters(gateway) == (0, 0)
    holder.release()
    (await gateway.scheduler.acquire(Ticket("b"))).release()
    await assert_drained(gateway)


async def test_a_request_that_fits_the_free_seats_is_not_held_behind_one_that_does_not(
    make: Make,
) -> None:
    """Limit 3, a 2-seat request running: a 2-seat critical one waits for seats, and a
    1-seat critical one of a tenant holding none, which is the more deserving of the two
    and fits the free seat, runs at once. In process it used to wait for the next
    release, while cluster mode granted it."""
    gateway = await make(global_max_in_flight=3)
    holder = await gateway.scheduler.acquire(Ticket("a", seats=2))
    big = asyncio.create_task(gateway.scheduler.acquire(Ticket("a", "critical", seats=2)))
    await settle(gateway)
    small = await asyncio.wait_for(gateway.scheduler.acquire(Ticket("b", "critical")), 2)
    assert not big.done()
    small.release()
    holder.release()
    (await asyncio.wait_for(big, 2)).release()
    await assert_drained(gateway)


async def test_a_request_held_back_by_a_head_too_large_runs_once_that_head_leaves(
    make: Make,
) -> None:
    """Limit 2, one seat held: tenant b's 2-seat request waits at the head of its queue,
    its 1-seat one behind it. When the large one gives up, the small one fits the free
    seat and runs; in process it used to wait for the next release."""
    gateway = await make(global_max_in_flight=2)
    holder = await gateway.scheduler.acquire(Ticket("a"))
    big, small = await waiting(gateway, Ticket("b", seats=2), Ticket("b"))
    big.cancel()
    (await asyncio.wait_for(small, 2)).release()
    holder.release()
    await assert_drained(gateway)


async def test_tenant_over_its_cap_gets_429(make: Make) -> None:
    gateway = await make(global_max_in_flight=10, tenant_max_in_flight={"free": 1})
    held = await gateway.scheduler.acquire(Ticket("free"))
    with pytest.raises(Rejected) as caught:
        await gateway.scheduler.acquire(Ticket("free"))
    assert (caught.value.reason, caught.value.status) == ("tenant_limit", 429)
    (await gateway.scheduler.acquire(Ticket("gold"))).release()
    held.release()
    assert gateway.scheduler.rejected["tenant_limit"] == 1
    await assert_drained(gateway)


async def test_raising_the_limit_admits_waiters_at_once(make: Make) -> None:
    gateway = await make(global_max_in_flight=1)
    holder = await gateway.scheduler.acquire(Ticket("a"))
    waiters = await waiting(gateway, *[Ticket("b")] * 3)
    gateway.set_capacity(3)
    await settle(gateway)
    assert sum(w.done() for w in waiters) == 2
    assert (await state(gateway)).inflight == 3
    holder.release()
    for waiter in waiters:
        (await asyncio.wait_for(waiter, 2)).release()
    await assert_drained(gateway)


async def test_lowering_the_limit_lets_running_requests_finish(make: Make) -> None:
    """A cut never revokes seats; new requests wait until in-flight is under the new limit."""
    gateway = await make(global_max_in_flight=3)
    running = [await gateway.scheduler.acquire(Ticket("a")) for _ in range(3)]
    gateway.set_capacity(1)
    await settle(gateway)
    [waiter] = await waiting(gateway, Ticket("b"))
    running[0].release()
    running[1].release()
    await settle(gateway)
    assert not waiter.done() and (await state(gateway)).inflight == 1
    running[2].release()
    (await asyncio.wait_for(waiter, 2)).release()
    await assert_drained(gateway)


async def test_snapshot_names_the_limit_and_the_tenants(make: Make) -> None:
    gateway = await make(global_max_in_flight=2, tenant_weights={"gold": 2})
    permit = await gateway.scheduler.acquire(Ticket("gold"))
    snap = await state(gateway)
    assert snap.limit == 2 and snap.inflight == 1
    assert snap.tenants["gold"].inflight == 1 and snap.tenants["gold"].weight == 2
    permit.release()
    await assert_drained(gateway)


def test_settings_without_redis_url_use_the_in_process_backend() -> None:
    from gateway.backends.memory import MemoryBackend

    assert isinstance(Gateway(Settings(), entry_points=False).backend, MemoryBackend)
