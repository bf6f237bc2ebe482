"""When a request that failed upstream is worth sending once more, to the next-best
upstream: a decision without I/O, from the request's method and what the attempt got.

A retry must never run a generation twice. A POST (every completion, chat and embedding
request) is not idempotent: run twice, it costs the GPU time twice, and may repeat what
it set off (tool calls, billing, writes). So a request of any method is retried only when
the upstream provably did not run it:

- ``unreachable``: no connection could be made (refused, connect timeout);
- ``failed`` with nothing sent: the connection broke before the request head was handed
  to it;
- 503: the upstream (or the ingress in front of it) refused the request as overloaded or
  not ready, before running it.

An idempotent method (RFC 9110 section 9.2.2: GET, HEAD, OPTIONS, TRACE, PUT, DELETE)
may run twice by definition, so it is also retried when the connection broke after the
request was sent, and on any other 5xx.

Never retried, whatever the method:

- ``timeout``: the upstream may still be working on the request, and a second copy
  elsewhere would add load where it hurts most;
- ``exhausted``: the connection pool is shared by all upstreams, the retry would wait on
  the same pool;
- ``malformed``: the upstream answered (the request ran there), with a head the proxy
  cannot read.

And for a POST: 500 (the upstream ran the request and failed at it), 504 (a gateway in
front of the upstream gave up waiting: the request ran, and may run still), 502 (a gateway
in front could not get a valid answer: it says so both when it could not connect, which
would be safe to retry, and when the upstream broke mid-request, which would not; it
cannot be told apart, so it is not retried), and a connection that broke after the
request was sent (the upstream may have read it and started).
"""

from __future__ import annotations

from gateway.proxy.client import UpstreamFailure

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
"""The methods a request may be run twice with (RFC 9110 section 9.2.2)."""

NOT_RUN_STATUSES = frozenset({503})
"""Statuses that say the request was refused before it ran, for any method."""


def worth_retrying(method: str, got: int | UpstreamFailure) -> bool:
    """Whether a request of ``method`` goes once more to the next-best upstream after an
    attempt got ``got``: a response status, or the failure that came instead (see the
    module docstring); a 2xx, 3xx or 4xx answer never is."""
    if isinstance(got, UpstreamFailure):
        if got.kind == "unreachable":
            return True
        if got.kind == "failed":
            return not got.sent or method in IDEMPOTENT
        return False
    if got in NOT_RUN_STATUSES:
        return True
    return got >= 500 and method in IDEMPOTENT
