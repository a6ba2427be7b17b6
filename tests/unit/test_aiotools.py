"""sms.aiotools: a retry loop that catches the error a library raises in place of a
cancellation must still stop when cancelled (a chain link that swallowed its cancel
once hung a node's config sync for good)."""

from __future__ import annotations

import asyncio
import threading

from sms.aiotools import cancel_and_wait, raise_if_cancelling

DEADLINE_S = 5.0


class LibraryError(Exception):
    """Stands for grpc.aio.AioRpcError(CANCELLED): raised instead of CancelledError."""


async def _call_that_converts_cancel(inside: asyncio.Event) -> None:
    inside.set()
    try:
        await asyncio.Event().wait()     # a call that only a cancel ends
    except asyncio.CancelledError:
        raise LibraryError("call cancelled") from None


async def _retry_loop(guarded: bool, rounds: list, inside: asyncio.Event) -> None:
    while True:
        try:
            await _call_that_converts_cancel(inside)
        except LibraryError:
            if guarded:
                raise_if_cancelling()
            rounds.append(1)
        await asyncio.sleep(0)


def test_guarded_retry_loop_stops_when_cancelled():
    """Without raise_if_cancelling the loop would catch the converted cancel and retry
    for ever, and cancel_and_wait would hang (the deadline below fails the test)."""
    result: list = []

    async def main():
        rounds: list = []
        inside = asyncio.Event()
        task = asyncio.get_running_loop().create_task(_retry_loop(True, rounds, inside))
        await inside.wait()                # the loop is in its call: cancel lands there
        await cancel_and_wait(task)
        result.append((task.cancelled(), len(rounds)))

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "the retry loop swallowed its cancellation"
    assert result == [(True, 0)]
