"""A third party's capacity provider that fails outside ``max_in_flight()``: while being
wired in, starting, stopping, in a readings callback, or taking the operator's limit.
Each fault is named with its plugin, ``SystemExit`` included, and never ends the server
without a word nor answers a bare 500."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from gateway import Gateway, PluginError, Settings
from gateway.routing.readings import Reading
from tests.admin.client import BEARER, TOKEN, admin
from tests.plugins.test_facade import offering

pytestmark = pytest.mark.anyio

ERRORS = [RuntimeError("not today"), SystemExit(4)]
IDS = ["raises", "exits"]


class Provider:
    """A computed provider answering 3, to which each test adds a failing method."""

    def __init__(self, settings: Settings) -> None:
        pass

    def max_in_flight(self) -> int:
        return 3


def gateway_with(provider: type, **settings: Any) -> Gateway:
    settings.setdefault("capacity_providers", ("static", "faulty"))
    return Gateway(
        Settings(**settings),
        plugins=[offering("faulty-capacity", {"faulty": provider})],
        entry_points=False,
    )


def failing(error: BaseException) -> Callable[..., Any]:
    def fail(*args: object) -> None:
        raise error

    return fail


@pytest.mark.parametrize("error", ERRORS, ids=IDS)
@pytest.mark.parametrize("method", ["subscribe", "use_readings", "use_ceiling"])
@pytest.mark.parametrize("redis", [False, True], ids=["in-process", "cluster"])
def test_a_provider_failing_to_be_wired_in_stops_startup_naming_its_plugin(
    method: str, error: BaseException, redis: bool
) -> None:
    """``sys.exit()`` in ``subscribe()`` used to end the server with status 4 and no
    message; in cluster mode the pool subscribes too, and must say the same."""
    faulty = type("Faulty", (Provider,), {method: failing(error)})
    cluster = {"redis_url": "redis://127.0.0.1:9/0"} if redis else {}

    with pytest.raises(PluginError) as caught:
        gateway_with(faulty, **cluster)

    assert caught.value.plugin == "faulty-capacity"
    assert f"{method}() raised {error!r}" in str(caught.value)


@pytest.mark.parametrize("error", ERRORS, ids=IDS)
async def test_a_provider_failing_to_start_is_a_plugin_error(error: BaseException) -> None:
    async def start(self: object) -> None:
        raise error

    gateway = gateway_with(type("Faulty", (Provider,), {"start": start}))

    with pytest.raises(PluginError, match="capacity provider 'faulty' failed to start") as caught:
        await gateway.start()
    assert caught.value.plugin == "faulty-capacity"
    assert not gateway.started


@pytest.mark.parametrize("error", ERRORS, ids=IDS)
async def test_a_provider_failing_to_stop_is_logged_and_the_rest_stop(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    stopped: list[str] = []

    async def stop(self: object) -> None:
        stopped.append("faulty")
        raise error

    gateway = gateway_with(type("Faulty", (Provider,), {"stop": stop}))
    backend_stop = gateway.backend.stop

    async def stop_backend() -> None:
        stopped.append("backend")
        await backend_stop()

    gateway.backend.stop = stop_backend  # type: ignore[method-assign]
    await gateway.start()
    with caplog.at_level(logging.ERROR, logger="obleth"):
        await gateway.stop()

    assert stopped == ["backend", "faulty"]
    [record] = [r for r in caplog.records if "failed to stop" in r.getMessage()]
    assert "capacity provider 'faulty' from plugin 'faulty-capacity'" in record.getMessage()


@pytest.mark.parametrize("error", ERRORS, ids=IDS)
def test_a_readings_callback_that_fails_is_named_once_a_minute(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """A provider's callback on the upstream readings that raises used to log a traceback
    at every polling round, naming only the function; ``sys.exit()`` there ended the
    server. Now: named with the provider and plugin, once, and the others still hear."""
    heard: list[int] = []

    class Faulty(Provider):
        def use_readings(self, readings: Any) -> None:
            readings.subscribe(failing(error))
            readings.subscribe(lambda: heard.append(1))

    gateway = gateway_with(Faulty, upstreams=["http://127.0.0.1:9"])
    with caplog.at_level(logging.ERROR, logger="obleth.routing"):
        for _ in range(3):
            gateway.readings.update(Reading("http://127.0.0.1:9", healthy=True, at=1.0))
            gateway.readings.notify()

    assert heard == [1, 1, 1]
    [record] = caplog.records
    assert (
        "a subscriber of the upstream readings of capacity provider 'faulty' from plugin "
        "'faulty-capacity'" in record.getMessage()
    )


def test_a_provider_answering_none_is_not_said_to_have_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Faulty(Provider):
        calls = 0

        def max_in_flight(self) -> Any:
            Faulty.calls += 1
            return 3 if Faulty.calls == 1 else None

    gateway = gateway_with(Faulty, capacity_providers=("faulty",))
    with caplog.at_level(logging.ERROR, logger="obleth.capacity"):
        assert gateway.capacity.current() == 3

    [record] = caplog.records
    assert "returned None, not an int >= 0; keeping its last value" in record.getMessage()
    assert record.exc_info is None


def test_in_cluster_mode_a_failing_computed_provider_is_logged_with_its_plugin(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pod holding the leader lease logs a provider that fails to answer: by its
    name and, as in process, its plugin's."""

    class Faulty(Provider):
        calls = 0

        def max_in_flight(self) -> int:
            Faulty.calls += 1
            if Faulty.calls > 1:
                raise ValueError("lost the config server")
            return 3

    gateway = gateway_with(Faulty, redis_url="redis://127.0.0.1:9/0")
    assert gateway.pool_capacity is not None
    with caplog.at_level(logging.ERROR, logger="obleth.cluster"):
        assert gateway.pool_capacity.own_values() == {}

    [record] = caplog.records
    assert record.getMessage().startswith(
        "capacity provider 'faulty' from plugin 'faulty-capacity' (registered by the "
        "application) raised ValueError('lost the config server')"
    )


