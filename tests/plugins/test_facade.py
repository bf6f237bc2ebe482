"""The plugin facade: what it accepts from plugins, how it names the ones that misbehave."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest

from gateway import (
    BadRequest,
    Classification,
    ConfigError,
    Gateway,
    GatewayMiddleware,
    PluginError,
    Priority,
    RequestInfo,
    Settings,
    Ticket,
    hookimpl,
    hookspecs,
)
from gateway.loopback import serve_in_task
from gateway.plugins import Plugins
from gateway.types import Receive, Scope, Send

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
BUILTINS = {
    "capacity-static",
    "classifier",
    "overflow-block",
    "overflow-drop-newest",
    "overflow-drop-oldest",
    "overflow-reject",
    "scorer-kv-utilization",
    "scorer-load-balance",
    "scorer-prefix-affinity",
    "scorer-queue-depth",
    "scorer-session-affinity",
}
SCOPE: Scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
REQUEST = RequestInfo(tenant="acme", priority="standard", method="POST", path="/v1/completions")


def plugin(name: str, **hooks: Callable[..., Any]) -> SimpleNamespace:
    """A plugin object registered as ``name`` whose attributes are ``hooks``."""
    return SimpleNamespace(__name__=name, **hooks)


def offering(name: str, offers: object) -> SimpleNamespace:
    """A plugin whose ``obleth_capacity_providers`` returns ``offers``."""

    @hookimpl
    def obleth_capacity_providers() -> object:
        return offers

    return plugin(name, obleth_capacity_providers=obleth_capacity_providers)


def with_headers(headers: dict[str, str]) -> Scope:
    """``SCOPE`` with these request headers, as a server would pass them."""
    raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    return {**SCOPE, "headers": raw}


def facade(*extra: object, **settings: Any) -> Plugins:
    return Plugins(Settings(**settings), extra=extra, entry_points=False)


def classified_past(
    name: str, classifier: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> tuple[Classification | None, logging.LogRecord]:
    """Classify a request from tenant ``acme`` (header ``x-tenant``) with ``classifier``
    registered as plugin ``name`` before the built-in; the answer and the one record
    the plugin logger wrote."""
    plugins = facade(plugin(name, obleth_classify_request=classifier), tenant_header="x-tenant")
    with caplog.at_level(logging.ERROR, logger="obleth.plugins"):
        answer = plugins.classify(with_headers({"x-tenant": "acme"}), None)
    [record] = [r for r in caplog.records if r.name == "obleth.plugins"]
    return answer, record


@hookimpl
def obleth_request_admited(request: RequestInfo, wait_s: float) -> None:
    """An observer hook misspelled (``admitted``), as plugins are found to have."""


class Fixed:
    """A capacity provider with a constant limit of 3."""

    def __init__(self, settings: Settings) -> None:
        pass

    def max_in_flight(self) -> int:
        return 3


# -- what a plugin may offer ----------------------------------------------------------------


def test_provider_from_a_plugin_object_can_be_selected() -> None:
    """A plugin passed in code offers a provider that settings select by name."""
    gateway = Gateway(
        Settings(capacity_providers=["fixed"]),
        plugins=[offering("fixed-capacity", {"fixed": Fixed})],
        entry_points=False,
    )

    assert gateway.capacity.current() == 3


def test_two_plugins_offering_one_provider_name_are_both_named() -> None:
    """A provider name offered twice stops startup, naming both plugins."""
    with pytest.raises(PluginError) as caught:
        facade(offering("first", {"fixed": Fixed}), offering("second", {"fixed": Fixed}))

    message = str(caught.value)
    assert "'first'" in message
    assert "'second'" in message
    assert "'fixed'" in message


def test_plugin_offering_a_builtin_name_is_reported_next_to_the_builtin() -> None:
    """A third-party provider called `static` collides with the built-in: the error is the
    third party's (it used to be told as a fault of Obleth's own ``capacity-static``),
    naming the built-in beside it."""
    with pytest.raises(PluginError) as caught:
        facade(offering("impostor", {"static": Fixed}))

    assert caught.value.plugin == "impostor"
    message = str(caught.value)
    assert message.startswith("plugin 'impostor'")
    assert "and so does plugin 'capacity-static'" in message


def test_hook_implemented_under_another_name_by_specname_is_used() -> None:
    """pluggy's ``specname`` lets a function of any name implement a hook."""

    @hookimpl(specname="obleth_capacity_providers")
    def acme_providers() -> dict[str, object]:
        return {"fixed": Fixed}

    gateway = Gateway(
        Settings(capacity_providers=["fixed"]),
        plugins=[plugin("acme", acme_providers=acme_providers)],
        entry_points=False,
    )

    assert gateway.capacity.current() == 3


