"""contrib/haproxy/haproxy.cfg: HAProxy itself (Debian's package, which .ci/run installs
where it is missing) accepts it, and it fits the compose stack it fronts: its servers
are the gateway pods on their traffic port, each taken out of rotation by its own
`/readyz`, with least-connections balancing and timeouts that outlast the gateways' own."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.contrib.stack import (
    HAPROXY_CFG,
    Container,
    compose_container,
    compose_file,
    compose_services,
    haproxy_ms,
    haproxy_sections,
    is_readiness,
    obleth_services,
    target_port,
)
from tests.proxy.upstreams import unused_port

#: Debian's package puts it in /usr/sbin, which a non-root PATH may lack
HAPROXY_PATHS = ("/usr/sbin/haproxy", "/usr/bin/haproxy")
#: a bound on one configuration check
CHECK_TIMEOUT_S = 60
BACKEND = "backend gateways"


@pytest.fixture(scope="module")
def haproxy() -> str:
    """The haproxy executable; missing, the test fails (it must run in CI)."""
    found = shutil.which("haproxy") or next(
        (path for path in HAPROXY_PATHS if Path(path).exists()), None
    )
    if found is None:
        pytest.fail(
            "haproxy is not installed: `apt-get install haproxy` (.ci/run installs it "
            "where it is missing)"
        )
    return found


def check(haproxy: str, config: Path) -> subprocess.CompletedProcess[str]:
    """``haproxy -c -f config``: HAProxy parses and checks the file without serving."""
    return subprocess.run(
        [haproxy, "-c", "-f", str(config)],
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        check=False,
    )


def sections() -> dict[str, list[list[str]]]:
    return haproxy_sections(HAPROXY_CFG.read_text(encoding="utf-8"))


def directives(section: str, keyword: str) -> list[list[str]]:
    """The directives of ``section`` that start with ``keyword``, each without it."""
    return [words[1:] for words in sections()[section] if words[0] == keyword]


def timeout_ms(name: str) -> float:
    """``timeout <name>`` of the gateways' backend, else of the defaults."""
    for section in (BACKEND, "defaults"):
        for words in directives(section, "timeout"):
            if words[0] == name:
                return haproxy_ms(words[1])
    raise AssertionError(f"no `timeout {name}` for {BACKEND}")


def frontends() -> list[str]:
    """The frontends whose traffic goes to the gateways."""
    name = BACKEND.removeprefix("backend ")
    return [
        section
        for section, words in sections().items()
        if section.startswith("frontend ") and ["default_backend", name] in words
    ]


def gateways() -> dict[str, Container]:
    services = compose_services()
    return {name: compose_container(s) for name, s in obleth_services(services, "serve").items()}


def test_haproxy_accepts_the_configuration(haproxy: str) -> None:
    """`haproxy -c` finds the file valid, with no warning but the one expected outside
    the compose network: the gateways' names do not resolve here, and their servers
    start out of rotation until they do (`init-addr none`) instead of stopping HAProxy."""
    result = check(haproxy, HAPROXY_CFG)
    assert result.returncode == 0, result.stderr
    assert "Configuration file is valid" in result.stdout + result.stderr
    warnings = [line for line in result.stderr.splitlines() if "[WARNING]" in line]
    unresolved = [w for w in warnings if "could not resolve address 'gateway-" in w]
    assert warnings == unresolved, "\n".join(warnings)


def test_haproxy_refuses_a_broken_copy(haproxy: str, tmp_path: Path) -> None:
    """The check above can fail: an unknown balancing algorithm, or a health check that
    expects something HAProxy does not know, is refused with a non-zero exit."""
    text = HAPROXY_CFG.read_text(encoding="utf-8")
    for good, bad in (
        ("balance leastconn", "balance fewest-streams"),
        ("http-check expect status 200", "http-check expect ready"),
    ):
        assert good in text
        broken = tmp_path / "broken.cfg"
        broken.write_text(text.replace(good, bad), encoding="utf-8")
        result = check(haproxy, broken)
        assert result.returncode != 0, f"haproxy -c accepted {bad!r}"


