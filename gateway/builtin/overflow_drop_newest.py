"""The ``drop-newest`` overflow policy: the newcomer waits for a seat up to
``queue_timeout_s`` while the queue has room; when the queue is full it is refused at once
(503 ``queue_full``)."""

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
        return "queue"


@hookimpl(trylast=True)
def obleth_overflow_policies() -> Mapping[str, Factory]:
    return {"drop-newest": DropNewest}
