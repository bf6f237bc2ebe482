"""Drive the middleware directly over ASGI: scripted receive, recorded send."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from gateway.types import Message, Scope


def http_scope(
    path: str = "/v1/completions",
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }


@dataclass
class Client:
    """One client connection: sends ``body`` in ``chunks``, may disconnect on demand."""

    body: bytes = b""
    chunks: int = 1
    sent: list[Message] = field(default_factory=list)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    _pending: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        size = max(1, -(-len(self.body) // self.chunks))
        parts = [self.body[i : i + size] for i in range(0, len(self.body), size)] or [b""]
        self._pending = [
            {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
            for i, part in enumerate(parts)
        ]

    async def receive(self) -> Message:
        if self._pending:
            return self._pending.pop(0)
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.gone.is_set():
            return  # as uvicorn does: sends after a disconnect are dropped
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        for message in self.sent:
            if message["type"] == "http.response.start":
                return int(message["status"])
        return None

    @property
    def headers(self) -> dict[str, str]:
        for message in self.sent:
            if message["type"] == "http.response.start":
                return {k.decode(): v.decode() for k, v in message["headers"]}
        return {}

    @property
    def text(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    def json(self) -> Any:
        import json

        return json.loads(self.text)
