"""The ``adaptive`` capacity provider for Obleth: a limit on requests in flight that keeps
the backends' time to first byte near its no-load value."""

from __future__ import annotations

from obleth_adaptive.knobs import Knobs
from obleth_adaptive.law import Law
from obleth_adaptive.provider import AdaptiveLimit

__all__ = ["AdaptiveLimit", "Knobs", "Law"]
