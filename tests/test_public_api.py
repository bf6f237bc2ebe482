"""The public surface is what ``gateway`` exports, and nothing leaks by accident."""

from __future__ import annotations

import copy
import pickle
import types
from concurrent.futures import ProcessPoolExecutor

import pytest

import gateway


def test_all_is_sorted_and_complete() -> None:
    """Every public name imported into ``gateway`` is listed in ``__all__``, in order."""
    public = {
        name
        for name, value in vars(gateway).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"  # from __future__
    }
    assert gateway.__all__ == sorted(gateway.__all__)
    assert set(gateway.__all__) == public


def test_plugin_authors_find_the_marker_at_the_top() -> None:
    """``from gateway import hookimpl`` is the marker pluggy recognises for project obleth."""
    assert gateway.hookimpl.project_name == "obleth"


def _settings_with_limit(limit: int) -> gateway.Settings:
    return gateway.Settings(global_max_in_flight=limit)


def test_an_error_raised_in_a_worker_process_reaches_the_parent_whole() -> None:
    with ProcessPoolExecutor(max_workers=1) as pool, pytest.raises(gateway.ConfigError) as caught:
        pool.submit(_settings_with_limit, 0).result(timeout=60)
    assert caught.value.setting == "global_max_in_flight" and caught.value.value == 0
    assert "global_max_in_flight=0" in str(caught.value)


ERRORS = [
    gateway.ConfigError("max_queue", -1, "a whole number of at least 1"),
    gateway.PluginError("vllm", "its factory raised", distribution="obleth-vllm 1.0"),
    gateway.PluginError.together(
        [gateway.PluginError("a", "broken"), gateway.PluginError("b", "also broken")]
    ),
    gateway.BadRequest("bad priority", param="x-priority", status=400),
    gateway.Disconnected(),
    gateway.Rejected.because("tenant_limit", retry_after_s=2.5),
    gateway.Unroutable("no upstream serves it", status=404, code="model_not_found", param="model"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda error: type(error).__name__)
def test_every_error_survives_pickle_and_copy(error: gateway.OblethError) -> None:
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error)):  # noqa: S301 (our own bytes)
        assert type(again) is type(error) and str(again) == str(error)
        assert described(again) == described(error)


def described(error: gateway.OblethError) -> dict[str, object]:
    """An error's attributes, ``PluginError.problems`` (which holds the error itself) by
    their messages."""
    attributes = dict(vars(error))
    if "problems" in attributes:
        attributes["problems"] = [str(problem) for problem in attributes["problems"]]
    return attributes
