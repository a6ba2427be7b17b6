"""Unit tests of the fault-trial history checker (tests/fault/history.py), no I/O.

Each test starts from one small clean trial, `Scenario`: two producers write eight
records under four partition keys into two partitions, every record is acked and
stored at its SN, one consumer tails both partitions from TRIM_HORIZON and sees every
record, and one fault is followed by an ack. The clean trial passes; each test then
breaks it in one way and checks that exactly that kind of violation is reported, named
and counted, and that `ok` is False.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from tests.fault.history import (CORRUPT, DUPLICATE, LOST, NO_RESUME, READER_GAP, READER_LOST, READER_ORDER,
                                 READER_WRONG_SN, REORDERING, SLOW_RESUME, TRIM_HORIZON, UNEXPECTED, WRONG_SN,
                                 CheckResult, History, ReadRecord, TrialRow, check, format_table)
from tests.fault.workload import encode_payload, payload_id_of

STREAM = "s"
CONSUMER = "c0"
# (producer, seq, partition key, partition, SN) in submission order
RECORDS = [("w0", 0, "a", 0, 100), ("w1", 0, "b", 0, 110), ("w0", 1, "c", 1, 101), ("w0", 2, "a", 0, 120),
           ("w1", 1, "b", 0, 130), ("w1", 2, "d", 1, 111), ("w0", 3, "c", 1, 121), ("w0", 4, "a", 0, 140)]
STEP_S = 0.1          # record i is submitted at i * STEP_S ...
ACK_DELAY_S = 0.05    # ... and acked this much later
FAULT_S = 0.62        # between the submissions of records 6 and 7 (the last, on p0)


def payload(producer: str, seq: int) -> str:
    return f"{producer}-{seq:06d}"


@dataclass
class Ack:
    producer: str
    seq: int
    key: str
    partition: int
    sn: int | None
    sent_s: float
    time_s: float
    duplicate: bool = False

    @property
    def payload(self) -> str:
        return payload(self.producer, self.seq)


@dataclass
class Scenario:
    """A clean trial as plain lists a test can break before building the History."""

    acks: list[Ack] = field(default_factory=list)
    final: list[ReadRecord] = field(default_factory=list)
    seen: list[tuple[int, int, str]] = field(default_factory=list)       # consumer's (partition, SN, payload)
    starts: list[tuple[int, str]] = field(default_factory=lambda: [(0, TRIM_HORIZON), (1, TRIM_HORIZON)])
    failed: list[str] = field(default_factory=list)                       # payloads that failed for good
    faults: list[tuple[str, float, tuple[int, ...] | None]] = field(default_factory=lambda: [("kill", FAULT_S, None)])

    @classmethod
    def clean(cls) -> "Scenario":
        s = cls()
        for i, (producer, seq, key, partition, sn) in enumerate(RECORDS):
            s.acks.append(Ack(producer, seq, key, partition, sn, i * STEP_S, i * STEP_S + ACK_DELAY_S))
        s.final = sorted((ReadRecord(a.partition, a.sn, a.key, a.payload) for a in s.acks),
                         key=lambda r: (r.partition, r.sn))
        s.seen = [(r.partition, r.sn, r.payload) for r in s.final]
        return s

    def history(self) -> History:
        h = History(clock=lambda: 0.0)
        for a in self.acks:
            h.record_submit(STREAM, a.producer, a.seq, a.key, a.payload, a.sent_s)
        for a in sorted(self.acks, key=lambda a: a.time_s):
            h.record_ack(STREAM, a.partition, a.key, a.payload, a.sn, a.duplicate, a.time_s,
                         producer=a.producer, seq=a.seq, sent_s=a.sent_s)
        for p in self.failed:
            h.record_error("Timeout", p, 9.0, producer=p.split("-")[0], stream=STREAM)
        for partition, position in self.starts:
            h.record_consumer_start(CONSUMER, STREAM, partition, position, 0.0)
        for n, (partition, sn, p) in enumerate(self.seen):
            h.record_observation(CONSUMER, partition, sn, p, 1.0 + n * 0.01, stream=STREAM)
        for kind, at_s, partitions in self.faults:
            h.mark_fault(kind, at_s, stream=STREAM, partitions=partitions)
        return h

    def check(self, **kwargs) -> CheckResult:
        return check(self.history(), self.final, **kwargs)

    def without_ack(self, producer: str, seq: int) -> Ack:
        ack = next(a for a in self.acks if (a.producer, a.seq) == (producer, seq))
        self.acks.remove(ack)
        return ack


def assert_only(result: CheckResult, kind: str, count: int = 1) -> None:
    assert not result.ok
    assert dict(result.by_kind) == {kind: count}, result.summary()
    assert all(v.kind == kind for v in result.violations)
    assert kind in str(result.violations[0])


# --- the clean trial ------------------------------------------------------------------------
def test_a_clean_history_passes():
    result = Scenario.clean().check()
    assert result.ok, result.summary()
    assert (result.submitted, result.acked, result.stored, result.observations) == (8, 8, 8, 8)
    assert (result.lost, result.duplicates, result.unexpected, result.reorderings, result.reader_anomalies) \
        == (0, 0, 0, 0, 0)
    assert len(result.recoveries) == 1 and result.recoveries[0].kind == "kill"
    # the first record submitted after the fault (record 7) was acked ACK_DELAY_S after its submission
    assert result.recoveries[0].recovery_s == pytest.approx(7 * STEP_S + ACK_DELAY_S - FAULT_S)
    assert result.summary().startswith("OK")
    result.assert_ok()


def test_a_duplicate_ack_with_the_original_sn_passes():
    s = Scenario.clean()
    first = s.acks[3]
    s.acks.append(Ack(first.producer, first.seq, first.key, first.partition, first.sn, first.sent_s, 0.9,
                      duplicate=True))
    result = s.check()
    assert result.ok, result.summary()
    assert result.acked == 8


def test_failed_records_may_be_stored_once_or_not_at_all():
    s = Scenario.clean()
    kept = s.without_ack("w1", 1)           # failed, yet stored (the ack was lost)
    dropped = s.without_ack("w1", 2)        # failed, not stored
    s.failed = [kept.payload, dropped.payload]
    s.final = [r for r in s.final if r.payload != dropped.payload]
    s.seen = [x for x in s.seen if x[2] != dropped.payload]
    result = s.check()
    assert result.ok, result.summary()
    assert (result.acked, result.failed, result.failed_stored) == (6, 2, 1)


def test_a_consumer_that_saw_a_prefix_passes():
    s = Scenario.clean()
    s.seen = [x for x in s.seen if x[0] == 0][:2] + [x for x in s.seen if x[0] == 1][:1]
    assert s.check().ok


# --- (a) acked records are durable -------------------------------------------------------------
def test_a_lost_ack_is_detected():
    s = Scenario.clean()
    lost = s.acks[2].payload
    s.final = [r for r in s.final if r.payload != lost]
    s.seen = [x for x in s.seen if x[2] != lost]
    result = s.check()
    assert_only(result, LOST)
    assert result.lost == 1 and lost in result.violations[0].message


def test_an_ack_with_the_wrong_sn_is_detected():
    s = Scenario.clean()
    s.acks[1].sn += 1
    result = s.check()
    assert_only(result, WRONG_SN)
    assert result.wrong_sn == 1 and "SN 111" in result.violations[0].message


def test_a_duplicate_ack_with_another_sn_is_detected():
    s = Scenario.clean()
    first = s.acks[0]
    s.acks.append(Ack(first.producer, first.seq, first.key, first.partition, 999, first.sent_s, 0.9, duplicate=True))
    result = s.check()
    assert_only(result, WRONG_SN)
    assert "duplicate ack" in result.violations[0].message


def test_a_duplicate_ack_without_an_sn_is_detected():
    s = Scenario.clean()
    s.acks[5].sn, s.acks[5].duplicate = None, True
    result = s.check()
    assert_only(result, WRONG_SN)
    assert "duplicate ack without an SN" in result.violations[0].message


def test_a_record_stored_under_another_key_is_detected():
    s = Scenario.clean()
    s.final[0] = s.final[0]._replace(partition_key="zzz")
    assert_only(s.check(), CORRUPT)


# --- (b) nothing extra ----------------------------------------------------------------------
def test_a_duplicate_in_the_read_back_is_detected():
    s = Scenario.clean()
    copy = s.final[1]
    s.final.append(ReadRecord(copy.partition, 500, copy.partition_key, copy.payload))   # stored again, later
    result = s.check()
    assert_only(result, DUPLICATE)
    assert result.duplicates == 1


def test_a_failed_record_stored_twice_is_a_duplicate():
    s = Scenario.clean()
    failed = s.without_ack("w1", 2)
    s.failed = [failed.payload]
    s.final.append(ReadRecord(failed.partition, 500, failed.key, failed.payload))
    assert_only(s.check(), DUPLICATE)


def test_a_record_never_submitted_is_detected():
    s = Scenario.clean()
    s.final.append(ReadRecord(1, 500, "x", "ghost-000001"))
    result = s.check()
    assert_only(result, UNEXPECTED)
    assert result.unexpected == 1 and "ghost-000001" in result.violations[0].message


# --- (c) order ---------------------------------------------------------------------------------
def test_sns_going_back_within_a_partition_are_detected():
    s = Scenario.clean()
    p0 = [r for r in s.final if r.partition == 0]
    p1 = [r for r in s.final if r.partition == 1]
    p0[1], p0[2] = p0[2], p0[1]
    s.final = p0 + p1
    s.seen = [(r.partition, r.sn, r.payload) for r in s.final]
    result = s.check()
    # the read-back itself goes back once; the consumer, which saw the same order, too
    assert result.by_kind[REORDERING] == 1
    assert result.reorderings == 1
    assert not result.ok


def test_a_producers_key_out_of_submission_order_is_detected():
    s = Scenario.clean()
    # w0's records 0 and 2 (key "a") swap SNs, in the acks and in storage alike
    a0 = next(a for a in s.acks if (a.producer, a.seq) == ("w0", 0))
    a2 = next(a for a in s.acks if (a.producer, a.seq) == ("w0", 2))
    a0.sn, a2.sn = a2.sn, a0.sn
    s.final = sorted((ReadRecord(a.partition, a.sn, a.key, a.payload) for a in s.acks),
                     key=lambda r: (r.partition, r.sn))
    s.seen = [(r.partition, r.sn, r.payload) for r in s.final]
    result = s.check()
    assert_only(result, REORDERING)
    assert "producer w0 key 'a'" in result.violations[0].message


# --- (d) readers ---------------------------------------------------------------------------------
def test_a_reader_that_saw_a_record_later_lost_is_detected():
    s = Scenario.clean()
    lost = s.final.pop(3)
    s.failed = [lost.payload]
    s.acks = [a for a in s.acks if a.payload != lost.payload]      # never acked: no LOST, only the reader
    result = s.check()
    assert_only(result, READER_LOST)
    assert result.reader_anomalies == 1 and lost.payload in result.violations[0].message


def test_a_reader_that_saw_another_sn_is_detected():
    s = Scenario.clean()
    partition, sn, p = s.seen[2]
    s.seen[2] = (partition, sn + 1, p)
    assert_only(s.check(), READER_WRONG_SN)


def test_a_reader_gap_is_detected():
    s = Scenario.clean()
    del s.seen[1]
    result = s.check()
    assert_only(result, READER_GAP)
    assert "skipped 1 records" in result.violations[0].message


def test_a_reader_from_trim_horizon_that_missed_the_first_record_is_detected():
    s = Scenario.clean()
    del s.seen[0]
    assert_only(s.check(), READER_GAP)


def test_a_reader_from_latest_may_start_anywhere():
    s = Scenario.clean()
    s.starts = [(0, "LATEST"), (1, TRIM_HORIZON)]
    del s.seen[0]
    assert s.check().ok


def test_a_reader_going_back_is_detected():
    s = Scenario.clean()
    s.seen.insert(3, s.seen[1])            # p0 records 0, 1, 2, then 1 again, then 3, 4
    result = s.check()
    assert_only(result, READER_ORDER)
    assert result.reader_anomalies == 1


def test_a_reader_seeing_sns_go_back_is_detected_even_if_the_read_back_agrees():
    s = Scenario.clean()
    p0 = [r for r in s.final if r.partition == 0]
    s.seen = [(0, r.sn, r.payload) for r in p0]
    s.seen[1], s.seen[2] = s.seen[2], s.seen[1]      # the consumer saw SN 120 before SN 110
    result = s.check()
    assert result.by_kind[READER_ORDER] == 1 and not result.ok


# --- (e) writes resume after faults ---------------------------------------------------------------
def test_no_ack_after_a_fault_is_detected():
    s = Scenario.clean()
    s.faults = [("kill", 5.0, None)]
    result = s.check()
    assert_only(result, NO_RESUME)
    assert result.no_resume == 1 and not result.recoveries[0].resumed


def test_an_ack_of_a_record_sent_before_the_fault_does_not_count_as_resumed():
    s = Scenario.clean()
    last = s.acks[-1]
    last.sent_s, last.time_s = 0.60, 0.75          # in flight across the fault at 0.62
    assert_only(s.check(), NO_RESUME)


def test_a_fault_on_some_partitions_needs_an_ack_on_them():
    s = Scenario.clean()
    s.faults = [("kill-head", FAULT_S, (1,))]        # only record 7 (p0) is acked after it
    assert_only(s.check(), NO_RESUME)
    s.faults = [("kill-head", FAULT_S, (0,))]
    assert s.check().ok


def test_a_slow_resume_is_detected_when_a_bound_is_given():
    s = Scenario.clean()
    assert s.check(resume_within_s=1.0).ok
    assert_only(s.check(resume_within_s=0.01), SLOW_RESUME)


# --- the result and the table ----------------------------------------------------------------------
def test_violations_are_all_counted_but_only_the_first_kept():
    s = Scenario.clean()
    s.final, s.seen = [], []
    result = s.check(violations_kept=3)
    assert result.lost == 8 and result.violation_count == 8 and len(result.violations) == 3
    assert "8 violations" in result.summary()
    with pytest.raises(AssertionError, match="lost"):
        result.assert_ok()


def test_several_streams_need_a_final_read_per_stream():
    h = Scenario.clean().history()
    h.record_submit("other", "w9", 0, "k", "w9-000000", 0.0)
    with pytest.raises(ValueError, match="dict"):
        check(h, [])
    final = Scenario.clean().final
    result = check(h, {STREAM: final, "other": [ReadRecord(0, 1, "k", "w9-000000")]})
    assert result.ok, result.summary()
    assert result.submitted == 9


def test_format_table_aggregates_trials_per_fault_kind():
    clean = Scenario.clean().check()
    lossy = Scenario.clean()
    lossy.final = lossy.final[1:]
    lossy.seen = lossy.seen[1:]
    lossy.starts = []
    lossy.faults = [("kill", 5.0, None)]
    broken = lossy.check()
    table = format_table([("kill", clean), TrialRow("kill", broken), ("pause", clean)])
    lines = table.splitlines()
    assert lines[0].split()[:6] == ["fault", "trials", "ok", "acked", "lost", "dups"]
    kill = lines[2].split()
    assert kill[:6] == ["kill", "2", "1", "16", "1", "0"]
    assert kill[-1] == "never"                      # one kill trial never resumed
    pause = lines[3].split()
    assert pause[:6] == ["pause", "1", "1", "8", "0", "0"]
    assert pause[-2] == pause[-1] == f"{clean.recoveries[0].recovery_s:.2f}"


# --- the history and payloads -----------------------------------------------------------------------
def test_the_history_takes_events_from_many_threads():
    h = History()
    per_thread = 2_000

    def ack(t: int) -> None:
        for i in range(per_thread):
            h.record_ack(STREAM, 0, "k", f"t{t}-{i}", i + 1, producer=f"t{t}", seq=i)

    threads = [threading.Thread(target=ack, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.acked_count(STREAM) == h.acked_count() == 4 * per_thread
    assert len(h.acks) == 4 * per_thread


def test_payload_ids_round_trip_through_record_bytes():
    data = encode_payload("w3-000123", 64)
    assert len(data) == 64 and payload_id_of(data) == "w3-000123"
    assert payload_id_of(encode_payload("w3-000124")) == "w3-000124"
    assert payload_id_of(b"not ours") == "not ours"
