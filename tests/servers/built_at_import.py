"""``tests.servers.app``'s app with the gateway built while this module is imported, before
the server runs: a bad setting raises ``ConfigError`` here, in the server's import of the
app (``GatewayMiddleware``'s documented behaviour outside an event loop)."""

from __future__ import annotations

from tests.servers.app import gated

app = gated()
