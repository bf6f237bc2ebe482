"""The retry rule as a table: which failures and statuses send a request to the next-best
upstream, by method (test_retry.py drives the same rule through real servers)."""

from __future__ import annotations

import pytest

from gateway.proxy.client import FailureKind, UpstreamFailure
from gateway.proxy.retries import worth_retrying


def failure(kind: FailureKind, *, sent: bool = True) -> UpstreamFailure:
    return UpstreamFailure(kind, "detail", sent=sent)


@pytest.mark.parametrize(
    ("got", "post", "get"),
    [
        (failure("unreachable", sent=False), True, True),
        (failure("failed", sent=False), True, True),
        (failure("failed"), False, True),
        (failure("timeout"), False, False),
        (failure("exhausted", sent=False), False, False),
        (failure("malformed"), False, False),
        (503, True, True),
        (500, False, True),
        (502, False, True),
        (504, False, True),
        (501, False, True),
        (429, False, False),
        (404, False, False),
        (200, False, False),
    ],
    ids=lambda value: value.kind if isinstance(value, UpstreamFailure) else str(value),
)
def test_a_post_is_retried_only_when_the_upstream_provably_did_not_run_it(
    got: int | UpstreamFailure, post: bool, get: bool
) -> None:
    """POST: no connection, a connection broken before the request was handed to it, or
    503. An idempotent method also after the request was sent, and on any 5xx. Never:
    the response timeout, a full pool, an answer the proxy cannot read, or a non-5xx."""
    assert worth_retrying("POST", got) is post
    assert worth_retrying("PATCH", got) is post
    assert worth_retrying("GET", got) is get
    assert worth_retrying("DELETE", got) is get
