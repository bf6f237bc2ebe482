"""The admin API's capacity endpoint, served by a real uvicorn and called by a real HTTP
client: reading and changing the limit live, refusing bad bodies and bad tokens without
touching the limit, off without a token, and one limit for every pod in cluster mode."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from gateway import Gateway, Settings
from gateway.admin.status import status
from gateway.core.tickets import Ticket
from tests.admin.client import BEARER, TOKEN, admin, dialled_pod
from tests.backends.dial import Dial, DialPlugin
from tests.backends.redis_pods import TTL, Pods, eventually

CAPACITY = "/api/v1/capacity"
STATUS = "/api/v1/status"

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def dialled(dial: Dial, limit: int) -> AsyncIterator[Gateway]:
    """A started gateway with the admin API on, whose providers are ``static`` (``limit``)
    and the computed ``dial``; stopped afterwards."""
    settings = Settings(
        global_max_in_flight=limit, admin_token=TOKEN, capacity_providers=("static", "dial")
    )
    gateway = Gateway(settings, plugins=[DialPlugin(dial)], entry_points=False)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


@asynccontextmanager
async def started(**settings: Any) -> AsyncIterator[Gateway]:
    gateway = Gateway(Settings(**settings), entry_points=False)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


async def test_an_operator_reads_and_changes_the_limit_live(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """GET answers the limit in force; PUT changes it at once, and the log says the old and
    new ceiling, the limit in force, who asked and a short hash of the token, never the
    token."""
    caplog.set_level(logging.WARNING, "obleth.admin")
    async with (
        started(global_max_in_flight=4, admin_token=TOKEN) as gateway,
        admin(gateway) as client,
    ):
        read = await client.get("/api/v1/capacity", headers=BEARER)
        assert (read.status_code, read.json()) == (200, {"max_in_flight": 4})
        changed = await client.put("/api/v1/capacity", headers=BEARER, json={"max_in_flight": 300})
        assert (changed.status_code, changed.json()) == (
            200,
            {"max_in_flight": 300, "ceiling": 300},
        )
        assert gateway.capacity.current() == 300
        again = await client.get("/api/v1/capacity", headers=BEARER)
        assert again.json() == {"max_in_flight": 300}
    assert "ceiling 4 -> 300 (limit in force 300), by 127.0.0.1:" in caplog.text
    assert TOKEN not in caplog.text


async def test_answers_with_live_values_tell_caches_not_to_keep_them() -> None:
    """The status, the limit read and the limit set are ``Cache-Control: no-store``: a
    browser's or a proxy's cache must not answer the next read with an old limit."""
    async with (
        started(global_max_in_flight=4, admin_token=TOKEN) as gateway,
        admin(gateway) as client,
    ):
        answers = [
            await client.get("/api/v1/status", headers=BEARER),
            await client.get(CAPACITY, headers=BEARER),
            await client.put(CAPACITY, headers=BEARER, json={"max_in_flight": 5}),
        ]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.headers.get("cache-control") for a in answers] == ["no-store"] * 3


async def test_a_put_answers_the_limit_in_force_and_the_ceiling_it_set(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PUT sets the operator's ceiling; with a computed provider below it the limit in
    force stays that provider's value: the answer says both, GET right after agrees with
    its ``max_in_flight``, and the log names the old and new ceiling and the limit."""
    caplog.set_level(logging.WARNING, "obleth.admin")
    async with dialled(Dial(20), 10) as gateway, admin(gateway) as client:
        raised = await client.put(CAPACITY, headers=BEARER, json={"max_in_flight": 300})
        assert (raised.status_code, raised.json()) == (200, {"max_in_flight": 20, "ceiling": 300})
        assert (await client.get(CAPACITY, headers=BEARER)).json() == {"max_in_flight": 20}
        cut = await client.put(CAPACITY, headers=BEARER, json={"max_in_flight": 5})
        assert cut.json() == {"max_in_flight": 5, "ceiling": 5}
        assert (await client.get(CAPACITY, headers=BEARER)).json() == {"max_in_flight": 5}
    assert "ceiling 10 -> 300 (limit in force 20), by 127.0.0.1:" in caplog.text
    assert "ceiling 300 -> 5 (limit in force 5)" in caplog.text


class Follower(Dial):
    """A computed provider that stays under the ceiling without announcing it, as
    ``kv-pressure`` and ``adaptive`` do: its value is the lower of its own and the
    operator's limit."""

    def max_in_flight(self) -> int:
        return min(self.value, self.ceiling())


