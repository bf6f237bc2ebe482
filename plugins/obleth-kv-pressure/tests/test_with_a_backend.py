"""The provider in a real gateway, reading a real simulated backend (``obleth
mock-backend`` in a process of its own) whose small KV cache a burst of long answers
overflows: the gateway's poller sees the preemptions and the provider cuts the limit."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from gateway import Gateway, Settings
from gateway.loopback import mock_backend_process


@pytest.fixture
def backend() -> Iterator[str]:
    """A simulated backend with room for 12 sequences of 512 tokens (384 blocks of 16),
    decoding a token every 5 ms."""
    with mock_backend_process(
        "--kv-cache-blocks", "384", "--max-num-seqs", "64", "--step-ms", "5",
        "--step-ms-per-seq", "0", "--prefill-ms-per-token", "0",
    ) as url:  # fmt: skip
        yield url


def test_preemptions_at_the_backend_cut_the_gateways_limit(backend: str) -> None:
    settings = Settings(
        global_max_in_flight=48,
        capacity_providers=("static", "kv-pressure"),
        upstreams=[backend],
        upstream_poll_interval_s=0.05,
    )

    async def scenario() -> tuple[int, int, str]:
        gateway = Gateway(settings)
        await gateway.start()
        try:
            before = gateway.snapshot().limit
            # 32 answers of 400 tokens after 100-token prompts: about 26 blocks each at the
            # end, 830 in all, for a cache of 384: the backend must preempt
            prompt = "word " * 100
            async with httpx.AsyncClient(base_url=backend, timeout=60) as http:
                await asyncio.gather(
                    *(
                        http.post(
                            "/v1/completions",
                            json={"model": "obleth-sim", "prompt": prompt, "max_tokens": 400},
                        )
                        for _ in range(32)
                    )
                )
            await asyncio.sleep(0.3)  # the poller's next rounds
            provider = gateway.providers["kv-pressure"]
            return before, gateway.snapshot().limit, str(provider.explain())  # type: ignore[attr-defined]
        finally:
            await gateway.stop()

    before, after, explained = asyncio.run(scenario())

    assert before == 48
    assert after < 48, explained
    assert "preemptions" in explained or "KV usage" in explained
