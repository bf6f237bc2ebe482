"""The gate's capacity: set_capacity checks its input, providers combine and fail safely.

Waiting, waking, timeouts and races are the backend contract: tests/backends/test_contract.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from gateway import Gateway, Settings, hookimpl
from gateway.core.tickets import Ticket


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


def test_set_capacity_refuses_a_bad_limit() -> None:
    """A limit below 0 (or no whole number) is refused with a message, and the old limit
    stays; 0 pauses admissions until the limit is raised."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=4)
        for bad in (-1, 2.5, True):
            with pytest.raises(ValueError, match="at least 0"):
                gateway.set_capacity(bad)  # type: ignore[arg-type]
        assert gateway.capacity.current() == 4
        gateway.set_capacity(0)
        waiting = asyncio.create_task(gateway.scheduler.acquire(Ticket("a")))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # paused: nothing is admitted
        gateway.set_capacity(1)
        (await asyncio.wait_for(waiting, 1)).release()
        await gateway.stop()

    run(scenario)


class Dial:
    """A capacity provider of a plugin's own that an operator can set, like ``static``."""

    def __init__(self, settings: Settings) -> None:
        self.value = 2

    def max_in_flight(self) -> int:
        return self.value

    def set_max_in_flight(self, value: int) -> None:
        self.value = value


class DialPlugin:
    @hookimpl
    def obleth_capacity_providers(self) -> dict[str, object]:
        return {"dial": Dial}


def test_set_capacity_sets_whichever_provider_can_be_set() -> None:
    """set_capacity goes to the one provider that can be set, whatever its name; with
    none (or two) it says which providers the gateway has and which can be set."""

    async def scenario() -> None:
        gateway = Gateway(
            Settings(capacity_providers=("dial",)), plugins=[DialPlugin()], entry_points=False
        )
        gateway.set_capacity(7)
        assert gateway.capacity.current() == 7
        both = Gateway(
            Settings(capacity_providers=("dial", "static")),
            plugins=[DialPlugin()],
            entry_points=False,
        )
        with pytest.raises(
            RuntimeError, match="uses dial, static, of which these can be set: dial, static"
        ):
            both.set_capacity(3)

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
    # what the status and the metrics show is the value in use, not the faulty answer
    flaky.value = -5
    assert gateway.provider_limits() == {"static": 10, "flaky": 5}
    flaky.value = 2
    assert gateway.capacity.current() == 2
    assert gateway.provider_limits() == {"static": 10, "flaky": 2}


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


def test_free_seats_are_closed_until_start_and_after_stop() -> None:
    """Before start and after stop the fast path offers nothing: the caller takes the
    full path, which (in the middleware) starts the gateway first."""

    async def scenario() -> None:
        gateway = Gateway(Settings(), entry_points=False)
        seats = gateway.scheduler.free_seats
        assert seats is not None
        assert not seats.take(Ticket("a"))
        await gateway.start()
        assert seats.take(Ticket("a"))
        seats.give_back(Ticket("a"))
        await gateway.stop()
        assert not seats.take(Ticket("a"))
        assert_drained(gateway)

    run(scenario)


class PolledPlugin:
    """Offers the capacity provider ``polled``, whose limit is ``values["x"]``, read on
    every decision: it has no ``subscribe``, so nobody announces its changes."""

    def __init__(self, values: dict[str, int]) -> None:
        self.values = values

    @hookimpl
    def obleth_capacity_providers(self) -> dict[str, object]:
        values = self.values

        class Polled:
            def max_in_flight(self) -> int:
                return values["x"]

        return {"polled": lambda settings: Polled()}


