"""The streaming reverse proxy: an ASGI app forwarding requests to an upstream server.

::

    app.py        ProxyApp (lifespan, the shared client, the upstream choice) and proxy_to
    upstream.py   which upstream a request goes to, the URL it is sent to there, and
                  Reroutable, the router's handle the proxy retries through
    exchange.py   one request relayed both ways: streaming, disconnects, timeouts,
                  upstream failures and the one retry on the next-best upstream
    retries.py    which failures and statuses that retry is for, by method
    deadlines.py  the waits on the upstream an exchange bounds: the body it must take,
                  the answer's headers, the silence between two chunks of its answer
    inbound.py    the client's side of an exchange: its body, its disconnect
    outbound.py   the upstream's side: the request each attempt sends, what it got,
                  the hang-up
    headers.py    which headers cross the proxy (not the hop-by-hop ones), and how
                  their bytes are handed to the HTTP client
    forwarding.py the X-Forwarded-* headers written for the upstream, and the peers
                  (trusted proxies) whose own are believed
    client.py     the pooled HTTP client shared by all requests, and the answers to an
                  attempt that got no response
    models.py     GET /v1/models answered by the gateway: the union of the upstreams' lists
"""

from __future__ import annotations

from gateway.proxy.app import ProxyApp, proxy_to
from gateway.proxy.upstream import Reroutable, UpstreamChoice, route_of, routed_upstream

__all__ = ["ProxyApp", "Reroutable", "UpstreamChoice", "proxy_to", "route_of", "routed_upstream"]
