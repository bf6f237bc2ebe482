"""The plugin facade: the only code that touches ``pm.hook``.

One ``Plugins`` per gateway (no module globals). Built-ins are registered through the
same door as third-party plugins, then entry points of the ``obleth`` group are loaded one
at a time, so that a broken one is named with its distribution.
At startup the facade collects what plugins offer, checks it, reports collisions naming
both plugins, and hands the request path plain typed callables.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final, Literal, cast, get_args

import pluggy

from gateway import hookspecs
from gateway.builtin import DEFAULT_PLUGINS, classifier
from gateway.core.admission import OverflowAction, QueueView
from gateway.core.tickets import PRIORITIES, Ticket
from gateway.errors import BadRequest, ConfigError, PluginError
from gateway.protocols import (
    CapacityProvider,
    Classification,
    Factory,
    OverflowPolicy,
    RequestInfo,
    RoutingScorer,
)
from gateway.settings import Settings
from gateway.types import Scope

log = logging.getLogger("obleth.plugins")

ENTRY_POINT_GROUP: Final = "obleth"
_BUILTIN_CLASSIFIER: Final = "classifier"
_NAME = re.compile(r"^[a-z0-9]+(?:[-.][a-z0-9]+)*$")

Kind = Literal["capacity provider", "overflow policy", "routing scorer"]
_COLLECTORS: Final[dict[Kind, str]] = {
    "capacity provider": "obleth_capacity_providers",
    "overflow policy": "obleth_overflow_policies",
    "routing scorer": "obleth_routing_scorers",
}
_ROLES: Final[dict[Kind, type]] = {
    "capacity provider": CapacityProvider,
    "overflow policy": OverflowPolicy,
    "routing scorer": RoutingScorer,
}
_SETTING_OF: Final[dict[Kind, str]] = {
    "capacity provider": "capacity_providers",
    "overflow policy": "overflow_policy",
    "routing scorer": "routing_scorers",
}


@dataclass(frozen=True)
class PluginInfo:
    """One registered plugin, for ``obleth plugins`` and error messages."""

    name: str
    distribution: str
    version: str
    provides: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Impl:
    """One plugin's implementation of a hook, called with just the arguments it declares."""

    plugin: str
    function: Callable[..., Any]
    argnames: tuple[str, ...]

    def __call__(self, arguments: Mapping[str, Any]) -> Any:
        return self.function(*[arguments[name] for name in self.argnames])


@dataclass(frozen=True)
class _Offer:
    factory: Factory
    plugin: str


