"""The public surface is what ``gateway`` exports, and nothing leaks by accident."""

from __future__ import annotations

import types

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
