"""A queue's delivery state of one partition (queues/state.py), against a model: random
histories of fetches, receives, acks (current, late and stale handles), visibility changes,
dead letters, restores, trims and time passing. After every step: nothing fetched is lost
(a record leaves only by an ack of its latest delivery or by a trim), nothing in flight is
received again before its deadline, dead letters come only after MaxReceiveCount receives,
and the state rebuilt from its changes, or from a snapshot, is the same state."""

import itertools

import pytest
from hypothesis import event, given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from queues import state as qs
from sms import errors

UID, ORDINAL = 77, 3


def _nonces():
    return itertools.count(1)


class _Model:
    """What a queue must do, kept as plainly as possible: SN -> fields."""

    def __init__(self):
        self.cursor = 0
        self.records: dict[int, dict] = {}     # not done
        self.done: set[int] = set()


class QueueMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.window, self.dead_max = 12, 3
        self.q = qs.PartitionQueue(UID, ORDINAL, window_max=self.window, dead_max=self.dead_max)
        self.log: list[qs.Change] = []
        self.now = 1_000
        self.next_sn = 10
        self.nonce = itertools.count(1)
        self.handles: list[str] = []            # every handle ever issued
        self.fetched: set[int] = set()
        self.done: set[int] = set()
        self.max_receive = 2
        self.last_received_at: dict[int, tuple[int, int]] = {}   # sn -> (at, deadline) of its latest receive
        self.snapshot_log: list[qs.Change] | None = None

    @initialize(max_receive=st.sampled_from([1, 2, 3]))
    def configure(self, max_receive):
        self.max_receive = max_receive

    def _record(self, changes):
        self.log += changes

    @rule(n=st.integers(0, 6), gap=st.integers(1, 3))
    def fetch(self, n, gap):
        n = min(n, self.q.room())
        self.next_sn = max(self.next_sn, self.q.cursor)     # (a trim may have moved the cursor on)
        sns = []
        for _ in range(n):
            sns.append(self.next_sn)
            self.next_sn += gap
        cursor = self.next_sn
        self.next_sn += 1
        self._record(self.q.fetch(sns, cursor))
        self.fetched.update(sns)

    @rule(limit=st.integers(1, 10), vis=st.sampled_from([0, 5, 50, 500]), dead=st.booleans())
    def receive(self, limit, vis, dead):
        before = {sn: (e.kind, e.deadline_ms) for sn, e in self.q.entries.items()}
        out, changes = self.q.receive(limit, self.now, vis, self.nonce, max_receive_count=self.max_receive, dead=dead)
        self._record(changes)
        event(f"receive{' dead' if dead else ''}: {'some' if out else 'none'}")
        assert len(out) <= limit
        sns = [d.sn for d in out]
        assert sns == sorted(sns)
        for d in out:
            kind, deadline = before[d.sn]
            # never one in flight before its deadline
            assert kind not in (qs.Kind.IN_FLIGHT, qs.Kind.DEAD_IN_FLIGHT) or deadline <= self.now
            e = self.q.entries[d.sn]
            assert e.kind is (qs.Kind.DEAD_IN_FLIGHT if dead else qs.Kind.IN_FLIGHT)
            assert d.receive_count == e.receive_count and d.receive_count <= self.max_receive + 10
            h = qs.parse_handle(d.handle)
            assert (h.queue_uid, h.ordinal, h.sn, h.dead) == (UID, ORDINAL, d.sn, dead)
            self.handles.append(d.handle)

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 10_000))
    def ack(self, i):
        text = self.handles[i % len(self.handles)]
        h = qs.parse_handle(text)
        e = self.q.entries.get(h.sn)
        latest = e is not None and e.nonce == h.nonce
        was_done = h.sn in self.done
        error, changes = self.q.ack(h, self.now, self.max_receive)
        self._record(changes)
        event(f"ack: {error.name if error else 'ok'}{' (done already)' if was_done else ''}")
        if error is None:
            assert latest or was_done          # (an ack of a record done already: done, nothing changes)
            assert h.sn not in self.q.entries
            self.done.add(h.sn)
        else:
            assert not was_done and h.sn in self.q.entries

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 10_000), vis=st.sampled_from([0, 1, 30, 300]))
    def change_visibility(self, i, vis):
        h = qs.parse_handle(self.handles[i % len(self.handles)])
        error, changes = self.q.change_visibility(h, self.now, vis, self.max_receive)
        self._record(changes)
        if error is None and vis:
            e = self.q.entries[h.sn]
            assert e.deadline_ms == self.now + vis

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 10_000))
    def restore(self, i):
        h = qs.parse_handle(self.handles[i % len(self.handles)])
        error, changes = self.q.restore(h, self.now, self.max_receive)
        self._record(changes)
        event(f"restore: {error.name if error else 'ok'}")
        if error is None:
            e = self.q.entries[h.sn]
            assert e.kind is qs.Kind.AVAILABLE and e.receive_count == 0
        elif not h.dead:
            assert error is qs.HandleError.NOT_DEAD

    @rule(ms=st.sampled_from([1, 4, 10, 60, 600]))
    def tick(self, ms):
        self.now += ms
        self._record(self.q.expire(self.now, self.max_receive))

    @rule(k=st.integers(0, 8))
    def trim(self, k):
        sns = sorted(self.q.entries.keys())
        bound = sns[min(k, len(sns) - 1)] if sns and k < len(sns) else self.q.cursor + (k % 3)
        gone = {sn for sn in self.q.entries if sn < bound}
        self._record(self.q.trim(bound))
        self.done |= gone
        self.done |= {sn for sn in self.fetched if sn < bound}

    @rule()
    def snapshot(self):
        self.snapshot_log = list(self.q.snapshot())
        self.after_snapshot = len(self.log)

    @invariant()
    def nothing_fetched_is_lost(self):
        for sn in self.fetched:
            assert (sn in self.q.entries) != (sn in self.done), sn

    @invariant()
    def counters_and_bounds(self):
        live = sum(1 for e in self.q.entries.values() if e.kind in (qs.Kind.AVAILABLE, qs.Kind.IN_FLIGHT))
        dead = len(self.q.entries) - live
        assert (self.q.live, self.q.dead) == (live, dead)
        # (a restore may take the live ones past the window: dead letters came out of it)
        assert dead <= self.dead_max and live + dead <= self.window + self.dead_max
        assert list(self.q.available) == sorted(sn for sn, e in self.q.entries.items() if e.kind is qs.Kind.AVAILABLE)
        assert list(self.q.dead_available) == sorted(sn for sn, e in self.q.entries.items() if e.kind is qs.Kind.DEAD)
        for e in self.q.entries.values():
            if e.kind in (qs.Kind.DEAD, qs.Kind.DEAD_IN_FLIGHT):
                assert e.receive_count >= self.max_receive      # only after MaxReceiveCount receives

    @invariant()
    def replay_gives_the_same_state(self):
        again = qs.replay(UID, ORDINAL, self.log, window_max=self.window, dead_max=self.dead_max)
        assert again.view() == self.q.view()
        if self.snapshot_log is not None:
            from_snapshot = qs.replay(UID, ORDINAL, self.snapshot_log + self.log[self.after_snapshot:],
                                      window_max=self.window, dead_max=self.dead_max)
            assert from_snapshot.view() == self.q.view()
        # and both expire the same way from here on
        later = self.now + 1000
        assert again.expire(later, self.max_receive) == qs.replay(
            UID, ORDINAL, self.q.snapshot(), window_max=self.window, dead_max=self.dead_max).expire(
            later, self.max_receive)


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)


