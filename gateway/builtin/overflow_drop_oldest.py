"""The ``drop-oldest`` overflow policy: the newcomer waits for a seat up to
``queue_timeout_s``; when the queue is full, the oldest waiter of the tenant with the
largest weighted share (running plus waiting) is evicted (503 ``evicted``) and the
newcomer takes its place, never one of a more urgent class than the newcomer's (then the
newcomer gets 503 ``queue_full``). A light tenant next to a flooding one keeps getting
through, because the flooder's own waiters make room."""

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
