"""Stopping a background task for certain, even when it loses a cancellation.

On Python 3.11, ``asyncio.wait_for`` returns the awaited result instead of raising
``CancelledError`` when the cancellation arrives in the same turn of the loop as that
result (fixed in 3.12, CPython gh-86296). redis-py sends every command through
``wait_for`` once a socket timeout is set, as ours always is. A loop that talks to Redis can
therefore drop the one ``cancel()`` its owner sends at shutdown and carry on, while the
owner waits for it forever: a worker of ``obleth serve`` then never exits on SIGTERM.
"""

from __future__ import annotations

import asyncio
from typing import Any

RECANCEL_S = 0.25
"""How long a cancelled task may run on before it is cancelled again. Longer than any
clean-up our tasks do once cancelled (a few Redis calls on loopback at most), short enough
not to hold up a shutdown."""


async def cancel_and_wait(task: asyncio.Task[Any] | asyncio.Future[Any]) -> None:
    """Cancel ``task`` and return once it has finished, cancelling it again every
    ``RECANCEL_S`` for as long as it runs on.

    Re-raises what the task raised, other than its cancellation; a task already finished
    is only read. If the caller is cancelled meanwhile, its own cancellation propagates
    and ``task`` is left cancelled but perhaps still running."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=RECANCEL_S)
    if not task.cancelled():
        task.result()
