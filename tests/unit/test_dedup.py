"""Unit tests of ingestion.dedup: one test per rule of DESIGN section 6, every bad input
with its named error (table unchanged, session still usable), bounds, rebuild, the
non-dedup policies, and a hypothesis state machine in which producers send, resend,
reorder and lose requests and acks while writes commit or fail in any order."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import grpc
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ingestion.dedup import (DEDUP_CLOCK_SKEW_MS_MAX, DEDUP_KEY_BYTES_MAX, DEDUP_MISSING_SSSNS_MAX,
                             DEDUP_SESSIONS_PER_PARTITION_MAX, DEDUP_WINDOW_MS_MIN, HWM_NONE, SSSN_MAX,
                             DecisionKind, DedupKeyTooLarge, DedupTable, InvalidDedupKey, InvalidHwm,
                             InvalidProducerId, InvalidSession, InvalidSssn, Resolution, SessionConflict,
                             StaleSubmission, StoredRecord, SubmissionInFuture, TableFull)
from sms import errors
from sms.errors import InvalidArgument, InvariantViolation, Throttled
from sms.types import IngestionPolicy

WRITE, DUPLICATE, QUEUED = DecisionKind.WRITE, DecisionKind.DUPLICATE, DecisionKind.QUEUED
NOW_MS = 1_700_000_000_000
WINDOW_MS = DEDUP_WINDOW_MS_MIN
A, B, C = b"producer-a", b"producer-b", b"producer-c"


def sig(producer_id: bytes, sssn: int) -> bytes:
    """The signature of producer_id's record sssn (what ingestion would compute)."""
    return hashlib.blake2b(producer_id + str(sssn).encode(), digest_size=16).digest()


def make(**kwargs) -> DedupTable:
    return DedupTable("s/p0000", WINDOW_MS, **kwargs)


def put(table: DedupTable, producer_id: bytes, sssn: int, hwm: int = HWM_NONE, key: bytes | None = None,
        submit_ms: int = NOW_MS, now_ms: int = NOW_MS, signature: bytes | None = None):
    return table.submit(producer_id, sssn, hwm, submit_ms, signature or sig(producer_id, sssn), key, now_ms)


def snapshot(table: DedupTable) -> tuple:
    """Everything the table holds, to show that a rejected submission changed nothing."""
    return table.stats(), repr(table._sessions), repr(table._keys)


def written(table: DedupTable, producer_id: bytes, sssn: int, sn: int, **kwargs) -> None:
    assert put(table, producer_id, sssn, **kwargs).kind is WRITE
    assert table.committed(producer_id, sssn, sn) == []


# --- the rules of DESIGN section 6 ---------------------------------------------------------

def test_a_new_record_is_written_and_pending():
    t = make()
    d = put(t, A, 0)
    assert (d.kind, d.sn, d.ticket, d.missing) == (WRITE, None, None, ())
    assert t.stats()["pending"] == 1 and t.stats()["entries"] == 1
    assert t.committed(A, 0, 100) == []
    assert t.stats()["pending"] == 0
    t.check_invariants()


def test_a_stale_submission_is_rejected():
    t = make()
    oldest_ok_ms = NOW_MS - WINDOW_MS
    assert put(t, A, 0, submit_ms=oldest_ok_ms).kind is WRITE
    before = snapshot(t)
    with pytest.raises(StaleSubmission):
        put(t, A, 1, submit_ms=oldest_ok_ms - 1)
    with pytest.raises(StaleSubmission):           # a retry past the window as well
        put(t, A, 0, submit_ms=oldest_ok_ms, now_ms=NOW_MS + 1)
    assert snapshot(t) == before


def test_a_committed_duplicate_is_acked_with_the_original_sn_and_not_stored():
    t = make()
    written(t, A, 0, 100)
    writes = t.stats()["writes_total"]
    for _ in range(3):
        d = put(t, A, 0)
        assert (d.kind, d.sn) == (DUPLICATE, 100)
    assert t.stats()["writes_total"] == writes
    assert t.stats()["entries"] == 1


