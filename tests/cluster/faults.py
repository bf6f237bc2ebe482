"""The Redis faults the cluster tests and benchmarks make, each written once.

- ``lose_pool``: ``FLUSHALL``, a restart without persistence, or a failover to a replica
  that missed the last writes (the pods reach Redis through a ``TcpProxy``, which is then
  pointed at the promoted replica, as a Sentinel-managed address would be);
- ``outage``: Redis frozen by ``SIGSTOP``, or refusing writes at ``maxmemory 1``, for a
  while, then back;
- ``start_replica``: a replica of a server, synced, ready to be promoted;
- ``first_completion``: how long the first request on a pod takes.
"""

from __future__ import annotations

import time
from typing import Literal

import httpx

from tests.redis_procs import HOST, RedisServer, TcpProxy

PoolLoss = Literal["flushall", "restart", "failover"]
Outage = Literal["sigstop", "oom", "down"]


def start_replica(master: RedisServer, within_s: float = 10.0) -> RedisServer:
    """A new redis-server replicating ``master``, returned once it has synced."""
    replica = RedisServer(extra_args=("--replicaof", HOST, str(master.port)))
    with replica.sync_client() as client:
        deadline = time.monotonic() + within_s
        while client.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                replica.stop()
                raise RuntimeError(f"the replica of {master!r} did not sync within {within_s} s")
            time.sleep(0.02)
    return replica


def lose_pool(
    fault: PoolLoss,
    master: RedisServer,
    proxy: TcpProxy | None = None,
    replica: RedisServer | None = None,
) -> None:
    """Make Redis lose the pool; a failover needs the ``proxy`` the pods use and a synced
    ``replica`` of ``master``, which becomes the new master."""
    if fault == "flushall":
        with master.sync_client() as client:
            client.flushall()
    elif fault == "restart":
        master.restart_empty()
    else:
        if proxy is None or replica is None:
            raise ValueError("a failover needs the pods' proxy and a replica to promote")
        with replica.sync_client() as client:
            client.execute_command("REPLICAOF", "NO", "ONE")
        time.sleep(0.02)  # the old master takes writes the promoted replica never sees
        proxy.retarget(replica)


def outage(redis: RedisServer, kind: Outage, seconds: float) -> None:
    """Redis frozen (``sigstop``), refusing writes (``oom``) or down (``down``: shut down,
    then started again empty, every connection and subscription gone) for ``seconds``;
    back after, whatever happens meanwhile."""
    if kind == "down":
        redis.restart_empty(after_s=seconds)
        return
    if kind == "sigstop":
        redis.pause()
    else:
        with redis.sync_client() as client:
            client.config_set("maxmemory", 1)
    try:
        time.sleep(seconds)
    finally:
        if kind == "sigstop":
            redis.resume()
        else:
            with redis.sync_client() as client:
                client.config_set("maxmemory", 0)


def first_completion(url: str, timeout_s: float = 30.0) -> tuple[float, httpx.Response]:
    """Seconds a small completion sent to the pod at ``url`` took, and its answer."""
    started = time.monotonic()
    answer = httpx.post(
        url + "/v1/completions",
        json={"prompt": "first", "max_tokens": 2},
        headers={"x-tenant": "t"},
        trust_env=False,
        timeout=timeout_s,
    )
    return time.monotonic() - started, answer
