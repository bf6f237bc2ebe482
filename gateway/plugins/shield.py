"""The selected overflow policy, shielded on the request path: a policy's fault is named
in the log, never a failed request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, get_args

from gateway.core.admission import OverflowAction, QueueView
from gateway.core.tickets import Ticket
from gateway.faults import PASSED_ON
from gateway.protocols import OverflowPolicy

_ACTIONS: Final[frozenset[str]] = frozenset(get_args(OverflowAction))

#: what a faulty policy's request does: wait, as under ``block``, the default policy
FALLBACK: Final[OverflowAction] = "wait"


class ShieldedPolicy:
    """An overflow policy whose faults (``decide`` raises, ``SystemExit`` included, or
    answers no action) are logged through ``complain(plugin, what, problem=None)`` and
    answered ``FALLBACK``; ``gateway.faults.PASSED_ON`` is raised as it comes."""

    __slots__ = ("_complain", "_decide", "_plugin")

    def __init__(
        self,
        policy: OverflowPolicy,
        plugin: str,
        complain: Callable[..., None],
    ) -> None:
        self._decide = policy.decide
        self._plugin = plugin
        self._complain = complain

    def decide(self, view: QueueView, ticket: Ticket) -> OverflowAction:
        try:
            action = self._decide(view, ticket)
        except PASSED_ON:
            raise
        except BaseException:
            self._complain(self._plugin, "its overflow policy's decide()")
            return FALLBACK
        if not isinstance(action, str) or action not in _ACTIONS:  # a list is no action
            expected = ", ".join(sorted(_ACTIONS))
            self._complain(
                self._plugin,
                "its overflow policy's decide()",
                f"answered {action!r}, not one of {expected}",
            )
            return FALLBACK
        return action
