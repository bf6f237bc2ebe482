"""The one gate with the in-process backend: waiting, waking, timeouts and races."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

import pytest

from gateway import Gateway, Rejected, Settings, hookimpl
from gateway.core.tickets import Ticket
from gateway.errors import Disconnected
from gateway.protocols import Permit


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


async def started(**settings: object) -> Gateway:
    gateway = Gateway(Settings(**settings), entry_points=False)  # type: ignore[arg-type]
    await gateway.start()
    return gateway


def assert_drained(gateway: Gateway) -> None:
    snap = gateway.snapshot()
    assert (snap.inflight, snap.queued) == (0, 0)
    assert snap.tenants == {}
    assert gateway.scheduler.admitted == gateway.scheduler.released


def test_waiter_gets_the_seat_when_the_holder_releases() -> None:
    """A queued request runs as soon as a seat frees, without polling."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=1)
        holder = await gateway.scheduler.acquire(Ticket("a"))
        waiter = asyncio.create_task(gateway.scheduler.acquire(Ticket("b")))
        await asyncio.sleep(0)
        assert not waiter.done() and gateway.snapshot().queued == 1
        holder.release()
        permit = await asyncio.wait_for(waiter, 1)
        assert permit.waited_s >= 0
        permit.release()
        assert_drained(gateway)

    run(scenario)


def test_release_counts_once_however_often_it_is_called() -> None:
    """Calling release twice gives back one seat, not two."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=2)
        permit = await gateway.scheduler.acquire(Ticket("a"))
        other = await gateway.scheduler.acquire(Ticket("a"))
        assert permit.release() is True
        assert permit.release() is False
        assert gateway.snapshot().inflight == 1
        other.release()
        assert_drained(gateway)

    run(scenario)


def test_queue_timeout_answers_503_and_frees_the_queue_slot() -> None:
    """A request that waits longer than queue_timeout_s is rejected with queue_timeout."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=1, queue_timeout_s=0.02)
        holder = await gateway.scheduler.acquire(Ticket("a"))
        with pytest.raises(Rejected) as caught:
            await gateway.scheduler.acquire(Ticket("b"))
        assert caught.value.reason == "queue_timeout" and caught.value.status == 503
        assert gateway.snapshot().queued == 0
        holder.release()
        assert_drained(gateway)

    run(scenario)


def test_no_seat_is_lost_when_grants_race_with_timeouts() -> None:
    """Many waiters with short timeouts while seats free up: every seat comes back."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=3, queue_timeout_s=0.01, max_queue=10_000)
        rng = random.Random(3)
        outcomes = {"ran": 0, "timed_out": 0}

        async def client(i: int) -> None:
            await asyncio.sleep(rng.random() * 0.05)
            try:
                permit = await gateway.scheduler.acquire(Ticket(f"t{i % 4}"))
            except Rejected as exc:
                outcomes["timed_out" if exc.reason == "queue_timeout" else exc.reason] += 1
                return
            await asyncio.sleep(rng.random() * 0.004)
            permit.release()
            outcomes["ran"] += 1

        await asyncio.gather(*(client(i) for i in range(600)))
        assert set(outcomes) == {"ran", "timed_out"}
        assert outcomes["ran"] > 0 and outcomes["timed_out"] > 0
        assert_drained(gateway)

    run(scenario)


def test_cancelled_waiter_leaves_the_queue() -> None:
    """A waiting task that is cancelled takes no seat and leaves no trace."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=1)
        holder = await gateway.scheduler.acquire(Ticket("a"))
        waiter = asyncio.create_task(gateway.scheduler.acquire(Ticket("b")))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert gateway.snapshot().queued == 0
        holder.release()
        assert_drained(gateway)

    run(scenario)


def test_seat_granted_to_a_waiter_cancelled_before_it_ran_goes_to_the_next() -> None:
    """A grant that reaches a task just as it is cancelled is handed on, not lost."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=1)
        holder = await gateway.scheduler.acquire(Ticket("a"))
        first = asyncio.create_task(gateway.scheduler.acquire(Ticket("b")))
        second = asyncio.create_task(gateway.scheduler.acquire(Ticket("c")))
        await asyncio.sleep(0)
        holder.release()  # grants `first`, whose task has not run yet
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        permit = await asyncio.wait_for(second, 1)
        permit.release()
        assert_drained(gateway)

    run(scenario)


def test_client_that_disconnects_while_waiting_leaves_the_queue() -> None:
    """When the disconnect watch fires, the request stops waiting and takes no seat."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=1)
        holder = await gateway.scheduler.acquire(Ticket("a"))
        gone = asyncio.Event()

        async def disconnected() -> bool:
            await gone.wait()
            return True

        waiter = asyncio.create_task(
            gateway.scheduler.acquire(Ticket("b"), disconnected=disconnected)
        )
        await asyncio.sleep(0)
        gone.set()
        with pytest.raises(Disconnected):
            await waiter
        assert gateway.snapshot().queued == 0
        holder.release()
        assert_drained(gateway)

    run(scenario)


