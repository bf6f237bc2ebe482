"""The ``tenant-quota`` capacity provider: ``OBLETH_TENANT_QUOTA_SHARE`` of the static
limit, read with ``PluginKnobs`` as docs/plugins.md shows."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from gateway import Settings, hookimpl
from gateway.settings.knobs import PluginKnobs


class TenantQuota:
    def __init__(self, settings: Settings) -> None:
        knobs = PluginKnobs(os.environ, "OBLETH_TENANT_")
        share = knobs.number("QUOTA_SHARE", 0.5, least=0.0, most=1.0)
        knobs.done()
        self._limit = max(1, int(settings.global_max_in_flight * share))

    def max_in_flight(self) -> int:
        return self._limit


@hookimpl
def obleth_capacity_providers() -> Mapping[str, Callable[[Settings], object]]:
    return {"tenant-quota": TenantQuota}
