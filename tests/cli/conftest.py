"""Fixtures of the ``obleth serve --workers`` tests: the process tree in front of a
simulated backend, on a real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cli.serve_workers import ServeWorkers
from tests.cluster.pods import SimBackend


@pytest.fixture
def sim() -> Iterator[SimBackend]:
    with SimBackend(name="workers-sim") as backend:
        yield backend


@pytest.fixture
def serve(sim: SimBackend, redis_url: str, pool_name: str) -> Iterator[ServeWorkers]:
    with ServeWorkers(sim.url, redis_url, pool_name) as pod:
        yield pod
