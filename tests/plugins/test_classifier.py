"""The built-in classifier: the documented rules, on raw headers, with its memo of tickets."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterable, Iterator
from types import BuiltinFunctionType, FunctionType, ModuleType

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import GatewayMiddleware, PluginError, Settings, hookimpl
from gateway.builtin.classifier import MEMO_SIZE, HeaderReader, reader_for, tenant_of_key
from gateway.core.tickets import PRIORITIES, Ticket
from gateway.core.tickets import ticket as make_ticket
from gateway.errors import BadRequest
from gateway.hookspecs import HEADER_TICKETS
from gateway.plugins import Plugins
from gateway.protocols import Classification

Headers = list[tuple[bytes, bytes]]

NAMES = ["authorization", "x-api-key", "api-key", "x-tenant", "x-priority", "accept", "host"]
VALUES = [
    "Bearer sk-one",
    "bearer  sk-two ",
    "Basic dXNlcg==",
    "Bearer ",
    "sk-three",
    "",
    "  ",
    " gold ",
    "café",
    "critical",
    "Background",
    "urgent",
]


def expected(headers: Headers, config: Settings) -> tuple[str, str] | str:
    """The rules as the docs state them, from a decoded dict (the last repeated header
    counts): the tenant header, else the bearer token's hash, else ``x-api-key`` or
    ``api-key``'s hash, else the default tenant; the priority header only when trusted.
    "bad priority" for a trusted priority header that names none."""
    seen = {name.decode("latin-1"): value.decode("latin-1") for name, value in headers}
    tenant = None
    if config.tenant_header is not None:
        raw = seen.get(config.tenant_header, "").encode("latin-1")
        try:
            named = raw.decode("utf-8")  # a tenant's name is UTF-8 ...
        except UnicodeDecodeError:
            named = raw.decode("latin-1")  # ... or, when it is no UTF-8, Latin-1
        tenant = named.strip() or None
    if tenant is None:
        scheme, _, token = seen.get("authorization", "").partition(" ")
        key = token.strip() if scheme.lower() == "bearer" else ""
        key = key or seen.get("x-api-key") or seen.get("api-key") or ""
        tenant = tenant_of_key(key) if key else config.default_tenant
    priority = config.default_priority
    claimed = seen.get(config.priority_header) if config.trust_priority_header else None
    if claimed is not None:
        priority = claimed.strip().lower()
        if priority not in PRIORITIES:
            return "bad priority"
    return tenant, priority


def answer(reader: HeaderReader, headers: Iterable[tuple[bytes, bytes]]) -> tuple[str, str] | str:
    try:
        ticket = reader.ticket(headers)
    except BadRequest:
        return "bad priority"
    return ticket.tenant, ticket.priority


header_lists = st.lists(
    st.tuples(st.sampled_from(NAMES), st.sampled_from([*VALUES, "caf\xe9"])).map(
        # "café" goes as UTF-8, "caf\xe9" as Latin-1 (one byte no UTF-8 decoder takes)
        lambda pair: (pair[0].encode(), pair[1].encode("utf-8" if pair[1] in VALUES else "latin-1"))
    ),
    max_size=6,
)
configurations = st.builds(
    Settings,
    tenant_header=st.sampled_from([None, "x-tenant"]),
    trust_priority_header=st.booleans(),
    default_priority=st.sampled_from(PRIORITIES[:2]),
)


@settings(max_examples=300, deadline=None)
@given(config=configurations, requests=st.lists(header_lists, min_size=1, max_size=4))
def test_the_reader_follows_the_documented_rules_on_first_sight_and_from_memory(
    config: Settings, requests: list[Headers]
) -> None:
    """Every request classifies as the rules say, and asking again (now from the memo)
    gives the same answer."""
    reader = HeaderReader(
        config.tenant_header,
        config.priority_header if config.trust_priority_header else None,
        config.default_tenant,
        config.default_priority,
    )
    for headers in requests + requests:
        assert answer(reader, headers) == expected(headers, config)
        # ASGI promises an iterable, not a list: a one-shot iterator reads the same
        assert answer(reader, iter(headers)) == expected(headers, config)


def test_the_hook_answers_as_the_reader_does() -> None:
    """With another classifier in front that passes, the built-in answers through the hook
    exactly as the middleware's direct path does."""

    class Passing:
        @hookimpl
        def obleth_classify_request(self) -> None:
            return None

    config = Settings(tenant_header="x-tenant")
    plugins = Plugins(config, extra=[Passing()], entry_points=False)
    assert plugins.header_ticket is None  # another classifier: no direct path
    headers = [(b"x-tenant", b" gold "), (b"authorization", b"Bearer sk-one")]
    scope = {"type": "http", "method": "GET", "path": "/", "headers": headers}
    classification = plugins.classify(scope, None)
    assert classification is not None
    direct = reader_for(config).ticket(headers)
    assert (classification.tenant, classification.priority) == (direct.tenant, direct.priority)
    assert direct.tenant == "gold"


