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


def test_the_backend_serves_the_model_its_flag_names_and_refuses_others() -> None:
    """``obleth mock-backend --model NAME`` lists NAME in ``/v1/models``, answers it, and
    answers any other model 404 as vLLM does, naming NAME."""
    with mock_backend_process("--model", "llama-3-8b", "--step-ms", "1") as url:
        models = httpx.get(url + "/v1/models", trust_env=False, timeout=5).json()
        asks = [
            httpx.post(
                url + "/v1/completions",
                json={"model": model, "prompt": "hello", "max_tokens": 1},
                trust_env=False,
                timeout=10,
            )
            for model in ("llama-3-8b", "obleth-sim")
        ]
    assert [card["id"] for card in models["data"]] == ["llama-3-8b"]
    served, unserved = asks
    assert served.status_code == 200 and served.json()["model"] == "llama-3-8b"
    assert unserved.status_code == 404
    error = unserved.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("NotFoundError", 404, "model")
    assert "`obleth-sim`" in error["message"] and "llama-3-8b" in error["message"]