@pytest.mark.parametrize(
    ("attr", "options", "named"),
    [
        ("obleth_capacity_provider", {}, "'obleth_capacity_provider'"),
        (
            "acme_providers",
            {"specname": "obleth_capacity_provider"},
            "'acme_providers' (specname 'obleth_capacity_provider')",
        ),
        ("capacity_providers", {}, "'capacity_providers'"),
    ],
)
def test_marked_function_that_implements_no_hook_is_reported(
    attr: str, options: dict[str, Any], named: str
) -> None:
    """A marked function whose name (or specname) is no hook (a misspelling, usually) would
    never be called: pluggy files it under an unknown hook name without a word. Startup
    stops, naming the plugin, the function and the hooks there are."""

    def providers() -> dict[str, object]:
        return {"fixed": Fixed}

    with pytest.raises(PluginError) as caught:
        facade(plugin("typo", **{attr: hookimpl(**options)(providers)}))

    assert caught.value.plugin == "typo"
    assert named in str(caught.value) and "no Obleth hook" in str(caught.value)
    assert "obleth_capacity_providers" in str(caught.value)  # in the list of hooks


@pytest.mark.parametrize(
    ("offers", "complaint"),
    [
        (["fixed"], "returned list"),
        ({"fixed": 3}, "the factory is a int"),
        ({"Fixed_Capacity": Fixed}, "kebab-case"),
    ],
    ids=["list", "non-callable-factory", "non-kebab-name"],
)
def test_collector_returning_garbage_names_the_plugin(offers: object, complaint: str) -> None:
    """A collector returning anything but `{kebab-name: factory}` stops startup, naming it."""
    with pytest.raises(PluginError) as caught:
        facade(offering("sloppy", offers))

    assert caught.value.plugin == "sloppy"
    assert str(caught.value).startswith("plugin 'sloppy'")
    assert complaint in str(caught.value)


@pytest.mark.parametrize(
    "error", [RuntimeError("no policies today"), SystemExit("no policies today")]
)
def test_collector_that_raises_names_the_plugin(error: BaseException) -> None:
    """A collector that raises stops startup with the plugin's name and the error; one
    that calls ``sys.exit()`` too (it used to stop the process without a word)."""

    @hookimpl
    def obleth_overflow_policies() -> dict[str, object]:
        raise error

    with pytest.raises(PluginError) as caught:
        facade(plugin("moody", obleth_overflow_policies=obleth_overflow_policies))

    assert caught.value.plugin == "moody"
    assert "no policies today" in str(caught.value)


# -- what a factory builds ------------------------------------------------------------------


@pytest.mark.parametrize("kind", [RuntimeError, SystemExit])
def test_factory_that_raises_names_the_plugin(kind: type[BaseException]) -> None:
    """A selected factory that raises stops startup, naming the plugin and the error; one
    that calls ``sys.exit()`` too."""

    def explode(settings: Settings) -> object:
        raise kind("cannot reach the control plane")

    with pytest.raises(PluginError) as caught:
        Gateway(
            Settings(capacity_providers=["remote"]),
            plugins=[offering("remote-capacity", {"remote": explode})],
            entry_points=False,
        )

    assert caught.value.plugin == "remote-capacity"
    assert "'remote'" in str(caught.value)
    assert f"{kind.__name__}: cannot reach the control plane" in str(caught.value)


def test_factory_returning_an_object_without_max_in_flight_names_the_plugin() -> None:
    """A provider lacking `max_in_flight` is refused at startup, naming its plugin."""

    def hollow(settings: Settings) -> object:
        return SimpleNamespace(limit=3)

    with pytest.raises(PluginError) as caught:
        Gateway(
            Settings(capacity_providers=["hollow"]),
            plugins=[offering("hollow-capacity", {"hollow": hollow})],
            entry_points=False,
        )

    assert caught.value.plugin == "hollow-capacity"
    assert "CapacityProvider" in str(caught.value)


