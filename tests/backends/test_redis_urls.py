"""``redis_url`` reaches Redis however it is deployed: a unix socket, Sentinel, and bad
URLs stop startup with a message naming the setting. (TCP and Redis Cluster are covered
by test_redis_pool.py.)"""

from __future__ import annotations

import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway import ConfigError, Gateway, Settings
from gateway.backends.redis.audit import audit_sync
from gateway.backends.redis.connect import _hosts
from gateway.core.tickets import Ticket
from gateway.settings import shown_url
from tests.cluster.pods import free_port
from tests.redis_procs import RedisServer, find_redis_server

pytestmark = pytest.mark.anyio


async def _admits_and_releases(url: str, pool: str, server: RedisServer) -> None:
    gateway = Gateway(
        Settings(redis_url=url, pool=pool, learning_window_s=0, global_max_in_flight=2),
        entry_points=False,
    )
    await gateway.start()
    try:
        permit = await gateway.scheduler.acquire(Ticket("t"))
        with server.sync_client() as client:
            assert audit_sync(client, pool).inflight == 1
        permit.release()
    finally:
        await gateway.stop()
    with server.sync_client() as client:
        assert audit_sync(client, pool).empty


async def test_unix_socket(tmp_path: Path, pool_name: str) -> None:
    socket = tmp_path / "redis.sock"
    with RedisServer(extra_args=["--unixsocket", str(socket), "--unixsocketperm", "700"]) as server:
        await _admits_and_releases(f"unix://{socket}?db=0", pool_name, server)


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[tuple[int, RedisServer]]:
    """A real Sentinel (redis-server --sentinel) watching a real master: (port, master)."""
    with RedisServer() as master:
        port = free_port()
        conf = tmp_path / "sentinel.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
            f"sentinel monitor obleth 127.0.0.1 {master.port} 1\n"
        )
        with (tmp_path / "sentinel.log").open("wb") as log:
            process = subprocess.Popen(
                [find_redis_server(), str(conf), "--sentinel"], stdout=log, stderr=log
            )
            try:
                _wait_for_sentinel(port)
                yield port, master
            finally:
                process.kill()
                process.wait(timeout=10)


async def test_sentinel_finds_the_master(sentinel: tuple[int, RedisServer], pool_name: str) -> None:
    """The gateway finds the master through Sentinel, and once stopped leaves no
    connection open to Sentinel either (only this test's own, which asks)."""
    port, master = sentinel
    await _admits_and_releases(f"redis+sentinel://127.0.0.1:{port}/obleth/0", pool_name, master)
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1) as client:
        clients = client.execute_command("CLIENT", "LIST")
    listed = clients.decode() if isinstance(clients, bytes) else str(clients)
    assert listed.count("cmd=") == 1, listed


def _wait_for_sentinel(port: int) -> None:
    deadline = time.monotonic() + 10
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1) as client:
        while True:
            try:
                if client.execute_command("SENTINEL", "get-master-addr-by-name", "obleth"):
                    return
            except redis.exceptions.ConnectionError:
                pass
            assert time.monotonic() < deadline, "sentinel did not start"
            time.sleep(0.05)


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("redis+sentinel://127.0.0.1:26379", "name the Sentinel service"),
        ("redis+cluster://127.0.0.1:notaport", "is not host:port"),
        ("redis+cluster://[::1,[::2]:7000", "'\\[::1' is not host:port"),
    ],
)
def test_bad_urls_stop_startup_naming_the_setting(url: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint) as caught:
        Gateway(Settings.from_env({"OBLETH_REDIS_URL": url}), entry_points=False)
    assert caught.value.setting == "OBLETH_REDIS_URL"


def _strict_urlsplit(url: str, *args: Any, **kwargs: Any) -> urllib.parse.SplitResult:
    """``urlsplit`` as Python releases with the fix of CVE-2024-11168 (3.12.8, 3.13.1,
    3.11.11 and distributions' backports) have it: nothing may precede a ``[`` in the
    netloc, and only a port may follow its ``]``."""
    parts = _URLSPLIT(url, *args, **kwargs)
    before, bracket, inside = parts.netloc.rpartition("@")[2].partition("[")
    after = inside.partition("]")[2]
    if bracket and (before or (after and not after.startswith(":"))):
        raise ValueError("Invalid IPv6 URL")
    return parts


_URLSPLIT = urllib.parse.urlsplit


