"""``gateway.loopback.mock_backend_process``: the simulated backend in a process of its
own, as plugin authors' tests start it."""

from __future__ import annotations

import httpx
import pytest

from gateway.loopback import mock_backend_process


def test_it_yields_a_backend_that_answers_and_stops_it_on_exit() -> None:
    with mock_backend_process("--max-num-seqs", "2") as url:
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(url + "/health", trust_env=False, timeout=5).status_code == 200
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", trust_env=False, timeout=1)


def test_a_backend_that_cannot_start_is_an_error_not_a_hang() -> None:
    with (
        pytest.raises(RuntimeError, match="exited at startup"),
        mock_backend_process("--max-num-seqs", "0"),
    ):
        pass  # pragma: no cover - never reached
