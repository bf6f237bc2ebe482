"""``ProcessPlan``: a WSGI middleware's gateway (and the flight plan over it), one per
process.

A gateway belongs to the process that started it: its event loop thread, the futures of
its queue, the seats it holds, its leases in Redis. A server that forks after the gateway
started (gunicorn ``--preload`` with ``start()`` at import, a request served before the
fork) would hand each child a copy of all of that, bound to a loop that is not running
there. So each forked process gets a fresh gateway, built from the same settings and
plugins as the first, at its first use.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable

from gateway.asgi.plan import FlightPlan
from gateway.complaints import Complaints
from gateway.gateway import Gateway, given
from gateway.settings import Settings
from gateway.types import ASGIApp


class ProcessPlan:
    """The flight plan of the current process's gateway, for the ASGI app ``app``.

    Built from ``settings``/``plugins``, or around a ready ``gateway`` (as ``given``
    takes them); raises here what building raises. In a process forked from the one that
    built it, ``current()`` builds a fresh gateway from the same settings and plugins,
    once. A handed ``gateway`` cannot be built again: a child keeps it if it had not
    started before the fork, and refuses it (``RuntimeError``) if it had.
    """

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings | None,
        gateway: Gateway | None,
        plugins: Iterable[object],
    ) -> None:
        self._app = app
        extras = tuple(plugins)  # an iterator would be spent by the first build
        first = given(settings, gateway, extras)
        #: how a forked process builds its own; None for a gateway handed over
        self._build: Callable[[], Gateway] | None = None
        if gateway is None:
            known = first.settings  # read from OBLETH_* once, in the first process

            def build() -> Gateway:
                return Gateway(known, plugins=extras)

            self._build = build
        self._plan = self._plan_of(first)
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def current(self) -> FlightPlan:
        """This process's plan; in a forked process, built at the first call."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._plan = self._plan_of(self._fresh())
                    self._pid = os.getpid()
        return self._plan

    def here(self) -> FlightPlan | None:
        """This process's plan if ``current()`` has made it; never builds one."""
        return self._plan if self._pid == os.getpid() else None

    def _fresh(self) -> Gateway:
        inherited = self._plan.gateway
        if self._build is not None:
            return self._build()
        if inherited.started:
            raise RuntimeError(
                "WSGIGatewayMiddleware(gateway=...): that gateway was started in process "
                f"{self._pid}, which this process (pid {os.getpid()}) forked from; a started "
                "gateway cannot serve a second process (its loop, its queue and its seats "
                "stayed in the first). Pass settings= and plugins= instead of gateway=, so "
                "that each process builds its own, or start it only after the fork "
                "(gunicorn's post_worker_init hook, not at import under --preload)."
            )
        return inherited  # never started: nothing of the first process in it

    def _plan_of(self, gateway: Gateway) -> FlightPlan:
        # the worker thread answers the client: the flight's app only waits for it
        return FlightPlan(self._app, gateway, Complaints(), answers_aside=True)
