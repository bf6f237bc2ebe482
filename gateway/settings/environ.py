"""``OBLETH_*`` variables read into settings, and the errors for names that are no setting."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from gateway.errors import ConfigError, without_userinfo
from gateway.settings.parsers import READS_BLANK

if TYPE_CHECKING:
    from gateway.settings.declared import Spec

ENV_PREFIX = "OBLETH_"

#: what Kubernetes sets in every pod for each Service of its namespace (its "service
#: links"): a Service named ``obleth`` or ``obleth-redis`` gives ``OBLETH_SERVICE_HOST``,
#: ``OBLETH_PORT_8000_TCP_ADDR``, ``OBLETH_REDIS_PORT`` and the like, which no one wrote
#: and which must not stop the gateway as misspelt settings would
_SERVICE_LINK = re.compile(
    r"(OBLETH(?:_[A-Z0-9_]+?)??)_(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?"
    r"|PORT(?:_[0-9]+_(?:TCP|UDP|SCTP)(?:_(?:PROTO|PORT|ADDR))?)?)"
)


def service_link(key: str, environ: Mapping[str, str]) -> bool:
    """Whether ``key`` is one of those variables: shaped like one, and its Service's
    ``<SERVICE>_SERVICE_HOST`` is set too, as Kubernetes always sets it (so that a typo
    such as ``OBLETH_PORT=9000``, written alone, is still refused)."""
    found = _SERVICE_LINK.fullmatch(key)
    return found is not None and f"{found[1]}_SERVICE_HOST" in environ


def read_environ(environ: Mapping[str, str], specs: Mapping[str, Spec]) -> dict[str, Any]:
    """The ``OBLETH_*`` variables of ``environ``, each read by its setting's parser, by
    setting name. Other variables are left alone; so are those of an installed plugin's
    own namespace (``plugin_prefixes``). Any other ``OBLETH_*`` variable that is no
    setting is an error (a typo must not silently leave a limit unset).

    A blank variable (empty, or spaces) is unset: the setting keeps its default, as
    deployment tools write ``OBLETH_X=`` for a value left out. Only a parser that gives
    blank a meaning of its own (``parsers.READS_BLANK``: None, such as "no time limit")
    reads it."""
    values: dict[str, Any] = {}
    written: dict[str, str] = {}  # setting name: the variable that set it
    owned: tuple[str, ...] | None = None
    for key, text in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        spec = specs.get(key[len(ENV_PREFIX) :].lower())
        if spec is not None and written.setdefault(spec.name, key) != key:
            shown = "<hidden>" if _SECRET.search(key) or _has_password(text) else text
            raise ConfigError(
                key,
                shown,
                f"{written[spec.name]} sets the same setting; set one of the two (as {spec.env})",
            )
        if spec is None:
            if service_link(key, environ):
                continue  # Kubernetes' own, for a Service named obleth...
            if owned is None:
                owned = plugin_prefixes()
            if key.startswith(owned) and not _slip_of_a_setting(key, owned, specs):
                continue  # the plugin's own setting: the plugin reads it
            known = [each.env for each in specs.values()]
            raise unknown_setting(key, text, known, near=_plugin_slip(key, known, owned))
        if text.strip() or spec.parse in READS_BLANK:
            values[spec.name] = spec.parse(key, text)
    return values


def _slip_of_a_setting(key: str, owned: tuple[str, ...], specs: Mapping[str, Spec]) -> bool:
    """Whether ``key``, under a plugin's prefix, is all but the name of one of Obleth's
    own settings under that prefix too: a plugin named ``tenant`` must not turn
    ``OBLETH_TENANT_HEADRE`` into its own variable, and ``tenant_header`` silently off."""
    prefix = next(p for p in owned if key.startswith(p))
    ours = [spec.env for spec in specs.values() if spec.env.startswith(prefix)]
    return bool(ours) and bool(difflib.get_close_matches(key, ours, n=1, cutoff=0.9))


def plugin_prefixes() -> tuple[str, ...]:
    """``OBLETH_<NAME>_`` for every installed plugin of the ``obleth`` entry-point group:
    the variables a plugin reads for its own settings (``OBLETH_KV_PRESSURE_HIGH`` for the
    plugin ``kv-pressure``). Read from the installed distributions' metadata, without
    importing any plugin."""
    names = {point.name for point in entry_points(group="obleth")}
    return tuple(f"{ENV_PREFIX}{name.upper().replace('-', '_')}_" for name in sorted(names) if name)


def _plugin_slip(key: str, known: Sequence[str], prefixes: tuple[str, ...]) -> str | None:
    """What ``key`` stands for when its prefix is all but an installed plugin's
    (``OBLETH_KV_PRESURE_HIGH`` for ``OBLETH_KV_PRESSURE_HIGH``), unless it is closer still
    to one of Obleth's own ``known`` variables; else None."""
    if difflib.get_close_matches(key, known, n=1, cutoff=0.9):
        return None
    best, best_ratio = None, 0.9
    for prefix in prefixes:
        for cut in range(len(prefix) - 2, len(prefix) + 3):
            head = key[:cut]
            ratio = difflib.SequenceMatcher(None, head, prefix).ratio()
            if head != prefix and ratio >= best_ratio:
                best, best_ratio = prefix + key[cut:], ratio
    return best


def unknown_setting(
    written: str, value: object, known: Sequence[str], *, near: str | None = None
) -> ConfigError:
    """The error for ``written=value`` when ``written`` is none of the ``known`` names (all
    variables or all keywords, as the user wrote it), suggesting ``near`` or else the
    closest known one. The value is hidden when it may be a secret: a misspelt
    ``OBLETH_ADMIN_TOKEN`` must not print the token, nor a misspelt ``OBLETH_REDIS_URL``
    its password."""
    close = [near] if near is not None else difflib.get_close_matches(written, known, n=1)
    near = close[0] if close else None
    hint = f"did you mean {near}? " if near else ""
    if _SECRET.search(" ".join([written, *close])) or _has_password(value):
        value = "<hidden>"
    return ConfigError(written, value, f"no such setting; {hint}known: {', '.join(known)}")


#: the words of a name whose value may be a secret
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|KEY|AUTH|CREDENTIAL", re.IGNORECASE)


def _has_password(value: object) -> bool:
    """Whether ``value`` may be a URL carrying a password: in its user part (also without
    a scheme), or as ``?password=`` (which redis-py reads)."""
    if not isinstance(value, str):
        return False
    return "password=" in value.lower() or without_userinfo(value.strip()) != value.strip()


def check_env_text(value: object, specs: Mapping[str, Spec]) -> None:
    """``env_text`` given as a keyword: only ``from_env`` (and ``replace``) should."""
    if not isinstance(value, Mapping) or not value.keys() <= specs.keys():
        raise ConfigError(
            "env_text",
            value,
            "is set by Settings.from_env (setting names and their text); leave it out",
        )
