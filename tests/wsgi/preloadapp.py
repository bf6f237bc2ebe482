"""The gunicorn tests' app (``gunicornapp.py``), started when it is imported, which under
``gunicorn --preload`` is before gunicorn forks its workers.

With ``HOLD_AT_FORK`` set, a request admitted at import is still open when the workers
fork: its seat is taken in the process that forks. With ``PRELOAD_GATEWAY=given``, the
middleware is handed a gateway built beforehand (``gateway=``) instead of its settings.
"""

from __future__ import annotations

import os
from typing import Any
from wsgiref.util import setup_testing_defaults

from gateway import Gateway
from gateway.wsgi import WSGIGatewayMiddleware
from tests.wsgi import gunicornapp

if os.environ.get("PRELOAD_GATEWAY") == "given":
    application = WSGIGatewayMiddleware(gunicornapp.app, gateway=Gateway())
else:
    application = gunicornapp.application

application.start()

if os.environ.get("HOLD_AT_FORK"):
    _environ: dict[str, Any] = {"PATH_INFO": "/v1/chat/completions"}
    setup_testing_defaults(_environ)
    # served, and never closed: its seat stays taken in this process
    held = application(_environ, lambda status, headers, exc_info=None: None)
