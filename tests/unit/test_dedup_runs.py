"""`DedupTable.submit_run` / `committed_run` against `submit` / `committed` one record at a
time: two tables fed the same random history (fresh runs, retries, gaps, HWMs that move,
dedup keys, stale and future submissions, bound hits, commits in any order) must give the
same decisions, the same named errors and the same table afterwards. The run methods are
the ingestion hot path; the per-record ones are the reference (tests/unit/test_dedup.py)."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from ingestion.dedup import DEDUP_WINDOW_MS_MIN, HWM_NONE, DecisionKind, DedupTable
from sms.errors import SmsError

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
    t.check_invariants()
    sessions = {pid: (s.pruned_hwm, s.expires_ms,
                      [(e.sssn, e.state, e.sn, e.signature, e.dedup_key, e.expires_ms, len(e.waiters))
                       for e in s.entries.values()])
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