async def test_a_raised_ceiling_raises_a_limit_a_computed_provider_follows() -> None:
    """In process, a computed provider capped by the ceiling moves with it, and only the
    ceiling's provider announces the move: lowered to 4 and raised to 500, the limit in
    force stayed 4 while the status showed both providers at 500."""
    async with dialled(Follower(1000), 64) as gateway, admin(gateway) as client:
        for ceiling in (4, 500):
            put = await client.put(CAPACITY, headers=BEARER, json={"max_in_flight": ceiling})
            assert put.json() == {"max_in_flight": ceiling, "ceiling": ceiling}
        status = (await client.get("/api/v1/status", headers=BEARER)).json()
    assert status["capacity"]["max_in_flight"] == 500
    assert status["capacity"]["providers"] == {"static": 500, "dial": 500}


async def test_in_cluster_mode_a_get_right_after_a_put_agrees_with_it(
    redis_url: str, pool_name: str
) -> None:
    """The PUT answers once Redis has taken the new ceiling: its ``max_in_flight`` is the
    pool's limit with it (the leader's computed value when lower), and a GET on the same
    pod at once answers the same, not the limit before the PUT."""
    async with dialled_pod(redis_url, pool_name) as gateway:

        async def heard() -> bool:
            return gateway.snapshot().limit == 4  # the pool has the leader's value

        assert await eventually(heard, 3 * TTL)
        async with admin(gateway) as client:
            for ceiling, in_force in ((30, 4), (2, 2), (8, 4), (0, 0)):
                put = await client.put(CAPACITY, headers=BEARER, json={"max_in_flight": ceiling})
                assert put.json() == {"max_in_flight": in_force, "ceiling": ceiling}
                read = await client.get(CAPACITY, headers=BEARER)
                assert read.json() == {"max_in_flight": in_force}


async def test_every_error_has_the_openai_style_type_of_its_status() -> None:
    """Clients sort errors by ``type``: a bad token is an ``authentication_error``, every
    other refusal of the admin API an ``invalid_request_error``, never a bare ``error``."""
    async with (
        started(global_max_in_flight=4, admin_token=TOKEN) as gateway,
        admin(gateway) as client,
    ):
        answers = [
            await client.get(CAPACITY),
            await client.get("/api/v1/nowhere", headers=BEARER),
            await client.post(CAPACITY, headers=BEARER),
            await client.put(CAPACITY, headers=BEARER, content=b" " * 5000),
            await client.put(CAPACITY, headers=BEARER, content=b"{}"),
        ]
        gateway.providers["second"] = gateway.providers["static"]  # two that can be set
        answers.append(await client.put(CAPACITY, headers=BEARER, json={"max_in_flight": 9}))
    types = {answer.status_code: answer.json()["error"]["type"] for answer in answers}
    assert types == {
        401: "authentication_error",
        404: "invalid_request_error",
        405: "invalid_request_error",
        413: "invalid_request_error",
        422: "invalid_request_error",
        409: "invalid_request_error",
    }


async def test_zero_pauses_admissions_until_the_limit_is_raised() -> None:
    async with (
        started(global_max_in_flight=2, admin_token=TOKEN) as gateway,
        admin(gateway) as client,
    ):
        paused = await client.put("/api/v1/capacity", headers=BEARER, json={"max_in_flight": 0})
        assert paused.json() == {"max_in_flight": 0, "ceiling": 0}
        waiting = asyncio.create_task(gateway.scheduler.acquire(Ticket("t")))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiting.done()
        await client.put("/api/v1/capacity", headers=BEARER, json={"max_in_flight": 1})
        (await asyncio.wait_for(waiting, 2)).release()


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b'{"max_in_flight": -1}', 422, "outside 0 to"),
        (b'{"max_in_flight": 2.5}', 422, "no whole number"),
        # read as written, not as the float it rounds to (0, and 1e9: both were taken)
        (b'{"max_in_flight": 1e-400}', 422, "1E-400 is no whole number"),
        (b'{"max_in_flight": 999999999.99999999}', 422, "no whole number"),
        # an exponent too large to be made an int of: refused before any is made
        (b'{"max_in_flight": 1e999999999}', 422, "outside 0 to"),
        (b'{"max_in_flight": 1e99999999999999999999}', 422, "outside 0 to"),
        (b'{"max_in_flight": "7"}', 422, "no whole number"),
        (b'{"max_in_flight": true}', 422, "no whole number"),
        (b"{}", 422, "missing"),
        (b'{"max_in_flight": 5, "extra": 1}', 422, "unknown field 'extra'"),
        (b'{"max_in_flight": 1000000001}', 422, "outside 0 to 1000000000"),
        (b"not json", 422, "no JSON"),
        (b"[5]", 422, "no JSON object"),
        (b'{"max_in_flight": 5, "pad": "' + b"x" * 5000 + b'"}', 413, "larger than"),
    ],
)
async def test_a_bad_body_is_refused_by_name_and_the_limit_stays(
    body: bytes, status: int, says: str
) -> None:
    async with (
        started(global_max_in_flight=4, admin_token=TOKEN) as gateway,
        admin(gateway) as client,
    ):
        answer = await client.put("/api/v1/capacity", headers=BEARER, content=body)
        error = answer.json()["error"]
        assert answer.status_code == status
        assert error["param"] == "max_in_flight" and says in error["message"]
        assert gateway.capacity.current() == 4


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": f"Basic {TOKEN}"}],
)
async def test_no_token_or_a_wrong_one_gets_401_and_changes_nothing(
    headers: dict[str, str],
) -> None:
    async with (
        started(global_max_in_flight=4, admin_token=TOKEN) as gateway,
        admin(gateway) as client,
    ):
        for answer in (
            await client.get("/api/v1/capacity", headers=headers),
            await client.put("/api/v1/capacity", headers=headers, json={"max_in_flight": 9}),
        ):
            assert answer.status_code == 401
            assert answer.headers["www-authenticate"].startswith("Bearer")
            assert answer.json()["error"]["code"] == "unauthorized"
        assert gateway.capacity.current() == 4


