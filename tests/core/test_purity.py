"""core/ makes decisions without I/O: no event loop, network, web framework or telemetry."""

from __future__ import annotations

import ast
from pathlib import Path

import gateway.core

FORBIDDEN = {"asyncio", "redis", "starlette", "opentelemetry", "httpx", "uvicorn", "time", "socket"}


def test_core_imports_no_io_libraries() -> None:
    """Every module under gateway/core imports none of the I/O libraries."""
    core = Path(gateway.core.__file__).parent
    offenders = []
    for path in sorted(core.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