class Plugins:
    """Loads, checks and fronts every plugin of one gateway.

    ``extra`` plugin objects (modules or instances with ``@hookimpl`` functions) are
    registered after the built-ins and before entry points: the way an application or a
    test adds a plugin without packaging it.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        extra: Iterable[object] = (),
        entry_points: bool = True,
    ) -> None:
        self.settings = settings
        self._pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self._pm.add_hookspecs(hookspecs)
        for name in settings.disable_plugins:
            self._pm.set_blocked(name)
        self._origin: dict[str, tuple[str, str]] = {}
        self._builtins: set[str] = set()
        for module_name in DEFAULT_PLUGINS:
            module = importlib.import_module(module_name)
            self._register(module, _builtin_name(module), ("obleth", _own_version()))
            self._builtins.add(_builtin_name(module))
        # every broken plugin is found before one error names them all
        problems: list[PluginError] = []
        #: every plugin name offered, registered or blocked
        offered = set(self._builtins)
        for index, plugin in enumerate(extra):
            name = getattr(plugin, "__name__", None) or f"{type(plugin).__name__}-{index}"
            offered.add(name)
            try:
                self._register(plugin, name, _APPLICATION)
            except PluginError as problem:
                problems.append(problem)
        if entry_points:
            offered |= self._load_entry_points(problems)
        problems += self._hook_name_problems()
        self._offers: dict[Kind, dict[str, _Offer]] = {
            kind: self._collect(kind, problems) for kind in _COLLECTORS
        }
        if problems:
            raise PluginError.together(problems)
        self._check_disabled_names(offered)
        self._classifiers = self._impls("obleth_classify_request")
        self._on_admitted = self._impls("obleth_request_admitted")
        self._on_rejected = self._impls("obleth_request_rejected")
        self._on_finished = self._impls("obleth_request_finished")
        self._on_routed = self._impls("obleth_request_routed")
        self._last_complaint: dict[str, float] = {}
        #: whether any classifier reads the body (only then does the middleware read it)
        self.wants_body = any("body" in impl.argnames for impl in self._classifiers)
        #: whether any plugin observes requests (else the middleware skips the bookkeeping)
        self.observes = bool(self._on_admitted or self._on_rejected or self._on_finished)
        #: whether any plugin observes routing decisions
        self.observes_routing = bool(self._on_routed)
        #: the built-in classifier when it is the only one: callers may then classify with
        #: it directly, without a header dict or a hook call; else None
        self.header_reader: classifier.HeaderReader | None = None
        if [impl.plugin for impl in self._classifiers] == [_BUILTIN_CLASSIFIER]:
            self.header_reader = classifier.reader_for(settings)

    # -- startup ----------------------------------------------------------------------------

    def _register(self, plugin: object, name: str, origin: tuple[str, str]) -> None:
        if self._pm.is_blocked(name):
            return
        existing = self._pm.get_plugin(name)
        if existing is not None:
            holder = self.distribution_of(name) or "the application's code"
            raise PluginError(
                name,
                f"the name is taken by another plugin, from {holder}; OBLETH_DISABLE_PLUGINS="
                f"{name} would disable both: uninstall one of the two, or rename one (its "
                "entry point, or the __name__ of a plugin passed in code)",
                distribution=_dist_label(origin) or None,
            )
        try:
            self._pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginError(
                name, f"could not be registered: {exc}", distribution=_dist_label(origin) or None
            ) from exc
        self._origin[name] = origin

    def _load_entry_points(self, problems: list[PluginError]) -> set[str]:
        """Load every entry point not disabled, one at a time; the names of all of them.
        One that fails to load or register is added to ``problems`` and skipped."""
        found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        for entry_point in sorted(found, key=lambda ep: ep.name):
            if self._pm.is_blocked(entry_point.name):
                continue
            dist = entry_point.dist
            origin = (dist.name, dist.version) if dist is not None else ("unknown", "")
            try:
                plugin = entry_point.load()
            except Exception as exc:
                problem = PluginError(
                    entry_point.name,
                    f"failed to load {entry_point.value!r}: {type(exc).__name__}: {exc}. "
                    f"Fix or uninstall {origin[0]}, or skip it with "
                    f"OBLETH_DISABLE_PLUGINS={entry_point.name}",
                    distribution=_dist_label(origin),
                )
                problem.__cause__ = exc
                problems.append(problem)
                continue
            try:
                self._register(plugin, entry_point.name, origin)
            except PluginError as problem:
                problems.append(problem)
        return {entry_point.name for entry_point in found}

    def _hook_name_problems(self) -> list[PluginError]:
        """What pluggy would silently pass over, or call in a way Obleth does not: a
        misspelled hook (or ``specname``), a hook function without the marker, a wrapper.

        A marked function implements the hook its ``specname`` names, else the one its own
        name does; an unmarked one is looked at only when its name starts with ``obleth_``.
        """
        known = set(hookspecs.HOOK_NAMES)
        problems: list[PluginError] = []
        for name, plugin in self._registered():
            for attr in dir(plugin):
                function = getattr(plugin, attr, None)
                if not inspect.isroutine(function):
                    continue
                options = getattr(function, _MARK, None)
                if not isinstance(options, dict):
                    problem = _unmarked_problem(attr, known)
                else:
                    problem = _marked_problem(attr, options, known)
                if problem is not None:
                    distribution = self.distribution_of(name)
                    problems.append(PluginError(name, problem, distribution=distribution))
        return problems

    def _check_disabled_names(self, offered: set[str]) -> None:
        """A name in ``disable_plugins`` that no plugin here has is most likely a typo
        (the plugin meant stays enabled), but may as well name a plugin installed on
        other pods only: said in the log, not fatal."""
        if not self.settings.disable_plugins:
            return
        unknown = [name for name in self.settings.disable_plugins if name not in offered]
        if unknown:
            log.warning(
                "disable_plugins (OBLETH_DISABLE_PLUGINS) names %s, which no plugin here "
                "has; plugins: %s",
                ", ".join(repr(name) for name in unknown),
                ", ".join(sorted(offered)),
            )

    def _collect(self, kind: Kind, problems: list[PluginError]) -> dict[str, _Offer]:
        """Every plugin's offers of ``kind`` by name. What cannot be used (the hook raised
        or answered something other than a dict, a bad name or factory, a name offered
        twice) is added to ``problems`` and left out; the first offer of a name is kept."""
        offers: dict[str, _Offer] = {}
        hook = _COLLECTORS[kind]

        def problem(plugin: str, text: str) -> PluginError:
            error = PluginError(plugin, text, distribution=self.distribution_of(plugin))
            problems.append(error)
            return error

        for impl in self._impls(hook):
            plugin = impl.plugin
            try:
                offered = impl({})
            except Exception as exc:
                problem(plugin, f"{hook}() raised {type(exc).__name__}: {exc}").__cause__ = exc
                continue
            if offered is None:
                continue
            if not isinstance(offered, Mapping):
                problem(
                    plugin,
                    f"{hook}() returned {type(offered).__name__}; expected a dict of "
                    "{name: factory}",
                )
                continue
            for name, factory in offered.items():
                if not isinstance(name, str) or not _NAME.match(name):
                    problem(
                        plugin, f"offers a {kind} named {name!r}; names are lower-case kebab-case"
                    )
                elif not callable(factory):
                    problem(
                        plugin,
                        f"{kind} {name!r}: the factory is a {type(factory).__name__}, "
                        "not a callable taking Settings",
                    )
                elif name in offers:
                    other = offers[name].plugin
                    problem(
                        plugin,
                        f"offers a {kind} named {name!r}, and so does plugin {other!r} "
                        f"({self.distribution_of(other)}); disable one with "
                        "OBLETH_DISABLE_PLUGINS",
                    )
                else:
                    offers[name] = _Offer(cast(Factory, factory), plugin)
        return offers

    def _impls(self, hook: str) -> list[_Impl]:
        """The hook's implementations in the order pluggy would call them."""
        caller: pluggy.HookCaller = getattr(self._pm.hook, hook)
        return [
            _Impl(impl.plugin_name, impl.function, tuple(impl.argnames))
            for impl in reversed(caller.get_hookimpls())
        ]

    # -- what the gateway builds from -------------------------------------------------------

    def names(self, kind: Kind) -> list[str]:
        return sorted(self._offers[kind])

    def build_each(self, selected: Sequence[tuple[Kind, str]]) -> list[Any]:
        """What ``build`` makes of each ``(kind, name)``, in order.

        A name nothing offers is a ``ConfigError``, raised before any factory runs; then
        every factory is called, and those that fail are named together in one
        ``PluginError`` (a factory's own ``ConfigError`` is raised as it comes)."""
        for kind, name in selected:
            self._offer(kind, name)
        built = []
        problems: list[PluginError] = []
        for kind, name in selected:
            try:
                built.append(self.build(kind, name))
            except PluginError as problem:
                problems.append(problem)
        if problems:
            raise PluginError.together(problems)
        return built

    def build(self, kind: Kind, name: str) -> Any:
        """Call the factory the user selected by ``name`` and check what it returns."""
        offer = self._offer(kind, name)
        try:
            built = offer.factory(self.settings)
        except (ConfigError, PluginError):
            raise
        except Exception as exc:
            raise PluginError(
                offer.plugin,
                f"the factory of {kind} {name!r} raised {type(exc).__name__}: {exc}",
                distribution=self.distribution_of(offer.plugin),
            ) from exc
        role = _ROLES[kind]
        if not isinstance(built, role):
            raise PluginError(
                offer.plugin,
                f"the factory of {kind} {name!r} returned {type(built).__name__}, which lacks "
                f"what gateway.protocols.{role.__name__} requires",
                distribution=self.distribution_of(offer.plugin),
            )
        return built

    def _offer(self, kind: Kind, name: str) -> _Offer:
        offer = self._offers[kind].get(name)
        if offer is None:
            installed = ", ".join(self.names(kind)) or "none"
            raise self.settings.error(
                _SETTING_OF[kind], name, f"no {kind} by that name; installed: {installed}"
            )
        return offer

    def shielded_policy(self, name: str, policy: OverflowPolicy) -> OverflowPolicy:
        """``policy`` (selected by ``name``) shielded on the request path: when its
        ``decide`` raises or answers something other than ``queue``, ``reject`` or
        ``evict``, the plugin is named in the log and the request waits, as under ``block``.
        """
        return _ShieldedPolicy(policy, self.plugin_of("overflow policy", name), self._complain)

    def plugin_of(self, kind: Kind, name: str) -> str:
        return self._offers[kind][name].plugin

    def origin_text(self, kind: Kind, name: str) -> str:
        """`` from plugin 'p' (distribution version)``: where the ``kind`` ``name`` comes
        from, for log lines about it."""
        plugin = self.plugin_of(kind, name)
        return f" from plugin {plugin!r} ({self._origin_text(plugin)})"

    def describe(self) -> list[PluginInfo]:
        """Every registered plugin with its origin and what it offers, sorted by name."""
        result = []
        for name, _ in sorted(self._registered()):
            distribution, version = self._origin.get(name, ("unknown", ""))
            distribution = distribution or "(the application)"
            provides: dict[str, list[str]] = {}
            for kind, offers in self._offers.items():
                mine = sorted(n for n, offer in offers.items() if offer.plugin == name)
                if mine:
                    provides[kind] = mine
            for hook in hookspecs.HOOK_NAMES:
                if hook in _COLLECTORS.values():
                    continue
                if any(impl.plugin == name for impl in self._impls(hook)):
                    provides.setdefault("hooks", []).append(hook)
            result.append(PluginInfo(name, distribution, version, provides))
        return result

    # -- the request path -------------------------------------------------------------------

    def classify(self, scope: Scope, body: bytes | None) -> Classification | None:
        """The first plugin's answer; a plugin that raises is logged and skipped.

        Plugins get the headers decoded, in a dict with lower-case names.
        """
        if self.header_reader is not None:
            return self.header_reader.read(scope["headers"])
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        arguments = {"scope": scope, "headers": headers, "body": body, "settings": self.settings}
        for impl in self._classifiers:
            try:
                answer = impl(arguments)
            except BadRequest:
                raise
            except Exception:
                self._complain(impl.plugin, "hook obleth_classify_request")
                continue
            if answer is None:
                continue
            problem = _unusable(answer)
            if problem is None:
                return cast(Classification, answer)
            self._complain(impl.plugin, "hook obleth_classify_request", f"returned {problem}")
        return None

    def admitted(self, request: RequestInfo, wait_s: float) -> None:
        self._notify(
            self._on_admitted, "obleth_request_admitted", {"request": request, "wait_s": wait_s}
        )

    def rejected(self, request: RequestInfo, reason: str) -> None:
        self._notify(
            self._on_rejected, "obleth_request_rejected", {"request": request, "reason": reason}
        )

    def finished(self, request: RequestInfo, duration_s: float, outcome: str) -> None:
        self._notify(
            self._on_finished,
            "obleth_request_finished",
            {"request": request, "duration_s": duration_s, "outcome": outcome},
        )

    def routed(
        self, request: RequestInfo, upstream: str, scores: Mapping[str, Mapping[str, float]]
    ) -> None:
        self._notify(
            self._on_routed,
            "obleth_request_routed",
            {"request": request, "upstream": upstream, "scores": scores},
        )

    def complain(self, plugin: str, problem: str) -> None:
        """Log that ``plugin`` failed on the request path (rate-limited per plugin)."""
        if self._may_complain(plugin):
            origin = self._origin_text(plugin)
            log.error("plugin %r (%s): %s; the request goes on without it", plugin, origin, problem)

    def is_builtin(self, plugin: str) -> bool:
        """Whether ``plugin`` is one of Obleth's own built-in plugins."""
        return self._origin.get(plugin, ("", ""))[0] == "obleth" and plugin in self._builtins

    def _notify(self, impls: Sequence[_Impl], hook: str, arguments: Mapping[str, Any]) -> None:
        for impl in impls:
            try:
                impl(arguments)
            except Exception:
                self._complain(impl.plugin, f"hook {hook}")

    def _complain(self, plugin: str, what: str, problem: str | None = None) -> None:
        """Log that ``what`` of ``plugin`` failed on the request path (``problem``, or the
        exception being handled), at most once a minute per plugin."""
        if not self._may_complain(plugin):
            return
        where = f"plugin {plugin!r} ({self._origin_text(plugin)}), {what}"
        if problem is None:
            log.exception("%s raised; the request goes on without it", where)
        else:
            log.error("%s %s; the request goes on without it", where, problem)

    def _may_complain(self, plugin: str) -> bool:
        """Whether a complaint about ``plugin`` may be logged now: one a minute per plugin."""
        now = time.monotonic()
        if now - self._last_complaint.get(plugin, -3600.0) < 60.0:
            return False
        self._last_complaint[plugin] = now
        return True

    def _origin_text(self, plugin: str) -> str:
        return self.distribution_of(plugin) or "registered by the application"

    # -- naming -----------------------------------------------------------------------------

    def _registered(self) -> list[tuple[str, object]]:
        """Registered plugins; pluggy also lists blocked names, with None as the plugin."""
        return [(n, p) for n, p in self._pm.list_name_plugin() if p is not None]

    def distribution_of(self, plugin: str) -> str:
        """``name version`` of the distribution a plugin came from, for messages."""
        return _dist_label(self._origin.get(plugin, ("unknown", "")))


