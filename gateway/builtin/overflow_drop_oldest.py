"""The ``drop-oldest`` overflow policy: queue the newcomer; when the queue is full, evict
the oldest waiter of the tenant with the largest weighted share (503 ``evicted``), never
one of a more urgent class than the newcomer's. A light tenant next to a flooding one
keeps getting through, because the flooder's own waiters make room."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core.admission import OverflowAction, QueueView
from gateway.core.tickets import Ticket
from gateway.hookimpl import hookimpl
from gateway.protocols import Factory
from gateway.settings import Settings


class DropOldest:
    def __init__(self, settings: Settings) -> None:
        pass

    def decide(self, view: QueueView, ticket: Ticket) -> OverflowAction:
        return "evict"


@hookimpl(trylast=True)
def obleth_overflow_policies() -> Mapping[str, Factory]:
    return {"drop-oldest": DropOldest}
