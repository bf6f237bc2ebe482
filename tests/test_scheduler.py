"""The gate's capacity: set_capacity checks its input, providers combine and fail safely.

Waiting, waking, timeouts and races are the backend contract: tests/backends/test_contract.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from gateway import Gateway, Settings, hookimpl


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
