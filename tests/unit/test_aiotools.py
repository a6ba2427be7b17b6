"""kernel.aiotools: a retry loop that catches the error a library raises in place of a
cancellation must still stop when cancelled (a chain link that swallowed its cancel
once hung a node's config sync for good)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from kernel.aiotools import cancel_and_wait, raise_if_cancelling, wait_event

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


def test_wait_event_returns_whether_the_event_was_set():
    async def main():
        event = asyncio.Event()
        assert await wait_event(event, 0.01) is False
        asyncio.get_running_loop().call_soon(event.set)
        assert await wait_event(event, 5) is True
    asyncio.run(main())


def test_a_loop_of_wait_event_always_stops_when_cancelled():
    """The loops of the chain manager, the storage node's sync and the election wait on an
    event with a timeout and are cancelled at stop, often just as the event is set (a
    watch fires while the node shuts down). asyncio.wait_for lost a cancel that landed as
    its wait ended (Python 3.11): the loop went on and its node never stopped. Each loop
    here, cancelled in the same tick as its event is set or about its timeout, must end."""
    async def forever(event: asyncio.Event, timeout_s: float) -> None:
        while True:
            await wait_event(event, timeout_s)
            event.clear()

    async def main():
        for i in range(200):
            event = asyncio.Event()
            timeout_s = 0.001 + (i % 5) * 0.0005
            task = asyncio.get_running_loop().create_task(forever(event, timeout_s))
            await asyncio.sleep(timeout_s * (1 + (i % 3)))
            if i % 2:
                event.set()          # the wait ends as the cancel lands
                if i % 4 == 1:
                    await asyncio.sleep(0)    # (its inner wait done first: where wait_for lost 13% of cancels)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=2.0)
            assert task in done, f"loop {i} did not stop after its cancel"
            assert task.cancelled()
    asyncio.run(main())


def test_cancel_and_wait_passes_on_a_cancel_of_its_caller():
    """A task that stops another (cancel_and_wait) and is itself cancelled meanwhile stops:
    the cancel is not taken for the other task's end."""
    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)        # cleanup that takes a while
            raise

    async def stopper(other: asyncio.Task, rounds: list) -> None:
        while True:                          # a loop, as the nodes' sync loops are
            await cancel_and_wait(other)
            rounds.append(1)
            await asyncio.sleep(0.01)

    async def main():
        other = asyncio.get_running_loop().create_task(slow_to_stop())
        await asyncio.sleep(0)
        rounds: list = []
        task = asyncio.get_running_loop().create_task(stopper(other, rounds))
        await asyncio.sleep(0.01)            # the stopper waits for `other` to end
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=DEADLINE_S)
        assert task in done and task.cancelled() and not rounds
        assert other.cancelled()
    asyncio.run(main())


def test_cancel_and_wait_in_the_cleanup_of_a_cancelled_task_stops_every_task():
    """A cancelled task whose `finally` stops two others with cancel_and_wait stops both:
    its own cancel, already under way, does not cut the cleanup short."""
    async def owner(a: asyncio.Task, b: asyncio.Task) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(a)
            await cancel_and_wait(b)

    async def main():
        a = asyncio.get_running_loop().create_task(asyncio.Event().wait())
        b = asyncio.get_running_loop().create_task(asyncio.Event().wait())
        task = asyncio.get_running_loop().create_task(owner(a, b))
        await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=DEADLINE_S)
        assert task in done and task.cancelled()
        assert a.cancelled() and b.cancelled()
    asyncio.run(main())


def test_a_byte_gate_holds_bytes_first_come_first_served():
    from kernel.aiotools import ByteGate

    async def main() -> None:
        gate = ByteGate(100)
        await gate.acquire(60)
        order: list[str] = []

        async def take(name: str, n: int) -> None:
            await gate.acquire(n)
            order.append(name)
        big = asyncio.ensure_future(take("big", 50))         # does not fit beside 60: waits
        small = asyncio.ensure_future(take("small", 10))     # would fit, but comes after: waits too
        await asyncio.sleep(0)
        assert order == [] and gate.held == 60
        gate.release(60)
        await asyncio.gather(big, small)
        assert order == ["big", "small"] and gate.held == 60
        gate.release(60)
        await gate.acquire(500)                              # larger than the limit: alone
        assert gate.held == 500
        late = asyncio.ensure_future(take("late", 1))
        await asyncio.sleep(0)
        late.cancel()                                        # a waiter that goes away holds nothing
        with pytest.raises(asyncio.CancelledError):
            await late
        gate.release(500)
        assert gate.held == 0 and not gate._waiters

    asyncio.run(main())


def test_a_byte_gate_gives_back_a_grant_whose_waiter_was_cancelled_meanwhile():
    from kernel.aiotools import ByteGate

    async def main() -> None:
        gate = ByteGate(10)
        await gate.acquire(10)
        waiter = asyncio.ensure_future(gate.acquire(5))
        await asyncio.sleep(0)
        gate.release(10)            # grants the waiter ...
        waiter.cancel()             # ... which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert gate.held == 0

    asyncio.run(main())
