"""What ``obleth serve`` puts around the gateway under uvicorn: bounds on slow or greedy
clients (the probes it answers itself are in ``gateway.admin.health``).

::

    protocol.py     BoundedHttpToolsProtocol: uvicorn's HTTP/1.1 protocol with a size bound
                    (431) and a time bound (408) on each request's line and headers
    bodytimeout.py  BodyTimeout: ASGI middleware answering 408 when a request body pauses
                    for too long while the app waits for it
    workers.py      Workers: the processes of ``obleth serve --workers N``, the sockets
                    they serve (bound by their parent) and their supervision
"""

from __future__ import annotations

from gateway.server.bodytimeout import BodyTimeout
from gateway.server.protocol import BoundedHttpToolsProtocol, bounded_protocol

__all__ = ["BodyTimeout", "BoundedHttpToolsProtocol", "bounded_protocol"]