def test_every_failing_factory_is_named_before_startup_stops() -> None:
    """Two providers, a policy and a scorer selected from broken factories: one error
    names all four, and the working provider next to them is built as usual."""
    called: list[str] = []

    def broken(name: str) -> Callable[[Settings], object]:
        def factory(settings: Settings) -> object:
            called.append(name)
            raise RuntimeError(f"{name} is broken")

        return factory

    @hookimpl
    def obleth_overflow_policies() -> dict[str, object]:
        return {"stubborn": broken("stubborn")}

    @hookimpl
    def obleth_routing_scorers() -> dict[str, object]:
        return {"dizzy": broken("dizzy")}

    with pytest.raises(PluginError) as caught:
        Gateway(
            Settings(
                capacity_providers=["remote", "fixed", "distant"],
                overflow_policy="stubborn",
                upstreams=["http://127.0.0.1:9"],
                routing_scorers="dizzy:1",
            ),
            plugins=[
                offering(
                    "far-capacity", {"remote": broken("remote"), "distant": broken("distant")}
                ),
                offering("fixed-capacity", {"fixed": Fixed}),
                plugin("stubborn-policy", obleth_overflow_policies=obleth_overflow_policies),
                plugin("dizzy-scorer", obleth_routing_scorers=obleth_routing_scorers),
            ],
            entry_points=False,
        )

    error = caught.value
    assert called == ["remote", "distant", "stubborn", "dizzy"]
    assert [problem.plugin for problem in error.problems] == [
        "far-capacity",
        "far-capacity",
        "stubborn-policy",
        "dizzy-scorer",
    ]
    assert str(error).startswith("4 problems with plugins, each to be fixed:\n")
    assert "capacity provider 'distant' raised RuntimeError: distant is broken" in str(error)


def test_a_name_nothing_offers_is_reported_before_any_factory_runs() -> None:
    """A typo in the settings is the thing to fix first: no factory is called."""
    called: list[str] = []

    def factory(settings: Settings) -> Fixed:
        called.append("fixed")
        return Fixed(settings)

    with pytest.raises(ConfigError) as caught:
        Gateway(
            Settings(capacity_providers=["fixed"], overflow_policy="no-such-policy"),
            plugins=[offering("fixed-capacity", {"fixed": factory})],
            entry_points=False,
        )

    assert caught.value.setting == "overflow_policy" and called == []


def test_unselected_factory_is_never_called() -> None:
    """Installing a plugin costs nothing until its provider is selected."""

    def explode(settings: Settings) -> object:
        raise AssertionError("an unselected factory was called")

    gateway = Gateway(plugins=[offering("idle", {"idle": explode})], entry_points=False)

    assert gateway.capacity.current() == Settings().global_max_in_flight


# -- names in settings ----------------------------------------------------------------------


def test_unknown_capacity_provider_names_the_setting_and_lists_installed_ones() -> None:
    """A provider name nobody offers stops startup, quoting the setting and the choices."""
    with pytest.raises(ConfigError) as caught:
        Gateway(Settings(capacity_providers=["static", "nope"]), entry_points=False)

    assert caught.value.setting == "capacity_providers"
    assert str(caught.value) == (
        "capacity_providers='nope': no capacity provider by that name; installed: static"
    )


def test_unknown_overflow_policy_lists_the_installed_policies() -> None:
    """An overflow policy nobody offers stops startup, listing every installed policy."""
    with pytest.raises(ConfigError) as caught:
        Gateway(Settings(overflow_policy="drop"), entry_points=False)

    assert caught.value.setting == "overflow_policy"
    assert "installed: block, drop-newest, drop-oldest, reject" in str(caught.value)


def test_unknown_policy_from_the_environment_names_the_variable() -> None:
    """A bad `OBLETH_OVERFLOW_POLICY` is reported under the variable the user set."""
    settings = Settings.from_env({"OBLETH_OVERFLOW_POLICY": "drop"})

    with pytest.raises(ConfigError) as caught:
        Gateway(settings, entry_points=False)

    assert str(caught.value) == (
        "OBLETH_OVERFLOW_POLICY='drop': no overflow policy by that name; "
        "installed: block, drop-newest, drop-oldest, reject"
    )


