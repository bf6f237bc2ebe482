"""What the gate knows about a request: who sends it, how urgent it is, how many seats."""

from __future__ import annotations

from typing import Final, Literal, NamedTuple, get_args

Priority = Literal["critical", "standard", "background"]

#: Priority classes from most to least urgent; a class is served strictly before the next.
PRIORITIES: Final[tuple[Priority, ...]] = get_args(Priority)

#: Rank of each class: lower ranks are served first.
PRIORITY_RANK: Final[dict[str, int]] = {name: rank for rank, name in enumerate(PRIORITIES)}

#: The class that never waits: admitted at once or rejected with ``no_wait``.
NO_WAIT_RANK: Final[int] = PRIORITY_RANK["background"]

#: The longest tenant name taken, from a header or a classifier. A tenant's name becomes a
#: label of the metrics, a key of the fair queue (in Redis too) and a word of the logs: a
#: client must not make a kilobyte of each out of one header.
MAX_TENANT_CHARS: Final[int] = 256


class Ticket(NamedTuple):
    """One request asking for seats; immutable once classified (a tuple: cheap to build
    on every request). ``tokens`` is its token estimate, counted only by a gate with a
    token budget or fair by tokens (0 where the gate does not count them)."""

    tenant: str
    priority: Priority = "standard"
    seats: int = 1
    tokens: int = 0

    @property
    def rank(self) -> int:
        return PRIORITY_RANK[self.priority]

    @property
    def of_class(self) -> Ticket:
        """The ticket without its token estimate: what records and tallies key on, so
        that every estimate of one class shares one key."""
        return self._replace(tokens=0) if self.tokens else self


_new_tuple = tuple.__new__


def ticket(tenant: str, priority: Priority = "standard", seats: int = 1, tokens: int = 0) -> Ticket:
    """``Ticket(tenant, priority, seats, tokens)``, built without the Python-level
    ``__new__`` of a named tuple: the request path builds one per request."""
    return _new_tuple(Ticket, (tenant, priority, seats, tokens))
