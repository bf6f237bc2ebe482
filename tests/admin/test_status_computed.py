"""``GET /api/v1/status`` with a computed capacity provider: where its value comes from
(the pool's leader, or this process), and who leads, as the OpenAPI document says."""

from __future__ import annotations

import pytest

from gateway import Gateway, Settings
from tests.admin.client import TOKEN, admin, dialled_pod
from tests.admin.test_openapi import documented_status
from tests.backends.dial import Dial, DialPlugin
from tests.backends.redis_pods import TTL, backend, eventually

pytestmark = pytest.mark.anyio


async def test_a_leaders_status_names_it_as_the_author_of_the_value_in_use(
    redis_url: str, pool_name: str
) -> None:
    """In cluster mode the value in use is the pool's, written by the leader: the status
    names that pod (as ``cluster.pod`` names pods), when it wrote, and who leads."""
    async with dialled_pod(redis_url, pool_name) as gateway:
        pod = backend(gateway).pod

        async def heard() -> bool:
            pool = gateway.pool_capacity
            return pool is not None and pool.in_use("dial") is not None

        assert await eventually(heard, 3 * TTL)
        async with admin(gateway) as client:
            found = await documented_status(client)
        assert found["capacity"]["providers"] == {"static": 10, "dial": 4}
        where = found["capacity"]["computed"]["dial"]
        assert (where["source"], where["pod"]) == ("pool", pod)
        assert isinstance(where["at"], float)
        assert (found["cluster"]["pod"], found["cluster"]["leader"]) == (pod, pod)


async def test_in_process_a_computed_value_is_the_gateways_own() -> None:
    settings = Settings(
        admin_token=TOKEN, capacity_providers=("static", "dial"), global_max_in_flight=10
    )
    gateway = Gateway(settings, plugins=[DialPlugin(Dial(4))], entry_points=False)
    async with admin(gateway) as client:
        found = await documented_status(client)
    assert found["capacity"]["max_in_flight"] == 4
    assert found["capacity"]["computed"] == {"dial": {"source": "own", "pod": None, "at": None}}
    assert found["cluster"] is None