def test_a_pending_duplicate_is_queued_until_the_write_commits():
    t = make()
    assert put(t, A, 0).kind is WRITE
    q1, q2 = put(t, A, 0), put(t, A, 0)
    assert q1.kind is QUEUED and q2.kind is QUEUED and q1.ticket != q2.ticket
    assert t.stats()["queued"] == 2
    resolved = t.committed(A, 0, 100)
    assert resolved == [Resolution(q1.ticket, DUPLICATE, A, 0, 100), Resolution(q2.ticket, DUPLICATE, A, 0, 100)]
    assert t.stats()["queued"] == 0
    assert (put(t, A, 0).kind, put(t, A, 0).sn) == (DUPLICATE, 100)
    t.check_invariants()


def test_a_failed_write_lets_the_first_queued_duplicate_write_and_keeps_the_rest_queued():
    t = make()
    assert put(t, A, 0).kind is WRITE
    q1, q2 = put(t, A, 0), put(t, A, 0)
    assert t.failed(A, 0) == [Resolution(q1.ticket, WRITE, A, 0)]
    s = t.stats()
    assert (s["pending"], s["queued"]) == (1, 1)    # q1 writes now; q2 waits behind it
    t.check_invariants()
    assert t.committed(A, 0, 200) == [Resolution(q2.ticket, DUPLICATE, A, 0, 200)]
    assert put(t, A, 0).sn == 200


def test_a_failed_write_without_waiters_lets_the_next_retry_write():
    t = make()
    assert put(t, A, 0).kind is WRITE
    assert t.failed(A, 0) == []
    assert t.stats()["entries"] == 0
    assert put(t, A, 0).kind is WRITE


def test_entries_at_or_below_the_hwm_are_pruned_and_an_sssn_below_it_is_a_duplicate_never_stored():
    t = make()
    for sssn in range(5):
        written(t, A, sssn, 100 + sssn)
    assert t.stats()["entries"] == 5
    assert put(t, A, 5, hwm=2).kind is WRITE         # the producer holds acks for 0..2
    assert t.stats()["entries"] == 3                 # 3, 4 and the pending 5
    writes = t.stats()["writes_total"]
    for sssn in (0, 1, 2):                           # answered, SN pruned, never stored again
        d = put(t, A, sssn)
        assert (d.kind, d.sn) == (DUPLICATE, None)
    assert put(t, A, 3).sn == 103                    # above the HWM: the SN is still known
    assert t.stats()["writes_total"] == writes
    d = put(t, A, 4, hwm=1)                          # a reordered request: the HWM does not go back
    assert (d.kind, d.sn, d.missing) == (DUPLICATE, 104, ())
    assert put(t, A, 2).sn is None
    t.check_invariants()


def test_an_hwm_equal_to_the_sssn_answers_duplicate_without_storing():
    t = make()
    d = put(t, A, 7, hwm=7)
    assert (d.kind, d.sn) == (DUPLICATE, None)
    assert t.stats()["entries"] == 0


def test_a_pending_entry_at_or_below_the_hwm_stays_until_its_outcome():
    t = make()
    assert put(t, A, 0).kind is WRITE
    written(t, A, 1, 101, hwm=HWM_NONE)
    assert put(t, A, 2, hwm=1).kind is WRITE         # a buggy HWM over the pending 0
    assert put(t, A, 0).kind is QUEUED               # 0 is still known as pending
    t.committed(A, 0, 100)                           # committed at or below the HWM: pruned at once
    assert t.stats()["entries"] == 1                 # only the pending 2
    assert put(t, A, 0).sn is None
    t.check_invariants()


def test_the_window_prunes_entries_and_drops_quiet_sessions():
    t = make()
    written(t, A, 0, 100)
    written(t, B, 0, 200, now_ms=NOW_MS + 10)
    assert put(t, C, 0).kind is WRITE                # stays pending
    t.prune(NOW_MS + WINDOW_MS)
    assert t.stats()["sessions"] == 3 and t.stats()["entries"] == 3   # nothing is outside yet
    t.prune(NOW_MS + WINDOW_MS + 1)
    s = t.stats()
    assert (s["sessions"], s["entries"], s["pending"]) == (2, 2, 1)   # A quiet and gone; C pending stays
    t.prune(NOW_MS + 10 * WINDOW_MS)
    s = t.stats()
    assert (s["sessions"], s["entries"], s["pending"]) == (1, 1, 1)
    t.committed(C, 0, 300)
    t.prune(NOW_MS + 10 * WINDOW_MS)
    assert t.stats()["sessions"] == 0 and t.stats()["entries"] == 0
    later_ms = NOW_MS + 10 * WINDOW_MS               # a quiet producer comes back: a new session
    assert put(t, A, 1, submit_ms=later_ms, now_ms=later_ms).kind is WRITE
    t.check_invariants()


