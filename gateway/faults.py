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


def stops_the_caller(exc: BaseException) -> bool:
    """Whether ``exc``, out of a plugin's ``start()`` or ``stop()`` (awaited by the
    gateway's own start or stop), must go on up: one of ``PASSED_ON``, but a
    ``CancelledError`` only while the task awaiting it is being cancelled. One that a
    plugin raised of its own accord is its failure, to be named like any other."""
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0
    return isinstance(exc, PASSED_ON)
