"""Unit tests of sms.producer._RecordFuture: the concurrent future SyncProducer.send()
returns, which makes its Condition only when something waits or registers a callback. It
must behave as `concurrent.futures.Future` does in every way a caller can see: result and
exception (settled or waited for, from other threads), callbacks before and after,
`concurrent.futures.wait` and `as_completed`, one outcome only, no cancel."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from sms.producer import _RecordFuture


def test_a_settled_future_answers_without_a_condition():
    f = _RecordFuture()
    assert f.running() and not f.done() and not f.cancelled()
    f.set_result(7)
    assert f.done() and not f.running() and f.result() == 7 and f.result(timeout=0) == 7 and f.exception() is None
    assert f._cond is None, "nobody waited: no Condition was made"
    g = _RecordFuture()
    g.set_exception(KeyError("x"))
    with pytest.raises(KeyError):
        g.result()
    assert isinstance(g.exception(), KeyError)


def test_one_outcome_only_and_no_cancel():
    f = _RecordFuture()
    assert f.cancel() is False, "a sent record cannot be called back"
    f.set_result(1)
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result(2)
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_exception(ValueError())
    assert f.result() == 1


def test_a_waiter_in_another_thread_is_woken():
    for setter in ("result", "exception"):
        f = _RecordFuture()
        got: list = []
        waiting = threading.Event()

        def wait() -> None:
            waiting.set()
            try:
                got.append(f.result(timeout=30))
            except Exception as e:
                got.append(e)

        t = threading.Thread(target=wait)
        t.start()
        assert waiting.wait(30)
        with pytest.raises(concurrent.futures.TimeoutError):
            f.result(timeout=0.01)      # (makes the condition if the thread has not yet)
        if setter == "result":
            f.set_result("ok")
        else:
            f.set_exception(ValueError("bad"))
        t.join(30)
        assert not t.is_alive()
        assert got == ["ok"] if setter == "result" else isinstance(got[0], ValueError)


def test_callbacks_before_and_after_the_outcome():
    seen: list = []
    f = _RecordFuture()
    f.add_done_callback(lambda fut: seen.append(("before", fut.result())))
    f.set_result(3)
    f.add_done_callback(lambda fut: seen.append(("after", fut.result())))
    assert seen == [("before", 3), ("after", 3)]


def test_wait_and_as_completed_see_outcomes_set_with_and_without_waiters():
    early = [_RecordFuture() for _ in range(5)]
    for i, f in enumerate(early):
        f.set_result(i)                  # settled before anyone waits
    late = [_RecordFuture() for _ in range(5)]

    def settle() -> None:
        for i, f in enumerate(late):
            f.set_result(10 + i)

    t = threading.Timer(0.05, settle)
    t.start()
    done, not_done = concurrent.futures.wait(early + late, timeout=30)
    t.join()
    assert not not_done and len(done) == 10
    assert sorted(f.result() for f in concurrent.futures.as_completed(early + late, timeout=30)) == \
        [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]


def test_racing_waiters_and_setters_never_lose_a_wakeup():
    """Many futures, each set by one thread while another waits on it: every wait ends
    with the value (a lost wake-up would time out)."""
    futures = [_RecordFuture() for _ in range(2000)]
    results: list = [None] * len(futures)

    def waiter() -> None:
        for i, f in enumerate(futures):
            results[i] = f.result(timeout=30)

    def setter() -> None:
        for i, f in enumerate(futures):
            f.set_result(i)

    threads = [threading.Thread(target=waiter), threading.Thread(target=setter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == list(range(len(futures)))
