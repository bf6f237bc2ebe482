"""Fixtures shared by every test."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Obleth is asyncio code: run anyio-marked tests on asyncio only, not on trio too."""
    return "asyncio"
