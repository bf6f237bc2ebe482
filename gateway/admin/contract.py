"""The admin API's fixed facts, kept by ``api.py`` and documented by ``openapi.py``: the
paths of its stateful endpoints and the bounds of what a capacity change may send."""

from __future__ import annotations

CAPACITY_PATH = "/api/v1/capacity"
STATUS_PATH = "/api/v1/status"

#: the largest limit accepted: far beyond any inference fleet, small enough to be a typo
MAX_LIMIT = 1_000_000
#: the largest request body read: a capacity change is a few bytes
MAX_BODY_BYTES = 4096
