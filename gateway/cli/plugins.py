"""``obleth plugins``: what is installed and what each plugin provides."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from gateway.cli.defaults import DefaultsShown
from gateway.plugins import Plugins
from gateway.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "plugins",
        help="list installed plugins and what each provides",
        description="List every plugin (built-in and installed through the 'obleth' entry "
        "point group) with its distribution, version and what it provides. A plugin that "
        "fails to load is reported by name, with its distribution.",
        formatter_class=DefaultsShown,
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    plugins = Plugins(Settings.from_env())
    infos = plugins.describe()
    if args.json:
        print(json.dumps([asdict(info) for info in infos], indent=2))
        return 0
    rows: list[tuple[str, ...]] = [("PLUGIN", "DISTRIBUTION", "VERSION", "PROVIDES")]
    for info in infos:
        rows.append((info.name, info.distribution, info.version, _provides(info.provides)))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
            + "  "
            + row[3]
        )
    return 0


def _provides(provides: dict[str, Any]) -> str:
    return "; ".join(f"{kind}: {', '.join(names)}" for kind, names in provides.items()) or "-"
