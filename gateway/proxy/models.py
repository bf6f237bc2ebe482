"""``ModelList``: ``GET /v1/models`` answered by ``obleth serve`` itself, as the union of
what its healthy upstreams serve, not as the answer of whichever upstream a request for it
happened to be routed to; and ``ModelCatalog``, which fetches those lists."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from gateway.asgi.responses import send_json, send_json_error
from gateway.complaints import Complaints
from gateway.proxy.upstream import unforwardable_path
from gateway.routing.httpclient import pooled_limits
from gateway.routing.upstreams import Upstream, parse_upstream
from gateway.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("obleth.proxy")

MODELS_PATH = "/v1/models"

FRESH_S = 5.0
"""How long a fetched list is answered without asking the upstreams again."""
STALE_S = 60.0
"""How long a list may still be answered (while a fresh one is fetched in the background);
older, a request waits for the fetch."""
FETCH_TIMEOUT_S = 2.0
"""How long one upstream may take to answer ``GET /v1/models``."""
MAX_BODY_BYTES = 1024 * 1024
"""A model list longer than this is no model list: the upstream is left out."""
OWNED_BY = "obleth"
"""``owned_by`` of the models an upstream was configured with (``URL=model|model``)."""

Entry = dict[str, Any]
"""One model as OpenAI's ``/v1/models`` lists it: ``id``, ``object``, ``created``,
``owned_by``, and whatever else the upstream said about it (vLLM adds ``max_model_len``)."""


class _Unlisted(Exception):
    """An upstream gave no usable model list; the message says what it gave instead."""


class ModelCatalog:
    """The models of a set of upstreams, fetched on demand and kept for a while.

    What callers may rely on:

    - ``models()`` is the union of the model lists of the upstreams ``healthy`` says are
      healthy now, deduplicated by ``id`` (the first upstream in configured order that
      lists a model gives its entry), in a stable order: upstreams as configured, each
      one's models as it lists them. None when no healthy upstream contributed a list (all
      unhealthy, or every fetch failed): nothing to answer.
    - An upstream configured with models (``URL=llama|qwen``) contributes exactly those,
      sorted, and is never asked: they are what the router sends it. The others are asked
      ``GET <base>/v1/models`` (``<base>`` keeps its path), all at once, each bounded by
      ``timeout_s``; one that fails (no answer, a non-2xx status, no OpenAI-style list) is
      left out until a later fetch succeeds, and logged at most once a minute.
    - Fetches happen only when asked, so an idle gateway costs nothing: a list younger
      than ``fresh_s`` is answered as it is; one younger than ``stale_s`` is answered while
      a fetch runs in the background; an older one (or none yet, or one no healthy
      upstream contributed to) waits for the fetch. Concurrent callers share one fetch,
      and a caller that gives up does not cancel it.
    - ``aclose()`` stops a fetch under way and closes the HTTP client; a later call opens
      a new one.
    """

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        *,
        healthy: Callable[[str], bool],
        fresh_s: float = FRESH_S,
        stale_s: float = STALE_S,
        timeout_s: float = FETCH_TIMEOUT_S,
    ) -> None:
        self._upstreams = tuple(upstreams)
        self._healthy = healthy
        self._fresh_s = fresh_s
        self._stale_s = max(stale_s, fresh_s)
        self._timeout_s = timeout_s
        self._urls = {u.url: _models_url(u.url) for u in self._upstreams if u.models is None}
        created = int(time.time())
        #: the lists of the upstreams that contributed one last time: url -> entries
        self._lists: dict[str, tuple[Entry, ...]] = {
            u.url: tuple(
                {"id": name, "object": "model", "created": created, "owned_by": OWNED_BY}
                for name in sorted(u.models)
            )
            for u in self._upstreams
            if u.models is not None
        }
        self._fetched_at = -float("inf") if self._urls else float("inf")
        self._fetch: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self._complaints = Complaints()

    async def models(self) -> list[Entry] | None:
        """The union of the healthy upstreams' models now; None when none contributed."""
        age = time.monotonic() - self._fetched_at
        if age >= self._fresh_s:
            fetch = self._fetch
            if fetch is None:
                fetch = self._fetch = asyncio.get_running_loop().create_task(
                    self._refresh(), name="obleth-model-lists"
                )
            if age >= self._stale_s or self._union() is None:
                await asyncio.shield(fetch)
        return self._union()

    async def aclose(self) -> None:
        fetch, self._fetch = self._fetch, None
        if fetch is not None:
            fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fetch
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _union(self) -> list[Entry] | None:
        union: dict[str, Entry] = {}
        contributed = False
        for upstream in self._upstreams:
            listed = self._lists.get(upstream.url)
            if listed is None or not self._healthy(upstream.url):
                continue
            contributed = True
            for entry in listed:
                union.setdefault(entry["id"], entry)
        return list(union.values()) if contributed else None

    async def _refresh(self) -> None:
        try:
            asked = [url for url in self._urls if self._healthy(url)]
            answers = await asyncio.gather(*(self._fetch_one(url) for url in asked))
            for url in self._urls:
                self._lists.pop(url, None)
            for url, answer in zip(asked, answers, strict=True):
                if answer is not None:
                    self._lists[url] = answer
            self._fetched_at = time.monotonic()
        finally:
            self._fetch = None

    async def _fetch_one(self, upstream: str) -> tuple[Entry, ...] | None:
        url = self._urls[upstream]
        try:
            async with asyncio.timeout(self._timeout_s):
                return _entries(await self._get(url))
        except TimeoutError:
            problem = f"no answer within {self._timeout_s} s"
        except httpx.HTTPError as exc:
            problem = f"{type(exc).__name__} {exc}".rstrip()
        except _Unlisted as exc:
            problem = str(exc)
        if self._complaints.may(upstream):
            log.warning(
                "GET %s: %s; the models of upstream %s are left out of %s",
                url,
                problem,
                upstream,
                MODELS_PATH,
            )
        return None

    async def _get(self, url: httpx.URL) -> object:
        client = self._client
        if client is None:
            client = self._client = httpx.AsyncClient(
                limits=pooled_limits(max(1, len(self._urls))),
                timeout=self._timeout_s,
                trust_env=False,
                follow_redirects=False,
            )
        body = bytearray()
        async with client.stream("GET", url) as response:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise _Unlisted(f"an answer over {MAX_BODY_BYTES} bytes")
        if not response.is_success:
            raise _Unlisted(f"answered {response.status_code}")
        try:
            document: object = json.loads(body)
        except ValueError:
            raise _Unlisted("answered something that is not JSON") from None
        return document


