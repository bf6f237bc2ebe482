"""``GET /dashboard``: the operator's page, served by a real gateway's admin API on a
loopback port and loaded in a real headless Chromium, which runs its script: the page
fetches the status with the token from the ``#token=`` fragment and shows the live state.
Over plain HTTP: it needs no token, is off without ``admin_token``, is served under a
policy that keeps it to its own origin and loads nothing from elsewhere.

``python -m tests.admin.test_dashboard docs/images/dashboard.png`` retakes the docs'
screenshot of a busy gateway.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import math
import re
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from websockets.asyncio.client import ClientConnection, connect

from gateway import Gateway, Settings
from gateway.admin import admin_app
from gateway.core.tickets import Priority, ticket
from gateway.loopback import serve_in_task
from gateway.protocols import Permit
from gateway.sim import create_app
from gateway.types import ASGIApp, Receive, Scope, Send
from tests.admin.client import BEARER, TOKEN
from tests.backends.dial import Dial, DialPlugin
from tests.backends.redis_pods import POD_SETTINGS, TTL, backend, eventually

pytestmark = pytest.mark.anyio

#: Debian's package; .ci/run installs it where it is missing
CHROMIUM = "/usr/bin/chromium"
# headless, as root in a container, on a closed network: no sandbox, no GPU, and none of
# the calls home (updates, sync, QUIC probes) that would only wait for refusals
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
#: virtual time a page runs before Chromium dumps or shoots it: timers fire without real
#: waiting and the clock stops while a fetch is on the wire, so the page's first polls
#: (2 s apart) complete whatever the machine's speed
BUDGET_MS = 5_000
#: a bound on one Chromium run, so that a browser that hangs fails the test, not the session
RUN_TIMEOUT_S = 120
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: elements the HTML parser must not wait for an end tag of
VOID_TAGS = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
)


@dataclass
class Element:
    """One element of a dumped DOM."""

    tag: str
    attributes: dict[str, str | None]
    children: list[Element | str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def all(self, tag: str) -> Iterator[Element]:
        """The elements named ``tag`` below this one, in document order."""
        for child in self.children:
            if isinstance(child, Element):
                if child.tag == tag:
                    yield child
                yield from child.all(tag)

    def by_id(self, id_: str) -> Element:
        found = self._find(id_)
        assert found is not None, f"the page has no element with id {id_!r}"
        return found

    def _find(self, id_: str) -> Element | None:
        if self.attributes.get("id") == id_:
            return self
        for child in self.children:
            found = child._find(id_) if isinstance(child, Element) else None
            if found is not None:
                return found
        return None

    def rows(self) -> list[list[str]]:
        """The cells' text of each table row below this element."""
        return [[cell.text() for cell in row.all("td")] for row in self.all("tr")]


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self._open = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, dict(attrs))
        self._open[-1].children.append(element)
        if tag not in VOID_TAGS:
            self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._open[-1].children.append(Element(tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self._open) - 1, 0, -1):
            if self._open[depth].tag == tag:
                del self._open[depth:]
                return

    def handle_data(self, data: str) -> None:
        self._open[-1].children.append(data)


def parse(html: str) -> Element:
    tree = _Tree()
    tree.feed(html)
    tree.close()
    return tree.root