@pytest.mark.parametrize("scheme", ["redis+cluster", "redis+sentinel"])
def test_node_lists_may_hold_ipv6_hosts_with_or_without_a_port(
    monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    """``[::1]`` alone used to be refused as "not host:port", and on Python releases that
    check bracketed hosts, any list with an IPv6 host after another node was refused as
    not a URL; a node without a port is on 6379, as a single host is."""
    monkeypatch.setattr(urllib.parse, "urlsplit", _strict_urlsplit)
    url = f"{scheme}://app:s3cret@redis-0:7002,[::1],[::2]:7001/mymaster/0"
    assert Settings(redis_url=url).redis_url == url
    assert _hosts(url, "redis_url") == [("redis-0", 7002), ("::1", 6379), ("::2", 7001)]
    # and what a message shows of it: the password masked whole, "@" in it or not
    shown = shown_url(url.replace("s3cret", "s3@cret"))
    assert shown == f"{scheme}://app:***@redis-0:7002,[::1],[::2]:7001/mymaster/0"


def test_an_unparsable_url_is_shown_without_its_password() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings(redis_url="redis://app:s3cret@[::1:6379/0")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "encoded"),
    [
        ("redis://app:Zq9/xY@redis:6379/0", "redis://app:Zq9%2FxY@redis:6379/0"),
        ("redis://:Zq9#xY@redis:6379", "redis://:Zq9%23xY@redis:6379"),
        ("rediss://app:Zq9?xY@redis:6380/0", "rediss://app:Zq9%3FxY@redis:6380/0"),
        (
            "redis+cluster://app:Zq9/xY@h1:7000,h2:7000",
            "redis+cluster://app:Zq9%2FxY@h1:7000,h2:7000",
        ),
        (
            "redis+sentinel://app:Zq9/xY@s1:26379/mymaster/0",
            "redis+sentinel://app:Zq9%2FxY@s1:26379/mymaster/0",
        ),
    ],
)
def test_a_password_with_a_raw_url_delimiter_is_refused_and_never_shown(
    url: str, encoded: str
) -> None:
    """A generated password often holds a ``/`` (base64), which ends a URL's host part:
    the message said the port ("Zq9") was no number, or the URL was taken and failed at
    the first connection, and either way showed the password whole."""
    with pytest.raises(ConfigError) as caught:
        Settings(redis_url=url)
    message = str(caught.value)
    assert "Zq9" not in message and "xY" not in message
    assert "***@" in message
    assert "percent-encode them in a password (/ as %2F, ? as %3F, # as %23)" in message
    # written as the message says, it is taken
    assert Settings(redis_url=encoded).redis_url == encoded


@pytest.mark.parametrize(
    "url",
    [
        "unix:///run/redis@main/redis.sock",
        "redis://redis:6379/0?client_name=me@pod",
        "redis://[::1]:6379/0?client_name=me@pod",
        "redis+sentinel://s1:26379,s2:26379/mymaster/0?client_name=me@pod",
    ],
)
def test_an_at_sign_in_a_path_or_a_query_is_not_taken_for_credentials(url: str) -> None:
    """RFC 3986 allows ``@`` there: such a URL is taken and shown as written."""
    assert Settings(redis_url=url).redis_url == url
    assert shown_url(url) == url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://redis:6379/0?password=Zq9xY", "redis://redis:6379/0?password=***"),
        (
            "redis+sentinel://s1:26379/mymaster/0?db=1&sentinel_password=Zq9xY&x=1",
            "redis+sentinel://s1:26379/mymaster/0?db=1&sentinel_password=***&x=1",
        ),
        ("unix:///tmp/r.sock?db=1&password=Zq9xY", "unix:///tmp/r.sock?db=1&password=***"),
    ],
)
def test_a_password_among_the_query_options_is_masked(url: str, shown: str) -> None:
    """redis-py takes ``password=`` (and Sentinel's ``sentinel_password=``) from the
    query; the failure mode's log and connection errors showed it."""
    assert shown_url(url) == shown


def test_an_unknown_scheme_is_shown_without_its_password() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings(redis_url="http://app:s3cret@redis:6379")
    assert "s3cret" not in str(caught.value) and "http://app:***@redis:6379" in str(caught.value)


def test_an_unknown_scheme_is_refused_by_the_settings() -> None:
    with pytest.raises(ConfigError, match="unknown scheme 'http'"):
        Settings(redis_url="http://redis:6379")


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("redis://localhost:notaport/0", "the port must be a number from 1 to 65535"),
        ("redis://localhost:99999/0", "the port must be a number from 1 to 65535"),
        ("redis:// bad host", "' bad host' is no host name or address"),
        ("redis://redis:6379/abc", "the path must be a database number"),
        ("redis://[::1:6379/0", r"not a URL that parses .* redis://\[::1\]:6379/0"),
        # each parses, and the pod used to start, then admit nothing (failure mode local
        # at 0 seats): no socket, a timeout of no time, no such database
        ("unix://", "names its socket: unix:///run/redis/redis.sock"),
        ("redis://redis:6379?socket_timeout=-1", "socket_timeout must be a number of seconds"),
        ("redis://redis:6379?socket_connect_timeout=0", "socket_connect_timeout must be"),
        ("redis://redis:6379/99999999999999999999", "no Redis database is numbered"),
    ],
)
def test_a_url_redis_could_not_use_is_refused_by_the_settings(url: str, complaint: str) -> None:
    """Caught at startup with the setting named, not as a traceback from redis-py, nor as
    a pod that starts and cannot connect."""
    with pytest.raises(ConfigError, match=complaint) as caught:
        Settings.from_env({"OBLETH_REDIS_URL": url})
    assert caught.value.setting == "OBLETH_REDIS_URL"


def test_a_refused_url_is_shown_without_its_password() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings(redis_url="redis://app:s3cret@redis:99999/0")
    assert "s3cret" not in str(caught.value)
    assert "redis://app:***@redis:99999/0" in str(caught.value)


def test_a_unix_socket_password_with_a_raw_slash_is_masked() -> None:
    """A unix URL's path follows its ``@``: the password's ``/`` was taken for the path's
    start, and the URL shown whole."""
    assert shown_url("unix://:Zq9/xY@/tmp/redis.sock?db=0") == "unix://:***@/tmp/redis.sock?db=0"