@pytest.mark.parametrize("polled", [False, True])
def test_free_seats_read_the_limit_on_every_take(polled: bool) -> None:
    """The fast path follows the limit the moment it changes: an announced change
    (set_capacity, up or down), alone or next to a provider read on every decision whose
    new value nobody announces."""
    values = {"x": 10}
    plugin = PolledPlugin(values)

    async def scenario() -> None:
        providers = ["static", "polled"] if polled else ["static"]
        gateway = Gateway(
            Settings(capacity_providers=providers, global_max_in_flight=1),
            plugins=[plugin],
            entry_points=False,
        )
        await gateway.start()
        seats = gateway.scheduler.free_seats
        assert seats is not None
        assert seats.take(Ticket("a")) and not seats.take(Ticket("b"))
        gateway.set_capacity(3)
        assert seats.take(Ticket("b"))
        gateway.set_capacity(2)
        assert not seats.take(Ticket("c"))
        gateway.set_capacity(3)
        if polled:
            values["x"] = 2
            assert not seats.take(Ticket("c"))
            values["x"] = 10
        assert seats.take(Ticket("c"))
        for tenant in "abc":
            seats.give_back(Ticket(tenant))
        assert_drained(gateway)

    run(scenario)


def test_a_limit_raised_unannounced_lets_the_waiters_in_at_the_next_request() -> None:
    """A provider read on every decision (no ``subscribe``) that goes from 0 to 3 while
    two requests wait: the next request to arrive hands the free seats to the waiters,
    first come first, and takes the one left, although nothing was in flight to release."""
    values = {"x": 0}
    plugin = PolledPlugin(values)

    async def scenario() -> None:
        gateway = Gateway(
            Settings(capacity_providers=["static", "polled"], global_max_in_flight=10),
            plugins=[plugin],
            entry_points=False,
        )
        await gateway.start()
        waiters = [asyncio.create_task(gateway.scheduler.acquire(Ticket(t))) for t in "ab"]
        await asyncio.sleep(0)
        assert gateway.snapshot().queued == 2
        values["x"] = 3
        newcomer = await asyncio.wait_for(gateway.scheduler.acquire(Ticket("c")), 2)
        permits = await asyncio.wait_for(asyncio.gather(*waiters), 2)
        assert [p.ticket.tenant for p in permits] == ["a", "b"]
        for permit in [*permits, newcomer]:
            permit.release()
        assert_drained(gateway)
        await gateway.stop()

    run(scenario)


def test_free_seats_grant_only_what_the_full_path_would_grant_at_once() -> None:
    """The fast path never barges past a waiter, never crosses the limit or a tenant's
    cap, and a seat it gives back goes to the waiter; the scheduler counts both paths."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=2, tenant_max_in_flight={"capped": 1})
        seats = gateway.scheduler.free_seats
        assert seats is not None
        assert seats.take(Ticket("a")) and seats.take(Ticket("capped"))
        assert not seats.take(Ticket("b"))  # the limit
        waiter = asyncio.create_task(gateway.scheduler.acquire(Ticket("w")))
        await asyncio.sleep(0)
        assert gateway.snapshot().queued == 1
        seats.give_back(Ticket("a"))
        permit = await asyncio.wait_for(waiter, 2)  # the freed seat went to the waiter
        assert not seats.take(Ticket("b"))  # full again
        permit.release()
        assert not seats.take(Ticket("capped"))  # a seat is free, the tenant's cap is not
        assert seats.take(Ticket("b"))
        seats.give_back(Ticket("b"))
        seats.give_back(Ticket("capped"))
        assert (gateway.scheduler.admitted, gateway.scheduler.released) == (4, 4)
        assert_drained(gateway)

    run(scenario)


def test_no_free_seat_while_someone_waits() -> None:
    """A seat free while a bigger request waits for its seats is not handed to a
    newcomer: it would barge past the queue's head."""

    async def scenario() -> None:
        gateway = await started(global_max_in_flight=2)
        seats = gateway.scheduler.free_seats
        assert seats is not None
        holder = gateway.scheduler.try_acquire(Ticket("a"))
        assert holder is not None
        waiter = asyncio.create_task(gateway.scheduler.acquire(Ticket("w", seats=2)))
        await asyncio.sleep(0)
        assert gateway.snapshot().queued == 1 and gateway.snapshot().inflight == 1
        assert not seats.take(Ticket("late"))
        holder.release()
        holder.release()  # a Permit from the fast path still releases once
        permit = await asyncio.wait_for(waiter, 2)
        permit.release()
        assert_drained(gateway)

    run(scenario)
