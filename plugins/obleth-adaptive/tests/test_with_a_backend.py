"""The provider in a real gateway (the middleware and its streaming proxy) in front of a
simulated backend (``obleth mock-backend``, a process of its own) with four batch slots:
a burst queues inside the backend, first tokens come late, and the limit falls."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from gateway import Gateway, GatewayMiddleware, Settings
from gateway.loopback import mock_backend_process
from gateway.proxy import ProxyApp

from obleth_adaptive import AdaptiveLimit, plugin

CEILING = 24


@pytest.fixture
def backend() -> Iterator[str]:
    """A simulated backend running 4 sequences at once, 5 ms per decode step and 0.5 ms
    of prefill per prompt token: a request beyond the fourth waits inside it for a slot,
    so its first token comes late."""
    with mock_backend_process(
        "--max-num-seqs", "4", "--step-ms", "5", "--step-ms-per-seq", "0",
        "--prefill-ms-per-token", "0.5",
    ) as url:  # fmt: skip
        yield url


def test_first_tokens_delayed_at_the_backend_cut_the_gateways_limit(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of 64 streamed completions: the probe measures the unloaded first token,
    the limit grows from the probe's 3 by one seat per first token within the tolerance,
    the backend queues all but 4 of them, and the late first tokens bring the limit
    down."""
    for name, value in {"WINDOW": "4", "PROBE_SAMPLES": "3", "PROBE_EVERY": "0"}.items():
        monkeypatch.setenv("OBLETH_ADAPTIVE_" + name, value)
    settings = Settings(
        global_max_in_flight=CEILING,
        capacity_providers=("static", "adaptive"),
        upstreams=[backend],
        upstream_poll_interval_s=0.05,
    )

    async def scenario() -> tuple[list[tuple[int, str]], list[int], dict[str, object]]:
        gateway = Gateway(settings, plugins=[plugin], entry_points=False)
        provider = gateway.providers["adaptive"]
        assert isinstance(provider, AdaptiveLimit)
        changes: list[tuple[int, str]] = []
        provider.subscribe(lambda: changes.append((provider.max_in_flight(), provider.law.reason)))
        proxy = ProxyApp()
        app = GatewayMiddleware(proxy, gateway=gateway)
        prompt = "word " * 100  # 125 tokens: about 60 ms of prefill
        body = {"model": "obleth-sim", "prompt": prompt, "max_tokens": 16, "stream": True}
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                answers = await asyncio.gather(
                    *(client.post("/v1/completions", json=body, timeout=60) for _ in range(64))
                )
        finally:
            await gateway.stop()
            await proxy.aclose()
        return changes, [answer.status_code for answer in answers], provider.explain()

    changes, statuses, explained = asyncio.run(scenario())

    assert statuses == [200] * 64
    limits = [limit for limit, _ in changes]
    reasons = [reason for _, reason in changes]
    first_cut = next(i for i, reason in enumerate(reasons) if reason.startswith("decrease"))
    assert first_cut >= 1, changes
    # the first probe ended at 3, and the slow start added a seat per fast first byte
    assert limits[:first_cut] == list(range(4, 4 + first_cut)), changes
    assert all(reason.startswith("slow start") for reason in reasons[:first_cut]), changes
    assert limits[first_cut] < limits[first_cut - 1], changes
    assert explained["baseline_s"] is not None
