"""The built-in classifier: tenant from a header or a hash of the API key; priority from a
header only when the settings trust it. Answers last, so any plugin can override it.

It runs on every request of the fast path, so it reads the raw ASGI headers, decodes only
the few it looks at, and remembers the ticket each recently seen header value led to, by
a salted in-process hash of the value: never the value itself, so no API key is kept. A
client sending the same credential again costs a dictionary lookup, not a parse and a
BLAKE2 hash.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Iterator

from gateway.core.memo import Memo
from gateway.core.tickets import MAX_TENANT_CHARS, PRIORITIES, Priority, Ticket, ticket
from gateway.errors import BadRequest
from gateway.hookimpl import hookimpl
from gateway.hookspecs import HEADER_TICKETS
from gateway.protocols import Classification
from gateway.settings import API_KEY_HEADERS, Settings
from gateway.types import Scope

# a tuple built in C: a named tuple's own __new__ is slow
_classification = functools.partial(tuple.__new__, Classification)
_KEY_HASH = hashlib.blake2b(digest_size=8, person=b"obleth-tenant")

#: Where an API key is looked for, in this order.
KEY_HEADERS = tuple(name.encode("latin-1") for name in API_KEY_HEADERS)

#: How many header values each memo holds before it starts over. Two values share an
#: entry only if their 64-bit hashes collide, which the process's secret hash salt makes
#: as unlikely as chance allows: for 4096 values, odds below one in 10^12.
MEMO_SIZE = 4096


def tenant_of_key(api_key: str) -> str:
    """A stable, non-reversible tenant id for an API key; the key itself is never kept.

    Equal keys give equal ids in every process and on every pod.
    """
    hasher = _KEY_HASH.copy()  # cheaper than building a personalised hasher each time
    hasher.update(api_key.encode())
    return "key-" + hasher.hexdigest()


def bearer_token(authorization: bytes) -> str | None:
    """The token of an ``Authorization: Bearer ...`` value, else None."""
    scheme, _, token = authorization.decode("latin-1").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _header_text(value: bytes) -> str:
    """A header's value as text: UTF-8, as clients send names like ``café`` today (and
    as a name in ``tenant_weights`` is written); bytes that are no UTF-8 read as Latin-1,
    HTTP's old default, so that every value names some tenant (and a priority that is
    refused is quoted as the client wrote it)."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = value.decode("latin-1")
    return text.strip()


def _tenant_of_authorization(value: bytes) -> str:
    token = bearer_token(value)
    return tenant_of_key(token) if token else ""


def _tenant_of_api_key(value: bytes) -> str:
    return tenant_of_key(value.decode("latin-1")) if value else ""


#: How each header that can name the tenant turns into a tenant id ("" when it names none).
_TENANT_OF: dict[bytes, Callable[[bytes], str]] = {
    b"authorization": _tenant_of_authorization,
    b"x-api-key": _tenant_of_api_key,
    b"api-key": _tenant_of_api_key,
}

#: A memo entry for a header value that names no tenant.
_NONE = ticket("")