class Chromium:
    """Headless Chromium, one fresh profile per page load."""

    def __init__(self, profiles: Path) -> None:
        self.profiles = profiles
        self.runs = 0

    async def dom(self, url: str) -> Element:
        """The DOM of ``url`` after the page has run for ``BUDGET_MS`` of virtual time."""
        return parse((await self._run(url, "--dump-dom")).decode())

    async def screenshot(
        self, url: str, path: Path, *, budget_ms: int = BUDGET_MS, height: int = 900
    ) -> None:
        """A PNG of ``url``, 1280 pixels wide, after it has run for ``budget_ms`` of virtual
        time."""
        size = f"--window-size=1280,{height}"
        await self._run(url, f"--screenshot={path}", size, budget_ms=budget_ms)

    async def _run(self, url: str, *options: str, budget_ms: int = BUDGET_MS) -> bytes:
        self.runs += 1
        process = await asyncio.create_subprocess_exec(
            CHROMIUM,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={self.profiles / f'profile-{self.runs}'}",
            f"--virtual-time-budget={budget_ms}",
            *options,
            url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(RUN_TIMEOUT_S):
                out, err = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 0, err.decode(errors="replace")[-3000:]
        return out


class DevTools:
    """One page of a headless Chromium driven over its DevTools protocol: navigate, run
    a script, read an element's text. Dialogs (``confirm``) are accepted and recorded."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.dialogs: list[str] = []
        self._ids = itertools.count(1)

    @classmethod
    @asynccontextmanager
    async def open(cls, profile: Path) -> AsyncIterator[DevTools]:
        process = await asyncio.create_subprocess_exec(
            CHROMIUM,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            port = await _devtools_port(profile / "DevToolsActivePort")
            async with httpx.AsyncClient(trust_env=False) as http:
                targets = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
            (page,) = [t for t in targets if t["type"] == "page"]
            async with connect(page["webSocketDebuggerUrl"], proxy=None, max_size=None) as socket:
                tools = cls(socket)
                await tools.call("Page.enable")
                yield tools
        finally:
            if process.returncode is None:
                process.terminate()
            try:
                async with asyncio.timeout(RUN_TIMEOUT_S):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """The result of ``method``; events that come first are read and let go, but for
        a dialog, which is accepted (the page waits for it)."""
        number = next(self._ids)
        await self.socket.send(json.dumps({"id": number, "method": method, "params": params}))
        async with asyncio.timeout(RUN_TIMEOUT_S):
            while True:
                message = json.loads(await self.socket.recv())
                if message.get("method") == "Page.javascriptDialogOpening":
                    self.dialogs.append(message["params"]["message"])
                    accept = {"accept": True}
                    reply = {"id": next(self._ids), "method": "Page.handleJavaScriptDialog"}
                    await self.socket.send(json.dumps({**reply, "params": accept}))
                elif message.get("id") == number:
                    assert "error" not in message, message["error"]
                    result: dict[str, Any] = message["result"]
                    return result

    async def evaluate(self, expression: str) -> Any:
        answer = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in answer, answer["exceptionDetails"]
        return answer["result"].get("value")

    async def text_once(self, id_: str, matches: Callable[[str], bool]) -> str:
        """The text of element ``id_`` once ``matches`` it, asked up to 200 times."""
        # null-safe: until the page has loaded there is no such element
        script = f"document.getElementById({json.dumps(id_)})?.textContent ?? null"
        text: str | None = None
        for _ in range(200):
            text = await self.evaluate(script)
            if text is not None and matches(text):
                return text
            await asyncio.sleep(0.05)
        raise AssertionError(f"#{id_} still shows {text!r}")


async def _devtools_port(announced: Path) -> int:
    """The port Chromium writes to ``DevToolsActivePort`` once it listens (asked up to
    400 times)."""
    for _ in range(400):
        try:
            first = (await asyncio.to_thread(announced.read_text)).partition("\n")[0]
        except FileNotFoundError:
            first = ""
        if first.isdigit():
            return int(first)
        await asyncio.sleep(0.05)
    raise AssertionError(f"Chromium never wrote {announced}")


@pytest.fixture
def chromium(tmp_path: Path) -> Chromium:
    return Chromium(tmp_path)


@asynccontextmanager
async def served(
    wrap: Callable[[ASGIApp], ASGIApp] | None = None,
    plugins: Sequence[object] = (),
    **settings: Any,
) -> AsyncIterator[tuple[Gateway, str]]:
    """A started gateway and the base URL of its admin API (of ``wrap(admin_app)``)."""
    gateway = Gateway(Settings(**settings), plugins=plugins, entry_points=False)
    await gateway.start()
    try:
        app = admin_app(gateway)
        async with serve_in_task(app if wrap is None else wrap(app), lifespan="off") as server:
            yield gateway, server.url
    finally:
        await gateway.stop()


def client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, trust_env=False)


async def test_the_page_needs_no_token_and_is_kept_to_its_own_origin() -> None:
    """GET and HEAD /dashboard answer the page without a token, as HTML nobody caches or
    sniffs, under a Content-Security-Policy that allows nothing from another origin."""
    async with served(admin_token=TOKEN) as (_, url), client(url) as http:
        page = await http.get("/dashboard")
        head = await http.head("/dashboard")
    assert (page.status_code, head.status_code) == (200, 200)
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.text.startswith("<!doctype html>")
    policy = page.headers["content-security-policy"].split("; ")
    for directive in (
        "default-src 'self'",
        "style-src 'unsafe-inline' 'self'",
        "connect-src 'self'",
        "img-src 'self' data:",
    ):
        assert directive in policy
    # its own script only, by its hash: not any inline script, as an injected one is
    [scripts] = [d for d in policy if d.startswith("script-src ")]
    [script] = re.findall(r"<script>(.*?)</script>", page.text, flags=re.S)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert scripts == f"script-src 'sha256-{digest}'"
    assert page.headers["cache-control"] == "no-store"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert head.headers["content-security-policy"] == page.headers["content-security-policy"]
    assert head.content == b""


async def test_the_page_is_off_without_an_admin_token() -> None:
    """A gateway nobody gave an admin token exposes no dashboard either."""
    async with served(global_max_in_flight=37) as (_, url), client(url) as http:
        assert (await http.get("/dashboard")).status_code == 404


async def test_the_page_loads_nothing_from_elsewhere_and_keeps_the_token_out_of_urls() -> None:
    """No URL of another host (no CDN, no web font), no file but itself; the token is read
    from the fragment, never from the query string, and kept in this tab only; strings
    from the API are written as text, never parsed as HTML."""
    async with served(admin_token=TOKEN) as (_, url), client(url) as http:
        page = (await http.get("/dashboard")).text
    assert re.findall(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", page) == []
    links = re.findall(r"""\b(?:src|href|action)=("[^"]*"|'[^']*'|[^\s>]+)""", page)
    assert [link for link in links if not link.strip("\"'").startswith("data:")] == []
    assert "location.hash" in page and "location.search" not in page
    assert "sessionStorage" in page and "localStorage" not in page
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in page


