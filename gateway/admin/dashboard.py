"""``GET /dashboard``: the operator's page (``dashboard.html``), served by the gateway itself.

The page is one self-contained file shipped as package data: inline CSS and script, no
build step, nothing fetched from another origin. It holds no data of its own and needs no
token to load; its script polls ``api/v1/status`` next to it and sets the limit with
``PUT api/v1/capacity``, sending the admin token the operator gives it (in the ``#token=``
fragment or a form) in the ``Authorization`` header only.
"""

from __future__ import annotations

import functools
from importlib import resources

from gateway.types import Send

DASHBOARD_PATH = "/dashboard"

#: the page may load, run, style and call only what comes from the gateway's own origin;
#: no page may frame it (a "Set" button under someone else's overlay), and its forms can
#: submit nowhere (the script sends the token in a header, never in a URL or a form post)
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'unsafe-inline' 'self'; style-src 'unsafe-inline' 'self'; "
    "connect-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


@functools.cache
def page() -> bytes:
    """The page's HTML, read from the package once."""
    return resources.files(__package__).joinpath("dashboard.html").read_bytes()


async def send_page(send: Send) -> None:
    """Answer with the page (for HEAD too: the server drops the body of a HEAD answer)."""
    body = page()
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", b"%d" % len(body)),
        (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
        (b"cache-control", b"no-store"),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