def test_an_ack_lists_the_sssns_between_the_hwm_and_this_sssn_that_never_arrived():
    t = make()
    written(t, A, 0, 100)
    assert put(t, A, 3).missing == (1, 2)
    assert put(t, A, 2).missing == (1,)
    assert put(t, A, 6, hwm=0).missing == (1, 4, 5)
    t.failed(A, 2)                                   # a failed write never stored: missing again
    assert put(t, A, 7, hwm=0).missing == (1, 2, 4, 5)
    assert put(t, A, 8, hwm=7).missing == ()
    far = put(t, B, 10 * DEDUP_MISSING_SSSNS_MAX)
    assert far.missing == tuple(range(DEDUP_MISSING_SSSNS_MAX))     # capped, lowest first


def test_a_dedup_key_deduplicates_a_committed_record_across_sessions():
    t = make()
    assert put(t, A, 0, key=b"order-1").kind is WRITE
    t.committed(A, 0, 100)
    d = put(t, B, 4, key=b"order-1")
    assert (d.kind, d.sn) == (DUPLICATE, 100)
    assert put(t, B, 4, key=b"order-1").sn == 100    # B's retry: the same answer
    assert put(t, B, 5, key=b"order-2").kind is WRITE
    assert t.stats()["dedup_keys"] == 2
    t.check_invariants()


def test_a_dedup_key_queues_behind_a_pending_write_of_another_session():
    t = make()
    assert put(t, A, 0, key=b"order-1").kind is WRITE
    qb = put(t, B, 4, key=b"order-1")
    qb_retry = put(t, B, 4, key=b"order-1")
    qa = put(t, A, 0, key=b"order-1")
    assert {qb.kind, qb_retry.kind, qa.kind} == {QUEUED}
    assert t.stats()["waiting"] == 1                 # B's entry waits on A's write
    t.check_invariants()
    resolved = t.committed(A, 0, 100)
    assert resolved == [Resolution(qb.ticket, DUPLICATE, B, 4, 100),
                        Resolution(qb_retry.ticket, DUPLICATE, B, 4, 100),
                        Resolution(qa.ticket, DUPLICATE, A, 0, 100)]
    assert put(t, B, 4, key=b"order-1").sn == 100
    assert t.stats()["waiting"] == 0
    t.check_invariants()


def test_a_failed_write_of_a_dedup_key_lets_the_other_session_write_it():
    t = make()
    assert put(t, A, 0, key=b"order-1").kind is WRITE
    qb = put(t, B, 4, key=b"order-1")
    qa = put(t, A, 0, key=b"order-1")
    assert t.failed(A, 0) == [Resolution(qb.ticket, WRITE, B, 4)]   # B writes the key now
    t.check_invariants()
    assert put(t, A, 0, key=b"order-1").kind is QUEUED               # A waits behind B's write
    resolved = t.committed(B, 4, 200)
    assert Resolution(qa.ticket, DUPLICATE, A, 0, 200) in resolved and len(resolved) == 2
    assert put(t, A, 0, key=b"order-1").sn == 200
    assert put(t, C, 9, key=b"order-1").sn == 200
    t.check_invariants()


def test_a_dedup_key_is_forgotten_after_the_window():
    t = make()
    written(t, A, 0, 100, key=b"order-1")
    later_ms = NOW_MS + WINDOW_MS + 1
    assert put(t, B, 0, key=b"order-1", submit_ms=later_ms, now_ms=later_ms).kind is WRITE
    t.prune(later_ms)
    t.check_invariants()


# --- bad input ---------------------------------------------------------------------------

