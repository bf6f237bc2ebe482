"""What operators reach on a gateway without passing its admission control.

::

    health.py   Probes: /healthz (alive), /readyz (ready for traffic) and /metrics, as an
                ASGI app wrapping any other; ``obleth serve`` puts it outermost, and a
                middleware user can mount it the same way
"""

from __future__ import annotations

from gateway.admin.health import Probes

__all__ = ["Probes"]
