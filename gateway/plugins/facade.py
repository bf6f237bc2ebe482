"""The plugin facade: the only code that touches ``pm.hook``.

One ``Plugins`` per gateway (no module globals). Built-ins are registered through the
same door as third-party plugins, then entry points of the ``obleth`` group are loaded one
at a time, so that a broken one is named with its distribution.
At startup the facade collects what plugins offer, checks it, reports collisions naming
both plugins, and hands the request path plain typed callables.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import pluggy

from gateway import builtin, hookspecs
from gateway.builtin import DEFAULT_PLUGINS
from gateway.complaints import Complaints
from gateway.errors import BadRequest, PluginError
from gateway.faults import PASSED_ON
from gateway.hookspecs import HEADER_TICKETS
from gateway.plugins.checks import (
    ENTRY_POINT_GROUP,
    HeaderTicket,
    dist_label,
    header_tickets,
    hook_problems,
    load_problem,
    unusable,
)
from gateway.plugins.inventory import PluginInfo, describe
from gateway.plugins.offers import COLLECTORS, SETTING_OF, Kind, Offer, build, collect
from gateway.plugins.shield import ShieldedPolicy
from gateway.protocols import Classification, OverflowPolicy, RequestInfo
from gateway.settings import Settings
from gateway.types import Scope

log = logging.getLogger("obleth.plugins")

#: raw ASGI headers to a ticket


@dataclass(frozen=True)
class _Impl:
    """One plugin's implementation of a hook, called with just the arguments it declares."""

    plugin: str
    function: Callable[..., Any]
    argnames: tuple[str, ...]

    def __call__(self, arguments: Mapping[str, Any]) -> Any:
        return self.function(*[arguments[name] for name in self.argnames])


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
            name = builtin.plugin_name(module_name)
            self._register(importlib.import_module(module_name), name, builtin.origin())
            self._builtins.add(name)
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
        self._offers: dict[Kind, dict[str, Offer]] = {
            kind: self._collect(kind, problems) for kind in COLLECTORS
        }
        if problems:
            raise PluginError.together(problems)
        self._check_disabled_names(offered)
        self._classifiers = self._impls("obleth_classify_request")
        self._on_admitted = self._impls("obleth_request_admitted")
        self._on_rejected = self._impls("obleth_request_rejected")
        self._on_finished = self._impls("obleth_request_finished")
        self._on_routed = self._impls("obleth_request_routed")
        self._complaints = Complaints()
        #: whether any classifier reads the body (only then does the middleware read it)
        self.wants_body = any("body" in impl.argnames for impl in self._classifiers)
        #: whether any plugin observes requests (else the middleware skips the bookkeeping)
        self.observes = bool(self._on_admitted or self._on_rejected or self._on_finished)
        #: whether any plugin observes routing decisions
        self.observes_routing = bool(self._on_routed)
        #: ``headers -> Ticket`` when the only classifier offers to answer from the raw
        #: ASGI headers alone (its hook function's ``header_tickets``): the request path
        #: then classifies without a header dict or a hook call (when it raises, the caller
        #: tells ``header_ticket_failed`` and takes the default class); else None
        self.header_ticket: HeaderTicket | None = self._header_ticket()

    def _header_ticket(self) -> HeaderTicket | None:
        if len(self._classifiers) != 1:
            return None
        impl = self._classifiers[0]
        offer = getattr(impl.function, HEADER_TICKETS, None)
        if offer is None:
            return None
        plugin = impl.plugin
        where = f"{HEADER_TICKETS} of obleth_classify_request"
        complain = functools.partial(self._complain, plugin, where)
        trusted = plugin in self._builtins  # ours: its answers need no check per request
        distribution = self.distribution_of(plugin)
        return header_tickets(
            offer, self.settings, plugin, distribution, None if trusted else complain
        )

    def header_ticket_failed(self) -> None:
        """Log that the header-only classification (``header_ticket``) raised, naming its
        plugin, at most once a minute; the caller goes on with the default class."""
        self._complain(self._classifiers[0].plugin, f"{HEADER_TICKETS} of obleth_classify_request")

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
                distribution=dist_label(origin) or None,
            )
        try:
            self._pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginError(
                name, f"could not be registered: {exc}", distribution=dist_label(origin) or None
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
            except PASSED_ON:
                raise
            except BaseException as exc:  # a sys.exit() at import is a fault, not a stop
                problems.append(load_problem(entry_point.name, entry_point.value, origin, exc))
                continue
            try:
                self._register(plugin, entry_point.name, origin)
            except PluginError as problem:
                problems.append(problem)
        return {entry_point.name for entry_point in found}

    def _hook_name_problems(self) -> list[PluginError]:
        """See ``checks.hook_problems``."""
        return [
            PluginError(name, problem, distribution=self.distribution_of(name))
            for name, plugin in self._registered()
            for problem in hook_problems(plugin)
        ]

    def _check_disabled_names(self, offered: set[str]) -> None:
        """A name in ``disable_plugins`` that no plugin here has is most likely a typo
        (the plugin meant stays enabled), but may as well name a plugin installed on
        other pods only: said in the log, not fatal."""
        unknown = [name for name in self.settings.disable_plugins if name not in offered]
        if unknown:
            log.warning(
                "disable_plugins (OBLETH_DISABLE_PLUGINS) names %s, which no plugin here "
                "has; plugins: %s",
                ", ".join(map(repr, unknown)),
                ", ".join(sorted(offered)),
            )

    def _collect(self, kind: Kind, problems: list[PluginError]) -> dict[str, Offer]:
        """Every plugin's offers of ``kind`` (see ``offers.collect``); problems are added
        to ``problems``."""

        def problem(plugin: str, text: str) -> PluginError:
            error = PluginError(plugin, text, distribution=self.distribution_of(plugin))
            problems.append(error)
            return error

        collectors = [
            (impl.plugin, functools.partial(impl, {})) for impl in self._impls(COLLECTORS[kind])
        ]
        # the built-ins' offers first: a plugin offering one of their names is the one told
        collectors.sort(key=lambda collector: collector[0] not in self._builtins)
        return collect(kind, collectors, problem, self.distribution_of)

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
        return build(kind, name, offer, self.settings, self.distribution_of(offer.plugin))

    def _offer(self, kind: Kind, name: str) -> Offer:
        offer = self._offers[kind].get(name)
        if offer is None:
            installed = ", ".join(self.names(kind)) or "none"
            raise self.settings.error(
                SETTING_OF[kind], name, f"no {kind} by that name; installed: {installed}"
            )
        return offer

    def shielded_policy(self, name: str, policy: OverflowPolicy) -> OverflowPolicy:
        """``policy`` (selected by ``name``) shielded on the request path: when its
        ``decide`` raises or answers no action (``wait``, ``queue``, ``evict`` or
        ``reject``), the plugin is named in the log and the request waits, as under
        ``block``.
        """
        return ShieldedPolicy(policy, self.plugin_of("overflow policy", name), self._complain)

    def plugin_of(self, kind: Kind, name: str) -> str:
        return self._offers[kind][name].plugin

    def origin_text(self, kind: Kind, name: str) -> str:
        """`` from plugin 'p' (distribution version)``: where the ``kind`` ``name`` comes
        from, for log lines about it."""
        plugin = self.plugin_of(kind, name)
        return f" from plugin {plugin!r} ({self._origin_text(plugin)})"

    def describe(self) -> list[PluginInfo]:
        """Every registered plugin with its origin and what it offers, sorted by name."""
        hooks = {hook: self._impls(hook) for hook in hookspecs.HOOK_NAMES}
        implementers = {
            hook: {impl.plugin for impl in impls}
            for hook, impls in hooks.items()
            if hook not in COLLECTORS.values()
        }
        return describe(dict(self._registered()), self._origin, self._offers, implementers)

    # -- the request path -------------------------------------------------------------------

    def classify(self, scope: Scope, body: bytes | None) -> Classification | None:
        """The first plugin's answer through the hook (``header_ticket``, when offered, is
        the caller's to try first); a plugin that raises (anything but ``BadRequest``
        and ``gateway.faults.PASSED_ON``) is logged and skipped. Plugins get the headers
        decoded, in a dict with lower-case names."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        arguments = {"scope": scope, "headers": headers, "body": body, "settings": self.settings}
        for impl in self._classifiers:
            try:
                answer = impl(arguments)
            except BadRequest:
                raise
            except PASSED_ON:
                raise
            except BaseException:  # SystemExit too: see gateway.faults
                self._complain(impl.plugin, "hook obleth_classify_request")
                continue
            if answer is None:
                continue
            problem = unusable(answer)
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
        self._complain(plugin, "", problem)

    def is_builtin(self, plugin: str) -> bool:
        """Whether ``plugin`` is one of Obleth's own built-in plugins."""
        return self._origin.get(plugin, ("", ""))[0] == "obleth" and plugin in self._builtins

    def _notify(self, impls: Sequence[_Impl], hook: str, arguments: Mapping[str, Any]) -> None:
        for impl in impls:
            try:
                impl(arguments)
            except PASSED_ON:
                raise
            except BaseException:
                self._complain(impl.plugin, f"hook {hook}")

    def _complain(self, plugin: str, what: str, problem: str | None = None) -> None:
        """Log that ``what`` of ``plugin`` failed on the request path (``problem``, or the
        exception being handled), at most once a minute per plugin."""
        if not self._complaints.may(plugin):
            return
        where = f"plugin {plugin!r} ({self._origin_text(plugin)})" + (f", {what}" if what else ":")
        if problem is None:
            log.exception("%s raised; the request goes on without it", where)
        else:
            log.error("%s %s; the request goes on without it", where, problem)

    def _origin_text(self, plugin: str) -> str:
        return self.distribution_of(plugin) or "registered by the application"

    # -- naming -----------------------------------------------------------------------------

    def _registered(self) -> list[tuple[str, object]]:
        """Registered plugins; pluggy also lists blocked names, with None as the plugin."""
        return [(n, p) for n, p in self._pm.list_name_plugin() if p is not None]

    def distribution_of(self, plugin: str) -> str:
        """``name version`` of the distribution a plugin came from, for messages."""
        return dist_label(self._origin.get(plugin, ("unknown", "")))


_APPLICATION: Final = ("", "")
