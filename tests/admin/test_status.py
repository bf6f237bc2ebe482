"""``GET /api/v1/status``: the gateway's state for operators, read from the one source of
truth, with the tenants bounded; behind the same token as the rest of the admin API."""

from __future__ import annotations

import asyncio

import pytest

from gateway import Gateway, Settings
from gateway.admin.status import status
from gateway.core.tickets import Ticket
from tests.admin.client import BEARER, TOKEN, admin

pytestmark = pytest.mark.anyio


async def test_status_reports_seats_waiters_tenants_and_upstreams() -> None:
    """Three tenants hold the two seats or wait; the status says so per class and per
    tenant, lists the two most active by name (``telemetry_tenants``) and sums up the rest."""
    settings = Settings(
        global_max_in_flight=2,
        admin_token=TOKEN,
        telemetry_tenants=2,
        tenant_weights={"gold": 4},
        upstreams=("http://127.0.0.1:9",),
    )
    gateway = Gateway(settings, entry_points=False)
    await gateway.start()
    try:
        held = [await gateway.scheduler.acquire(Ticket(t)) for t in ("gold", "gold")]
        waiting = [
            asyncio.create_task(gateway.scheduler.acquire(Ticket(t, p)))
            for t, p in (("gold", "critical"), ("free", "standard"), ("spare", "standard"))
        ]
        for _ in range(20):
            await asyncio.sleep(0)
        found = status(gateway)
        assert found["capacity"] == {"max_in_flight": 2, "providers": {"static": 2}, "computed": {}}
        assert (found["in_flight"], found["queued"]) == (2, 3)
        assert found["queued_by_class"] == {"critical": 1, "standard": 2, "background": 0}
        tenants = found["tenants"]
        assert tenants["listed"]["gold"] == {
            "in_flight": 2,
            "waiting": 1,
            "weight": 4.0,
            "share": 1.0,
        }
        assert list(tenants["listed"]) == ["gold", "free"]  # most active, then by name
        assert tenants["other"] == {"tenants": 1, "in_flight": 0, "waiting": 1}
        upstream = found["upstreams"]["http://127.0.0.1:9"]
        assert upstream["in_flight"] == 0 and upstream["healthy"] is False
        assert (upstream["routed"], upstream["rerouted"]) == (0, 0)
        assert found["routing"] == {"policy": "weighted", "recent": []}
        assert found["cluster"] is None and found["started"] is True
        async with admin(gateway) as client:
            answer = await client.get("/api/v1/status", headers=BEARER)
            assert answer.status_code == 200
            assert answer.json()["queued_by_class"] == found["queued_by_class"]
            assert (await client.get("/api/v1/status")).status_code == 401
            assert (await client.post("/api/v1/status", headers=BEARER)).status_code == 405
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        for permit in held:
            permit.release()
    finally:
        await gateway.stop()