async def test_chromium_shows_the_live_limit_fetched_with_the_token_from_the_fragment(
    chromium: Chromium, tmp_path: Path
) -> None:
    """Opened at /dashboard#token=..., the page's script fetches the status with that token
    and shows the limit in force; a limit changed through the API shows on the next load;
    a screenshot of the page is a PNG."""
    async with served(global_max_in_flight=37, admin_token=TOKEN) as (_, url):
        page = await chromium.dom(f"{url}/dashboard#token={TOKEN}")
        assert page.by_id("limit").text() == "37"
        assert page.by_id("status-line").text() == ""
        assert page.by_id("providers").text() == "static: 37"
        assert (page.by_id("in-flight").text(), page.by_id("queued").text()) == ("0", "0")
        assert "hidden" in page.by_id("token-panel").attributes
        assert "hidden" in page.by_id("cluster").attributes  # in process: no cluster
        shot = tmp_path / "dashboard.png"
        await chromium.screenshot(f"{url}/dashboard#token={TOKEN}", shot)
        async with client(url) as http:
            changed = await http.put("/api/v1/capacity", headers=BEARER, json={"max_in_flight": 41})
            assert changed.status_code == 200
        again = await chromium.dom(f"{url}/dashboard#token={TOKEN}")
        assert again.by_id("limit").text() == "41"
    png = shot.read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > len(PNG_SIGNATURE)