def reachable(root: object) -> Iterator[object]:
    """Every object the data of ``root`` leads to (not through classes, functions or
    modules, which lead to everything), with the strings, bytes and ints it holds."""
    seen = {id(root)}
    todo = [root]
    while todo:
        item = todo.pop()
        yield item
        for child in gc.get_referents(item):
            if isinstance(child, type | ModuleType | FunctionType | BuiltinFunctionType):
                continue
            if id(child) not in seen:
                seen.add(id(child))
                todo.append(child)


def test_the_memo_never_holds_a_credential_and_stays_bounded() -> None:
    """After more distinct API keys than the memo holds, nothing reachable from the reader
    contains a key, every answer is still the key's hashed tenant, and what it remembers
    stays within its bound."""
    reader = HeaderReader(None, None, "default", "standard")
    keys = [f"sk-secret-{n:06d}" for n in range(MEMO_SIZE + 100)]
    for _ in range(2):
        for key in keys:
            assert reader.ticket([(b"authorization", f"Bearer {key}".encode())]) == Ticket(
                tenant_of_key(key), "standard"
            )
    texts = [
        item.decode("latin-1") if isinstance(item, bytes) else item
        for item in reachable(reader)
        if isinstance(item, str | bytes)
    ]
    assert not [text for text in texts if "sk-secret" in text]
    tickets = [item for item in reachable(reader) if isinstance(item, Ticket)]
    assert 1 < len(tickets) <= MEMO_SIZE + 1  # the default ticket and what it remembers


def test_a_request_without_credentials_gets_the_default_ticket() -> None:
    reader = reader_for(Settings(default_tenant="anonymous", default_priority="background"))
    assert reader.ticket([(b"host", b"example")]) == Ticket("anonymous", "background")
    assert reader.ticket([]) is reader.ticket([(b"accept", b"*/*")])


def test_a_bad_priority_names_the_header_and_what_is_accepted() -> None:
    reader = reader_for(Settings(trust_priority_header=True, priority_header="x-urgency"))
    with pytest.raises(BadRequest, match="x-urgency: 'soon' is no priority") as caught:
        reader.ticket([(b"x-urgency", b"Soon")])
    assert "critical, standard, background" in str(caught.value)
    with pytest.raises(BadRequest, match="x-urgency: 'bientôt' is no priority"):
        reader.ticket([(b"x-urgency", "bientôt".encode())])


def test_any_classifier_may_offer_the_header_only_path() -> None:
    """The fast path is offered by an attribute any classifier may set, not by the
    built-in's name: a plugin's own, alone with the built-in disabled, becomes
    ``header_ticket`` (which the request path calls instead of the hook; ``classify``
    always asks the hook); next to the built-in, there is no fast path."""
    calls: list[str] = []

    class ByHeader:
        def __init__(self, settings: Settings) -> None:
            pass

        def ticket(self, headers: Headers) -> Ticket:
            calls.append("ticket")
            return make_ticket(dict(headers).get(b"x-team", b"none").decode(), "critical")

    class Team:
        @hookimpl
        def obleth_classify_request(self, scope: dict) -> Classification:
            calls.append("hook")
            headers = dict(scope["headers"])
            return Classification(headers.get(b"x-team", b"none").decode(), "critical")

    setattr(Team.obleth_classify_request, HEADER_TICKETS, ByHeader)
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [(b"x-team", b"red")]}
    alone = Plugins(Settings(disable_plugins=("classifier",)), extra=[Team()], entry_points=False)
    assert alone.header_ticket is not None
    assert alone.header_ticket(scope["headers"]) == make_ticket("red", "critical")
    assert alone.classify(scope, None) == ("red", "critical", None, None)
    assert calls == ["ticket", "hook"]
    calls.clear()
    beside = Plugins(Settings(), extra=[Team()], entry_points=False)
    assert beside.header_ticket is None
    assert beside.classify(scope, None) == ("red", "critical", None, None)
    assert calls == ["hook"]


