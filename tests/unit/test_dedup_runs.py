"""`DedupTable.submit_run` / `committed_run` against `submit` / `committed` one record at a
time: two tables fed the same random history (fresh runs, retries, gaps, HWMs that move,
dedup keys, stale and future submissions, bound hits, commits in any order) must give the
same decisions, the same named errors and the same table afterwards. The run methods are
the ingestion hot path; the per-record ones are the reference (tests/unit/test_dedup.py)."""

from __future__ import annotations

import hashlib
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from ingestion.dedup import DEDUP_CLOCK_SKEW_MS_MAX, DEDUP_WINDOW_MS_MIN, HWM_NONE, DecisionKind, DedupTable
from sms.errors import SmsError
from sms.seqno import COUNTER_UNIT

NOW_MS = 1_700_000_000_000
PRODUCERS = (b"producer-a", b"producer-b")


def sig(producer_id: bytes, sssn: int) -> bytes:
    return hashlib.blake2b(producer_id + str(sssn).encode(), digest_size=16).digest()


def tables() -> tuple[DedupTable, DedupTable]:
    bounds = dict(sessions_max=2, entries_per_session_max=12, keys_max=6, waiters_per_entry_max=3)
    return (DedupTable("s/p0000", DEDUP_WINDOW_MS_MIN, **bounds),
            DedupTable("s/p0000", DEDUP_WINDOW_MS_MIN, **bounds))


def outcome(x) -> tuple:
    if isinstance(x, SmsError):
        return ("error", x.name)
    return (x.kind, x.sn, x.ticket)


def snapshot(t: DedupTable) -> tuple:
    """Everything the table holds, its fresh runs as the entries they stand for (not
    changing the table: a run made into entries here would hide the next step's run
    paths)."""
    t.check_invariants()
    sessions = {pid: (s.pruned_hwm, s.expires_ms,
                      [(e.sssn, e.state, e.sn, e.signature, e.dedup_key, e.expires_ms, len(e.waiters))
                       for e in t.entries_of(pid)])
                for pid, s in t._sessions.items()}
    return t.stats(), sessions, sorted(t._keys)


step = st.one_of(
    st.tuples(st.just("run"), st.sampled_from(PRODUCERS), st.integers(0, 3),       # hwm lag below start
              st.integers(0, 20), st.integers(1, 8),                                # start, length
              st.sampled_from(["fresh", "gap", "key", "stale", "future", "retry"])),
    st.tuples(st.just("commit"), st.sampled_from(PRODUCERS), st.integers(0, 5)),   # how many pending
    st.tuples(st.just("fail"), st.sampled_from(PRODUCERS)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, min_size=1, max_size=25))
