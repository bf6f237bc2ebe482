"""``OBLETH_*`` variables read into settings, and the errors for names that are no setting."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.errors import ConfigError

if TYPE_CHECKING:
    from gateway.settings.declared import Spec

ENV_PREFIX = "OBLETH_"


def read_environ(environ: Mapping[str, str], specs: Mapping[str, Spec]) -> dict[str, Any]:
    """The ``OBLETH_*`` variables of ``environ``, each read by its setting's parser, by
    setting name. Other variables are left alone; an ``OBLETH_*`` variable that is no
    setting is an error (a typo must not silently leave a limit unset)."""
    values: dict[str, Any] = {}
    for key, text in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        spec = specs.get(key[len(ENV_PREFIX) :].lower())
        if spec is None:
            raise unknown_setting(key, text, [known.env for known in specs.values()])
        values[spec.name] = spec.parse(key, text)
    return values


def unknown_setting(written: str, value: object, known: Sequence[str]) -> ConfigError:
    """The error for ``written=value`` when ``written`` is none of the ``known`` names (all
    variables or all keywords, as the user wrote it), suggesting the closest one."""
    near = difflib.get_close_matches(written, known, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    return ConfigError(written, value, f"no such setting; {hint}known: {', '.join(known)}")


def check_env_names(value: object, specs: Mapping[str, Spec]) -> None:
    """``env_names`` given as a keyword: only ``from_env`` (and ``replace``) should."""
    if not isinstance(value, frozenset) or not value <= specs.keys():
        raise ConfigError(
            "env_names",
            value,
            "is set by Settings.from_env (a frozenset of setting names); leave it out",
        )
