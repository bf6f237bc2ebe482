"""How the gateway talks HTTP to upstreams: the connection pool every client to them keeps."""

from __future__ import annotations

import httpx

# Below uvicorn's default keep-alive timeout (5 s): a pooled connection is dropped by us
# before the upstream closes it, so a request is never written into a closing socket.
KEEPALIVE_EXPIRY_S = 4.0


def pooled_limits(connections: int) -> httpx.Limits:
    """Up to ``connections`` connections, every one of them kept alive between requests
    (reconnecting under load costs latency) until idle for ``KEEPALIVE_EXPIRY_S``."""
    return httpx.Limits(
        max_connections=connections,
        max_keepalive_connections=connections,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )
