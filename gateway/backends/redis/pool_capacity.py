"""One pod's capacity providers in cluster mode: the ceiling it shares, the computed values
it takes from the pool.

The rule is ``gateway.capacity.is_computed``. The provider that can be set (``static``)
holds the operator's limit: set on any pod, it is sent to Redis as the pool's *ceiling*,
and a ceiling set elsewhere is given back to it here, so that it answers the pool's
ceiling on every pod (``use_ceiling``, the failure mode and a pool Redis lost all read
it). Every other provider is *computed*, and ``Capacity`` holds it wrapped in a
``PoolValue``: the value the pod holding the leader lease wrote to Redis, as this pod last
heard it; its own value only while it has not heard one, or while Redis cannot be
reached. The pod holding the lease sends its own values (``own_values``). The providers
themselves run on every pod, so that any pod can take over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from gateway.backends.redis.wire import ComputedValue, PoolLimits
from gateway.capacity import ProviderFailed, ceiling_of, is_computed
from gateway.complaints import Complaints
from gateway.faults import PASSED_ON
from gateway.protocols import CapacityProvider

log = logging.getLogger("obleth.cluster")


class PoolCapacity:
    """The providers of one pod, and what it last heard of the pool's capacity.

    The Redis backend connects it: ``ceiling_set(value)`` is called when the operator's
    limit changed on this pod, ``own_changed()`` when a computed provider announced a new
    value of its own, and ``leading()`` says whether this pod holds the leader lease.
    """

    def __init__(
        self,
        providers: Mapping[str, CapacityProvider],
        *,
        default_ceiling: int,
        origins: Mapping[str, str] | None = None,
    ) -> None:
        """``origins`` says, for a provider's name, where it comes from (its plugin and
        distribution), for the log lines about a faulty provider."""
        self._providers = dict(providers)
        self._origins = dict(origins or {})
        self._default_ceiling = default_ceiling
        self._settable = [p for p in self._providers.values() if not is_computed(p)]
        self.values: dict[str, PoolValue] = {}
        for name, provider in self._providers.items():
            if is_computed(provider):
                announced = callable(getattr(provider, "subscribe", None))
                kind = AnnouncedPoolValue if announced else PoolValue
                self.values[name] = kind(name, provider, self)
        #: the pool's ceiling and computed values as last heard; None before the first
        self.heard: PoolLimits | None = None
        #: the pool's capacity version as last heard (-1: ask)
        self.cver = -1
        #: True while Redis cannot be reached: every provider answers for itself
        self.degraded = False
        self.ceiling_set: Callable[[int], None] = _ignore_value
        self.own_changed: Callable[[], None] = _ignore
        self.leading: Callable[[], bool] = lambda: False
        self._own_good: dict[str, int] = {}
        self._complaints = Complaints()
        self._syncing = False
        self._ceiling = default_ceiling
        for name, provider in self._providers.items():
            subscribe = getattr(provider, "subscribe", None)
            if not is_computed(provider) and callable(subscribe):
                _subscribe(name, subscribe, self._operator_changed)

    @property
    def computed(self) -> list[str]:
        """The names of the computed providers, in the order they were selected."""
        return list(self.values)

    def listed(self) -> list[tuple[str, CapacityProvider]]:
        """The providers as ``Capacity`` should hold them: the computed ones wrapped."""
        return [(name, self.values.get(name, p)) for name, p in self._providers.items()]

    def ceiling(self) -> int:
        """This pod's operator limit: the pool's ceiling once heard, kept in the provider."""
        try:
            self._ceiling = ceiling_of(self._providers.values(), self._default_ceiling)
        except PASSED_ON:
            raise
        except BaseException:  # SystemExit too: the provider's fault
            if self._complaints.may("ceiling"):
                log.exception(
                    "the capacity provider that can be set failed; keeping its last value"
                )
        return self._ceiling

    def in_use(self, name: str) -> ComputedValue | None:
        """The pool's value of computed provider ``name`` while this pod uses it; None
        while the pod uses its own (nothing heard yet, or Redis unreachable)."""
        heard = self.heard
        if heard is None or self.degraded:
            return None
        return heard.computed.get(name)

    def own_values(self) -> dict[str, int]:
        """Each computed provider's own value now (its last good one if it fails to
        answer; left out if it never answered well): what the lease holder sends."""
        for name, value in self.values.items():
            own = _good_answer(value.provider)
            if isinstance(own, int):
                self._own_good[name] = own
            elif self._complaints.may(name):
                # every pod reads the pool's value, not this one: no one else would say
                log.error(
                    "capacity provider %r%s %s; the pool keeps its last good value, %s",
                    name,
                    self._origins.get(name, ""),
                    own,
                    self._own_good.get(name, "none yet"),
                )
        return dict(self._own_good)

    def hear(self, limits: PoolLimits, cver: int, *, ceiling_pending: bool) -> None:
        """What a reply said of the pool's capacity. The ceiling is given to the provider
        that can be set, unless this pod has a ceiling of its own on the way to Redis
        (the reply is older than it). Providers whose answer changed announce it."""
        self.heard = limits
        self.cver = cver
        if not ceiling_pending:
            self._adopt_ceiling(limits.ceiling)
        self._announce()

    def forget(self) -> None:
        """Redis lost the pool (a new epoch): ask it for the capacity again."""
        self.cver = -1

    def set_degraded(self, degraded: bool) -> None:
        """Redis cannot be reached (True) or answers again (False)."""
        if degraded != self.degraded:
            self.degraded = degraded
            self._announce()

    # -- inside -----------------------------------------------------------------------------

    def _operator_changed(self) -> None:
        if not self._syncing:
            self.ceiling_set(self.ceiling())

    def _adopt_ceiling(self, ceiling: int) -> None:
        if len(self._settable) != 1:
            return  # several providers can be set: none of them is the pool's ceiling alone
        (provider,) = self._settable
        self._syncing = True
        try:
            if provider.max_in_flight() != ceiling:
                provider.set_max_in_flight(ceiling)  # type: ignore[attr-defined]
        except PASSED_ON:
            raise
        except BaseException:  # SystemExit too: the provider's fault
            log.exception("the pool's ceiling %d could not be given to this pod", ceiling)
        finally:
            self._syncing = False

    def _announce(self) -> None:
        for value in self.values.values():
            if isinstance(value, AnnouncedPoolValue):
                value.announce_if_changed()


class PoolValue:
    """A computed provider as every pod of the pool uses it: the leader's value, as last
    heard from Redis; the provider's own while none is heard. No I/O."""

    def __init__(self, name: str, provider: CapacityProvider, pool: PoolCapacity) -> None:
        self.name = name
        self.provider = provider
        self._pool = pool

    def max_in_flight(self) -> int:
        entry = self._pool.in_use(self.name)
        return entry.value if entry is not None else self.provider.max_in_flight()


