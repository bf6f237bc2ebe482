"""The ``kv-pressure`` capacity provider for Obleth: a limit on requests in flight that
shrinks when the inference backends run short of KV cache and grows back while they have
room."""

from __future__ import annotations

from obleth_kv_pressure.law import Knobs, Law, Signals
from obleth_kv_pressure.provider import KvPressureLimit

__all__ = ["Knobs", "KvPressureLimit", "Law", "Signals"]
