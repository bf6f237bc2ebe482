"""The admin API's OpenAPI document, ``GET /api/v1/openapi.json``."""

from __future__ import annotations

from typing import Any

from gateway.asgi.responses import send_json
from gateway.types import Send

OPENAPI_PATH = "/api/v1/openapi.json"


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the admin API."""
    return {"openapi": "3.1.0", "info": {"title": "Obleth admin API", "version": "1"}, "paths": {}}


async def send_document(send: Send) -> None:
    await send_json(send, 200, document())
