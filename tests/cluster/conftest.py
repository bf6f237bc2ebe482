"""Fixtures of the multi-process cluster tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.pods import SimBackend


@pytest.fixture(scope="module")
def sim() -> Iterator[SimBackend]:
    """One simulated backend process for the module; tests reset it."""
    with SimBackend() as backend:
        yield backend


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """Where the test's processes write their logs (quoted in assertion messages)."""
    return tmp_path
