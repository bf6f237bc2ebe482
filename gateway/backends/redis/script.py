"""The step script, shipped as package data and called once per batch.

On a single Redis server (``redis://``, ``rediss://``, ``unix://``) the step calls go
over a connection of their own: the pod makes one call at a time, so the client's pool,
retry and bookkeeping layers would only add cost to every call. On Sentinel and Cluster
the client routes each call (to the current master, to the pool's slot). Either way the
script runs by SHA and is loaded again when Redis answers ``NOSCRIPT`` (after a restart
or ``SCRIPT FLUSH``), so a flushed script cache costs one extra round trip, never a
failed request.
"""

from __future__ import annotations

import asyncio
import hashlib
from functools import cache
from importlib.resources import files
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from gateway.backends.redis.connect import Client
from gateway.backends.redis.keys import PoolKeys
from gateway.backends.redis.wire import Arg, StepReply, decode


@cache
def step_source() -> str:
    return files("gateway.backends.redis").joinpath("step.lua").read_text(encoding="utf-8")


class StepScript:
    """One pool's step script on one client: ``await script(args)`` is one round trip."""

    def __init__(self, client: Client, keys: PoolKeys) -> None:
        self._keys = keys.keys
        self._source = step_source()
        self._sha = hashlib.sha1(self._source.encode()).hexdigest()  # noqa: S324 (Redis' id)
        self._script: Any = client.register_script(self._source)
        self._connection: Any = None
        self._lock = asyncio.Lock()
        if type(client) is aioredis.Redis:
            pool = client.connection_pool
            if not getattr(pool, "service_name", None):  # not a Sentinel-managed pool
                self._connection = pool.connection_class(**pool.connection_kwargs)

    def may_have_moved(self) -> bool:
        """Whether the next call may reach another Redis server than the last one did: a
        new connection (after an error or at start) may land on a promoted replica or a
        restarted server. Through Sentinel or Cluster the client picks the node for every
        call, so the answer is always yes."""
        return self._connection is None or not self._connection.is_connected

    async def __call__(self, args: list[Arg]) -> StepReply:
        if self._connection is None:
            return decode(await self._script(keys=self._keys, args=args))
        async with self._lock:
            return decode(await self._on_own_connection(args))

    async def _on_own_connection(self, args: list[Arg]) -> Any:
        connection = self._connection
        keys = self._keys
        try:
            await connection.send_command("EVALSHA", self._sha, len(keys), *keys, *args)
            try:
                return await connection.read_response()
            except NoScriptError:
                await connection.send_command("EVAL", self._source, len(keys), *keys, *args)
                return await connection.read_response()
        except BaseException:
            # whatever happened mid-exchange, the next call starts on a fresh connection
            await connection.disconnect()
            raise

    async def aclose(self) -> None:
        if self._connection is not None:
            await self._connection.disconnect()
