"""``cancel_and_wait``: a background task stops even when it loses a cancellation, as a loop
calling redis-py can on Python 3.11 (``asyncio.wait_for`` drops a cancellation that
arrives with the reply)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.tasks import cancel_and_wait

pytestmark = pytest.mark.anyio


async def test_a_task_that_drops_its_first_cancellation_is_stopped_all_the_same() -> None:
    dropped = 0

    async def loop() -> None:
        nonlocal dropped
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if dropped:
                    raise
                dropped += 1  # what wait_for does on 3.11 when the reply came first

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)

    async with asyncio.timeout(30):  # a hang would otherwise stop the whole run
        await cancel_and_wait(task)

    assert dropped == 1
    assert task.cancelled()


async def test_what_the_task_raised_reaches_the_caller() -> None:
    async def failing() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise RuntimeError("closing the connection failed")

    task = asyncio.create_task(failing())
    await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="closing the connection failed"):
        await cancel_and_wait(task)


async def test_a_finished_task_is_only_read() -> None:
    async def quick() -> int:
        return 1

    task = asyncio.create_task(quick())
    await task

    await cancel_and_wait(task)

    assert task.result() == 1