@pytest.mark.parametrize(
    "error",
    [*ERRORS, json.JSONDecodeError("Expecting value", "", 0)],
    ids=[*IDS, "ValueError-subclass"],
)
async def test_a_settable_provider_that_fails_answers_the_put_500_naming_it(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """A plugin's provider that takes the operator's limit and raises used to answer a
    plain-text 500 with a traceback in the server's log; the answer is now a JSON error
    naming the provider and its plugin, and the server goes on. A subclass of
    ``ValueError`` is a bug like any other, not a refusal of the value (it was answered
    422 and not logged)."""

    class Settable(Provider):
        def set_max_in_flight(self, value: int) -> None:
            raise error

    gateway = gateway_with(Settable, capacity_providers=("faulty",), admin_token=TOKEN)
    await gateway.start()
    try:
        async with admin(gateway) as client:
            with caplog.at_level(logging.ERROR, logger="obleth.admin"):
                put = await client.put(
                    "/api/v1/capacity", headers=BEARER, json={"max_in_flight": 5}
                )
            read = await client.get("/api/v1/capacity", headers=BEARER)
    finally:
        await gateway.stop()

    assert put.status_code == 500
    assert put.json()["error"]["code"] == "provider_failed"
    assert put.json()["error"]["type"] == "server_error"
    message = put.json()["error"]["message"]
    assert message.startswith("plugin 'faulty-capacity'")
    assert f"capacity provider 'faulty' raised {error!r} in set_max_in_flight(5)" in message
    assert read.json() == {"max_in_flight": 3}
    assert any(r.exc_info for r in caplog.records)


async def test_a_settable_provider_refusing_a_value_answers_the_put_422() -> None:
    """A ``ValueError`` from ``set_max_in_flight`` refuses the value, as ``static``
    refuses one below 0: the operator's to fix, answered with the provider's reason."""

    class Even(Provider):
        def set_max_in_flight(self, value: int) -> None:
            raise ValueError(f"{value} is odd; this provider takes even limits")

    gateway = gateway_with(Even, capacity_providers=("faulty",), admin_token=TOKEN)
    await gateway.start()
    try:
        async with admin(gateway) as client:
            put = await client.put("/api/v1/capacity", headers=BEARER, json={"max_in_flight": 5})
    finally:
        await gateway.stop()
    assert put.status_code == 422
    assert put.json()["error"]["param"] == "max_in_flight"
    assert put.json()["error"]["message"] == "refused: 5 is odd; this provider takes even limits"


def test_in_cluster_mode_a_settable_provider_that_exits_keeps_the_last_ceiling(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pool reads the operator's ceiling from the provider that can be set; a
    ``sys.exit()`` there used to end the server from inside a reply from Redis."""

    class Settable(Provider):
        failing = False

        def max_in_flight(self) -> int:
            if Settable.failing:
                raise SystemExit(4)
            return 3

        def set_max_in_flight(self, value: int) -> None:
            raise SystemExit(4)

    gateway = gateway_with(
        Settable, capacity_providers=("faulty",), redis_url="redis://127.0.0.1:9/0"
    )
    pool = gateway.pool_capacity
    assert pool is not None
    assert pool.ceiling() == 3
    Settable.failing = True
    with caplog.at_level(logging.ERROR, logger="obleth.cluster"):
        assert pool.ceiling() == 3
    assert "the capacity provider that can be set failed" in caplog.text