async def test_head_on_a_read_answers_what_get_answers_without_the_body() -> None:
    """A monitoring tool's HEAD on the capacity or the status gets the GET's status and
    headers and no body; without the token, the same 401; a method a path does not take
    gets 405 with an ``Allow`` header that lists HEAD beside GET."""
    async with (
        started(global_max_in_flight=4, admin_token=TOKEN) as gateway,
        admin(gateway) as client,
    ):
        for path in (CAPACITY, STATUS):
            got = await client.get(path, headers=BEARER)
            head = await client.head(path, headers=BEARER)
            assert (head.status_code, head.content) == (200, b"")
            for name in ("content-type", "cache-control"):
                assert head.headers[name] == got.headers[name]
            refused = await client.head(path)
            assert (refused.status_code, refused.content) == (401, b"")
            assert refused.headers["www-authenticate"].startswith("Bearer")
        limit = await client.get(CAPACITY, headers=BEARER)
        head = await client.head(CAPACITY, headers=BEARER)
        assert head.headers["content-length"] == str(len(limit.content))
        wrong = {path: await client.delete(path, headers=BEARER) for path in (CAPACITY, STATUS)}
    assert {path: (a.status_code, a.headers["allow"]) for path, a in wrong.items()} == {
        CAPACITY: (405, "GET, HEAD, PUT"),
        STATUS: (405, "GET, HEAD"),
    }


async def test_a_body_naming_a_field_twice_is_refused_400_by_name() -> None:
    """``{"max_in_flight": 5, "max_in_flight": 500}`` is ambiguous (JSON parsers disagree
    on which one wins): refused 400, naming the field, and the limit stays."""
    async with (
        started(global_max_in_flight=4, admin_token=TOKEN) as gateway,
        admin(gateway) as client,
    ):
        body = b'{"max_in_flight": 5, "max_in_flight": 500}'
        answer = await client.put(CAPACITY, headers=BEARER, content=body)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            "invalid_body",
            "max_in_flight",
        )
        assert "'max_in_flight'" in error["message"] and "twice" in error["message"]
        assert gateway.capacity.current() == 4


async def test_two_authorization_headers_are_refused_400_whatever_they_hold() -> None:
    """A request carrying two ``Authorization`` headers is not judged by one of them: it
    is refused 400 naming the header, reads and changes alike, and the limit stays."""
    async with (
        started(global_max_in_flight=4, admin_token=TOKEN) as gateway,
        admin(gateway) as client,
    ):
        twice = [("Authorization", f"Bearer {TOKEN}"), ("Authorization", "Bearer wrong-one")]
        answers = [
            await client.get(CAPACITY, headers=twice),
            await client.get(STATUS, headers=twice[::-1]),
            await client.put(CAPACITY, headers=twice, json={"max_in_flight": 9}),
        ]
        for answer in answers:
            assert answer.status_code == 400
            error = answer.json()["error"]
            assert (error["type"], error["param"]) == ("invalid_request_error", "authorization")
            assert "Authorization" in error["message"]
        assert gateway.capacity.current() == 4


async def test_a_limit_no_provider_can_take_is_a_409_that_says_why() -> None:
    """With two providers that can both be set, the API does not guess which one."""
    async with (
        started(
            global_max_in_flight=4, admin_token=TOKEN, capacity_providers=("static",)
        ) as gateway,
        admin(gateway) as client,
    ):
        gateway.providers["second"] = gateway.providers["static"]  # two that can be set
        answer = await client.put("/api/v1/capacity", headers=BEARER, json={"max_in_flight": 9})
        assert answer.status_code == 409
        assert "exactly one capacity provider that can be set" in answer.json()["error"]["message"]
        assert gateway.capacity.current() == 4


