"""The step script, shipped as package data and registered once per client.

redis-py's ``Script`` calls it by SHA and loads it again when Redis answers ``NOSCRIPT``
(after a restart or ``SCRIPT FLUSH``), so a flushed script cache costs one extra round
trip, never a failed request.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

from gateway.backends.redis.connect import Client
from gateway.backends.redis.keys import PoolKeys
from gateway.backends.redis.wire import Arg, StepReply, decode


@cache
def step_source() -> str:
    return files("gateway.backends.redis").joinpath("step.lua").read_text(encoding="utf-8")


class StepScript:
    """One pool's step script on one client: ``await script(args)`` is one round trip."""

    def __init__(self, client: Client, keys: PoolKeys) -> None:
        self._script: Any = client.register_script(step_source())
        self._keys = keys.keys

    async def __call__(self, args: list[Arg]) -> StepReply:
        return decode(await self._script(keys=self._keys, args=args))
