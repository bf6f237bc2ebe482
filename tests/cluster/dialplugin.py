"""A test plugin for pods that must disagree: the ``pod-dial`` capacity provider, whose
value is the pod's own ``POD_DIAL`` variable. Every pod of a test cluster computes another
value, so only one pod's can be the pool's (``POD_PLUGINS=tests.cluster.dialplugin``)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from gateway import Settings, hookimpl
from gateway.protocols import Factory


class PodDial:
    """Answers ``POD_DIAL`` (read once, at assembly): a computed provider, as it cannot be
    set."""

    def __init__(self, settings: Settings) -> None:
        self._value = int(os.environ["POD_DIAL"])

    def max_in_flight(self) -> int:
        return self._value


@hookimpl
def obleth_capacity_providers() -> Mapping[str, Factory]:
    return {"pod-dial": PodDial}