def test_disabling_a_builtin_removes_its_policy() -> None:
    """`disable_plugins=["overflow-drop-oldest"]` makes `drop-oldest` unavailable."""
    plugins = facade(disable_plugins=["overflow-drop-oldest"])

    assert plugins.names("overflow policy") == ["block", "drop-newest", "reject"]
    with pytest.raises(ConfigError, match=re.escape("installed: block, drop-newest")):
        Gateway(
            Settings(overflow_policy="drop-oldest", disable_plugins=["overflow-drop-oldest"]),
            entry_points=False,
        )


def test_disabled_plugin_is_not_described() -> None:
    """A disabled plugin is absent from `describe()` (and so from `obleth plugins`)."""
    plugins = facade(disable_plugins=["overflow-drop-oldest"])

    assert "overflow-drop-oldest" not in {info.name for info in plugins.describe()}


def test_hook_function_without_the_marker_is_reported_not_ignored() -> None:
    """pluggy passes over an unmarked function; the gateway says it would never be called."""

    def obleth_capacity_providers() -> dict[str, object]:
        return {"fixed": Fixed}

    with pytest.raises(PluginError) as caught:
        facade(plugin("unmarked", obleth_capacity_providers=obleth_capacity_providers))

    assert caught.value.plugin == "unmarked"
    assert "'obleth_capacity_providers' without the @hookimpl marker" in str(caught.value)


def test_problems_of_several_plugins_are_reported_together() -> None:
    """Every plugin's problem is found before startup stops: one error lists them all,
    each naming its plugin; ``problems`` holds each one as its own ``PluginError``."""

    def obleth_capacity_providers() -> dict[str, object]:
        return {"fixed": Fixed}

    with pytest.raises(PluginError) as caught:
        facade(
            plugin("unmarked", obleth_capacity_providers=obleth_capacity_providers),
            plugin("typo", obleth_request_admited=obleth_request_admited),
        )

    error = caught.value
    assert [problem.plugin for problem in error.problems] == ["unmarked", "typo"]
    assert error.plugin == "unmarked"
    lines = str(error).splitlines()
    assert lines[0] == "2 problems with plugins, each to be fixed:"
    assert lines[1:] == [f"  {problem}" for problem in error.problems]
    assert "'obleth_capacity_providers' without the @hookimpl marker" in lines[1]
    assert "(did you mean 'obleth_request_admitted'?)" in lines[2]


def test_two_plugins_of_one_name_in_code_are_told_apart_from_installed_ones() -> None:
    """Two plugin objects with one ``__name__``: the error says the first came from the
    application's code (there is no distribution to name) and how to tell them apart."""
    with pytest.raises(PluginError) as caught:
        facade(offering("twin", {"fixed": Fixed}), offering("twin", {"other": Fixed}))

    message = str(caught.value)
    assert message.startswith("plugin 'twin': the name is taken by another plugin, from the ")
    assert "application's code" in message and "rename one" in message
    assert caught.value.distribution is None


def test_problems_with_offers_and_names_are_reported_together() -> None:
    """A name taken twice, a collector that raises, a badly named offer and a plugin whose
    own name is taken are all found before startup stops, each on its own line, next to
    a misspelled hook; what works is not reported."""

    @hookimpl
    def obleth_overflow_policies() -> dict[str, object]:
        raise RuntimeError("no policies today")

    @hookimpl
    def obleth_routing_scorers() -> dict[str, object]:
        return {"Shouty_Scorer": Fixed}

    with pytest.raises(PluginError) as caught:
        facade(
            offering("first", {"fixed": Fixed}),
            offering("second", {"fixed": Fixed, "other": Fixed}),
            plugin("moody", obleth_overflow_policies=obleth_overflow_policies),
            plugin("shouty", obleth_routing_scorers=obleth_routing_scorers),
            offering("capacity-static", {"spare": Fixed}),
            plugin("typo", obleth_request_admited=obleth_request_admited),
        )

    error = caught.value
    [twice] = [str(problem) for problem in error.problems if "'fixed'" in str(problem)]
    assert "'first'" in twice and "'second'" in twice and "'other'" not in str(error)
    by_plugin = {problem.plugin: str(problem) for problem in error.problems}
    assert {"capacity-static", "moody", "shouty", "typo"} < set(by_plugin)
    assert "the name is taken by another plugin, from obleth " in by_plugin["capacity-static"]
    assert "OBLETH_DISABLE_PLUGINS=capacity-static would disable both" in str(error)
    assert "raised RuntimeError: no policies today" in by_plugin["moody"]
    assert "'Shouty_Scorer'; names are lower-case kebab-case" in by_plugin["shouty"]
    assert "did you mean 'obleth_request_admitted'?" in by_plugin["typo"]
    assert str(error).startswith("5 problems with plugins, each to be fixed:\n")