@pytest.mark.parametrize(
    "token",
    ["Ab+cd/Ef+gh/0123456789==", 'a<b"c>`d&e%41-0123456789'],
    ids=["base64", "escaped-by-the-browser"],
)
async def test_a_token_in_the_fragment_is_taken_as_written(chromium: Chromium, token: str) -> None:
    """``openssl rand -base64`` tokens hold ``+`` and ``/``: the page sends them as they
    are (it used to read the fragment as a form, a ``+`` as a space, and get 401). The
    four characters a browser escapes in a fragment come back as they were, and ``&``
    or ``%`` stay themselves."""
    async with served(global_max_in_flight=37, admin_token=token) as (_, url):
        page = await chromium.dom(f"{url}/dashboard#token={token}")
        assert page.by_id("limit").text() == "37"
        assert page.by_id("status-line").text() == ""


async def test_a_refused_token_is_said_plainly_and_asked_for_again(chromium: Chromium) -> None:
    """With a wrong token the page shows no numbers, says the gateway refused the token
    (401) and shows the form that asks for it."""
    async with served(global_max_in_flight=37, admin_token=TOKEN) as (_, url):
        page = await chromium.dom(f"{url}/dashboard#token=not-the-token")
    assert "refused the admin token (401)" in page.by_id("status-line").text()
    assert "hidden" not in page.by_id("token-panel").attributes
    assert page.by_id("limit").text() == "\N{EN DASH}"  # no number yet


async def test_the_page_finds_the_api_under_the_prefix_it_is_mounted_at(
    chromium: Chromium,
) -> None:
    """Mounted at /admin, the page at /admin/dashboard polls /admin/api/v1/status."""

    def mounted(app: ASGIApp) -> ASGIApp:
        return Starlette(routes=[Mount("/admin", app)])

    async with served(mounted, global_max_in_flight=37, admin_token=TOKEN) as (_, url):
        page = await chromium.dom(f"{url}/admin/dashboard#token={TOKEN}")
    assert page.by_id("limit").text() == "37"
    assert page.by_id("status-line").text() == ""


async def test_tenants_upstreams_and_classes_are_shown_with_names_as_text(
    chromium: Chromium,
) -> None:
    """A busy gateway: the tenants holding seats and waiting are listed with their numbers
    and a tenant named like HTML shows as that text; the upstream and the waiters by
    class are shown."""
    markup = '<b onclick="steal()">acme</b> & co'
    async with (
        served(
            global_max_in_flight=3,
            admin_token=TOKEN,
            tenant_weights={"gold": 4},
            upstreams=("http://127.0.0.1:9",),
        ) as (gateway, url),
        Demand(gateway) as demand,
    ):
        demand.add([("gold", "standard"), ("gold", "standard"), (markup, "standard")])
        demand.add([("free", "standard"), ("gold", "critical")])
        await demand.settle()
        page = await chromium.dom(f"{url}/dashboard#token={TOKEN}")
    assert (page.by_id("in-flight").text(), page.by_id("queued").text()) == ("3", "2")
    assert [item.text() for item in page.by_id("queued-by-class").all("li")] == [
        "critical: 1",
        "standard: 1",
        "background: 0",
    ]
    tenants = page.by_id("tenant-rows").rows()
    assert tenants[0] == ["gold", "2", "1", "4", "67 %"]
    assert [markup, "1", "0", "1", "33 %"] in tenants
    assert ["free", "0", "1", "1", "0 %"] in tenants
    assert list(page.by_id("tenant-rows").all("b")) == []
    (upstream,) = page.by_id("upstream-rows").rows()
    assert upstream[:3] == ["http://127.0.0.1:9", "no", "0"]


