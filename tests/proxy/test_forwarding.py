"""The forwarding headers an upstream gets: this hop's, and a chain it can believe, through
a real upstream that echoes the headers it received."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from gateway.core.networks import parse_networks
from gateway.errors import ConfigError
from gateway.loopback import serve_in_task, serve_in_thread
from gateway.proxy import ProxyApp
from gateway.proxy.forwarding import TrustedProxies
from gateway.settings import Settings
from tests.cluster.pods import ServePod
from tests.proxy.upstreams import WAIT_S, Echo, header_values

pytestmark = pytest.mark.anyio

SPOOFED = {
    "x-forwarded-for": "203.0.113.7, 10.0.0.1",
    "x-forwarded-host": "api.example.com",
    "x-forwarded-proto": "https",
    "x-forwarded-port": "443",
    "forwarded": "for=203.0.113.7;proto=https",
    "x-real-ip": "203.0.113.7",
}
"""What a client or a proxy in front may have written."""


@contextlib.asynccontextmanager
async def proxy_answer_for(
    headers: dict[str, str], trusted_proxies: tuple[str, ...]
) -> AsyncIterator[dict[str, Any]]:
    """What the echoing upstream saw of a request sent from 127.0.0.1 with ``headers``
    through a proxy trusting ``trusted_proxies``, served as ``obleth serve`` serves it
    (without uvicorn's own rewriting of the client address)."""
    async with (
        serve_in_task(Echo(), lifespan="off") as upstream,
        serve_in_task(
            ProxyApp(upstream.url, trusted_proxies=trusted_proxies), proxy_headers=False
        ) as proxy,
        httpx.AsyncClient(trust_env=False, timeout=WAIT_S) as http,
    ):
        response = await http.get(f"{proxy.url}/v1/models", headers=headers)
        response.raise_for_status()
        yield {"answer": response.json(), "host": proxy.url.removeprefix("http://")}


async def test_an_untrusted_peers_forwarding_headers_are_replaced_by_its_own_address() -> None:
    """From a peer nobody trusts, X-Forwarded-For is the peer's address alone, Host and
    scheme are the gateway's own view, and Forwarded, X-Real-IP and other X-Forwarded-*
    headers are dropped: a client cannot make up where it came from."""
    async with proxy_answer_for(SPOOFED, trusted_proxies=()) as seen:
        answer = seen["answer"]
        assert header_values(answer, "x-forwarded-for") == ["127.0.0.1"]
        assert header_values(answer, "x-forwarded-host") == [seen["host"]]
        assert header_values(answer, "x-forwarded-proto") == ["http"]
        for dropped in ("forwarded", "x-real-ip", "x-forwarded-port"):
            assert header_values(answer, dropped) == []


async def test_a_trusted_peers_chain_is_extended_and_its_host_and_proto_kept() -> None:
    """From a trusted proxy, the peer's address is appended to the chain it sent, and its
    X-Forwarded-Host, X-Forwarded-Proto, Forwarded and the rest go through as it wrote them."""
    async with proxy_answer_for(SPOOFED, trusted_proxies=("127.0.0.0/8",)) as seen:
        answer = seen["answer"]
        assert header_values(answer, "x-forwarded-for") == ["203.0.113.7, 10.0.0.1, 127.0.0.1"]
        assert header_values(answer, "x-forwarded-host") == ["api.example.com"]
        assert header_values(answer, "x-forwarded-proto") == ["https"]
        for kept in ("forwarded", "x-real-ip", "x-forwarded-port"):
            assert header_values(answer, kept) == [SPOOFED[kept]]


async def test_a_trusted_peer_that_sent_no_forwarding_headers_gets_them_written() -> None:
    """Trust believes what a proxy wrote; where it wrote nothing, the gateway writes this
    hop's values."""
    async with proxy_answer_for({}, trusted_proxies=("127.0.0.1",)) as seen:
        answer = seen["answer"]
        assert header_values(answer, "x-forwarded-for") == ["127.0.0.1"]
        assert header_values(answer, "x-forwarded-host") == [seen["host"]]
        assert header_values(answer, "x-forwarded-proto") == ["http"]


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with serve_in_thread(Echo(), lifespan="off") as server:
        yield server.url


def test_obleth_serve_trusts_the_peers_of_trusted_proxies_and_no_others(echo_url: str) -> None:
    """``OBLETH_TRUSTED_PROXIES`` reaches the proxy of ``obleth serve``: a chain from
    127.0.0.1 is extended while it is trusted and replaced once it is not (uvicorn's own
    reading of X-Forwarded-For, which believes 127.0.0.1 by default, stays off)."""
    chains = []
    for trusted in ("127.0.0.1", "10.0.0.0/8"):
        env = {"OBLETH_TRUSTED_PROXIES": trusted}
        with ServePod([echo_url], env=env, name="forwarding") as pod:
            response = _when_routed(pod.url, {"x-forwarded-for": "203.0.113.7"})
            chains.append(header_values(response.json(), "x-forwarded-for"))
    assert chains == [["203.0.113.7, 127.0.0.1"], ["127.0.0.1"]]


def _when_routed(url: str, headers: dict[str, str]) -> httpx.Response:
    """``GET /version`` once the gateway routes (its upstream is healthy)."""
    for _ in range(int(WAIT_S / 0.02)):
        response = httpx.get(f"{url}/version", headers=headers, trust_env=False)
        if response.status_code == 200:
            return response
        time.sleep(0.02)
    pytest.fail(f"never routed: {response.status_code} {response.text}")


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("proxy.internal", "expected an IP address or a CIDR network"),
        ("10.0.0.1/8", "host bits set; the network is written 10.0.0.0/8"),
        ("10.0.0.0/33", "expected an IP address or a CIDR network"),
    ],
)
def test_a_trusted_proxy_that_is_no_address_or_network_stops_startup_naming_it(
    entry: str, said: str
) -> None:
    """The variable, the entry and what would do are named; so is the keyword, in code."""
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"OBLETH_TRUSTED_PROXIES": f"192.168.0.0/16,{entry}"})
    assert raised.value.setting == "OBLETH_TRUSTED_PROXIES"
    assert raised.value.value == entry
    assert said in str(raised.value)
    with pytest.raises(ConfigError, match="trusted_proxies"):
        ProxyApp(trusted_proxies=[entry])


def test_trusted_proxies_are_kept_in_their_canonical_spelling() -> None:
    """Addresses become networks of one; IPv6 works alike."""
    settings = Settings(trusted_proxies=[" 10.0.0.7", "fd00::/8"])
    assert settings.trusted_proxies == ("10.0.0.7/32", "fd00::/8")


@pytest.mark.parametrize(
    ("peer", "trusted"),
    [
        ("10.1.2.3", True),
        ("::ffff:10.1.2.3", True),  # an IPv4 peer as a dual-stack socket reports it
        ("fd00::1", True),
        ("11.0.0.1", False),
        ("not-an-address", False),
    ],
)
def test_a_peer_is_trusted_when_it_lies_in_a_trusted_network(peer: str, trusted: bool) -> None:
    """Membership, by address, whatever its spelling."""
    proxies = TrustedProxies(parse_networks(["10.0.0.0/8", "fd00::/8"]))
    assert proxies.trusts(peer) is trusted