@pytest.mark.parametrize("option", ["hookwrapper", "wrapper"])
def test_hook_wrapper_is_refused_naming_the_plugin(option: str) -> None:
    """Obleth calls each implementation itself: a wrapper would be called as a plain
    function, so it is refused at startup instead."""

    @hookimpl(**{option: True})
    def obleth_request_admitted(request: RequestInfo) -> Any:
        yield

    with pytest.raises(PluginError) as caught:
        facade(plugin("wrapping", obleth_request_admitted=obleth_request_admitted))

    assert caught.value.plugin == "wrapping"
    assert "as a hook wrapper" in str(caught.value) and "tryfirst=True" in str(caught.value)


def test_hook_wrapper_under_another_name_is_refused_too() -> None:
    @hookimpl(specname="obleth_request_admitted", wrapper=True)
    def watch(request: RequestInfo) -> Any:
        yield

    with pytest.raises(PluginError, match=r"'watch' \(specname 'obleth_request_admitted'\)"):
        facade(plugin("wrapping", watch=watch))


def test_disabling_a_name_no_plugin_has_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A typo in `disable_plugins` leaves the plugin meant enabled: the log says so."""
    with caplog.at_level(logging.WARNING, logger="obleth.plugins"):
        plugins = facade(disable_plugins=["overflow-drop-oldest", "overflow-drop-oldset"])

    assert plugins.names("overflow policy") == ["block", "drop-newest", "reject"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "names 'overflow-drop-oldset', which no plugin here has" in warnings[0]
    assert "overflow-drop-oldest" in warnings[0].split("plugins:")[1]  # the names there are


class Refusing:
    """A capacity provider whose `subscribe` or `use_readings` raises."""

    def __init__(self, settings: Settings) -> None:
        pass

    def max_in_flight(self) -> int:
        return 3


@pytest.mark.parametrize("method", ["subscribe", "use_readings"])
def test_provider_failing_to_be_wired_in_names_its_plugin(method: str) -> None:
    """A provider whose `subscribe()` or `use_readings()` raises stops startup as a
    PluginError naming its plugin, like any other fault at assembly."""

    def refuse(_: object) -> None:
        raise RuntimeError("not today")

    class Provider(Refusing):
        pass

    setattr(Provider, method, lambda self, arg: refuse(arg))

    with pytest.raises(PluginError) as caught:
        Gateway(
            Settings(capacity_providers=["refusing"]),
            plugins=[offering("refusing-capacity", {"refusing": Provider})],
            entry_points=False,
        )

    assert caught.value.plugin == "refusing-capacity"
    assert f"{method}() raised RuntimeError('not today')" in str(caught.value)


@pytest.mark.parametrize(
    "error", [RuntimeError("lost the config server"), SystemExit(1)], ids=["raises", "exits"]
)
def test_provider_failing_at_runtime_is_logged_with_its_plugin(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """A provider that raises after startup (``SystemExit`` included) keeps its last
    value; the log names the provider and the plugin it came from."""

    class Flaky(Refusing):
        calls = 0

        def max_in_flight(self) -> int:
            Flaky.calls += 1
            if Flaky.calls > 1:
                raise error
            return 3

    gateway = Gateway(
        Settings(capacity_providers=["flaky"]),
        plugins=[offering("flaky-capacity", {"flaky": Flaky})],
        entry_points=False,
    )
    with caplog.at_level(logging.ERROR, logger="obleth.capacity"):
        assert gateway.capacity.current() == 3

    assert [r.getMessage() for r in caplog.records] == [
        "capacity provider 'flaky' from plugin 'flaky-capacity' (registered by the "
        "application) raised; keeping its last value"
    ]


def test_hook_with_an_unknown_argument_is_a_named_plugin_error() -> None:
    """A hook function asking for an argument the hook does not have names its plugin."""

    @hookimpl
    def obleth_classify_request(header: dict[str, str]) -> None:
        return None

    with pytest.raises(PluginError, match=r"'typo-args'.*could not be registered"):
        facade(plugin("typo-args", obleth_classify_request=obleth_classify_request))


def test_imported_module_named_like_a_hook_is_not_mistaken_for_one() -> None:
    """A plugin may import a package called obleth_something; only functions are checked."""
    import types as pytypes

    helper_module = pytypes.ModuleType("obleth_acme_helpers")
    plugins = facade(plugin("acme", obleth_acme_helpers=helper_module))

    assert "acme" in {info.name for info in plugins.describe()}


# -- the request path -----------------------------------------------------------------------


def test_classifier_plugin_answers_before_the_builtin() -> None:
    """A plugin's classification wins over the built-in classifier's."""

    @hookimpl
    def obleth_classify_request(headers: dict[str, str]) -> Classification:
        return Classification(tenant=headers["x-team"], priority="critical")

    plugins = facade(plugin("teams", obleth_classify_request=obleth_classify_request))

    answer = plugins.classify(with_headers({"x-team": "search"}), None)

    assert answer == Classification(tenant="search", priority="critical")


def test_classifier_that_raises_falls_through_to_the_builtin(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A classifier that raises is logged by name and the built-in classifies the request."""

    @hookimpl
    def obleth_classify_request() -> Classification:
        raise KeyError("x-team")

    answer, record = classified_past("flaky", obleth_classify_request, caplog)

    assert answer == Classification(tenant="acme", priority="standard")
    assert "'flaky'" in record.getMessage()
    assert "obleth_classify_request" in record.getMessage()
    assert record.exc_info is not None


