"""How ``--help`` shows defaults: the formatter of every ``obleth`` parser, and the
default of a flag that stands for a setting."""

from __future__ import annotations

import argparse

from gateway.settings.declared import specs_of
from gateway.settings.doctable import shown_default
from gateway.settings.fields import Settings


class DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """``(default: X)`` after the help of every option whose default is a value, X being
    that value (the parser's own, so the help cannot drift from it). An option whose
    default is None says in its help what applies when it is left out (``of_setting``
    writes that for a flag standing for a setting); positionals show nothing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not action.option_strings
            or action.default is None
            or action.default is argparse.SUPPRESS
            or "(default: " in text
        ):
            return text
        return super()._get_help_string(action)


def of_setting(name: str) -> str:
    """``(default: $OBLETH_<NAME> if set, else <the setting's default>)``: what a flag
    standing for setting ``name`` comes to when it is left out."""
    spec = specs_of(Settings)[name]
    return f"(default: ${spec.env} if set, else {setting_default(name)})"


def setting_default(name: str) -> str:
    """Setting ``name``'s own default, as plain text (``none`` when it has none)."""
    shown = shown_default(specs_of(Settings)[name])  # as the settings table writes it
    return "none" if shown in ("*(none)*", "*(empty)*") else shown.strip("`")
