"""Built-in plugins: ordinary plugin modules, registered through the same door as
third-party ones and blockable by name with ``disable_plugins``."""

from __future__ import annotations

from typing import Final

#: Registered in this order, before entry points; a plugin's name is its module's short
#: name with dashes (``capacity-static``).
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
