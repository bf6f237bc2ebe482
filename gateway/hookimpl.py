"""The marker plugins put on their hook functions: ``from gateway import hookimpl``."""

from __future__ import annotations

import pluggy

hookimpl = pluggy.HookimplMarker("obleth")