async def test_the_set_button_changes_the_limit_and_says_why_when_it_cannot(
    tmp_path: Path,
) -> None:
    """In a browser: a limit the API refuses changes nothing and the page shows the API's
    message; a new limit is set at once and shown; 0 is set only after a confirmation
    that says it pauses admissions."""
    async with (
        served(global_max_in_flight=37, admin_token=TOKEN) as (gateway, url),
        DevTools.open(tmp_path / "profile") as page,
    ):
        await page.call("Page.navigate", url=f"{url}/dashboard#token={TOKEN}")
        await page.text_once("limit", lambda text: text == "37")
        assert await page.evaluate("location.href") == f"{url}/dashboard"  # token gone
        set_limit = """(value) => {
            const input = document.getElementById("capacity-input");
            input.value = value;
            input.dispatchEvent(new Event("input"));
            document.getElementById("capacity-set").click();
        }"""
        await page.evaluate(f"({set_limit})('-1')")
        refusal = await page.text_once("capacity-message", bool)
        async with client(url) as http:
            refused = await http.put("/api/v1/capacity", headers=BEARER, json={"max_in_flight": -1})
        assert refusal == f"Not changed: {refused.json()['error']['message']}"
        assert gateway.snapshot().limit == 37
        await page.evaluate("document.getElementById('capacity-message').textContent = ''")
        await page.evaluate(f"({set_limit})('1e3')")  # a number input takes it; not a limit
        typed = await page.text_once("capacity-message", bool)
        assert typed == "Enter the new limit, a whole number (0 pauses admissions)."
        assert gateway.snapshot().limit == 37
        await page.evaluate(f"({set_limit})('50')")
        await page.text_once("capacity-message", lambda text: text == "The limit is now 50.")
        assert gateway.snapshot().limit == 50
        await page.text_once("limit", lambda text: text == "50")
        assert page.dialogs == []
        await page.evaluate(f"({set_limit})('0')")
        await page.text_once("capacity-message", lambda text: text == "The limit is now 0.")
        assert gateway.snapshot().limit == 0
        (asked,) = page.dialogs
        assert "pauses admissions" in asked


async def test_a_ceiling_above_a_computed_limit_is_shown_as_what_it_is(tmp_path: Path) -> None:
    """In a browser: with a computed provider at 20, setting 300 sets the ceiling; the page
    says so and that the limit in force stays 20, not that the limit is 300."""
    async with (
        served(
            plugins=[DialPlugin(Dial(20))],
            global_max_in_flight=10,
            admin_token=TOKEN,
            capacity_providers=("static", "dial"),
        ) as (gateway, url),
        DevTools.open(tmp_path / "profile") as page,
    ):
        await page.call("Page.navigate", url=f"{url}/dashboard#token={TOKEN}")
        await page.text_once("limit", lambda text: text == "10")
        await page.evaluate("""(() => {
            const input = document.getElementById("capacity-input");
            input.value = "300";
            input.dispatchEvent(new Event("input"));
            document.getElementById("capacity-set").click();
        })()""")
        said = await page.text_once("capacity-message", bool)
        assert said == (
            "The ceiling is now 300; the limit in force is 20, the lowest of the capacity "
            "providers."
        )
        assert gateway.snapshot().limit == 20
        await page.text_once("limit", lambda text: text == "20")