def test_drop_oldest_evicts_the_flooders_oldest_waiter() -> None:
    """With drop-oldest a light tenant gets in; the flooder's oldest waiter gets 503 evicted."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=1, max_queue=2, overflow_policy="drop-oldest")
        holder = await gateway.scheduler.acquire(Ticket("flood"))
        flood = [asyncio.create_task(gateway.scheduler.acquire(Ticket("flood"))) for _ in range(2)]
        await asyncio.sleep(0)
        light = asyncio.create_task(gateway.scheduler.acquire(Ticket("light")))
        await asyncio.sleep(0)
        with pytest.raises(Rejected) as caught:
            await flood[0]
        assert caught.value.reason == "evicted"
        holder.release()
        (await asyncio.wait_for(flood[1], 1)).release()  # the older head goes first
        (await asyncio.wait_for(light, 1)).release()
        assert_drained(gateway)

    run(scenario)


def test_drop_newest_rejects_at_once() -> None:
    """With drop-newest nothing waits: no free seat means 503 over_capacity."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=1, overflow_policy="drop-newest")
        holder = await gateway.scheduler.acquire(Ticket("a"))
        with pytest.raises(Rejected) as caught:
            await gateway.scheduler.acquire(Ticket("b"))
        assert caught.value.reason == "over_capacity"
        holder.release()
        assert_drained(gateway)

    run(scenario)


def test_tenant_over_its_cap_gets_429() -> None:
    """tenant_max_in_flight refuses the tenant's extra request with 429 tenant_limit."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=10, tenant_max_in_flight={"free": 1})
        held = await gateway.scheduler.acquire(Ticket("free"))
        with pytest.raises(Rejected) as caught:
            await gateway.scheduler.acquire(Ticket("free"))
        assert (caught.value.reason, caught.value.status) == ("tenant_limit", 429)
        (await gateway.scheduler.acquire(Ticket("gold"))).release()
        held.release()
        assert gateway.scheduler.rejected["tenant_limit"] == 1
        assert_drained(gateway)

    run(scenario)


def test_raising_the_limit_admits_waiters_at_once() -> None:
    """set_capacity with a higher value wakes as many waiters as now fit, immediately."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=1)
        holder = await gateway.scheduler.acquire(Ticket("a"))
        waiters = [asyncio.create_task(gateway.scheduler.acquire(Ticket("b"))) for _ in range(3)]
        await asyncio.sleep(0)
        gateway.set_capacity(3)
        await asyncio.sleep(0)
        done = [w for w in waiters if w.done()]
        assert len(done) == 2 and gateway.snapshot().inflight == 3
        holder.release()
        permits: list[Permit] = [await asyncio.wait_for(w, 1) for w in waiters]
        for permit in permits:
            permit.release()
        assert_drained(gateway)

    run(scenario)


def test_lowering_the_limit_lets_running_requests_finish() -> None:
    """A cut never revokes seats; new requests wait until in-flight is under the new limit."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=3)
        running = [await gateway.scheduler.acquire(Ticket("a")) for _ in range(3)]
        gateway.set_capacity(1)
        waiter = asyncio.create_task(gateway.scheduler.acquire(Ticket("b")))
        running[0].release()
        running[1].release()
        await asyncio.sleep(0)
        assert not waiter.done() and gateway.snapshot().inflight == 1
        running[2].release()
        (await asyncio.wait_for(waiter, 1)).release()
        assert_drained(gateway)

    run(scenario)


def test_set_capacity_refuses_a_bad_limit() -> None:
    """A limit below 1 is refused with a message, and the old limit stays."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=4)
        with pytest.raises(ValueError, match="at least 1"):
            gateway.set_capacity(0)
        assert gateway.capacity.current() == 4

    run(scenario)


class Flaky:
    def __init__(self) -> None:
        self.value: object = 5

    def max_in_flight(self) -> int:
        if isinstance(self.value, Exception):
            raise self.value
        return self.value  # type: ignore[return-value]


def test_faulty_capacity_provider_is_named_and_its_last_value_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A provider that starts failing keeps its last good limit; the log names it."""
    flaky = Flaky()

    class Plugin:
        @hookimpl
        def obleth_capacity_providers(self) -> dict[str, object]:
            return {"flaky": lambda settings: flaky}

    gateway = Gateway(
        Settings(capacity_providers=["static", "flaky"], global_max_in_flight=10),
        plugins=[Plugin()],
        entry_points=False,
    )
    assert gateway.capacity.current() == 5
    flaky.value = RuntimeError("metrics endpoint down")
    with caplog.at_level(logging.ERROR, logger="obleth.capacity"):
        assert gateway.capacity.current() == 5
    assert "'flaky'" in caplog.text
    flaky.value = "lots"
    assert gateway.capacity.current() == 5
    flaky.value = 2
    assert gateway.capacity.current() == 2


def test_limit_is_the_minimum_of_the_providers() -> None:
    """Several providers combine by minimum, read on every decision."""
    values = {"x": 7}

    class Plugin:
        @hookimpl
        def obleth_capacity_providers(self) -> dict[str, object]:
            class Provider:
                def max_in_flight(self) -> int:
                    return values["x"]

            return {"moving": lambda settings: Provider()}

    gateway = Gateway(
        Settings(capacity_providers=["static", "moving"], global_max_in_flight=5),
        plugins=[Plugin()],
        entry_points=False,
    )
    assert gateway.capacity.current() == 5
    values["x"] = 2
    assert gateway.capacity.current() == 2
