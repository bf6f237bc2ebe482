"""What scorers know about the request being routed, and how it is read from the body."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.core.prefix import prompt_blocks
from gateway.protocols import Classification

if TYPE_CHECKING:
    from gateway.routing.fleet import Fleet


@dataclass(slots=True)
class RouteRequest:
    """One admitted request, as routing sees it; scorers read it and must not change it.

    ``blocks`` are the chained hashes of the prompt's leading blocks (see
    ``gateway.core.prefix``): the whole ``messages`` array for chat, ``prompt`` for
    completions, seeded with the model. Empty when the body is not an OpenAI-style JSON
    request or the prompt is shorter than one block. ``fleet`` is the state of the
    upstreams at decision time: readings, our in-flight counts, rendezvous hashing.
    """

    path: str
    model: str | None
    blocks: tuple[int, ...]
    session_id: str | None
    tenant: str
    fleet: Fleet


class RequestReader:
    """Reads the ``RouteRequest`` of an admitted HTTP request, for the router over ``fleet``.

    The prompt's blocks come from the classifier's ``routing_key`` when it gave one, else
    from the OpenAI-style JSON body; the session from the classifier's ``session_id``,
    else from ``session_header``. Requests whose prompt is shorter than ``block_bytes``
    have no blocks.
    """

    __slots__ = ("_block_bytes", "_fleet", "_session_header")

    def __init__(self, fleet: Fleet, *, block_bytes: int, session_header: str) -> None:
        self._fleet = fleet
        self._block_bytes = block_bytes
        self._session_header = session_header.encode("latin-1")

    def read(
        self,
        path: str,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes | None,
        tenant: str,
        classification: Classification | None,
    ) -> RouteRequest:
        """``headers`` are the raw ASGI ones; ``classification`` is None when the
        classifier's answer carried no routing hints."""
        payload = parse_body(body)
        model = model_of(payload)
        text = classification.routing_key if classification is not None else None
        if text is None:
            text = prompt_text(payload)
        session = classification.session_id if classification is not None else None
        if session is None:
            for name, value in headers:
                if name == self._session_header:
                    session = value.decode("latin-1").strip() or None
                    break
        return RouteRequest(
            path=path,
            model=model,
            blocks=blocks_of(text, model, self._block_bytes) if text else (),
            session_id=session,
            tenant=tenant,
            fleet=self._fleet,
        )


def parse_body(body: bytes | None) -> Mapping[str, object] | None:
    """The JSON object of an OpenAI-style body; None for anything else (no error: the
    upstream answers malformed requests itself)."""
    if not body:
        return None
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        # ValueError covers bad UTF-8 and bad JSON; RecursionError, nesting deeper than
        # the parser goes (a few hundred bytes of "[" are enough)
        return None
    return payload if isinstance(payload, dict) else None


def model_of(payload: Mapping[str, object] | None) -> str | None:
    model = None if payload is None else payload.get("model")
    return model if isinstance(model, str) and model else None


def prompt_text(payload: Mapping[str, object] | None) -> bytes:
    """The prompt as bytes: the ``messages`` array (each role and content, in order) for
    chat, ``prompt`` (or ``input``) otherwise; empty when there is none, or when a part
    that is not text is nested too deep to write out again (a body the parser only just
    took: the request is routed without a prefix, and its upstream judges it)."""
    try:
        return _prompt_text(payload)
    except RecursionError:
        return b""


def _prompt_text(payload: Mapping[str, object] | None) -> bytes:
    if payload is None:
        return b""
    messages = payload.get("messages")
    if isinstance(messages, list):
        return "".join(_message_text(m) for m in messages).encode("utf-8", "surrogatepass")
    prompt = payload.get("prompt", payload.get("input"))
    if isinstance(prompt, str):
        return prompt.encode("utf-8", "surrogatepass")
    if prompt is None:
        return b""
    return json.dumps(prompt, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


def blocks_of(text: bytes, model: str | None, block_bytes: int) -> tuple[int, ...]:
    # the NUL ends the model name: no model name can run on into a prompt's first bytes;
    # JSON may carry lone surrogates, which pass through as they do in the prompt
    seed = (model or "").encode("utf-8", "surrogatepass") + b"\0"
    return prompt_blocks(text, seed=seed, block_bytes=block_bytes)


def _message_text(message: object) -> str:
    if not isinstance(message, dict):
        return json.dumps(message, separators=(",", ":"), ensure_ascii=False) + "\x1e"
    role = message.get("role")
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            part["text"]
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else json.dumps(part, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
            for part in content
        )
    elif not isinstance(content, str):
        content = "" if content is None else json.dumps(content, ensure_ascii=False)
    # record and unit separators: a role can never run into its content
    return f"{role}\x1f{content}\x1e"