# --- single behaviours, named -----------------------------------------------------------------

def _queue(**kw):
    q = qs.PartitionQueue(UID, ORDINAL, **kw)
    q.fetch([10, 20, 30], 31)
    return q


def test_a_received_record_is_invisible_until_its_deadline_then_comes_back():
    q = _queue()
    n = _nonces()
    got, _ = q.receive(10, 0, 100, n)
    assert [d.sn for d in got] == [10, 20, 30] and [d.receive_count for d in got] == [1, 1, 1]
    assert q.receive(10, 99, 100, n)[0] == []
    again, _ = q.receive(10, 100, 100, n)
    assert [d.sn for d in again] == [10, 20, 30] and [d.receive_count for d in again] == [2, 2, 2]
    assert all(d.first_receive_ms == 0 for d in again)


def test_an_acknowledged_record_is_not_delivered_again():
    q = _queue()
    got, _ = q.receive(1, 0, 100, _nonces())
    error, changes = q.ack(qs.parse_handle(got[0].handle), 5)
    assert error is None and changes == [qs.Change(qs.Op.ACK, sn=10)]
    assert [d.sn for d in q.receive(10, 1000, 100, itertools.count(50))[0]] == [20, 30]


def test_a_handle_of_an_earlier_delivery_is_refused_once_the_record_is_received_again():
    q = _queue()
    first, _ = q.receive(1, 0, 10, _nonces())
    second, _ = q.receive(1, 10, 10, itertools.count(100))
    assert first[0].handle != second[0].handle
    assert q.ack(qs.parse_handle(first[0].handle), 11)[0] is qs.HandleError.EXPIRED
    assert q.ack(qs.parse_handle(second[0].handle), 11)[0] is None


