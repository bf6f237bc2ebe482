"""The ``reject`` overflow policy: nothing waits; when no seat is free the newcomer is
refused at once (503 ``over_capacity``)."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core.admission import OverflowAction, QueueView
from gateway.core.tickets import Ticket
from gateway.hookimpl import hookimpl
from gateway.protocols import Factory
from gateway.settings import Settings


class Reject:
    def __init__(self, settings: Settings) -> None:
        pass

    def decide(self, view: QueueView, ticket: Ticket) -> OverflowAction:
        return "reject"


@hookimpl(trylast=True)
def obleth_overflow_policies() -> Mapping[str, Factory]:
    return {"reject": Reject}