class PluginExit(BaseException):
    """A ``BaseException`` of a library's own making (as gevent's ``GreenletExit`` is)."""


@pytest.mark.parametrize("error", [SystemExit(2), PluginExit("stop")], ids=["exit", "own"])
def test_classifier_raising_a_base_exception_falls_through_to_the_builtin(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """A classifier that calls ``sys.exit()`` or raises a ``BaseException`` of its own is
    a faulty plugin like one raising ``Exception``: named in the log, and the next
    classifier (here the built-in) classifies the request."""

    @hookimpl
    def obleth_classify_request() -> Classification:
        raise error

    answer, record = classified_past("exiting", obleth_classify_request, caplog)

    assert answer == Classification(tenant="acme", priority="standard")
    assert "'exiting'" in record.getMessage()
    assert "obleth_classify_request" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[1] is error


@pytest.mark.parametrize("error", [asyncio.CancelledError, KeyboardInterrupt, GeneratorExit])
def test_cancellation_and_interrupts_from_a_classifier_are_not_swallowed(
    error: type[BaseException],
) -> None:
    """``CancelledError``, ``KeyboardInterrupt`` and ``GeneratorExit`` stop the work around
    the plugin, not just the plugin: they pass through the facade as they came."""

    @hookimpl
    def obleth_classify_request() -> Classification:
        raise error()

    plugins = facade(plugin("stopping", obleth_classify_request=obleth_classify_request))

    with pytest.raises(error):
        plugins.classify(SCOPE, None)


def test_a_request_whose_classifier_calls_sys_exit_is_answered_by_the_app(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Over HTTP: a classifier calling ``sys.exit()`` on every request used to end each
    one in a bare 500; now the built-in classifies it, the app answers it, and the log
    names the plugin once however many requests come."""

    @hookimpl
    def obleth_classify_request() -> Classification:
        sys.exit("classifier gave up")

    async def tenant_app(scope: Scope, receive: Receive, send: Send) -> None:
        tenant = scope["state"]["obleth"]["tenant"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": tenant.encode()})

    async def scenario() -> list[tuple[int, str]]:
        app = GatewayMiddleware(
            tenant_app,
            Settings(tenant_header="x-tenant"),
            plugins=[plugin("exiting", obleth_classify_request=obleth_classify_request)],
        )
        async with serve_in_task(app) as server, httpx.AsyncClient(trust_env=False) as http:
            answers = [
                await http.post(f"{server.url}/v1/completions", headers={"x-tenant": "acme"})
                for _ in range(3)
            ]
        return [(answer.status_code, answer.text) for answer in answers]

    with caplog.at_level(logging.ERROR, logger="obleth.plugins"):
        assert asyncio.run(scenario()) == [(200, "acme")] * 3

    [record] = [r for r in caplog.records if r.name == "obleth.plugins"]
    assert "'exiting'" in record.getMessage()


@pytest.mark.parametrize(
    ("answer", "complaint"),
    [
        (("acme", "standard"), "not a Classification"),
        (Classification(tenant=""), "tenant must be a non-empty str"),
        (Classification(tenant=cast(str, 7)), "tenant must be a non-empty str"),
        (Classification("acme", priority=cast(Priority, "urgent")), "priority must be one of"),
        (Classification("acme", routing_key=cast(bytes, "text")), "routing_key must be bytes"),
        (Classification("acme", session_id=cast(str, 12)), "session_id must be a str"),
        # a label of the metrics and a key in Redis: bounded as the tenant header is
        (Classification(tenant="x" * 100_000), "a tenant of 100000 characters; at most 256"),
        (Classification(tenant="a\nb\x00"), "the tenant must be printable"),
    ],
)
def test_classifier_answer_it_cannot_use_is_logged_and_skipped(
    answer: object, complaint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An answer the gate cannot use is named as the plugin's and the next classifier
    (here the built-in) classifies the request, instead of the answer failing later."""

    @hookimpl
    def obleth_classify_request() -> object:
        return answer

    result, record = classified_past("sloppy", obleth_classify_request, caplog)

    assert result == Classification(tenant="acme", priority="standard")
    assert "'sloppy'" in record.getMessage()
    assert complaint in record.getMessage()


class Faulty:
    """An overflow policy whose ``decide`` raises ``error``, or answers ``answer`` if one
    is given."""

    def __init__(self, answer: object = None, error: BaseException | None = None) -> None:
        self.answer = answer
        self.error = error or RuntimeError("policy bug")

    def decide(self, view: object, ticket: object) -> object:
        if self.answer is None:
            raise self.error
        return self.answer


class Tampering:
    """An overflow policy that tries to change the queue it is shown: it used to be handed
    the queue itself, and setting its count of seats in flight broke the limit for good."""

    def decide(self, view: Any, ticket: object) -> object:
        view.inflight = 0
        return "evict"


@pytest.mark.parametrize(
    ("policy", "complaint"),
    [
        (Faulty(), "raised"),
        (Faulty(error=SystemExit(1)), "raised"),
        (Faulty("maybe"), "answered 'maybe', not one of evict, queue, reject, wait"),
        (Faulty(["queue"]), "answered ['queue'], not one of evict, queue, reject, wait"),
        (Tampering(), "raised"),
    ],
    ids=["raises", "exits", "unknown-action", "unhashable-answer", "changes-the-view"],
)
def test_faulty_overflow_policy_is_named_and_the_request_waits_as_under_block(
    policy: Faulty, complaint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A policy's fault on the request path is logged naming its plugin, and the request
    queues for the next seat instead of failing."""

    @hookimpl
    def obleth_overflow_policies() -> object:
        return {"faulty": lambda settings: policy}

    gateway = Gateway(
        Settings(global_max_in_flight=1, overflow_policy="faulty"),
        plugins=[plugin("acme-policy", obleth_overflow_policies=obleth_overflow_policies)],
        entry_points=False,
    )
    ticket = Ticket(tenant="acme")

    async def second_request_after_a_release() -> tuple[int, int, bool, int]:
        await gateway.start()
        holder = await gateway.scheduler.acquire(ticket)
        waiter = asyncio.create_task(gateway.scheduler.acquire(ticket))
        await asyncio.sleep(0)
        snapshot = gateway.snapshot()
        holder.release()
        permit = await asyncio.wait_for(waiter, 10)
        granted = permit.release()
        after = gateway.snapshot().inflight
        await gateway.stop()
        return snapshot.queued, snapshot.inflight, granted, after

    with caplog.at_level(logging.ERROR, logger="obleth.plugins"):
        # one waiting behind the one seat held, and nothing in flight once both are done
        assert asyncio.run(second_request_after_a_release()) == (1, 1, True, 0)

    [record] = [r for r in caplog.records if r.name == "obleth.plugins"]
    assert "'acme-policy'" in record.getMessage()
    assert complaint in record.getMessage()


def test_classifier_bad_request_reaches_the_client() -> None:
    """`BadRequest` from a classifier is not swallowed: it becomes the client's 400."""

    @hookimpl
    def obleth_classify_request() -> Classification:
        raise BadRequest("x-team header is required", param="x-team")

    plugins = facade(plugin("strict", obleth_classify_request=obleth_classify_request))

    with pytest.raises(BadRequest, match="x-team header is required"):
        plugins.classify(SCOPE, None)


@pytest.mark.parametrize(
    "error", [RuntimeError("metrics sink is down"), SystemExit(1)], ids=["raises", "exits"]
)
def test_observer_that_raises_is_logged_and_the_others_are_still_told(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """An observer that raises (``SystemExit`` included) is logged by name and skipped;
    the next observer still runs."""
    seen: list[tuple[str, float]] = []

    @hookimpl
    def record(request: RequestInfo, wait_s: float) -> None:
        seen.append((request.tenant, wait_s))

    @hookimpl(tryfirst=True)
    def explode(request: RequestInfo) -> None:
        raise error

    plugins = facade(
        plugin("recorder", obleth_request_admitted=record),
        plugin("noisy", obleth_request_admitted=explode),
    )

    with caplog.at_level(logging.ERROR, logger="obleth.plugins"):
        plugins.admitted(REQUEST, 0.25)

    assert seen == [("acme", 0.25)]
    [record_] = [r for r in caplog.records if r.name == "obleth.plugins"]
    assert "'noisy'" in record_.getMessage()
    assert "obleth_request_admitted" in record_.getMessage()


def test_observers_receive_only_the_arguments_they_declare() -> None:
    """Each observer hook passes the request and its own detail, by argument name."""
    seen: list[tuple[str, object]] = []

    @hookimpl
    def obleth_request_rejected(reason: str) -> None:
        seen.append(("rejected", reason))

    @hookimpl
    def obleth_request_finished(outcome: str, duration_s: float) -> None:
        seen.append(("finished", (outcome, duration_s)))

    plugins = facade(
        plugin(
            "audit",
            obleth_request_rejected=obleth_request_rejected,
            obleth_request_finished=obleth_request_finished,
        )
    )
    plugins.rejected(REQUEST, "queue_full")
    plugins.finished(REQUEST, 1.5, "completed")

    assert seen == [("rejected", "queue_full"), ("finished", ("completed", 1.5))]


# -- describing what is installed -----------------------------------------------------------


def test_describe_lists_the_builtins_from_the_obleth_distribution() -> None:
    """`describe()` shows every built-in as coming from the `obleth` distribution."""
    infos = {info.name: info for info in facade().describe()}

    assert set(infos) == BUILTINS
    assert {info.distribution for info in infos.values()} == {"obleth"}
    assert infos["capacity-static"].provides == {"capacity provider": ["static"]}
    assert infos["overflow-drop-oldest"].provides == {"overflow policy": ["drop-oldest"]}
    assert infos["classifier"].provides == {"hooks": ["obleth_classify_request"]}


def test_describe_lists_a_plugin_object_with_what_it_provides() -> None:
    """A plugin passed in code is listed next to the built-ins with its offers."""
    plugins = facade(offering("fixed-capacity", {"fixed": Fixed}))
    infos = {info.name: info for info in plugins.describe()}

    assert infos["fixed-capacity"].provides == {"capacity provider": ["fixed"]}
    assert set(infos) == BUILTINS | {"fixed-capacity"}


# -- the plugin author's manual -------------------------------------------------------------


@pytest.mark.parametrize("hook", hookspecs.HOOK_NAMES)
def test_every_hook_is_documented_in_its_spec_and_the_plugin_guide(hook: str) -> None:
    """Each hook has a contract in its hookspec and a section in docs/plugins.md."""
    spec = getattr(hookspecs, hook)

    assert (spec.__doc__ or "").strip(), f"{hook} has no docstring"
    assert f"`{hook}(" in GUIDE.read_text(encoding="utf-8"), f"docs/plugins.md omits {hook}"
