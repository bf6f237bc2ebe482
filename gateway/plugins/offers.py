"""What plugins offer by name (capacity providers, overflow policies, routing scorers),
collected at startup and built when the settings select them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from gateway.errors import ConfigError, PluginError
from gateway.faults import PASSED_ON
from gateway.plugins.checks import NAME
from gateway.protocols import (
    CapacityProvider,
    Factory,
    OverflowPolicy,
    RoutingScorer,
)
from gateway.settings import Settings

Kind = Literal["capacity provider", "overflow policy", "routing scorer"]

#: the hook that collects each kind
COLLECTORS: Final[dict[Kind, str]] = {
    "capacity provider": "obleth_capacity_providers",
    "overflow policy": "obleth_overflow_policies",
    "routing scorer": "obleth_routing_scorers",
}
#: what each kind's factory must return
_ROLES: Final[dict[Kind, type]] = {
    "capacity provider": CapacityProvider,
    "overflow policy": OverflowPolicy,
    "routing scorer": RoutingScorer,
}
#: the setting that selects each kind by name
SETTING_OF: Final[dict[Kind, str]] = {
    "capacity provider": "capacity_providers",
    "overflow policy": "overflow_policy",
    "routing scorer": "routing_scorers",
}


@dataclass(frozen=True)
class Offer:
    factory: Factory
    plugin: str


#: one plugin's call of a collecting hook: (plugin name, the call)
Collector = tuple[str, Callable[[], object]]


def collect(
    kind: Kind,
    collectors: Iterable[Collector],
    problem: Callable[[str, str], PluginError],
    distribution_of: Callable[[str], str],
) -> dict[str, Offer]:
    """Every plugin's offers of ``kind`` by name. What cannot be used (the hook raised or
    answered something other than a dict, a bad name or factory, a name offered twice)
    is reported through ``problem(plugin, text)`` and left out; the first offer of a name
    is kept."""
    offers: dict[str, Offer] = {}
    hook = COLLECTORS[kind]
    for plugin, call in collectors:
        try:
            offered = call()
        except PASSED_ON:
            raise
        except BaseException as exc:  # SystemExit too: see gateway.faults
            problem(plugin, f"{hook}() raised {type(exc).__name__}: {exc}").__cause__ = exc
            continue
        if offered is None:
            continue
        if not isinstance(offered, Mapping):
            problem(
                plugin,
                f"{hook}() returned {type(offered).__name__}; expected a dict of {{name: factory}}",
            )
            continue
        for name, factory in offered.items():
            if not isinstance(name, str) or not NAME.match(name):
                problem(plugin, f"offers a {kind} named {name!r}; names are lower-case kebab-case")
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
                    f"({distribution_of(other)}); disable one with OBLETH_DISABLE_PLUGINS",
                )
            else:
                offers[name] = Offer(cast(Factory, factory), plugin)
    return offers


def build(
    kind: Kind,
    name: str,
    offer: Offer,
    settings: Settings,
    distribution: str,
) -> Any:
    """Call the factory of ``offer`` (the ``kind`` selected by ``name``) and check that
    what it returns can play its role; a failure is a ``PluginError`` naming the plugin
    (a factory's own ``ConfigError`` is raised as it comes)."""
    try:
        built = offer.factory(settings)
    except (ConfigError, PluginError):
        raise
    except PASSED_ON:
        raise
    except BaseException as exc:  # SystemExit too: see gateway.faults
        raise PluginError(
            offer.plugin,
            f"the factory of {kind} {name!r} raised {type(exc).__name__}: {exc}",
            distribution=distribution,
        ) from exc
    role = _ROLES[kind]
    if not isinstance(built, role):
        raise PluginError(
            offer.plugin,
            f"the factory of {kind} {name!r} returned {type(built).__name__}, which lacks "
            f"what gateway.protocols.{role.__name__} requires",
            distribution=distribution,
        )
    return built