def _entries(document: object) -> tuple[Entry, ...]:
    """The models of an OpenAI-style list, ``{"data": [{"id": ...}, ...]}``; each keeps
    what the upstream said, with ``object``, ``created`` and ``owned_by`` filled in where
    it said nothing (``created``: now)."""
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise _Unlisted('answered JSON without a "data" list')
    entries = []
    now = int(time.time())
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            raise _Unlisted(f'listed a model without an "id": {str(item)[:80]}')
        entry: Entry = {
            "id": item["id"],
            "object": "model",
            "created": item.get("created", now),
            "owned_by": item.get("owned_by", OWNED_BY),
        }
        for key, value in item.items():
            entry.setdefault(key, value)
        entries.append(entry)
    return tuple(entries)


def _models_url(upstream: str) -> httpx.URL:
    """``upstream``'s ``/v1/models``, below its own path: ``http://h/v`` gives ``/v/v1/models``."""
    base = parse_upstream(upstream)
    return base.copy_with(path=base.path.rstrip("/") + MODELS_PATH)


class ModelList:
    """Answers ``GET /v1/models`` and ``GET /v1/models/{id}`` (and ``HEAD``) from a
    ``ModelCatalog``; every other request (other methods on those paths too) goes to
    ``app``.

    - ``/v1/models``: ``200 {"object": "list", "data": [...]}``, the catalog's union.
    - ``/v1/models/{id}`` (an id may hold slashes): ``200`` with that model's entry, or
      ``404`` ``model_not_found`` when no healthy upstream lists it. A path with a ``.``
      or ``..`` segment goes on to ``app``, which refuses it (``unforwardable_path``).
    - No healthy upstream contributed a list: ``503`` ``no_model_list``, with
      ``Retry-After``.

    ``obleth serve`` puts it in front of ``GatewayMiddleware``, beside the probes, so
    these requests take no admission seat and never queue, rather than making the paths
    exempt: an exempt path still goes to the proxy, which would forward it to one upstream
    (the very answer this replaces). A listing is metadata answered from memory (or one
    shared fetch), it costs an upstream nothing, and a client that lists models before it
    sends work should learn what is served even while the queue is full.

    Lifespan messages pass through; once ``app`` has completed its shutdown, the
    catalog's fetch and client are closed.
    """

    def __init__(self, app: ASGIApp, catalog: ModelCatalog, *, retry_after_s: float) -> None:
        self.app = app
        self.catalog = catalog
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http" and scope["method"] in ("GET", "HEAD"):  # the server drops
            # a HEAD's body, keeping the GET's headers, as monitoring checks expect
            path: str = scope["path"]
            if path == MODELS_PATH:
                await self._list(send)
                return
            if (
                path.startswith(MODELS_PATH + "/")
                and len(path) > len(MODELS_PATH) + 1
                and unforwardable_path(scope) is None  # else the app refuses it, 400
            ):
                await self._one(path[len(MODELS_PATH) + 1 :], send)
                return
        elif kind == "lifespan":
            await self.app(scope, receive, self._closing_after_shutdown(send))
            return
        await self.app(scope, receive, send)

    async def _list(self, send: Send) -> None:
        models = await self.catalog.models()
        if models is None:
            await self._unavailable(send)
            return
        await send_json(send, 200, {"object": "list", "data": models})

    async def _one(self, model: str, send: Send) -> None:
        models = await self.catalog.models()
        if models is None:
            await self._unavailable(send)
            return
        for entry in models:
            if entry["id"] == model:
                await send_json(send, 200, entry)
                return
        await send_json_error(
            send,
            404,
            f"no upstream serves model {model!r}",
            code="model_not_found",
            param="model",
        )

    async def _unavailable(self, send: Send) -> None:
        await send_json_error(
            send,
            503,
            "no healthy upstream answered with its list of models; retry later",
            code="no_model_list",
            retry_after_s=self.retry_after_s,
        )

    def _closing_after_shutdown(self, send: Send) -> Send:
        async def sending(message: Message) -> None:
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                await self.catalog.aclose()
            await send(message)

        return sending
