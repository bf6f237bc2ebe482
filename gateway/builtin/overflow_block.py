"""The ``block`` overflow policy (the default): the newcomer waits for a seat up to
``queue_timeout_s``, in the queue while it has room, else for room, first come first served.
A full queue never refuses it; only the timeout ends its wait (503 ``queue_timeout``)."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core.admission import OverflowAction, QueueView
from gateway.core.tickets import Ticket
from gateway.hookimpl import hookimpl
from gateway.protocols import Factory
from gateway.settings import Settings


class Block:
    def __init__(self, settings: Settings) -> None:
        pass

    def decide(self, view: QueueView, ticket: Ticket) -> OverflowAction:
        return "wait"


@hookimpl(trylast=True)
def obleth_overflow_policies() -> Mapping[str, Factory]:
    return {"block": Block}
