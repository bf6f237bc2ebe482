"""``GET /dashboard``: the operator's page (``dashboard.html``), served by the gateway itself.

The page is one self-contained file shipped as package data: inline CSS and script, no
build step, nothing fetched from another origin. It holds no data of its own and needs no
token to load; its script polls ``api/v1/status`` next to it and sets the limit with
``PUT api/v1/capacity``, sending the admin token the operator gives it (in the ``#token=``
fragment or a form) in the ``Authorization`` header only.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from importlib import resources

from gateway.types import Send

DASHBOARD_PATH = "/dashboard"


@functools.cache
def page() -> bytes:
    """The page's HTML, read from the package once."""
    return resources.files(__package__).joinpath("dashboard.html").read_bytes()


@functools.cache
def content_security_policy() -> str:
    """What the page may do: load, style and call only what comes from the gateway's own
    origin, and run only its own script, named by its hash (a script injected into the
    page, through a tenant's name say, would not run even if the page failed to show
    names as text); no page may frame it (a "Set" button under someone else's overlay),
    and its forms can submit nowhere (the script sends the token in a header, never in a
    URL or a form post)."""
    scripts = re.findall(rb"<script>(.*?)</script>", page(), flags=re.S)
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
        for script in scripts
    )
    return (
        f"default-src 'self'; script-src {hashes}; style-src 'unsafe-inline' 'self'; "
        "connect-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    )


async def send_page(send: Send) -> None:
    """Answer with the page (for HEAD too: the server drops the body of a HEAD answer)."""
    body = page()
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", b"%d" % len(body)),
        (b"content-security-policy", content_security_policy().encode()),
        (b"cache-control", b"no-store"),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