def test_the_servers_are_the_compose_gateways_on_their_traffic_port() -> None:
    """HAProxy sends traffic to each gateway service of the stack, and to nothing else,
    on the port obleth serve takes requests on (`--port`), spreading it by fewest open
    connections: a streamed completion holds its connection a long time."""
    served = gateways()
    servers = {}
    for words in directives(BACKEND, "server"):
        host, port = words[1].rsplit(":", 1)
        servers[host] = int(port)
    assert servers == {name: gateway.args.port for name, gateway in served.items()}
    assert directives(BACKEND, "balance") == [["leastconn"]]
    assert len(frontends()) == 1, "one frontend sends traffic to the gateways"


def test_each_gateway_is_checked_on_its_readiness_where_obleth_serve_answers_it() -> None:
    """Every server is health-checked with `GET /readyz` on the port where obleth serve
    answers it, and only a 200 keeps it in rotation: a pod with 80 % of its queue bound
    waiting, or no healthy backend, gets no new requests, while the streams it serves
    go on (its sessions are not shut down when it is marked down)."""
    assert directives(BACKEND, "option") == [["httpchk"]]
    checks = directives(BACKEND, "http-check")
    (send,) = [words for words in checks if words[0] == "send"]
    assert send[:5] == ["send", "meth", "GET", "uri", "/readyz"], send
    assert [words for words in checks if words[0] == "expect"] == [["expect", "status", "200"]]
    (defaults,) = directives(BACKEND, "default-server")
    assert "check" in defaults
    served = gateways()
    for words in directives(BACKEND, "server"):
        options = words[2:] + defaults
        assert "shutdown-sessions" not in options, words[0]
        checked_port = (
            int(options[options.index("port") + 1])
            if "port" in options
            else int(words[1].rsplit(":", 1)[1])
        )
        answer = served[words[0]].get(checked_port, "/readyz")
        assert is_readiness(answer), f"{words[0]}: port {checked_port} does not answer /readyz"


def test_haproxy_outlasts_the_gateways_own_timeouts() -> None:
    """HAProxy never cuts a request the gateway would still answer: a request may wait
    `queue_timeout_s` for a seat, then `upstream_response_timeout_s` for the backend's
    first byte, and a stream may pause `upstream_read_timeout_s`; the gateway answers
    each of those limits itself (503, 504) before HAProxy's own timeouts end the wait."""
    for name, gateway in gateways().items():
        settings = gateway.settings
        assert settings is not None
        assert settings.upstream_response_timeout_s is not None, name
        assert settings.upstream_read_timeout_s is not None, name
        longest_s = max(
            settings.queue_timeout_s + settings.upstream_response_timeout_s,
            settings.upstream_read_timeout_s,
        )
        for timeout in ("server", "client"):
            assert timeout_ms(timeout) > longest_s * 1000, (name, timeout)


def test_compose_publishes_the_ports_haproxy_binds_and_the_gateways_believe_it_alone() -> None:
    """The compose stack publishes exactly the ports HAProxy listens on, mounts this file
    where the image reads it, and gives HAProxy the one address the gateways trust with
    X-Forwarded-For (the client's address HAProxy adds)."""
    services = compose_services()
    haproxy = services["haproxy"]
    binds = {int(words[0].rsplit(":", 1)[1]) for s in sections() for words in directives(s, "bind")}
    assert {target_port(port) for port in haproxy["ports"]} == binds
    (mounted,) = [v for v in haproxy["volumes"] if v.startswith("../haproxy/haproxy.cfg:")]
    assert mounted.split(":")[1] == "/usr/local/etc/haproxy/haproxy.cfg"
    address = ip_address(haproxy["networks"]["default"]["ipv4_address"])
    (subnet,) = [
        config["subnet"] for config in compose_file()["networks"]["default"]["ipam"]["config"]
    ]
    assert address in ip_network(subnet)
    for name, gateway in gateways().items():
        assert gateway.settings is not None
        assert gateway.settings.trusted_proxies == (f"{address}/32",), name
    (frontend,) = frontends()
    assert ["forwardfor"] in directives(frontend, "option")


