"""Fixtures shared by the simulator tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """The simulator is asyncio code: run async tests on asyncio only, not on trio too."""
    return "asyncio"
