"""Where the proxy finds the router's route for a request."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.proxy import Reroutable, route_of
from tests.proxy.upstreams import FakeRoute

ROUTE = FakeRoute("http://127.0.0.1:8000", "http://127.0.0.1:8001")


@pytest.mark.parametrize(
    ("state", "found"),
    [
        (None, None),
        ("not a mapping", None),
        ({}, None),
        ({"obleth": None}, None),
        ({"obleth": {"upstream": "http://127.0.0.1:8000"}}, None),
        ({"obleth": {"route": "http://127.0.0.1:8000"}}, None),
        ({"obleth": {"route": ROUTE}}, ROUTE),
    ],
)
def test_the_route_is_read_from_the_scope_state_when_it_is_reroutable(
    state: Any, found: Reroutable | None
) -> None:
    """Only an object with ``upstream`` and ``reroute`` counts; anything else is no route."""
    scope: dict[str, Any] = {"type": "http"}
    if state is not None:
        scope["state"] = state
    assert route_of(scope) is found
