"""Unit tests of storage/linkdriver.py, the one driver of the chain link machines.

The driver is what gRPC (storage/peerlink.py), the simulation (tests/sim/harness.py) and
the in-memory wire of tests/unit/test_link.py share; here it runs against recording fakes
of its transport, its replica and its machines, one rule per test."""

from __future__ import annotations

import pytest

from sms.errors import InvariantViolation, LogDiverged
from storage import link
from storage.linkdriver import OPENED, PENDING, Observer, ReceiverDriver, SenderDriver
from tests.unit.test_link import run_now

CHAIN = "s:1"
NOW = 50.0


class Transport(Observer):
    def __init__(self, opens=OPENED, current=True):
        self.opens = opens
        self.is_current = current
        self.calls: list = []

    def current(self) -> bool:
        return self.is_current

    def send(self, message) -> None:
        self.calls.append(("send", message))

    def open(self):
        self.calls.append(("open",))
        return self.opens

    def close(self, action) -> None:
        self.calls.append(("close", action))

    def set_timer(self, at: float) -> None:
        self.calls.append(("timer", at))

    def before_apply(self, action) -> None:
        self.calls.append(("before", action))

    def after_apply(self, action, error) -> None:
        self.calls.append(("after", action, error))


class Replica:
    def __init__(self, errors=()):
        self.applied: list = []
        self.errors = list(errors)

    async def apply(self, action):
        self.applied.append(action)
        return self.errors.pop(0) if self.errors else None


class Sender:
    """A sender machine that answers `opened` and `open_failed` with what it is given."""

    def __init__(self, after_open=(), after_failure=()):
        self.after_open, self.after_failure = list(after_open), list(after_failure)
        self.failures: list[str] = []

    def opened(self, now):
        return self.after_open

    def open_failed(self, now, reason):
        self.failures.append(reason)
        return self.after_failure


HELLO = link.Hello(CHAIN, 1)


def sender_driver(**kw):
    t = Transport(**{k: kw.pop(k) for k in ("opens", "current") if k in kw})
    r = Replica()
    s = Sender(**kw)
    return SenderDriver(s, r, t, observer=t), s, r, t


def test_a_send_goes_to_the_transport_and_a_timer_is_set():
    d, _, r, t = sender_driver()
    run_now(d.act([link.Send(HELLO), link.SetTimer(NOW + 1)], NOW))
    assert t.calls == [("send", HELLO), ("timer", NOW + 1)] and r.applied == []


def test_an_open_that_opens_at_once_goes_on_with_the_hello():
    d, _, _, t = sender_driver(after_open=[link.Send(HELLO)])
    run_now(d.act([link.Open()], NOW))
    assert t.calls == [("open",), ("send", HELLO)]


def test_an_open_left_pending_waits_for_opened():
    d, _, _, t = sender_driver(opens=PENDING, after_open=[link.Send(HELLO)])
    run_now(d.act([link.Open()], NOW))
    assert t.calls == [("open",)]
    run_now(d.opened(NOW))
    assert t.calls == [("open",), ("send", HELLO)]


def test_an_open_that_fails_tells_the_sender_why():
    d, s, _, t = sender_driver(opens="no address known for n2", after_failure=[link.SetTimer(NOW + 0.5)])
    run_now(d.act([link.Open()], NOW))
    assert s.failures == ["no address known for n2"] and t.calls == [("open",), ("timer", NOW + 0.5)]


def test_a_replaced_link_neither_opens_nor_commits():
    d, _, r, t = sender_driver(current=False)
    run_now(d.act([link.Open(), link.Commit(7), link.LearnerAcked("n4", 7)], NOW))
    assert t.calls == [] and r.applied == []


def test_commits_and_learner_progress_go_to_the_replica_between_the_hooks():
    d, _, r, t = sender_driver()
    commit, learner = link.Commit(9), link.LearnerAcked("n4", 9)
    run_now(d.act([commit, learner], NOW))
    assert r.applied == [commit, learner]
    assert t.calls == [("before", commit), ("after", commit, None), ("before", learner), ("after", learner, None)]


def test_a_close_goes_to_the_transport_and_finish_sending_does_nothing():
    d, _, r, t = sender_driver()
    close = link.Close("refused", suspect="n2")
    run_now(d.act([link.FinishSending(), close], NOW))
    assert t.calls == [("close", close)] and r.applied == []


@pytest.mark.parametrize("action", [link.Store(b"", 0, 0), link.ResetLog(), "junk"])
def test_a_sender_action_no_driver_knows_is_a_bug(action):
    d, *_ = sender_driver()
    with pytest.raises(InvariantViolation):
        run_now(d.act([action], NOW))


class Receiver:
    def __init__(self, state=link.ReceiverState.STREAMING, on_failure=()):
        self.state = state
        self.on_failure = list(on_failure)
        self.failed: list = []

    def store_failed(self, error):
        self.failed.append(error)
        self.state = link.ReceiverState.CLOSED
        return self.on_failure


def receiver_driver(errors=(), **kw):
    t, r, m = Transport(), Replica(errors), Receiver(**kw)
    return ReceiverDriver(m, r, t, observer=t), m, r, t


def test_replica_actions_are_applied_in_order():
    d, _, r, t = receiver_driver()
    store, reset, verified = link.Store(b"b", 3, 0), link.ResetLog(), link.MarkVerified()
    ack = link.Ack(CHAIN, 1, 3, 3)
    run_now(d.act([verified, store, link.Send(ack), reset]))
    assert r.applied == [verified, store, reset]
    assert [c for c in t.calls if c[0] == "send"] == [("send", ack)]


def test_a_failed_store_goes_back_to_the_receiver_and_its_refusal_is_sent():
    error = LogDiverged("does not chain")
    refusal = link.Refusal(CHAIN, 1, "LogDiverged", "does not chain")
    close = link.Close("refused: LogDiverged")
    d, m, r, t = receiver_driver(errors=[error], on_failure=[link.Send(refusal), close])
    later = link.Store(b"c", 4, 0)
    run_now(d.act([link.Store(b"b", 3, 0), later]))
    assert m.failed == [error]
    assert ("send", refusal) in t.calls and ("close", close) in t.calls
    assert later not in r.applied                # refused meanwhile: nothing more is stored


def test_a_closed_receiver_stores_nothing():
    d, _, r, _ = receiver_driver(state=link.ReceiverState.CLOSED)
    run_now(d.act([link.Store(b"b", 3, 0)]))
    assert r.applied == []


def test_sync_steps_take_only_sends_and_closes():
    d, _, r, t = receiver_driver()
    d.act_now([link.Send(HELLO), link.Close("lost")])
    assert [c[0] for c in t.calls] == ["send", "close"]
    with pytest.raises(InvariantViolation):
        d.act_now([link.Store(b"b", 3, 0)])
    assert r.applied == []


@pytest.mark.parametrize("action", [link.Commit(1), link.Open(), "junk"])
def test_a_receiver_action_no_driver_knows_is_a_bug(action):
    d, *_ = receiver_driver()
    with pytest.raises(InvariantViolation):
        run_now(d.act([action]))


def test_a_receiver_without_a_replica_is_never_due():
    d = ReceiverDriver(Receiver(), None, Transport())
    assert not d.due()
