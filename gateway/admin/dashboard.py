"""``GET /dashboard``: the operator's page, served by the gateway itself."""

from __future__ import annotations

from gateway.types import Send

DASHBOARD_PATH = "/dashboard"


async def send_page(send: Send) -> None:
    body = b"<!doctype html><title>Obleth</title>"
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", b"%d" % len(body)),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
