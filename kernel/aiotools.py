"""Small asyncio helpers shared by every role: owned tasks are stopped one way."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Coroutine
from typing import Any

from sms.errors import InvariantViolation

log = logging.getLogger(__name__)


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel an owned task and wait until it has stopped. A task that had already died
    of an error is logged here, so its failure is never lost silently."""
    if task is None:
        return
    if task.done():
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s had failed", task.get_name(), exc_info=task.exception())
        return
    current = asyncio.current_task()
    cancels_before = current.cancelling() if current is not None else 0
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        # the task's own end -- unless our caller was cancelled while it waited here: that
        # cancel is passed on (swallowing it kept a node's config sync looping, and the
        # node never stopped). A cancel already under way (cleanup in a `finally` of a
        # cancelled task) is not a new one: the cleanup goes on.
        if current is not None and current.cancelling() > cancels_before:
            raise


def raise_if_cancelling() -> None:
    """Re-raise a cancellation that a library turned into its own error: grpc.aio may
    answer a cancelled call with AioRpcError(CANCELLED), and a retry loop that catches
    that error would otherwise swallow the cancel and run on forever. Call it first in
    every `except` of a retry loop that catches such errors."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """True once `event` is set, False after `timeout_s`. Not asyncio.wait_for: in Python
    3.11 it runs the wait in another task, and a cancel that lands as its timeout fires is
    lost -- a loop cancelled at stop then waited for ever, and its node never stopped (seen
    under `make bench`). asyncio.timeout cancels in the caller's own task."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
        return True
    except TimeoutError:
        return event.is_set()


_BACKGROUND: set[asyncio.Task[Any]] = set()


def background(coroutine: Coroutine[Any, Any, Any]) -> None:
    """Run `coroutine` on the running loop without waiting for it; a strong reference is
    kept until it ends (the loop keeps only weak ones), and its failure is logged."""
    task = asyncio.get_running_loop().create_task(coroutine)
    _BACKGROUND.add(task)

    def done(t: asyncio.Task[Any]) -> None:
        _BACKGROUND.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.warning("a background task failed", exc_info=t.exception())
    task.add_done_callback(done)


class ByteGate:
    """Bytes in flight, at most `limit`: `acquire(n)` waits, first come first served, until
    `n` fits beside what is held (a request larger than `limit` goes alone, when nothing else
    is held); `release(n)` gives them back. What bounds a server's memory under many large
    requests at once: they wait in their sockets, not in the heap."""

    __slots__ = ("limit", "held", "_waiters")

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def _fits(self, n: int) -> bool:
        return self.held == 0 or self.held + n <= self.limit

    async def acquire(self, n: int) -> None:
        if not self._waiters and self._fits(n):
            self.held += n
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(n)           # (granted as it was cancelled: given back)
            else:
                if entry in self._waiters:        # (or _wake passed over it, cancelled)
                    self._waiters.remove(entry)
                self._wake()
            raise

    async def acquire_within(self, n: int, timeout_s: float) -> bool:
        """`acquire`, for at most `timeout_s`: False (nothing held) when it did not come."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.acquire(n)
            return True
        except TimeoutError:
            return False

    def release(self, n: int) -> None:
        if n > self.held:
            raise InvariantViolation(f"released {n} bytes of {self.held} held")
        self.held -= n
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            n, waiter = self._waiters.popleft()
            if waiter.done():
                continue
            self.held += n
            waiter.set_result(None)