async def test_without_a_token_the_api_is_off() -> None:
    async with started(global_max_in_flight=4) as gateway, admin(gateway) as client:
        assert (await client.get("/api/v1/capacity")).status_code == 404
        put = await client.put("/api/v1/capacity", headers=BEARER, json={"max_in_flight": 9})
        assert put.status_code == 404
        assert gateway.capacity.current() == 4


def test_a_token_too_short_stops_startup_without_showing_it() -> None:
    with pytest.raises(ValueError, match="at least 16 characters") as caught:
        Settings(admin_token="hunter2")
    assert "hunter2" not in str(caught.value)
    assert "hunter2" not in repr(Settings(admin_token=TOKEN + "hunter2"))
    # counted as it is used, without the white space around it: the message may not
    # say "16 characters ... expected at least 16"
    with pytest.raises(ValueError, match=r"'<15 characters>': expected a token of at least 16"):
        Settings(admin_token="a" * 15 + " ")


def test_a_token_beyond_ascii_stops_startup_without_showing_it() -> None:
    """A header carries the token: ``tökén-…`` would be sent as other bytes by a browser
    than by curl, and refused by ``obleth capacity``; it used to be taken all the same."""
    with pytest.raises(ValueError, match="printable ASCII") as caught:
        Settings(admin_token="tökén-0123456789abcdef")
    assert "tökén" not in str(caught.value)


async def test_in_cluster_mode_one_put_changes_every_pod_and_survives_a_restart(
    redis_url: str, pool_name: str
) -> None:
    pods = Pods(redis_url, pool_name, settings={"admin_token": TOKEN, "global_max_in_flight": 4})
    try:
        a = await pods.start()
        b = await pods.start()
        async with admin(a) as client:
            put = await client.put("/api/v1/capacity", headers=BEARER, json={"max_in_flight": 30})
            assert put.json() == {"max_in_flight": 30, "ceiling": 30}

        async def told() -> bool:
            return b.snapshot().limit == 30

        assert await eventually(told, 3)  # within a heartbeat (0.2 s here)
        cluster = status(b)["cluster"]
        assert (cluster["pool"], cluster["mode"], cluster["degraded"]) == (
            pool_name,
            "redis",
            False,
        )
        assert status(b)["capacity"]["max_in_flight"] == 30
        await b.stop()
        again = await pods.start()  # a pod restarted with the limit of its settings (4)

        async def kept() -> bool:
            return again.snapshot().limit == 30

        assert await eventually(kept, 3)
        async with admin(again) as client:
            read = await client.get("/api/v1/capacity", headers=BEARER)
            assert read.json() == {"max_in_flight": 30}
    finally:
        await pods.close()


async def test_mounted_under_a_prefix_of_the_application_its_paths_are_read_below_it() -> None:
    """``Mount("/admin", admin_app(gateway))`` in a Starlette app, next to the app's own
    routes: the API answers at /admin/api/v1/..., and the gateway's middleware, with the
    prefix exempt, never queues it, even with admissions paused."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    from gateway import GatewayMiddleware
    from gateway.admin import admin_app
    from gateway.loopback import serve_in_task

    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("hello")

    gateway = Gateway(
        Settings(
            global_max_in_flight=3,
            admin_token=TOKEN,
            exempt_paths=("/admin",),
            queue_timeout_s=0.1,
        ),
        entry_points=False,
    )
    app = Starlette(routes=[Route("/", hello), Mount("/admin", app=admin_app(gateway))])
    gated = GatewayMiddleware(app, gateway=gateway)
    async with (
        serve_in_task(gated) as server,
        httpx.AsyncClient(base_url=server.url, trust_env=False) as client,
    ):
        paused = await client.put(
            "/admin/api/v1/capacity", headers=BEARER, json={"max_in_flight": 0}
        )
        assert paused.json() == {"max_in_flight": 0, "ceiling": 0}
        assert (await client.get("/")).status_code == 503  # the app's own route: paused
        answer = await client.get("/admin/api/v1/capacity", headers=BEARER)
        assert answer.json() == {"max_in_flight": 0}
        status_answer = await client.get("/admin/api/v1/status", headers=BEARER)
        assert status_answer.json()["capacity"]["max_in_flight"] == 0
        assert (await client.get("/admin/dashboard")).status_code == 200
        await client.put("/admin/api/v1/capacity", headers=BEARER, json={"max_in_flight": 3})
        assert (await client.get("/")).text == "hello"
        # outside its mount the API is not there: the app's own 404
        assert (await client.get("/api/v1/capacity", headers=BEARER)).status_code == 404