#: what a client may claim about where it comes from, each header one the gateways
#: believe from a trusted proxy (docs/routing.md): none may reach them through HAProxy
CLAIMS = {
    "X-Forwarded-For": "6.6.6.6",
    "X-Forwarded-Host": "evil.example",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Port": "443",
    "X-Forwarded-Prefix": "/evil",
    "Forwarded": "for=6.6.6.6;host=evil.example",
    "X-Real-IP": "6.6.6.6",
}
#: a bound on HAProxy's start, polled every tenth of a second
START_TRIES = 300


class _Recorder(BaseHTTPRequestHandler):
    """Answers 200 to anything, keeping each request's path and headers."""

    server: _Recording

    def do_GET(self) -> None:
        self.server.received.append((self.path, self.headers))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Recording(ThreadingHTTPServer):
    received: list[tuple[str, Message]]


@contextlib.contextmanager
def recording_upstream() -> Iterator[_Recording]:
    """A loopback HTTP server standing for the gateway pods, recording what arrives."""
    server = _Recording(("127.0.0.1", 0), _Recorder)
    server.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def serving_copy(pods: int, tmp_path: Path) -> tuple[Path, int]:
    """contrib's configuration as it stands, but listening on loopback ports and sending
    to ``pods`` (one port) for every gateway: its path and the traffic port."""
    front, stats = unused_port(), unused_port()
    text = HAPROXY_CFG.read_text(encoding="utf-8")
    text = text.replace("bind :8080", f"bind 127.0.0.1:{front}")
    text = text.replace("bind :8404", f"bind 127.0.0.1:{stats}")
    text, servers = re.subn(
        r"server (gateway-\d+) gateway-\d+:8000", rf"server \1 127.0.0.1:{pods}", text
    )
    assert servers == 3, "the gateways' server lines changed: update this test"
    config = tmp_path / "haproxy.cfg"
    config.write_text(text, encoding="utf-8")
    return config, front


def test_what_a_client_claims_about_where_it_comes_from_is_dropped_at_the_edge(
    haproxy: str, tmp_path: Path
) -> None:
    """The gateways trust HAProxy, so they believe every forwarding header it passes: one
    a client sent (``X-Forwarded-Host: evil.example``, ``X-Forwarded-Port: 443``) must not
    get through, and ``X-Forwarded-For`` holds only the address HAProxy saw. Sent
    through HAProxy itself, running contrib's file."""
    with recording_upstream() as pods:
        config, front = serving_copy(pods.server_address[1], tmp_path)
        log = (tmp_path / "haproxy.log").open("w")
        process = subprocess.Popen(
            [haproxy, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            answer = None
            for _ in range(START_TRIES):
                if process.poll() is not None:
                    break
                try:
                    answer = httpx.get(f"http://127.0.0.1:{front}/v1/models", headers=CLAIMS)
                except httpx.TransportError:
                    time.sleep(0.1)
                    continue
                if answer.status_code == 200:
                    break
                time.sleep(0.1)
        finally:
            process.terminate()
            process.wait(timeout=CHECK_TIMEOUT_S)
            log.close()
        output = (tmp_path / "haproxy.log").read_text(encoding="utf-8")
        assert answer is not None and answer.status_code == 200, output
        [headers] = [headers for path, headers in pods.received if path == "/v1/models"]
    assert headers.get_all("X-Forwarded-For") == ["127.0.0.1"]
    for name in CLAIMS.keys() - {"X-Forwarded-For"}:
        assert name not in headers, f"{name} got through HAProxy"