_APPLICATION: Final = ("", "")
#: the attribute ``@hookimpl`` sets on a function: its options
_MARK: Final = f"{ENTRY_POINT_GROUP}_impl"
_HOOK_LIST: Final = ", ".join(hookspecs.HOOK_NAMES)
_ACTIONS: Final[frozenset[str]] = frozenset(get_args(OverflowAction))


class _ShieldedPolicy:
    """An overflow policy whose faults are logged and answered ``queue``."""

    __slots__ = ("_complain", "_decide", "_plugin")

    def __init__(
        self,
        policy: OverflowPolicy,
        plugin: str,
        complain: Callable[..., None],
    ) -> None:
        self._decide = policy.decide
        self._plugin = plugin
        self._complain = complain

    def decide(self, view: QueueView, ticket: Ticket) -> OverflowAction:
        try:
            action = self._decide(view, ticket)
        except Exception:
            self._complain(self._plugin, "its overflow policy's decide()")
            return "queue"
        if not isinstance(action, str) or action not in _ACTIONS:  # a list is no action
            expected = ", ".join(sorted(_ACTIONS))
            self._complain(
                self._plugin,
                "its overflow policy's decide()",
                f"answered {action!r}, not one of {expected}",
            )
            return "queue"
        return action


def _unusable(answer: object) -> str | None:
    """What makes a classifier's answer unusable, said for the log; None when it is usable."""
    if not isinstance(answer, Classification):
        return f"{answer!r}, not a Classification"
    tenant, priority, routing_key, session_id = answer
    if not isinstance(tenant, str) or not tenant:
        return f"{answer!r}: the tenant must be a non-empty str"
    if priority not in PRIORITIES:
        return f"{answer!r}: the priority must be one of {', '.join(PRIORITIES)}"
    if routing_key is not None and not isinstance(routing_key, bytes):
        return f"{answer!r}: routing_key must be bytes or None"
    if session_id is not None and not isinstance(session_id, str):
        return f"{answer!r}: session_id must be a str or None"
    return None


