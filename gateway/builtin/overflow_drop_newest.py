"""The ``drop-newest`` overflow policy: when no seat is free, reject the newcomer at once
(503 ``over_capacity``); nothing ever waits."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core.admission import OverflowAction, QueueView
from gateway.core.tickets import Ticket
from gateway.hookimpl import hookimpl
from gateway.protocols import Factory
from gateway.settings import Settings


class DropNewest:
    def __init__(self, settings: Settings) -> None:
        pass

    def decide(self, view: QueueView, ticket: Ticket) -> OverflowAction:
        return "reject"


@hookimpl(trylast=True)
def obleth_overflow_policies() -> Mapping[str, Factory]:
    return {"drop-newest": DropNewest}
