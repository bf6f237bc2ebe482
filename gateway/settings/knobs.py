"""``PluginKnobs``: a plugin's own ``OBLETH_<NAME>_*`` variables, read and checked.

Obleth leaves the variables under a plugin's name to the plugin (see
``gateway.settings.environ``); this is how a plugin reads them with the same rules and
errors as Obleth's own settings: a blank variable counts as unset, and a value out of
bounds is a ``ConfigError`` naming the variable, what it expects and an example, raised
from the plugin's factory so that startup stops on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import overload

from gateway.errors import ConfigError


class PluginKnobs:
    """The variables ``prefix + NAME`` of ``environ`` (``OBLETH_KV_PRESSURE_`` for the
    plugin ``kv-pressure``)."""

    def __init__(self, environ: Mapping[str, str], prefix: str) -> None:
        self._environ = environ
        self.prefix = prefix

    def raw(self, name: str) -> str | None:
        """The variable's text; None when it is unset or blank."""
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

    def error(self, name: str, value: object, expected: str) -> ConfigError:
        """The error for variable ``NAME``: a plugin's own cross-checks use it too."""
        return ConfigError(self.prefix + name, value, expected)