def test_a_header_only_path_that_raises_is_named_and_the_request_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A plugin's header-only classification that raises on a request is the plugin's
    fault: the log names it, the request gets the default class and is served; one whose
    construction fails stops startup with a ``PluginError`` naming it."""

    class Fragile:
        def __init__(self, settings: Settings) -> None:
            self.teams = {b"red": "red"}

        def ticket(self, headers: Headers) -> Ticket:
            if dict(headers)[b"x-team"] == b"quit":
                raise SystemExit(3)  # a stray sys.exit() is the plugin's fault too
            return make_ticket(self.teams[dict(headers)[b"x-team"]], "critical")

    class Team:
        @hookimpl
        def obleth_classify_request(self) -> None:
            return None

    setattr(Team.obleth_classify_request, HEADER_TICKETS, Fragile)
    settings = Settings(disable_plugins=("classifier",), default_tenant="nobody")
    app = GatewayMiddleware(echo_tenant, settings, plugins=[Team()])

    async def three_requests() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            teams = ("red", "blue", "quit")
            answers = [await client.get("/", headers={"x-team": t}) for t in teams]
        await app.gateway.stop()
        return answers

    with caplog.at_level("ERROR", logger="obleth"):
        known, missing, exiting = asyncio.run(three_requests())
    assert (known.status_code, known.text) == (200, "red")
    assert (missing.status_code, missing.text) == (200, "nobody")
    assert (exiting.status_code, exiting.text) == (200, "nobody")
    [record] = [r for r in caplog.records if "header_tickets" in r.getMessage()]
    assert "plugin 'Team-0'" in record.getMessage() and record.exc_info is not None

    class Broken(Fragile):
        def __init__(self, settings: Settings) -> None:
            raise ValueError("missing TEAM_MAP")

    setattr(Team.obleth_classify_request, HEADER_TICKETS, Broken)
    with pytest.raises(PluginError, match=r"plugin 'Team-0'.*header_tickets.*TEAM_MAP"):
        Plugins(settings, extra=[Team()], entry_points=False)


def test_a_header_only_path_answering_what_the_gate_cannot_use_is_named_and_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A third party's header-only path is checked as the hook is: ``None``, a bare tuple,
    an unknown priority or a ticket of 0 seats (which would pass the global limit) is
    logged under the plugin's name, and the request goes on in the default class. They
    used to end in a 500 with a traceback, or be admitted past the limit."""

    answers: dict[bytes, object] = {
        b"none": None,
        b"tuple": ("red", "critical", 1),
        b"urgent": make_ticket("red", "urgent"),  # type: ignore[arg-type]
        b"free": make_ticket("red", "critical", 0),
        b"good": make_ticket("red", "critical"),
    }

    class Sloppy:
        def __init__(self, settings: Settings) -> None:
            pass

        def ticket(self, headers: Headers) -> object:
            return answers[dict(headers)[b"x-team"]]

    class Team:
        @hookimpl
        def obleth_classify_request(self) -> None:
            return None

    setattr(Team.obleth_classify_request, HEADER_TICKETS, Sloppy)
    settings = Settings(disable_plugins=("classifier",), default_tenant="nobody")
    app = GatewayMiddleware(echo_tenant, settings, plugins=[Team()])

    async def each() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            got = [await client.get("/", headers={"x-team": team.decode()}) for team in answers]
        await app.gateway.stop()
        return got

    with caplog.at_level("ERROR", logger="obleth"):
        got = asyncio.run(each())
    assert [(a.status_code, a.text) for a in got] == [(200, "nobody")] * 4 + [(200, "red")]
    [record] = [r for r in caplog.records if "header_tickets" in r.getMessage()]
    assert "plugin 'Team-0'" in record.getMessage()  # once a minute, the first of them
    assert "returned None, not a Ticket" in record.getMessage()
    assert app.gateway.scheduler.admitted == app.gateway.scheduler.released == 5


async def echo_tenant(scope: dict, receive: object, send: Callable) -> None:
    """An app answering the tenant the gateway admitted the request as."""
    body = scope["state"]["obleth"]["tenant"].encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})
