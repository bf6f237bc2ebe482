"""The ``session-affinity`` scorer: keep a session on one upstream."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core.rendezvous import stable_hash
from gateway.hookimpl import hookimpl
from gateway.protocols import Factory
from gateway.routing.request import RouteRequest
from gateway.settings import Settings


class SessionAffinity:
    """Score = 1 for the upstream rendezvous hashing assigns to the session id, else 0.

    The session id comes from the ``session_header`` request header (or a classifier
    plugin). Every pod assigns a session to the same upstream; when that upstream leaves
    the candidates (unhealthy, saturated), only its sessions move. Requests without a
    session id score 0 everywhere.
    """

    def __init__(self, settings: Settings) -> None:
        pass

    def score(self, request: RouteRequest, upstreams: list[str]) -> Mapping[str, float]:
        if not request.session_id:
            return {}
        chosen = request.fleet.rendezvous(stable_hash(request.session_id), upstreams)
        return {} if chosen is None else {chosen: 1.0}


@hookimpl(trylast=True)
def obleth_routing_scorers() -> Mapping[str, Factory]:
    return {"session-affinity": SessionAffinity}