def test_a_late_ack_of_the_latest_delivery_still_counts():
    q = _queue()
    got, _ = q.receive(1, 0, 10, _nonces())
    assert q.ack(qs.parse_handle(got[0].handle), 500)[0] is None      # deadline passed, nobody took it
    assert 10 not in q.entries


def test_after_max_receive_count_a_record_becomes_a_dead_letter_and_can_be_restored():
    q = _queue()
    n = itertools.count(1)
    for t in (0, 10):
        q.receive(1, t, 10, n, max_receive_count=2)
    assert q.receive(1, 20, 10, n, max_receive_count=2)[0][0].sn == 20     # 10 is dead now
    assert q.entries[10].kind is qs.Kind.DEAD
    dead, _ = q.receive(10, 20, 10, n, max_receive_count=2, dead=True)
    assert [d.sn for d in dead] == [10] and dead[0].receive_count == 2
    h = qs.parse_handle(dead[0].handle)
    assert h.dead
    assert q.ack(qs.Handle(UID, ORDINAL, 10, h.nonce, False), 21)[0] is qs.HandleError.NOT_DEAD
    error, _ = q.restore(h, 21, 2)
    assert error is None and q.entries[10].kind is qs.Kind.AVAILABLE and q.entries[10].receive_count == 0
    assert 10 in [d.sn for d in q.receive(10, 21, 10, n, max_receive_count=2)[0]]


def test_visibility_zero_makes_a_record_visible_at_once_and_keeps_its_count():
    q = _queue()
    n = _nonces()
    got, _ = q.receive(1, 0, 1000, n)
    assert q.change_visibility(qs.parse_handle(got[0].handle), 5, 0)[0] is None
    again, _ = q.receive(1, 5, 1000, n)
    assert again[0].sn == 10 and again[0].receive_count == 2


def test_the_window_bounds_what_a_partition_holds():
    q = qs.PartitionQueue(UID, ORDINAL, window_max=3)
    assert q.room() == 3
    q.fetch([1, 2, 3], 4)
    assert q.room() == 0
    with pytest.raises(errors.InvariantViolation):
        q.fetch([5], 6)
    got, _ = q.receive(1, 0, 10, _nonces())
    q.ack(qs.parse_handle(got[0].handle), 1)
    assert q.room() == 1


def test_retention_ends_delivery_whatever_the_state():
    q = _queue()
    q.receive(1, 0, 10, _nonces())
    assert q.trim(25) == [qs.Change(qs.Op.TRIM, value=25)]
    assert sorted(q.entries) == [30] and q.cursor == 31
    assert q.trim(30) == []                 # nothing below 30 is held any more


@given(st.text(max_size=80) | st.binary(max_size=60).map(lambda b: __import__("base64").urlsafe_b64encode(b).decode()))
def test_a_handle_no_queue_issued_is_a_named_error(text):
    try:
        qs.parse_handle(text)
    except errors.InvalidArgument:
        pass


def test_a_handle_round_trips():
    text = qs.make_handle(2**63 + 5, 1023, 2**127 + 99, 2**64 - 1, True)
    assert len(text) <= 64
    assert qs.parse_handle(text) == qs.Handle(2**63 + 5, 1023, 2**127 + 99, 2**64 - 1, True)