class HeaderReader:
    """The built-in classification for one configuration, from ``scope["headers"]``.

    ``priority_header`` is None when the priority header is not trusted. What the caller
    may rely on: equal headers give equal answers; a request with none of the headers it
    reads gets the default ticket, the same object every time. Safe to share between
    threads: a memo is only ever read, added to or cleared, each one step.
    """

    __slots__ = (
        "_default",
        "_priority_header",
        "_priority_name",
        "_reads",
        "_sources",
        "_tenant_of",
    )

    def __init__(
        self,
        tenant_header: str | None,
        priority_header: str | None,
        default_tenant: str,
        default_priority: Priority,
    ) -> None:
        tenant_source = _encoded(tenant_header)
        self._priority_header = _encoded(priority_header)
        self._priority_name = priority_header
        names = (*([tenant_source] if tenant_source else []), *KEY_HEADERS)
        #: headers that can name the tenant, in order: the first that does wins
        self._sources = names
        #: how each of them becomes a tenant id
        self._tenant_of = {name: _TENANT_OF.get(name, _header_text) for name in names}
        #: every header read, with the tickets its recent values led to (None for the
        #: priority header)
        self._reads: dict[bytes, Memo[int, Ticket] | None] = {
            name: Memo(MEMO_SIZE) for name in names
        }
        if self._priority_header is not None:
            # settings keep it apart from every header that names the tenant
            self._reads[self._priority_header] = None
        self._default = ticket(default_tenant, default_priority)

    def ticket(self, headers: Iterable[tuple[bytes, bytes]]) -> Ticket:
        """The ticket of a request with these raw ASGI headers (lower-case names).

        Raises ``BadRequest`` for a priority header, when trusted, that names no priority,
        and for a tenant header naming a tenant longer than ``MAX_TENANT_CHARS``.
        """
        # nearly every request carries one of the headers read, once: it is answered from
        # that header alone; two or more (or one twice) take the general rules
        reads = self._reads
        seen: bytes | None = None
        seen_value = b""
        rest = iter(headers)
        for name, value in rest:
            if name in reads:
                if seen is not None:
                    return self._from_several({seen: seen_value, name: value}, rest)
                seen, seen_value = name, value
        if seen is None:
            return self._default
        memo = reads[seen]
        if memo is None:  # the priority header alone
            return self._with_priority(self._default, seen_value)
        known = memo.get(hash(seen_value))
        if known is None:
            known = self._learn(seen, seen_value)
        return self._default if known is _NONE else known

    def _from_several(
        self, found: dict[bytes, bytes], rest: Iterator[tuple[bytes, bytes]]
    ) -> Ticket:
        """The general rules, for the headers ``found`` so far and the ``rest``."""
        reads = self._reads
        for name, value in rest:
            if name in reads:
                found[name] = value  # the last of repeated headers counts
        result = self._default
        for source in self._sources:
            named = found.get(source)
            memo = reads[source]
            if named is not None and memo is not None:
                known = memo.get(hash(named))
                if known is None:
                    known = self._learn(source, named)
                if known is not _NONE:
                    result = known
                    break
        header = self._priority_header
        if header is not None:
            claimed = found.get(header)
            if claimed is not None:
                result = self._with_priority(result, claimed)
        return result

    def _learn(self, header: bytes, value: bytes) -> Ticket:
        """The ticket ``header: value`` leads to, remembered by the value's hash."""
        memo = self._reads[header]
        assert memo is not None  # a header that names the tenant
        tenant = self._tenant_of[header](value)
        if len(tenant) > MAX_TENANT_CHARS:
            name = header.decode("latin-1")
            raise BadRequest(
                f"header {name}: a tenant name of {len(tenant)} characters; "
                f"at most {MAX_TENANT_CHARS} are taken",
                param=name,
            )
        known = ticket(tenant, self._default.priority) if tenant else _NONE
        return memo.keep(hash(value), known)

    def _with_priority(self, result: Ticket, claimed: bytes) -> Ticket:
        priority = self._priority(claimed)
        return result if priority == result.priority else ticket(result.tenant, priority)

    def read(self, headers: Iterable[tuple[bytes, bytes]]) -> Classification:
        """``ticket(headers)`` as the hook answers it."""
        result = self.ticket(headers)
        return _classification((result.tenant, result.priority, None, None))

    def _priority(self, claimed: bytes) -> Priority:
        text = _header_text(claimed).lower()
        for priority in PRIORITIES:
            if text == priority:
                return priority
        name = self._priority_name
        raise BadRequest(
            f"header {name}: {text!r} is no priority; expected one of {', '.join(PRIORITIES)}",
            param=name,
        )


def _encoded(header: str | None) -> bytes | None:
    return header.encode("latin-1") if header is not None else None


#: one reader per configuration, for the hook call that has only ``settings`` at hand
_reader = functools.lru_cache(maxsize=16)(HeaderReader)


def reader_for(settings: Settings) -> HeaderReader:
    """The reader for ``settings`` (one per configuration, shared)."""
    trusted = settings.priority_header if settings.trust_priority_header else None
    return _reader(
        settings.tenant_header, trusted, settings.default_tenant, settings.default_priority
    )


@hookimpl(trylast=True)
def obleth_classify_request(scope: Scope, settings: Settings) -> Classification:
    return reader_for(settings).read(scope["headers"])


# the facade classifies with the reader directly while this is the only classifier: no
# header dict, no hook call (see gateway.hookspecs.HEADER_TICKETS)
setattr(obleth_classify_request, HEADER_TICKETS, reader_for)
