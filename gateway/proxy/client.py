"""The one HTTP client a proxy shares across all its requests, sized for long streams."""

from __future__ import annotations

import httpx

from gateway.routing.httpclient import pooled_limits


def upstream_client(*, connect_timeout_s: float, max_connections: int) -> httpx.AsyncClient:
    """A client for forwarding: pooled keep-alive connections, no read timeout.

    - No read or write timeout: a completion may stream for minutes and a client may
      upload slowly. The proxy's own ``response_timeout_s`` and ``read_timeout_s`` (see
      ``gateway.proxy.exchange``) bound the waits on the upstream, as httpx's read timeout
      could not: it is one value for the response headers and every body chunk alike.
    - ``connect_timeout_s`` bounds both connecting and waiting for a free pooled
      connection, so an unreachable or saturated upstream is answered, not waited on.
    - Up to ``max_connections`` connections, all of them kept alive between requests
      (``pooled_limits``): concurrent streams each hold one.
    - The environment is ignored (``trust_env=False``): proxy variables such as
      ``HTTP_PROXY`` must not reroute traffic to internal upstreams.
    - Redirects are not followed: they are answers for the client.
    """
    return httpx.AsyncClient(
        limits=pooled_limits(max_connections),
        timeout=httpx.Timeout(
            connect=connect_timeout_s, read=None, write=None, pool=connect_timeout_s
        ),
        trust_env=False,
        follow_redirects=False,
    )
