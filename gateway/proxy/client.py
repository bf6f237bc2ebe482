"""The one HTTP client a proxy shares across all its requests, sized for long streams."""

from __future__ import annotations

import httpx

# Below uvicorn's default keep-alive timeout (5 s): a pooled connection is dropped by us
# before the upstream closes it, so a request is never written into a closing socket.
KEEPALIVE_EXPIRY_S = 4.0


def upstream_client(*, connect_timeout_s: float, max_connections: int) -> httpx.AsyncClient:
    """A client for forwarding: pooled keep-alive connections, no read timeout.

    - No read or write timeout: a completion may stream for minutes and a client may
      upload slowly. The proxy's own ``response_timeout_s`` and ``read_timeout_s`` (see
      ``gateway.proxy.exchange``) bound the waits on the upstream, as httpx's read timeout
      could not: it is one value for the response headers and every body chunk alike.
    - ``connect_timeout_s`` bounds both connecting and waiting for a free pooled
      connection, so an unreachable or saturated upstream is answered, not waited on.
    - Up to ``max_connections`` connections, all of them kept alive between requests:
      concurrent streams each hold one, and reconnecting under load costs latency.
    - The environment is ignored (``trust_env=False``): proxy variables such as
      ``HTTP_PROXY`` must not reroute traffic to internal upstreams.
    - Redirects are not followed: they are answers for the client.
    """
    return httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        ),
        timeout=httpx.Timeout(
            connect=connect_timeout_s, read=None, write=None, pool=connect_timeout_s
        ),
        trust_env=False,
        follow_redirects=False,
    )
