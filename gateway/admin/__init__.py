"""What operators reach on a gateway without passing its admission control.

::

    api.py      admin_app(gateway): the admin API (GET/PUT /api/v1/capacity), behind a
                bearer token (``admin_token``); off without one
    health.py   Probes: /healthz (alive), /readyz (ready for traffic) and /metrics, as an
                ASGI app wrapping any other; ``obleth serve`` puts it outermost, and a
                middleware user can mount it the same way
"""

from __future__ import annotations

from gateway.admin.api import admin_app
from gateway.admin.health import Probes

__all__ = ["Probes", "admin_app"]