BAD_INPUTS = [
    ("negative sssn", InvalidSssn, dict(sssn=-1)),
    ("sssn over 64 bits", InvalidSssn, dict(sssn=SSSN_MAX + 1)),
    ("hwm above this sssn", InvalidHwm, dict(sssn=3, hwm=4)),
    ("hwm below none", InvalidHwm, dict(hwm=-2)),
    ("submitted in the future", SubmissionInFuture, dict(submit_ms=NOW_MS + DEDUP_CLOCK_SKEW_MS_MAX + 1)),
    ("dedup key too large", DedupKeyTooLarge, dict(key=b"k" * (DEDUP_KEY_BYTES_MAX + 1))),
    ("empty dedup key", InvalidDedupKey, dict(key=b"")),
    ("empty producer id", InvalidProducerId, dict(producer_id=b"")),
    ("stale", StaleSubmission, dict(submit_ms=NOW_MS - WINDOW_MS - 1)),
    ("same sssn, other record", SessionConflict, dict(sssn=1, signature=b"another record")),
    ("same sssn, other dedup key", SessionConflict, dict(sssn=1, key=b"another key")),
]


@pytest.mark.parametrize("what,error,fields", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gets_a_named_error_changes_nothing_and_the_session_stays_usable(what, error, fields):
    t = make()
    written(t, A, 0, 100)
    assert put(t, A, 1, key=b"order-1").kind is WRITE
    assert put(t, A, 1, key=b"order-1").kind is QUEUED
    before = snapshot(t)
    args = dict(producer_id=A, sssn=2, hwm=0, key=None) | fields
    with pytest.raises(error) as raised:
        put(t, args.pop("producer_id"), args.pop("sssn"), **args)
    assert snapshot(t) == before
    assert isinstance(raised.value, InvalidArgument) and raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert errors.registry()[error.__name__] is error
    assert raised.value.message                      # says what was wrong
    # the session goes on as if nothing had happened
    assert put(t, A, 0).sn == 100
    assert put(t, A, 1, key=b"order-1").kind is QUEUED
    assert put(t, A, 2, hwm=0).kind is WRITE
    assert len(t.committed(A, 1, 101)) == 2
    t.check_invariants()


def test_error_classes_are_named_and_grouped():
    for cls in (InvalidSssn, InvalidHwm, InvalidProducerId, SessionConflict):
        assert issubclass(cls, InvalidSession)
    assert issubclass(DedupKeyTooLarge, InvalidDedupKey)
    assert issubclass(TableFull, Throttled) and TableFull.retriable
    assert not StaleSubmission.retriable and not SessionConflict.retriable


def test_a_conflicting_signature_on_a_committed_record_changes_nothing():
    t = make()
    written(t, A, 0, 100)
    before = snapshot(t)
    with pytest.raises(SessionConflict):
        put(t, A, 0, signature=b"not the same record")
    assert snapshot(t) == before
    assert put(t, A, 0).sn == 100


# --- bounds and statistics ---------------------------------------------------------------

def test_too_many_sessions_is_table_full_until_one_goes_quiet():
    t = make()
    for i in range(DEDUP_SESSIONS_PER_PARTITION_MAX):
        written(t, b"p%d" % i, 0, i)
    before = snapshot(t)
    with pytest.raises(TableFull):
        put(t, b"one too many", 0)
    assert snapshot(t) == before
    assert put(t, b"p0", 0).sn == 0                  # known sessions carry on
    later_ms = NOW_MS + WINDOW_MS + 1
    t.prune(later_ms)
    assert t.stats()["sessions"] == 0
    assert put(t, b"one too many", 0, submit_ms=later_ms, now_ms=later_ms).kind is WRITE


def test_too_many_unpruned_entries_in_a_session_is_table_full_until_the_hwm_moves():
    t = make(entries_per_session_max=4)
    for sssn in range(4):
        written(t, A, sssn, 100 + sssn)
    before = snapshot(t)
    with pytest.raises(TableFull):
        put(t, A, 4)
    assert snapshot(t) == before
    assert put(t, A, 3).sn == 103                    # answers that add nothing still work
    assert put(t, B, 0).kind is WRITE                # other sessions are not affected
    assert put(t, A, 4, hwm=0).kind is WRITE         # an ack frees room in the same request
    assert t.stats()["entries"] == 5                 # A: 1, 2, 3, 4 and B: 0
    t.check_invariants()


def test_too_many_dedup_keys_or_waiters_is_table_full():
    t = make(keys_max=2, waiters_per_entry_max=2)
    written(t, A, 0, 100, key=b"k0")
    assert put(t, A, 1, key=b"k1").kind is WRITE
    before = snapshot(t)
    with pytest.raises(TableFull):
        put(t, A, 2, key=b"k2")
    assert snapshot(t) == before
    assert put(t, A, 2).kind is WRITE                # no key: no dedup key needed
    assert put(t, B, 0, key=b"k0").sn == 100         # a known key adds none
    put(t, A, 1, key=b"k1")
    put(t, B, 1, key=b"k1")
    before = snapshot(t)
    with pytest.raises(TableFull):
        put(t, A, 1, key=b"k1")
    assert snapshot(t) == before
    t.check_invariants()


def test_stats_count_sizes_and_totals():
    t = make()
    assert t.stats() == dict(sessions=0, entries=0, pending=0, waiting=0, queued=0, dedup_keys=0,
                             writes_total=0, duplicates_total=0, queued_total=0)
    put(t, A, 0, key=b"k")
    put(t, A, 0, key=b"k")
    put(t, B, 0, key=b"k")
    written(t, C, 0, 7)
    put(t, C, 0)
    assert t.stats() == dict(sessions=3, entries=3, pending=1, waiting=1, queued=2, dedup_keys=1,
                             writes_total=2, duplicates_total=1, queued_total=2)
    t.committed(A, 0, 1)
    assert t.stats() == dict(sessions=3, entries=3, pending=0, waiting=0, queued=0, dedup_keys=1,
                             writes_total=2, duplicates_total=3, queued_total=2)


# --- recovery ----------------------------------------------------------------------------

def test_rebuild_from_stored_records_makes_retries_duplicates_with_the_stored_sns():
    old = NOW_MS - 2 * WINDOW_MS
    records = [
        StoredRecord(A, 0, None, sig(A, 0), 10, old),             # outside the window: skipped
        StoredRecord(A, 1, None, sig(A, 1), 11, NOW_MS - 1000),
        StoredRecord(A, 2, b"order-1", sig(A, 2), 12, NOW_MS - 900),
        (B, 0, None, sig(B, 0), 13, NOW_MS - 800),                 # plain tuples do too
        StoredRecord(B, 0, None, sig(B, 0), 14, NOW_MS - 700),     # stored twice: the first SN wins
    ]
    t = make()
    assert t.rebuild(records, NOW_MS) == 4
    s = t.stats()
    assert (s["sessions"], s["entries"], s["dedup_keys"], s["pending"]) == (2, 3, 1, 0)
    assert put(t, A, 1).sn == 11
    assert put(t, A, 2, key=b"order-1").sn == 12
    assert put(t, B, 0).sn == 13
    assert put(t, C, 0, key=b"order-1").sn == 12                  # dedup keys survive too
    assert put(t, A, 3, hwm=0).kind is WRITE                      # then new records as usual
    with pytest.raises(SessionConflict):                           # signatures were rebuilt
        put(t, A, 1, signature=b"something else")
    t.check_invariants()


def test_a_key_twin_is_known_after_a_rebuild_only_while_the_first_key_is_in_the_window():
    """The documented lapse: a twin answered by its dedup key is not stored."""
    twin_ms = NOW_MS + WINDOW_MS // 2
    t = make()
    written(t, A, 0, 100, key=b"order-1")
    assert put(t, B, 0, key=b"order-1", submit_ms=twin_ms, now_ms=twin_ms).sn == 100
    records = [StoredRecord(A, 0, b"order-1", sig(A, 0), 100, NOW_MS)]
    inside_ms = NOW_MS + WINDOW_MS
    t = make()
    t.rebuild(records, inside_ms)
    assert put(t, B, 0, key=b"order-1", submit_ms=twin_ms, now_ms=inside_ms).sn == 100
    past_ms = NOW_MS + DEDUP_CLOCK_SKEW_MS_MAX + WINDOW_MS + 1
    t = make()
    t.rebuild(records, past_ms)
    assert put(t, B, 0, key=b"order-1", submit_ms=twin_ms, now_ms=past_ms).kind is WRITE


def test_rebuild_keeps_the_highest_sssns_of_a_session_beyond_its_bound():
    t = make(entries_per_session_max=3)
    t.rebuild([StoredRecord(A, s, None, sig(A, s), 100 + s, NOW_MS) for s in range(5)], NOW_MS)
    assert t.stats()["entries"] == 3
    assert put(t, A, 1).sn is None                   # below the kept ones: acked, SN forgotten
    assert put(t, A, 2).sn == 102
    t.check_invariants()


def test_rebuild_needs_sn_order_and_an_unused_table():
    t = make()
    with pytest.raises(InvariantViolation):
        t.rebuild([StoredRecord(A, 0, None, sig(A, 0), 5, NOW_MS),
                   StoredRecord(A, 1, None, sig(A, 1), 4, NOW_MS)], NOW_MS)
    t = make()
    put(t, A, 0)
    with pytest.raises(InvariantViolation):
        t.rebuild([], NOW_MS)


# --- states and policies -----------------------------------------------------------------

def test_outcomes_need_a_pending_write():
    t = make()
    written(t, A, 0, 100)
    with pytest.raises(InvariantViolation):
        t.committed(A, 0, 101)
    with pytest.raises(InvariantViolation):
        t.failed(A, 0)
    with pytest.raises(InvariantViolation):
        t.failed(B, 3)


@pytest.mark.parametrize("policy", [IngestionPolicy.AT_LEAST_ONCE_DUP_PERMITTED, IngestionPolicy.BEST_EFFORT,
                                    "at_least_once_dup_permitted"])
def test_the_dup_permitted_policies_write_every_submission_and_track_nothing(policy):
    t = make(policy=policy)
    for _ in range(3):
        assert put(t, A, 0, key=b"k").kind is WRITE
        assert t.committed(A, 0, 100) == []
    assert put(t, A, 0, submit_ms=NOW_MS - 10 * WINDOW_MS).kind is WRITE    # no window to be stale in
    assert t.failed(A, 0) == []
    assert t.rebuild([StoredRecord(A, 0, None, sig(A, 0), 1, NOW_MS)], NOW_MS) == 0
    t.prune(NOW_MS)
    assert t.stats() == dict(sessions=0, entries=0, pending=0, waiting=0, queued=0, dedup_keys=0,
                             writes_total=4, duplicates_total=0, queued_total=0)
    with pytest.raises(InvalidSssn):                 # malformed fields are still refused
        put(t, A, -1)


# --- the state machine -------------------------------------------------------------------

PRODUCERS = (A, B, C)
KEYS = (None, None, b"k0", b"k1", b"k2")
SIM_SESSIONS_MAX = 2
SIM_ENTRIES_MAX = 3
SIM_KEYS_MAX = 3
SIM_WAITERS_MAX = 2


@dataclass
class Producer:
    pid: bytes
    records: dict[int, tuple[bytes | None, int]] = field(default_factory=dict)  # sssn -> (key, submit_ms)
    unsent: set[int] = field(default_factory=set)       # requests lost before any table saw them
    received: dict[int, int | None] = field(default_factory=dict)               # acks that arrived
    hwm: int = HWM_NONE
    hwm_sent_max: int = HWM_NONE                         # to the current table

    def current_hwm(self, now_ms: int) -> int:
        """Cumulative: acked, or given up (stale: never resent)."""
        while (s := self.hwm + 1) in self.records and (
                s in self.received or self.records[s][1] < now_ms - WINDOW_MS):
            self.hwm = s
        return self.hwm


class DedupMachine(RuleBasedStateMachine):
    """The caller of a DedupTable and a storage model; checks the promises of each answer."""

    def __init__(self):
        super().__init__()
        self.now_ms = NOW_MS
        self.table = self._new_table()
        self.producers = {pid: Producer(pid) for pid in PRODUCERS}
        self.next_sn = 1
        self.log: list[StoredRecord] = []                 # storage, in SN order
        self.stored: dict[tuple[bytes, int], int] = {}    # (producer, sssn) -> SN of its own write
        self.inflight: dict[tuple[bytes, int], tuple[bytes | None, int]] = {}   # -> (key, submitted_ms)
        self.tickets: dict[int, tuple[tuple[bytes, int], bytes | None, int]] = {}
        self.key_inflight: dict[bytes, tuple[bytes, int]] = {}
        self.key_last_ms: dict[bytes, int] = {}           # submission time of the key's last write
        self.key_sns: dict[bytes, set[int]] = {}
        self.acked: dict[tuple[bytes, int], int] = {}     # the SN each record was answered with
        self.twin_acked_epoch: dict[tuple[bytes, int], int] = {}   # answered by a dedup-key twin
        self.epoch = 0                                    # takeovers so far
        self.sessions_bound = SIM_SESSIONS_MAX
        self.keys_bound = SIM_KEYS_MAX

    @staticmethod
    def _new_table() -> DedupTable:
        return DedupTable("sim", WINDOW_MS, sessions_max=SIM_SESSIONS_MAX, entries_per_session_max=SIM_ENTRIES_MAX,
                          keys_max=SIM_KEYS_MAX, waiters_per_entry_max=SIM_WAITERS_MAX)

    # --- producers ---
    @rule(pid=st.sampled_from(PRODUCERS), key=st.sampled_from(KEYS), lost=st.booleans(), lose_ack=st.booleans())
    def send_new(self, pid, key, lost, lose_ack):
        prod = self.producers[pid]
        sssn = len(prod.records)
        prod.records[sssn] = (key, self.now_ms)
        if lost:
            prod.unsent.add(sssn)
            return
        self._submit(prod, sssn, prod.current_hwm(self.now_ms), lose_ack)

    @precondition(lambda self: any(p.records for p in self.producers.values()))
    @rule(data=st.data(), lose_ack=st.booleans())
    def resend(self, data, lose_ack):
        """A retry, a duplicate delivery or a reordered request (with an older HWM)."""
        prod = data.draw(st.sampled_from([p for p in self.producers.values() if p.records]))
        acked = sorted(s for s in prod.records if s in prod.received)
        if acked and data.draw(st.booleans()):     # an acked record: a duplicate delivery
            sssn = data.draw(st.sampled_from(acked))
        else:
            sssn = data.draw(st.sampled_from(sorted(prod.records)))
        hwm = data.draw(st.integers(HWM_NONE, prod.current_hwm(self.now_ms)))
        self._submit(prod, sssn, min(hwm, sssn), lose_ack)

    def _submit(self, prod: Producer, sssn: int, hwm: int, lose_ack: bool) -> None:
        key, submit_ms = prod.records[sssn]
        ps = (prod.pid, sssn)
        stale = submit_ms < self.now_ms - WINDOW_MS
        before = self.table.stats()
        try:
            d = self.table.submit(prod.pid, sssn, hwm, submit_ms, sig(*ps), key, self.now_ms)
        except (StaleSubmission, TableFull) as e:
            assert isinstance(e, StaleSubmission) == stale
            assert self.table.stats() == before
            return
        assert not stale
        prod.unsent.discard(sssn)
        prod.hwm_sent_max = max(prod.hwm_sent_max, hwm)
        self._check_missing(prod, sssn, hwm, d.missing)
        if d.kind is WRITE:
            self._start_write(ps, key, self.now_ms)
        elif d.kind is DUPLICATE:
            if d.sn is None:
                assert ps in self.acked or ps in self.stored, f"{ps} answered stored but never was"
            else:
                self._ack(ps, key, d.sn, lose_ack)
        else:
            assert d.kind is QUEUED and d.ticket not in self.tickets
            assert ps in self.inflight or (key is not None and key in self.key_inflight)
            self.tickets[d.ticket] = (ps, key, self.now_ms)

    def _check_missing(self, prod: Producer, sssn: int, hwm: int, missing: tuple[int, ...]) -> None:
        assert list(missing) == sorted(set(missing)) and len(missing) <= DEDUP_MISSING_SSSNS_MAX
        assert all(hwm < m < sssn and (prod.pid, m) not in self.inflight for m in missing)
        never_seen = [s for s in prod.unsent if prod.hwm_sent_max < s < sssn
                      and prod.records[s][1] >= self.now_ms - WINDOW_MS]
        assert set(never_seen) <= set(missing), f"{never_seen} not all in {missing}"

    def _start_write(self, ps, key, submitted_ms) -> None:
        assert ps not in self.inflight, f"{ps}: a second write while one is in flight"
        assert ps not in self.stored, f"{ps}: written twice"
        if key is not None:
            assert key not in self.key_inflight, f"{key}: written by {ps} and {self.key_inflight.get(key)}"
            assert self.now_ms > self.key_last_ms.get(key, -WINDOW_MS) + WINDOW_MS, f"{key}: twice in the window"
            self.key_inflight[key] = ps
        self.inflight[ps] = (key, submitted_ms)

    def _ack(self, ps, key, sn: int, lose: bool, own: bool = False) -> None:
        """Every answer with an SN names the write that stored the record (or its key twin)."""
        assert sn == self.stored.get(ps) or (key is not None and sn in self.key_sns.get(key, ())), (ps, sn)
        known = self.acked.get(ps)
        if known is not None and known != sn:
            # The one lapse: a key twin is not stored, so a table rebuilt after the key left
            # the window writes the twin's retry as a record of its own.
            assert own and self.twin_acked_epoch.get(ps, self.epoch) < self.epoch, (ps, known, sn)
        self.acked[ps] = sn
        if not own and ps not in self.stored:
            self.twin_acked_epoch.setdefault(ps, self.epoch)
        if not lose:
            self.producers[ps[0]].received[ps[1]] = sn

    # --- the write path ---
    @precondition(lambda self: self.inflight)
    @rule(data=st.data(), lose_ack=st.booleans())
    def commit(self, data, lose_ack):
        ps = data.draw(st.sampled_from(sorted(self.inflight)))
        key, submitted_ms = self.inflight.pop(ps)
        sn, self.next_sn = self.next_sn, self.next_sn + 1
        self.stored[ps] = sn
        self.log.append(StoredRecord(ps[0], ps[1], key, sig(*ps), sn, self.now_ms))
        if key is not None:
            del self.key_inflight[key]
            self.key_last_ms[key] = submitted_ms
            self.key_sns.setdefault(key, set()).add(sn)
        self._ack(ps, key, sn, lose_ack, own=True)
        for r in self.table.committed(ps[0], ps[1], sn):
            assert r.kind is DUPLICATE and r.sn == sn
            tps, tkey, _ = self.tickets.pop(r.ticket)
            assert tps == (r.producer_id, r.sssn)
            self._ack(tps, tkey, sn, lose_ack)

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def fail(self, data):
        ps = data.draw(st.sampled_from(sorted(self.inflight)))
        key, _ = self.inflight.pop(ps)
        if key is not None:
            del self.key_inflight[key]
        for r in self.table.failed(*ps):
            assert r.kind is WRITE
            tps, tkey, queued_ms = self.tickets.pop(r.ticket)
            assert tps == (r.producer_id, r.sssn)
            self._start_write(tps, tkey, queued_ms)

    # --- time, pruning, takeover ---
    @rule(ms=st.sampled_from(["short"] * 4 + ["long"]).flatmap(
        lambda step: st.integers(0, 3_000) if step == "short" else st.integers(WINDOW_MS // 2, 2 * WINDOW_MS)),
          prune=st.booleans())
    def advance(self, ms, prune):
        self.now_ms += ms
        if prune:
            self.table.prune(self.now_ms)

    @precondition(lambda self: not self.inflight)
    @rule(now=st.integers(0, 3))
    def takeover(self, now):
        """Another ingestion node takes the partition over and rebuilds from storage
        (now and then: a takeover at every quiet moment would leave little else)."""
        if now:
            return
        self.table = self._new_table()
        self.table.rebuild(self.log, self.now_ms)
        self.epoch += 1
        s = self.table.stats()
        self.sessions_bound = max(SIM_SESSIONS_MAX, s["sessions"])
        self.keys_bound = max(SIM_KEYS_MAX, s["dedup_keys"])
        for prod in self.producers.values():
            prod.hwm_sent_max = HWM_NONE

    @invariant()
    def table_stays_consistent_and_bounded(self):
        self.table.check_invariants()
        s = self.table.stats()
        assert s["pending"] == len(self.inflight)
        assert s["queued"] == len(self.tickets)
        assert s["sessions"] <= self.sessions_bound
        assert s["dedup_keys"] <= self.keys_bound
        assert s["entries"] <= self.sessions_bound * SIM_ENTRIES_MAX
        if not self.inflight:
            assert not self.tickets, "tickets wait on no write"


DedupMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
TestDedupMachine = DedupMachine.TestCase