class AnnouncedPoolValue(PoolValue):
    """A ``PoolValue`` over a provider that announces its changes: it announces its own
    (a new value heard from the pool, or the provider's own while that one is in use)."""

    def __init__(self, name: str, provider: CapacityProvider, pool: PoolCapacity) -> None:
        super().__init__(name, provider, pool)
        self._subscribers: list[Callable[[], None]] = []
        self._announced = self._answer()
        _subscribe(name, provider.subscribe, self._provider_changed)  # type: ignore[attr-defined]

    def subscribe(self, callback: Callable[[], None]) -> None:
        self._subscribers.append(callback)

    def announce_if_changed(self) -> None:
        answer = self._answer()
        if answer != self._announced:
            self._announced = answer
            for callback in self._subscribers:
                callback()

    def _provider_changed(self) -> None:
        self.announce_if_changed()
        self._pool.own_changed()

    def _answer(self) -> int | None:
        try:
            return self.max_in_flight()
        except PASSED_ON:
            raise
        except BaseException:
            return None  # the provider's own failed: Capacity reads it, logs, keeps the last


def _good_answer(provider: CapacityProvider) -> int | str:
    """The provider's answer if it is a whole number >= 0; else what was wrong with it."""
    try:
        value = provider.max_in_flight()
    except PASSED_ON:
        raise
    except BaseException as exc:
        return f"raised {exc!r}"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"returned {value!r}, not an int >= 0"
    return value


def _subscribe(
    name: str, subscribe: Callable[[Callable[[], None]], object], callback: Callable[[], None]
) -> None:
    """``subscribe(callback)`` on provider ``name``; ``ProviderFailed`` if it raises."""
    try:
        subscribe(callback)
    except PASSED_ON:
        raise
    except BaseException as exc:  # SystemExit too: the provider's fault
        raise ProviderFailed(name, f"subscribe() raised {exc!r}") from exc


def _ignore() -> None:
    pass


def _ignore_value(_: int) -> None:
    pass
