"""core/ makes decisions without I/O: no event loop, network, web framework or telemetry,
and nothing of the gateway above it (settings, backends, the request path), so that every
layer can use it and its tests need nothing running."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import gateway.core

FORBIDDEN = {"asyncio", "redis", "starlette", "opentelemetry", "httpx", "uvicorn", "time", "socket"}
CORE = Path(gateway.core.__file__).parent


def imported(tree: ast.AST) -> Iterator[str]:
    """Every module an import in ``tree`` names, at any depth (in functions too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against gateway.core
                yield "gateway.core" + ("." + node.module if node.module else "")
            elif node.module:
                yield node.module


def offences(name: str) -> bool:
    top = name.split(".")[0]
    outside_core = top == "gateway" and not (
        name == "gateway.core" or name.startswith("gateway.core.")
    )
    return top in FORBIDDEN or outside_core


def test_core_imports_no_io_library_and_nothing_of_the_gateway_above_it() -> None:
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        where = path.relative_to(CORE)
        offenders += [f"{where}: {name}" for name in imported(tree) if offences(name)]
    assert offenders == []


def test_the_check_catches_what_it_forbids() -> None:
    """The check itself: an I/O import, a gateway import outside core and one nested in a
    function are offences; core's own modules and the standard library are not."""
    source = (
        "import asyncio\n"
        "from gateway.settings import Settings\n"
        "from gateway.core.tickets import Ticket\n"
        "from . import fairqueue\n"
        "import heapq\n"
        "def later():\n"
        "    from gateway.errors import Rejected\n"
    )
    found = [name for name in imported(ast.parse(source)) if offences(name)]
    assert found == ["asyncio", "gateway.settings", "gateway.errors"]
