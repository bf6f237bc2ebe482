"""``PluginKnobs``: a plugin's own ``OBLETH_<NAME>_*`` variables, read and checked.

Obleth leaves the variables under a plugin's name to the plugin (see
``gateway.settings.environ``); this is how a plugin reads them with the same rules and
errors as Obleth's own settings: a blank variable counts as unset, and a value out of
bounds is a ``ConfigError`` naming the variable, what it expects and an example, raised
from the plugin's factory so that startup stops on it; and, once the plugin has read
its knobs (``done``), a variable under its name that it did not read is a typo, an error
that suggests the closest name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import overload

from gateway.errors import ConfigError
from gateway.settings.environ import ENV_PREFIX, plugin_prefixes, service_link, unknown_setting


class PluginKnobs:
    """The variables ``prefix + NAME`` of ``environ`` (``OBLETH_KV_PRESSURE_`` for the
    plugin ``kv-pressure``)."""

    def __init__(self, environ: Mapping[str, str], prefix: str) -> None:
        self._environ = environ
        self.prefix = prefix
        #: the names asked for so far (``done`` reports any other variable as a typo)
        self._asked: set[str] = set()

    def raw(self, name: str) -> str | None:
        """The variable's text; None when it is unset or blank."""
        self._asked.add(name)
        raw = self._environ.get(self.prefix + name)
        return None if raw is None or not raw.strip() else raw

    @overload
    def whole(self, name: str, default: int, *, least: int) -> int: ...
    @overload
    def whole(self, name: str, default: None, *, least: int) -> int | None: ...
    def whole(self, name: str, default: int | None, *, least: int) -> int | None:
        """A whole number of at least ``least``; ``default`` when unset."""
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            value = least - 1
        if value < least:
            raise self.error(name, raw, f"expected a whole number of at least {least}")
        return value

    def number(
        self,
        name: str,
        default: float,
        *,
        least: float | None = None,
        above: float | None = None,
        most: float | None = None,
        expected: str | None = None,
    ) -> float:
        """A finite number within the bounds given; ``default`` when unset. The error says
        ``expected`` (``a fraction from 0 to 1``, say), else the bounds, and gives
        ``default`` as an example."""
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        fits = math.isfinite(value) and (least is None or value >= least)
        fits = fits and (above is None or value > above) and (most is None or value <= most)
        if not fits:
            if expected is None:
                bounds = [f"at least {least:g}"] if least is not None else []
                bounds += [f"above {above:g}"] if above is not None else []
                bounds += [f"at most {most:g}"] if most is not None else []
                expected = " ".join(["a number", " and ".join(bounds)]).strip()
            raise self.error(name, raw, f"expected {expected}, e.g. {default:g}")
        return value

    def done(self) -> None:
        """Call once every knob is read: a variable under the prefix that was never asked
        for (``OBLETH_KV_PRESSURE_HIHG``) is a ``ConfigError`` suggesting the closest
        name, as a typo in Obleth's own variables is. Variables of another installed
        plugin whose name extends this one's (``OBLETH_KV_`` and ``OBLETH_KV_PRESSURE_``)
        are that plugin's, and so are Obleth's own settings (``OBLETH_TENANT_HEADER``
        under a plugin named ``tenant``)."""
        from gateway.settings.fields import setting_names  # a cycle at import time

        prefix = self.prefix
        others = tuple(p for p in plugin_prefixes() if p != prefix and p.startswith(prefix))
        known = sorted(prefix + name for name in self._asked)
        core = {ENV_PREFIX + name.upper() for name in setting_names()}
        for key, value in self._environ.items():
            ours = key.startswith(prefix) and not key.startswith(others) and key not in core
            ours = ours and not service_link(key, self._environ)  # Kubernetes', not a typo
            if ours and key[len(prefix) :] not in self._asked:
                raise unknown_setting(key, value, known)

    def error(self, name: str, value: object, expected: str) -> ConfigError:
        """The error for variable ``NAME``: a plugin's own cross-checks use it too."""
        return ConfigError(self.prefix + name, value, expected)
