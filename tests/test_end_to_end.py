"""The middleware in front of the simulated backend on a real uvicorn server, over HTTP."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections import Counter

import httpx
import pytest

from gateway import GatewayMiddleware, Settings
from gateway.loopback import serve_in_thread
from gateway.routing.httpclient import KEEPALIVE_EXPIRY_S
from gateway.sim import SimConfig, create_app

LIMIT = 12


def test_backend_never_sees_more_than_the_limit_across_500_concurrent_requests() -> None:
    """500 concurrent requests from 3 tenants: the backend's own count never passes the limit."""
    backend = create_app(SimConfig(max_num_seqs=64, step_s=0.002, step_s_per_seq=0.0))
    app = GatewayMiddleware(
        backend,
        Settings(
            global_max_in_flight=LIMIT,
            tenant_header="x-tenant",
            tenant_weights={"a": 3, "b": 2, "c": 1},
            queue_timeout_s=60,
            exempt_paths=["/sim", "/metrics", "/health"],
        ),
    )

    async def drive(url: str) -> Counter[int]:
        limits = httpx.Limits(max_connections=500, keepalive_expiry=KEEPALIVE_EXPIRY_S)
        async with httpx.AsyncClient(
            base_url=url, limits=limits, timeout=60, trust_env=False
        ) as http:

            async def one(i: int) -> int:
                body = {"prompt": f"request {i} " * 20, "max_tokens": 4, "stream": i % 3 == 0}
                headers = {"x-tenant": "abc"[i % 3]}
                async with http.stream("POST", "/v1/completions", json=body, headers=headers) as r:
                    await r.aread()
                    return r.status_code

            return Counter(await asyncio.gather(*(one(i) for i in range(500))))

    with serve_in_thread(app) as server:
        statuses = asyncio.run(drive(server.url))
        stats = httpx.get(f"{server.url}/sim/stats", trust_env=False).json()
    assert statuses == Counter({200: 500})
    assert stats["max_concurrency"] == LIMIT  # reached, and never passed
    assert stats["completed"] == 500 and stats["concurrency"] == 0
    scheduler = app.gateway.scheduler
    assert scheduler.admitted == scheduler.released == 500


def test_demo_runs_by_itself_and_reports_the_limit_held() -> None:
    """`obleth demo` finishes on its own and says the backend stayed within the limit."""
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "demo", "--duration", "3", "--limit", "8"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "never above the limit" in result.stdout
    assert "every one released once" in result.stdout
    for tenant in ("gold", "silver", "bronze"):
        assert tenant in result.stdout


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--tenants", "göld:2,free:1"], "tenant 'göld': names are sent as a header, so ASCII"),
        (["--tenants", "gold:1,gold:2"], "tenant 'gold' is named twice"),
        (["--tenants", "gold:inf"], "weights above 0"),
        (["--policy", "fifo"], "--policy fifo: no overflow policy by that name; installed: block"),
        (["--queue-timeout", "-1"], "--queue-timeout -1.0: expected a finite number of seconds"),
        (["--max-queue", "-3"], "--max-queue -3: "),
    ],
)
def test_demo_refuses_a_flag_it_cannot_use_naming_it(flags: list[str], complaint: str) -> None:
    """Bad tenants or a setting the gateway refuses stop the demo before any load, in one
    line that names the flag."""
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "demo", *flags, "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert complaint in result.stderr and "Traceback" not in result.stderr
    assert "obleth demo" not in result.stdout  # no table: nothing ran


def test_demo_stopped_by_ctrl_c_stops_its_clients_quietly() -> None:
    """Ctrl-C mid-run ends the demo with status 130, without a traceback from a client."""
    # as a terminal would have it: a shell running this in the background may have left
    # SIGINT ignored, which the child would inherit
    start = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['obleth', 'demo', '--duration', '30']; "
        "runpy.run_module('gateway', run_name='__main__')"
    )
    demo = subprocess.Popen(
        [sys.executable, "-c", start],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert demo.stdout is not None
    demo.stdout.readline()  # the first table: the load is running
    demo.send_signal(signal.SIGINT)
    _, stderr = demo.communicate(timeout=30)
    assert demo.returncode == 130
    assert "Traceback" not in stderr
