"""Built-in plugins: ordinary plugin modules, registered through the same door as
third-party ones and blockable by name with ``disable_plugins``."""

from __future__ import annotations

import importlib.metadata
from typing import Final

#: Registered in this order, before entry points; a plugin's name is its module's short
#: name with dashes (``capacity-static``, see ``plugin_name``).
DEFAULT_PLUGINS: Final[tuple[str, ...]] = (
    "gateway.builtin.capacity_static",
    "gateway.builtin.overflow_block",
    "gateway.builtin.overflow_drop_newest",
    "gateway.builtin.overflow_drop_oldest",
    "gateway.builtin.overflow_reject",
    "gateway.builtin.classifier",
    "gateway.builtin.scorer_prefix_affinity",
    "gateway.builtin.scorer_queue_depth",
    "gateway.builtin.scorer_kv_utilization",
    "gateway.builtin.scorer_load_balance",
    "gateway.builtin.scorer_session_affinity",
)


def plugin_name(module_name: str) -> str:
    """The plugin name of the built-in module ``module_name`` (one of ``DEFAULT_PLUGINS``):
    its short name with dashes, the name ``disable_plugins`` and ``obleth plugins`` use."""
    return module_name.rsplit(".", 1)[-1].replace("_", "-")


def origin() -> tuple[str, str]:
    """Where the built-ins come from: the ``obleth`` distribution and its version
    (``unknown`` in a source tree that was never installed)."""
    try:
        return ("obleth", importlib.metadata.version("obleth"))
    except importlib.metadata.PackageNotFoundError:
        return ("obleth", "unknown")
