"""``PASSED_ON``: the exceptions out of a plugin's code that are not the plugin's fault.

Whatever else a plugin raises while a request is served is its fault, ``BaseException``s
included: ``SystemExit`` from a stray ``sys.exit()``, or a library's own subclass (as
gevent's ``GreenletExit`` is). Each is logged naming the plugin and the request goes on
without it, as for an ``Exception``. Callers write::

    try:
        answer = plugin_call()
    except PASSED_ON:
        raise
    except BaseException:
        ...  # the plugin's fault: name it in the log, go on without it

The three passed on stop the work around the call, not only the plugin:
``asyncio.CancelledError`` (the request or the server is being cancelled),
``KeyboardInterrupt`` (the operator's Ctrl-C) and ``GeneratorExit`` (a generator being
closed). Swallowing them would keep a cancelled request, or a server told to stop, going.
"""

from __future__ import annotations

import asyncio
from typing import Final

PASSED_ON: Final[tuple[type[BaseException], ...]] = (
    asyncio.CancelledError,
    KeyboardInterrupt,
    GeneratorExit,
)
