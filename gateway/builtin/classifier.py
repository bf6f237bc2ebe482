"""The built-in classifier: tenant from a header or a hash of the API key; priority from a
header only when the settings trust it. Answers last, so any plugin can override it."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping

from gateway.core.tickets import PRIORITIES, Priority
from gateway.errors import BadRequest
from gateway.hookimpl import hookimpl
from gateway.protocols import Classification
from gateway.settings import Settings

# a tuple built in C: this runs once per request, and a named tuple's own __new__ is slow
_classification = functools.partial(tuple.__new__, Classification)
_KEY_HASH = hashlib.blake2b(digest_size=8, person=b"obleth-tenant")
KEY_HEADERS = ("authorization", "x-api-key", "api-key")


def tenant_of_key(api_key: str) -> str:
    """A stable, non-reversible tenant id for an API key; the key itself is never kept.

    Equal keys give equal ids in every process and on every pod.
    """
    hasher = _KEY_HASH.copy()  # cheaper than building a personalised hasher each time
    hasher.update(api_key.encode())
    return "key-" + hasher.hexdigest()


def headers_read(settings: Settings) -> frozenset[str]:
    """The request headers this classifier looks at, so callers can decode just those."""
    names = set(KEY_HEADERS)
    if settings.tenant_header is not None:
        names.add(settings.tenant_header)
    if settings.trust_priority_header:
        names.add(settings.priority_header)
    return frozenset(names)


def api_key_of(headers: Mapping[str, str]) -> str | None:
    """The bearer token of ``Authorization``, else ``x-api-key`` / ``api-key``."""
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return headers.get("x-api-key") or headers.get("api-key") or None


@hookimpl(trylast=True)
def obleth_classify_request(headers: Mapping[str, str], settings: Settings) -> Classification:
    tenant = None
    if settings.tenant_header is not None:
        tenant = headers.get(settings.tenant_header, "").strip() or None
    if tenant is None:
        key = api_key_of(headers)
        tenant = tenant_of_key(key) if key else settings.default_tenant
    priority: Priority = settings.default_priority
    if settings.trust_priority_header:
        claimed = headers.get(settings.priority_header)
        if claimed is not None:
            claimed = claimed.strip().lower()
            if claimed not in PRIORITIES:
                raise BadRequest(
                    f"header {settings.priority_header}: {claimed!r} is no priority; "
                    f"expected one of {', '.join(PRIORITIES)}",
                    param=settings.priority_header,
                )
            priority = claimed
    return _classification((tenant, priority, None, None))
