"""The effective limit: the minimum of every selected capacity provider.

This is the one place that defines capacity; the scheduler, status and metrics all read
it here. A provider without ``subscribe()`` is read on every admission decision; one with
it is read when it calls back, and that value holds until its next call.

Two kinds of provider, told apart by one rule (``is_computed``): a provider that can be
set (``set_max_in_flight``, as the built-in ``static``) holds the operator's limit, the
*ceiling*; every other provider is *computed* from what the gateway observes (the
upstreams' readings, latencies). In process every provider answers for itself. In cluster
mode the ceiling is the pool's, set from any pod, and a computed provider's value is the
one the pod holding the pool's leader lease computed: each pod's ``Capacity`` then holds
the computed providers as the pool sees them (``gateway.backends.redis.pool_capacity``),
and the minimum is taken here as always.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeGuard

from gateway.complaints import Complaints
from gateway.faults import PASSED_ON
from gateway.protocols import CapacityProvider

log = logging.getLogger("obleth.capacity")

_RAISED = object()
"""What ``Capacity._complain`` is told a provider answered when it raised (None is an
answer a provider may give, and a fault of another kind)."""


def is_computed(provider: object) -> bool:
    """Whether ``provider``'s value is computed rather than set by the operator: true for
    every provider except one that can be set (with ``set_max_in_flight``)."""
    return getattr(provider, "set_max_in_flight", None) is None


def ceiling_of(providers: Iterable[CapacityProvider], default: int) -> int:
    """The operator's limit now: the value of the provider that can be set (the lowest,
    should there be several), else ``default`` (``global_max_in_flight``). A computed
    limit never needs to exceed it."""
    values = [int(p.max_in_flight()) for p in providers if not is_computed(p)]
    return min(values, default=default)


class ProviderFailed(ValueError):
    """A provider could not give its first value, or could not be wired in (its
    ``subscribe()`` or ``use_readings()`` raised); ``provider`` is its name."""

    def __init__(self, provider: str, problem: str) -> None:
        self.provider = provider
        super().__init__(f"capacity provider {provider!r}: {problem}")


class Capacity:
    """Combines providers by minimum and shields the request path from faulty ones.

    A provider that raises (anything but ``gateway.faults.PASSED_ON``: ``SystemExit``
    too) or answers something other than a whole number ≥ 0 is logged by name (at most
    once a minute) and its last good answer is used instead. A provider
    that offers ``subscribe`` promises to announce every change, so its value is read
    once per change instead of once per decision; the others are read every time.
    """

    def __init__(
        self,
        providers: Sequence[tuple[str, CapacityProvider]],
        *,
        origins: Mapping[str, str] | None = None,
    ) -> None:
        """``origins`` says, for a provider's name, where it comes from (its plugin and
        distribution), for the log lines about a faulty provider."""
        if not providers:
            raise ValueError("Capacity needs at least one provider")
        self._providers = list(providers)
        self._origins = dict(origins or {})
        self._last_good = [0 for _ in providers]
        self._complaints = Complaints()
        self._subscribers: list[Callable[[], None]] = []
        self._polled: list[int] = []
        for index, (_, provider) in enumerate(self._providers):
            self._last_good[index] = self._read(index, provider, initial=True)
            subscribe = getattr(provider, "subscribe", None)
            if callable(subscribe):
                try:
                    subscribe(self._changed)
                except PASSED_ON:
                    raise
                except BaseException as exc:  # SystemExit too: the provider's fault
                    name = self._providers[index][0]
                    raise ProviderFailed(name, f"subscribe() raised {exc!r}") from exc
            else:
                self._polled.append(index)
        self._announced = self._announced_minimum()
        #: the limit itself while every provider announces its changes, kept current by
        #: those announcements; None while some provider must be read on every decision
        #: (then call ``current()``). Readers on the request path check this first.
        self.settled = self._announced if not self._polled else None

    @property
    def providers(self) -> dict[str, CapacityProvider]:
        return dict(self._providers)

    def current(self) -> int:
        """The limit now."""
        if not self._polled:
            assert self._announced is not None
            return self._announced
        providers = self._providers
        limit = min(self._read(i, providers[i][1]) for i in self._polled)
        announced = self._announced
        return limit if announced is None or limit < announced else announced

    def values(self) -> dict[str, int]:
        """Each provider's value as the limit uses it: its answer now, or, from one that
        fails to give a whole number ≥ 0, its last good answer (the limit's own reads log
        the fault). For operators, not the request path: it asks every provider, and
        changes nothing the limit is computed from."""
        values = {}
        for index, (name, provider) in enumerate(self._providers):
            try:
                value = provider.max_in_flight()
            except PASSED_ON:
                raise
            except BaseException:
                value = None
            values[name] = value if _whole(value) else self._last_good[index]
        return values

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` whenever a provider says its value changed."""
        self._subscribers.append(callback)

    def _announced_minimum(self) -> int | None:
        """The minimum over providers that announce their changes (None if there are none)."""
        values = (v for i, v in enumerate(self._last_good) if i not in self._polled)
        return min(values, default=None)

    def _changed(self) -> None:
        # every announcing provider is read again, not only the one that spoke: a computed
        # value stays under the operator's ceiling (``use_ceiling``), so it moves when the
        # ceiling does, and the ceiling's provider is the one to announce that move
        for each, (_, provider) in enumerate(self._providers):
            if each not in self._polled:
                self._read(each, provider)
        self._announced = self._announced_minimum()
        if not self._polled:
            self.settled = self._announced
        for callback in self._subscribers:
            callback()

    def _read(self, index: int, provider: CapacityProvider, *, initial: bool = False) -> int:
        try:
            value = provider.max_in_flight()
        except PASSED_ON:
            raise
        except BaseException as exc:
            if initial:
                name = self._providers[index][0]
                raise ProviderFailed(name, f"max_in_flight() raised {exc!r}") from exc
            self._complain(index, _RAISED)
            return self._last_good[index]
        if not _whole(value):
            if initial:
                name = self._providers[index][0]
                raise ProviderFailed(name, f"max_in_flight() returned {value!r}, not an int >= 0")
            self._complain(index, value)
            return self._last_good[index]
        self._last_good[index] = value
        return value

    def _complain(self, index: int, value: object) -> None:
        """Log provider ``index``'s fault: it answered ``value``, or raised (``_RAISED``)."""
        if not self._complaints.may(index):
            return
        name = self._providers[index][0]
        origin = self._origins.get(name, "")
        if value is _RAISED:
            log.exception("capacity provider %r%s raised; keeping its last value", name, origin)
        else:
            log.error(
                "capacity provider %r%s returned %r, not an int >= 0; keeping its last value",
                name,
                origin,
                value,
            )


def _whole(value: object) -> TypeGuard[int]:
    """Whether a provider's answer is a limit: a whole number ≥ 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