class Demand:
    """Requests a test makes through ``gateway``'s scheduler: some hold seats, some wait."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.requests: list[asyncio.Task[Permit]] = []

    async def __aenter__(self) -> Demand:
        return self

    async def __aexit__(self, *_: object) -> None:
        for request in self.requests:
            request.cancel()  # a waiter gives up; a request holding seats is done already
        await self.settle()
        self.resize(0)

    def add(self, tickets: list[tuple[str, Priority]]) -> None:
        for tenant, priority in tickets:
            request = self.gateway.scheduler.acquire(ticket(tenant, priority))
            self.requests.append(asyncio.create_task(request))

    def resize(self, total: int, tenants: Iterator[tuple[str, Priority]] | None = None) -> None:
        """``total`` requests: new ones from ``tenants``, or the oldest seats released and
        then the newest waiters given up."""
        while len(self.requests) < total and tenants is not None:
            self.add([next(tenants)])
        held = [r for r in self.requests if r.done()]
        waiting = [r for r in self.requests if not r.done()]
        while len(held) + len(waiting) > total:
            if held:
                request = held.pop(0)
                if not request.cancelled() and request.exception() is None:
                    request.result().release()
            else:
                waiting.pop().cancel()
        self.requests = held + waiting

    async def settle(self) -> None:
        """Let the scheduler admit whom it admits now (a bounded number of loop turns)."""
        for _ in range(50):
            await asyncio.sleep(0)


async def docs_screenshot(path: Path) -> None:
    """The docs' picture: a gateway over three simulated upstreams whose demand swells past
    the limit (so requests queue) until the limit is raised, five minutes of it drawn.

    Each status poll moves the demand one step, so the chart is the same on every run."""
    weights = {"acme": 4.0, "globex": 2.0}
    names = ["acme", "globex", "acme", "initech", "umbrella", "acme", "globex", "hooli"]
    mix: Iterator[tuple[str, Priority]] = (
        (names[i % len(names)], "critical" if i % 9 == 0 else "standard") for i in range(10**6)
    )
    async with AsyncExitStack() as stack:
        sims = [
            await stack.enter_async_context(serve_in_task(create_app(), lifespan="on"))
            for _ in range(3)
        ]
        polls = 0
        demand: Demand | None = None

        def scripted(app: ASGIApp) -> ASGIApp:
            async def step(scope: Scope, receive: Receive, send: Send) -> None:
                nonlocal polls
                if demand is not None and scope.get("path") == "/api/v1/status":
                    polls += 1
                    if polls == 100:
                        gateway.set_capacity(64)
                    demand.resize(round(30 + 25 * math.sin(polls / 16 - 0.5) + polls / 4), mix)
                    await demand.settle()
                await app(scope, receive, send)

            return step

        gateway, url = await stack.enter_async_context(
            served(
                scripted,
                global_max_in_flight=48,
                admin_token=TOKEN,
                tenant_weights=weights,
                upstreams=tuple(sim.url for sim in sims),
            )
        )
        demand = await stack.enter_async_context(Demand(gateway))
        with tempfile.TemporaryDirectory() as profiles:
            browser = Chromium(Path(profiles))
            page = f"{url}/dashboard#token={TOKEN}"
            await browser.screenshot(page, path, budget_ms=300_000, height=1000)


if __name__ == "__main__":
    asyncio.run(docs_screenshot(Path(sys.argv[1] if len(sys.argv) > 1 else "dashboard.png")))


async def test_a_computed_limit_is_shown_with_the_pod_that_computed_it(
    chromium: Chromium, redis_url: str, pool_name: str
) -> None:
    """In cluster mode the page says which pod computed a computed provider's value, and
    which pod leads."""
    async with served(
        plugins=[DialPlugin(Dial(4))],
        admin_token=TOKEN,
        redis_url=redis_url,
        pool=pool_name,
        capacity_providers=("static", "dial"),
        global_max_in_flight=10,
        **POD_SETTINGS,
    ) as (gateway, url):
        pod = backend(gateway).pod

        async def heard() -> bool:
            pool = gateway.pool_capacity
            return pool is not None and pool.in_use("dial") is not None

        assert await eventually(heard, 3 * TTL)
        page = await chromium.dom(f"{url}/dashboard#token={TOKEN}")

    assert page.by_id("limit").text() == "4"
    providers = [item.text() for item in page.by_id("providers").all("li")]
    assert providers == ["static: 10", f"dial: 4 (computed by {pod})"]
    assert page.by_id("cluster-leader").text() == pod
