"""The admin API's fixed facts, kept by ``api.py`` and ``status.py`` and documented by
``openapi.py``: the paths of its stateful endpoints, the bounds of what a capacity change
may send, and the words the status uses for where a computed limit comes from."""

from __future__ import annotations

from gateway.settings.checks import MAX_COUNT

#: where ``obleth serve`` listens for the admin API unless told otherwise (the seed's port)
ADMIN_PORT = 9090

CAPACITY_PATH = "/api/v1/capacity"
STATUS_PATH = "/api/v1/status"

#: the largest limit accepted: the one ``global_max_in_flight`` accepts at startup, so that
#: an operator can always set back the limit a pod started with
MAX_LIMIT = MAX_COUNT
#: the largest request body read: a capacity change is a few bytes
MAX_BODY_BYTES = 4096

#: where the status says a computed provider's value comes from: the pool's (written to
#: Redis by the pod holding the leader lease), or this process's own computation
FROM_POOL = "pool"
FROM_OWN = "own"
