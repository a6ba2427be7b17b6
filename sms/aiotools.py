"""Small asyncio helpers shared by every role: owned tasks are stopped one way."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel an owned task and wait until it has stopped. A task that had already died
    of an error is logged here, so its failure is never lost silently."""
    if task is None:
        return
    if task.done():
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s had failed", task.get_name(), exc_info=task.exception())
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


def raise_if_cancelling() -> None:
    """Re-raise a cancellation that a library turned into its own error: grpc.aio may
    answer a cancelled call with AioRpcError(CANCELLED), and a retry loop that catches
    that error would otherwise swallow the cancel and run on forever. Call it first in
    every `except` of a retry loop that catches such errors."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()
