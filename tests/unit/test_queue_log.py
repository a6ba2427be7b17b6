"""A queue's state log records (queues/log.py): every change a state makes survives its
bytes; a rebuild from the records is the state, ignores what an owner wrote after another
took the partition over, and starts again at a snapshot; bytes that are not a record are
QueueLogCorrupt, never a crash."""

import itertools
import random

import pytest
from hypothesis import given, settings, strategies as st

from queues import log as qlog
from queues import state as qs

UID = 9


def _history(seed: int, steps: int = 300):
    """A random history of one partition's state: (state, [(changes of one step)])."""
    rnd = random.Random(seed)
    q = qs.PartitionQueue(UID, 1, window_max=30, dead_max=5)
    nonces = itertools.count(1)
    now, next_sn, handles, steps_out = 1000, 100, [], []
    for _ in range(steps):
        op = rnd.randrange(7)
        if op == 0:
            sns = [next_sn + i * 3 for i in range(min(rnd.randrange(6), q.room()))]
            next_sn += 3 * len(sns) + 1
            changes = q.fetch(sns, next_sn)
        elif op == 1:
            out, changes = q.receive(rnd.randrange(1, 8), now, rnd.choice([0, 5, 50]), nonces, max_receive_count=2,
                                     dead=rnd.random() < 0.3)
            handles += [d.handle for d in out]
        elif op == 2 and handles:
            _e, changes = q.ack(qs.parse_handle(rnd.choice(handles)), now, 2)
        elif op == 3 and handles:
            _e, changes = q.change_visibility(qs.parse_handle(rnd.choice(handles)), now, rnd.choice([0, 9]), 2)
        elif op == 4 and handles:
            _e, changes = q.restore(qs.parse_handle(rnd.choice(handles)), now, 2)
        elif op == 5:
            now += rnd.choice([1, 10, 100])
            changes = q.expire(now, 2)
        else:
            changes = q.trim(next_sn - rnd.randrange(40)) if rnd.random() < 0.1 else []
        steps_out.append(changes)
    return q, steps_out


@pytest.mark.parametrize("seed", range(12))
def test_a_rebuild_from_the_records_is_the_state(seed):
    q, steps = _history(seed)
    records = [qlog.encode(qlog.RecordKind.CHANGES, 1, 4, changes) for changes in steps if changes]
    assert all(qlog.decode(r)[3] == changes for r, changes in zip(records, [c for c in steps if c]))
    again, epoch = qlog.rebuild(UID, 1, records, window_max=30, dead_max=5)
    assert again.view() == q.view() and epoch == 0
    # a snapshot in the middle, then the rest: the same
    cut = len(records) // 2
    before = qlog.rebuild(UID, 1, records[:cut], window_max=30, dead_max=5)[0]
    snap = qlog.encode(qlog.RecordKind.SNAPSHOT, 1, 4, before.snapshot())
    garbage_before = [qlog.encode(qlog.RecordKind.CHANGES, 1, 4, [qs.Change(qs.Op.FETCH, value=5, sns=(1, 2))])]
    assert qlog.rebuild(UID, 1, garbage_before + [snap] + records[cut:], window_max=30,
                        dead_max=5)[0].view() == q.view()


def test_records_of_other_partitions_and_of_a_fenced_owner_are_skipped():
    q, steps = _history(3, 100)
    mine = [qlog.encode(qlog.RecordKind.CHANGES, 1, 7, c) for c in steps if c]
    other = qlog.encode(qlog.RecordKind.CHANGES, 2, 9, [qs.Change(qs.Op.FETCH, value=10**6, sns=(999,))])
    takeover = qlog.encode(qlog.RecordKind.TAKEOVER, 1, 8, [])
    zombie = qlog.encode(qlog.RecordKind.CHANGES, 1, 7, [qs.Change(qs.Op.TRIM, value=10**9)])
    state, epoch = qlog.rebuild(UID, 1, mine[:1] + [other] + mine[1:] + [takeover, zombie], window_max=30,
                                dead_max=5)
    assert epoch == 8 and state.view() == q.view()


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_bytes_that_are_no_record_are_named(data):
    try:
        qlog.decode(data)
    except qlog.QueueLogCorrupt:
        pass


@settings(max_examples=300)
@given(st.integers(0, 10_000), st.integers(0, 255))
def test_a_damaged_record_is_named_or_reads_as_another(index, value):
    q, steps = _history(5, 60)
    record = bytearray(qlog.encode(qlog.RecordKind.CHANGES, 1, 2, [c for s in steps for c in s]))
    record[index % len(record)] = value
    try:
        qlog.decode(bytes(record))
    except qlog.QueueLogCorrupt:
        pass
    with pytest.raises(qlog.QueueLogCorrupt):
        qlog.decode(bytes(record[:-1]) if record[-1:] else b"x")
