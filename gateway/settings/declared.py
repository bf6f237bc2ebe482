"""Settings declared once: ``setting()``, the dataclass field that carries a setting's
parser, check and doc line; ``Spec``, what one declaration holds; and ``Declared``, the
base class that turns a dataclass of such fields into validated settings.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Self, TypeVar, cast

from gateway.errors import ConfigError
from gateway.settings.environ import ENV_PREFIX, check_env_text, read_environ, unknown_setting

_T = TypeVar("_T")

EnvParser = Callable[[str, str], Any]
"""``parse(key, text)``: the value of variable ``key`` written as ``text`` (see ``parsers``)."""

Check = Callable[[Any, str, Any], Any]
"""``check(settings, name, value)``: ``value`` normalised, or ``ConfigError`` naming the
setting as the user wrote it (see ``checks``)."""

_METADATA_KEY = "obleth.setting"


@dataclass(frozen=True, slots=True)
class _Declaration:
    doc: str
    parse: EnvParser
    check: Check
    shown_default: str | None


def setting(
    default: _T,
    *,
    doc: str,
    parse: EnvParser,
    check: Check,
    shown_default: str | None = None,
    secret: bool = False,
) -> _T:
    """A field of a ``Declared`` dataclass: a setting with its ``default``, read from
    ``OBLETH_<NAME>`` by ``parse``, checked by ``check`` and described by ``doc``.

    ``doc`` is one line of Markdown, the setting's row in the reference table of
    docs/configuration.md (``python -m gateway.settings.doctable`` writes it there).
    ``shown_default`` stands in that table for a default the value would misdescribe, such
    as a None that means "computed from other settings". A mapping default is frozen and
    handed out by a factory, as dataclasses refuse mutable defaults. A ``secret`` (a
    token) is left out of the settings' ``repr``, so that logging them never leaks it.
    """
    metadata = {_METADATA_KEY: _Declaration(doc, parse, check, shown_default)}
    if isinstance(default, Mapping):
        frozen = MappingProxyType(dict(default))
        return field(default_factory=cast("Callable[[], _T]", lambda: frozen), metadata=metadata)
    return field(default=default, metadata=metadata, repr=not secret)


@dataclass(frozen=True, slots=True)
class Spec:
    """One setting as declared: its name and default, and what ``setting()`` was given."""

    name: str
    default: Any
    doc: str
    parse: EnvParser
    check: Check
    shown_default: str | None

    @property
    def env(self) -> str:
        """The setting's environment variable, ``OBLETH_<NAME>``."""
        return ENV_PREFIX + self.name.upper()


_specs_by_class: dict[type, Mapping[str, Spec]] = {}


def specs_of(cls: type) -> Mapping[str, Spec]:
    """The settings declared on the dataclass ``cls``, by name, in declaration order."""
    specs = _specs_by_class.get(cls)
    if specs is None:
        specs = _specs_by_class[cls] = MappingProxyType(_declared_on(cls))
    return specs


def _declared_on(cls: type) -> dict[str, Spec]:
    specs: dict[str, Spec] = {}
    for each in dataclasses.fields(cls):
        declared = each.metadata.get(_METADATA_KEY)
        if declared is None:
            continue
        factory = each.default_factory
        default = factory() if callable(factory) else each.default
        specs[each.name] = Spec(
            each.name,
            default,
            declared.doc,
            declared.parse,
            declared.check,
            declared.shown_default,
        )
    return specs


@dataclass(frozen=True, kw_only=True)
class Declared:
    """What a frozen dataclass of ``setting()`` fields can rely on:

    - a keyword that is no setting is a ``ConfigError`` suggesting the closest name (it is
      caught in ``__new__``, before the generated ``__init__`` would raise a bare
      ``TypeError``);
    - every value is checked, in declaration order, whenever an instance is built
      (``replace`` and ``dataclasses.replace`` included);
    - ``from_env`` reads ``OBLETH_*`` variables; ``label`` and ``error`` name a setting
      as the user wrote it.
    """

    env_text: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """The settings read from ``OBLETH_*`` variables (by ``from_env``; the others were given
    as keywords, such as a command's flags), each with the text as written, so that errors
    name the variable and show what the user wrote."""

    def __new__(cls, *args: Any, **values: Any) -> Self:
        specs = specs_of(cls)
        for name, value in values.items():
            if name == "env_text":
                check_env_text(value, specs)
            elif name not in specs:
                raise unknown_setting(name, value, list(specs))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for spec in specs_of(type(self)).values():
            value = spec.check(self, spec.name, getattr(self, spec.name))
            object.__setattr__(self, spec.name, value)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """Settings from ``OBLETH_*`` variables; keyword ``overrides`` win over them.

        An ``OBLETH_*`` variable that is no setting is an error (a typo must not be
        silently ignored).
        """
        environ = os.environ if environ is None else environ
        specs = specs_of(cls)
        values = read_environ(environ, specs)
        # by setting name, as read_environ matches them (OBLETH_max_queue is max_queue)
        written = {key[len(ENV_PREFIX) :].lower(): text for key, text in environ.items()
                   if key.startswith(ENV_PREFIX)}  # fmt: skip
        texts = {name: written[name] for name in values if name not in overrides}
        values.update(overrides)
        return cls(**values, env_text=MappingProxyType(texts))

    @property
    def env_names(self) -> frozenset[str]:
        """The settings read from ``OBLETH_*`` variables."""
        return frozenset(self.env_text)

    def label(self, name: str, *, like: str | None = None) -> str:
        """The setting as the user wrote it: the environment variable or the keyword. With
        ``like``, a setting the user may not have written, named as ``like`` was (so
        that a message about ``OBLETH_X`` says ``OBLETH_Y``, not ``y``)."""
        from_env = name in self.env_names or (like is not None and like in self.env_names)
        return ENV_PREFIX + name.upper() if from_env else name

    def chose(self, name: str) -> bool:
        """Whether the user set ``name``: read from the environment, or given a value other
        than its default. A check that finds two settings in conflict blames the one the
        user chose (a default the user never wrote is not where to look)."""
        return name in self.env_names or getattr(self, name) != specs_of(type(self))[name].default

    def error(self, name: str, value: object, expected: str) -> ConfigError:
        """The error for setting ``name`` given ``value``, naming it as the user wrote it.
        When ``value`` is a whole list or mapping read from a variable, the message shows
        the variable's text instead of what it was parsed into (``'a,b'``, not
        ``('a', 'b')``); a number or a word shows as parsed, and a check that shows a
        part, or hides a secret, passes that and it is kept."""
        text = self.env_text.get(name)
        if (
            text is not None
            and isinstance(value, (Mapping, tuple, list, set, frozenset))
            and _same(value, getattr(self, name, _UNSET))
        ):
            value = text
        return ConfigError(self.label(name), value, expected)

    def replace(self, **changes: Any) -> Self:
        """These settings with ``changes``, given as keywords (an error names them so)."""
        kept = {name: text for name, text in self.env_text.items() if name not in changes}
        return dataclasses.replace(self, **changes, env_text=MappingProxyType(kept))


_UNSET = object()


def _same(value: object, stored: object) -> bool:
    """Whether a check's ``value`` is the setting's ``stored`` value (never raising: a
    value may compare badly)."""
    if value is stored:
        return True
    try:
        return bool(value == stored)
    except Exception:
        return False
