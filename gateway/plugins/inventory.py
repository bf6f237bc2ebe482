"""What ``obleth plugins`` lists: every registered plugin, where it comes from and what it
offers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.plugins.offers import Kind, Offer


@dataclass(frozen=True)
class PluginInfo:
    """One registered plugin, for ``obleth plugins`` and error messages."""

    name: str
    distribution: str
    version: str
    provides: dict[str, list[str]] = field(default_factory=dict)


def describe(
    registered: Mapping[str, object],
    origins: Mapping[str, tuple[str, str]],
    offers: Mapping[Kind, Mapping[str, Offer]],
    implementers: Mapping[str, set[str]],
) -> list[PluginInfo]:
    """The ``registered`` plugins (by name) sorted by name, each with its origin (from
    ``origins``: distribution and version), the names it offers of each kind, and the
    hooks it implements (``implementers``: the plugins implementing each hook)."""
    result = []
    for name in sorted(registered):
        distribution, version = origins.get(name, ("unknown", ""))
        provides: dict[str, list[str]] = {}
        for kind, by_name in offers.items():
            mine = sorted(n for n, offer in by_name.items() if offer.plugin == name)
            if mine:
                provides[kind] = mine
        hooks = [hook for hook, plugins in implementers.items() if name in plugins]
        if hooks:
            provides["hooks"] = hooks
        result.append(PluginInfo(name, distribution or "(the application)", version, provides))
    return result
