"""A simulated OpenAI-compatible inference backend with vLLM-style metrics (see docs/sim.md)."""

from __future__ import annotations

from gateway.sim.app import create_app
from gateway.sim.config import SimConfig
from gateway.sim.engine import SimEngine

__all__ = ["SimConfig", "SimEngine", "create_app"]