def _unmarked_problem(attr: str, known: set[str]) -> str | None:
    if not attr.startswith("obleth_"):
        return None
    if attr not in known:
        return _no_hook(repr(attr), attr, known)
    return (
        f"defines {attr!r} without the @hookimpl marker, so it would never be called; "
        "mark it (from gateway import hookimpl)"
    )


def _marked_problem(attr: str, options: dict[str, Any], known: set[str]) -> str | None:
    hook = options.get("specname") or attr
    what = f"{attr!r}" if hook == attr else f"{attr!r} (specname {hook!r})"
    if hook not in known:
        return _no_hook(what, hook, known)
    if options.get("hookwrapper") or options.get("wrapper"):
        return (
            f"marks {what} as a hook wrapper, which Obleth does not call; "
            "use tryfirst=True or trylast=True to order it instead"
        )
    return None


def _no_hook(what: str, hook: str, known: set[str]) -> str:
    """The problem of a function that implements ``hook``, which is not in ``known``."""
    close = difflib.get_close_matches(hook, sorted(known), n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    return f"implements {what}, which is no Obleth hook{guess}; hooks are: {_HOOK_LIST}"


def _dist_label(origin: tuple[str, str]) -> str:
    """``name version``; empty for plugins the application registered in code."""
    distribution, version = origin
    return f"{distribution} {version}".strip()


def _builtin_name(module: ModuleType) -> str:
    return module.__name__.rsplit(".", 1)[-1].replace("_", "-")


def _own_version() -> str:
    try:
        return importlib.metadata.version("obleth")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