def test_runs_decide_and_leave_the_table_as_records_one_at_a_time(history):
    ref, fast = tables()
    sn = 1000
    for action in history:
        if action[0] == "run":
            _, pid, lag, start, length, shape = action
            records = []
            for k in range(length):
                sssn = start + k + (2 if shape == "gap" and k == length // 2 else 0)
                submit_ms = NOW_MS - (DEDUP_WINDOW_MS_MIN + 5 if shape == "stale" and k == 0 else 0) \
                    + (10 ** 6 if shape == "future" and k == length - 1 else 0)
                key = f"key-{sssn % 4}".encode() if shape == "key" else None
                records.append((sssn, submit_ms, sig(pid, sssn), key))
            hwm = max(HWM_NONE, start - 1 - lag)
            expected, missing_ref = [], set()
            for sssn, submit_ms, signature, key in records:
                try:
                    d = ref.submit(pid, sssn, hwm, submit_ms, signature, key, NOW_MS)
                    missing_ref.update(d.missing)
                    expected.append(outcome(d))
                except SmsError as e:
                    expected.append(outcome(e))
            got = fast.submit_run(pid, hwm, NOW_MS, records)
            assert [outcome(x) for x in got] == expected
            missing_fast = set()
            for x in got:
                if not isinstance(x, SmsError):
                    missing_fast.update(x.missing)
            assert missing_fast == missing_ref
        elif action[0] == "commit":
            _, pid, count = action
            session = ref._sessions.get(pid)
            pending = [e.sssn for e in session.entries.values()
                       if e.state.value == "PENDING"][:count] if session else []
            outcomes = []
            for sssn in pending:
                outcomes.append((sssn, sn))
                sn += 1
            expected = []
            for sssn, s in outcomes:
                expected.extend(ref.committed(pid, sssn, s))
            got = fast.committed_run(pid, outcomes) if outcomes else []
            assert [(r.ticket, r.kind, r.producer_id, r.sssn, r.sn) for r in got] == \
                   [(r.ticket, r.kind, r.producer_id, r.sssn, r.sn) for r in expected]
        else:
            _, pid = action
            session = ref._sessions.get(pid)
            pending = [e.sssn for e in session.entries.values() if e.state.value == "PENDING"] if session else []
            if pending:
                a = ref.failed(pid, pending[0])
                b = fast.failed(pid, pending[0])
                assert [(r.ticket, r.kind, r.sssn) for r in a] == [(r.ticket, r.kind, r.sssn) for r in b]
        assert snapshot(fast) == snapshot(ref)


def test_a_fresh_run_is_decided_at_once_and_committed_as_a_run():
    _, t = tables()
    got = t.submit_run(b"p", HWM_NONE, NOW_MS, [(i, NOW_MS, sig(b"p", i), None) for i in range(5)])
    assert [d.kind for d in got] == [DecisionKind.WRITE] * 5
    assert t.stats()["pending"] == 5
    assert t.committed_run(b"p", [(i, 100 + i) for i in range(5)]) == []
    assert t.stats()["pending"] == 0
    # the next request's HWM prunes the committed run; a retry below it is a duplicate
    got = t.submit_run(b"p", 4, NOW_MS, [(5, NOW_MS, sig(b"p", 5), None)])
    assert got[0].kind is DecisionKind.WRITE and t.stats()["entries"] == 1
    t.check_invariants()


# --- fresh runs (`submit_fresh`) as ingestion's fast path uses them -----------------------

def one_by_one(ref: DedupTable, pid: bytes, hwm: int, now: int, records) -> list[tuple]:
    """The outcome of each record through `submit`, in order."""
    out = []
    for sssn, submit_ms, signature, key in records:
        try:
            out.append(outcome(ref.submit(pid, sssn, hwm, submit_ms, signature, key, now)))
        except SmsError as e:
            out.append(outcome(e))
    return out


fresh_step = st.one_of(
    st.tuples(st.just("fresh"), st.sampled_from(PRODUCERS), st.integers(0, 3), st.integers(-2, 2),
              st.integers(1, 6), st.sampled_from([0, 1, 1000])),   # hwm lag, start offset, length, submit spread
    st.tuples(st.just("run"), st.sampled_from(PRODUCERS), st.integers(0, 3), st.integers(0, 20),
              st.integers(1, 6), st.sampled_from(["fresh", "retry", "key", "gap"])),
    st.tuples(st.just("commit_fresh"), st.integers(0, 3)),
    st.tuples(st.just("fail_fresh"), st.integers(0, 3)),
    st.tuples(st.just("commit"), st.sampled_from(PRODUCERS), st.integers(0, 4)),
    # time passes: a little, or to about when the oldest records go stale (a run partly so)
    st.tuples(st.just("tick"), st.one_of(st.integers(0, 3000),
                                         st.integers(DEDUP_WINDOW_MS_MIN - 3000, DEDUP_WINDOW_MS_MIN + 3000))),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(fresh_step, min_size=1, max_size=30))
def test_fresh_runs_decide_and_settle_as_records_one_at_a_time(history):
    """The fast table takes a fresh run whole when `submit_fresh` accepts it (else
    `submit_run`, as ingestion does), settles it with `committed_fresh` / `failed_fresh`,
    and meets record-by-record paths that turn its runs into entries; the reference takes
    every record through `submit`, `committed` and `failed`. Same decisions, same
    resolutions, same table (runs seen as entries) after every step."""
    ref, fast = tables()
    now, sn = NOW_MS, 1 << 40
    tokens: list[tuple[bytes, object, int, int]] = []      # (producer, run, first sssn, count)
    nexts = dict.fromkeys(PRODUCERS, 0)
    taken = 0
    for action in history:
        kind = action[0]
        if kind == "fresh":
            _, pid, lag, offset, length, spread = action
            start = max(0, nexts[pid] + offset)
            hwm = max(HWM_NONE, start - 1 - lag)
            # submit times at and ahead of the clock (within the skew): records expire apart
            submits = [now + (spread * k) % (DEDUP_CLOCK_SKEW_MS_MAX + 1) for k in range(length)]
            records = [(start + k, submits[k], sig(pid, start + k), None) for k in range(length)]
            expected = one_by_one(ref, pid, hwm, now, records)
            run = fast.submit_fresh(pid, hwm, now, start, length, min(submits), max(submits),
                                    b"".join(r[2] for r in records), struct.pack(f"<{length}Q", *submits))
            if run is not None:
                taken += 1
                assert all(e == (DecisionKind.WRITE, None, None) for e in expected)
                tokens.append((pid, run, start, length))
            else:
                assert [outcome(x) for x in fast.submit_run(pid, hwm, now, records)] == expected
            nexts[pid] = max(nexts[pid], start + length)
        elif kind == "run":
            _, pid, lag, start, length, shape = action
            records = []
            for k in range(length):
                sssn = start + k + (2 if shape == "gap" and k == length // 2 else 0)
                key = f"key-{sssn % 4}".encode() if shape == "key" else None
                records.append((sssn, now, sig(pid, sssn), key))
            hwm = max(HWM_NONE, start - 1 - lag)
            expected = one_by_one(ref, pid, hwm, now, records)
            assert [outcome(x) for x in fast.submit_run(pid, hwm, now, records)] == expected
        elif kind in ("commit_fresh", "fail_fresh"):
            if not tokens:
                continue
            pid, run, start, length = tokens.pop(min(action[1], len(tokens) - 1))
            session = ref._sessions.get(pid)
            states = [session.entries.get(start + k) for k in range(length)] if session else []
            if not states or any(e is None or e.state.value != "PENDING" for e in states):
                continue          # (settled by a record-by-record step meanwhile)
            if kind == "commit_fresh":
                want = [r for k in range(length) for r in ref.committed(pid, start + k, sn + k * COUNTER_UNIT)]
                got = fast.committed_fresh(pid, run, sn)
                sn += length * COUNTER_UNIT
            else:
                want = [r for k in range(length) for r in ref.failed(pid, start + k)]
                got = fast.failed_fresh(pid, run)
            assert [(r.ticket, r.kind, r.producer_id, r.sssn, r.sn) for r in got] == \
                   [(r.ticket, r.kind, r.producer_id, r.sssn, r.sn) for r in want]
        elif kind == "commit":
            _, pid, count = action
            pending = [e.sssn for e in ref.entries_of(pid) if e.state.value == "PENDING"][:count]
            outcomes = [(sssn, sn + k) for k, sssn in enumerate(pending)]
            sn += len(pending)
            want = [r for sssn, s in outcomes for r in ref.committed(pid, sssn, s)]
            got = fast.committed_run(pid, outcomes) if outcomes else []
            assert [(r.ticket, r.kind, r.sssn, r.sn) for r in got] == [(r.ticket, r.kind, r.sssn, r.sn) for r in want]
        else:
            now += action[1]
            ref.prune(now)
            fast.prune(now)
        assert snapshot(fast) == snapshot(ref)


def test_a_fresh_run_is_one_object_until_something_looks_at_its_records():
    _, t = tables()
    submits = struct.pack("<4Q", *[NOW_MS] * 4)
    sigs = b"".join(sig(b"p", i) for i in range(4))
    run = t.submit_fresh(b"p", HWM_NONE, NOW_MS, 0, 4, NOW_MS, NOW_MS, sigs, submits)
    assert run is not None and t.stats()["pending"] == 4 and not t._sessions[b"p"].entries
    # a gap below it, a retry, a too-old submit time: not fresh, nothing changed
    assert t.submit_fresh(b"p", 3, NOW_MS, 6, 1, NOW_MS, NOW_MS, sig(b"p", 6), submits[:8]) is None
    assert t.submit_fresh(b"p", HWM_NONE, NOW_MS, 2, 1, NOW_MS, NOW_MS, sig(b"p", 2), submits[:8]) is None
    assert t.submit_fresh(b"p", 3, NOW_MS, 4, 1, 0, 0, sig(b"p", 4), bytes(8)) is None
    assert t.committed_fresh(b"p", run, 1 << 32) == []
    # the next run's HWM takes the committed run whole
    nxt = t.submit_fresh(b"p", 3, NOW_MS, 4, 1, NOW_MS, NOW_MS, sig(b"p", 4), submits[:8])
    assert nxt is not None and t.stats()["entries"] == 1 and t._sessions[b"p"].runs == [nxt]
    # a retry of SSSN 4 goes record by record: the run becomes entries, and it is queued
    d = t.submit(b"p", 4, 3, NOW_MS, sig(b"p", 4), None, NOW_MS)
    assert d.kind is DecisionKind.QUEUED and not t._sessions[b"p"].runs
    (resolution,) = t.committed_fresh(b"p", nxt, 5 << 32)
    assert (resolution.kind, resolution.sn) == (DecisionKind.DUPLICATE, 5 << 32)
    t.check_invariants()


def test_a_run_partly_past_the_window_is_pruned_record_by_record():
    ref, fast = tables()
    submits = [NOW_MS, NOW_MS + 2000, NOW_MS + 4000]
    sigs = [sig(b"p", i) for i in range(3)]
    for k in range(3):
        ref.submit(b"p", k, HWM_NONE, submits[k], sigs[k], None, NOW_MS)
        ref.committed(b"p", k, (7 + k) * COUNTER_UNIT)
    run = fast.submit_fresh(b"p", HWM_NONE, NOW_MS, 0, 3, NOW_MS, NOW_MS + 4000, b"".join(sigs),
                            struct.pack("<3Q", *submits))
    assert fast.committed_fresh(b"p", run, 7 * COUNTER_UNIT) == []
    assert snapshot(fast) == snapshot(ref)
    later = NOW_MS + DEDUP_WINDOW_MS_MIN + 1000          # the first record is stale, the others not
    ref.prune(later)
    fast.prune(later)
    assert snapshot(fast) == snapshot(ref) and fast.stats()["entries"] == 2
    last = NOW_MS + DEDUP_WINDOW_MS_MIN + 5000            # all of them
    ref.prune(last)
    fast.prune(last)
    assert snapshot(fast) == snapshot(ref) and fast.stats()["entries"] == 0
