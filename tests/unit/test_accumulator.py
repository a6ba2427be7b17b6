"""Unit tests of sms.accumulator.Accumulator, the producer's sans-IO core.

No asyncio, no sockets, no sleeps: a test queues records with `room()`/`add()` (each with
an outcome object that records what it was told), calls `poll(now_s)` with a time it
advances itself, reads the `PutRequest`s that come back (entries, SSSNs, HWMs, session
ordinals) and answers each with `on_answer` (a `PutRecordsResponse` built here) or
`on_call_failed`. The last test drives random sequences of adds, polls, answers with
faults, splits and map refreshes against a simulated owner whose brain is
`ingestion.dedup.DedupTable` (one per producer session), and checks exactly-once storage,
HWM safety and the accumulator's books at the end.
"""

from __future__ import annotations

import concurrent.futures
from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sms.accumulator as accumulator_module
from ingestion.dedup import DecisionKind, DedupTable
from sms import errors, hashing, limits, seqno, wire
from sms.accumulator import HWM_NONE, SESSION_META_BYTES, Accumulator, ProducerResult, PutRequest, Room, Session
from sms.proto import sms_pb2
from sms.types import (ChainMember, IngestionPolicy, PartitionInfo, PartitionState, Persistence, StreamInfo,
                       StreamStatus)

STREAM = "s"
PID = b"acc-1"
A, B = "node-a:1", "node-b:1"
H = hashing.HASH_SPACE
LOW, HIGH = H // 8, 5 * H // 8          # a hash in the lower / the upper half of the space
CLOCK_MS = 1_700_000_000_000            # the wall clock the accumulator stamps submit_ms with
BACKOFF_S, BACKOFF_MAX_S = 0.1, 0.8


# --- helpers ----------------------------------------------------------------------------------

class Outcome:
    """A record's outcome slot that remembers what it was told, and fails on a second call."""

    __slots__ = ("calls", "value", "tag")

    def __init__(self, tag=None):
        self.calls = 0
        self.value = None
        self.tag = tag

    def done(self) -> bool:
        return self.calls > 0

    def cancelled(self) -> bool:
        return False

    def set_result(self, result) -> None:
        self._set(result)

    def set_exception(self, error: BaseException) -> None:
        assert isinstance(error, BaseException)
        self._set(error)

    def _set(self, value) -> None:
        self.calls += 1
        assert self.calls == 1, f"outcome {self.tag!r} set twice: {self.value!r}, then {value!r}"
        self.value = value

    @property
    def result(self) -> ProducerResult:
        assert isinstance(self.value, ProducerResult), f"{self.tag!r}: {self.value!r}"
        return self.value

    @property
    def error(self) -> BaseException:
        assert isinstance(self.value, BaseException), f"{self.tag!r}: {self.value!r}"
        return self.value


@dataclass
class Part:
    """One partition of a test stream map."""

    ordinal: int
    lo: int
    hi: int
    owner: str | None = A
    closed: bool = False
    parents: tuple[int, ...] = ()
    children: tuple[int, ...] = ()


def make_info(parts: list[Part], *, version: int = 1, window_s: int = 300) -> StreamInfo:
    infos = []
    for p in parts:
        member = ChainMember(f"n-{p.owner}", p.owner, "head+tail") if p.owner else None
        infos.append(PartitionInfo(
            ordinal=p.ordinal, hash_lo=p.lo, hash_hi=p.hi, valid_from_ms=0, valid_to_ms=None,
            state=PartitionState.CLOSED if p.closed else PartitionState.OPEN, parents=p.parents,
            children=p.children, chain_epoch=1, chain=(member,) if member else (), ingestion_owner=member))
    return StreamInfo(name=STREAM, status=StreamStatus.ACTIVE, replication_factor=1,
                      persistence=Persistence.MEMORY, ingestion_policy=IngestionPolicy.AT_LEAST_ONCE_NO_DUP,
                      retention_hours=24, map_version=version, created_ms=0, partitions=tuple(infos),
                      dedup_window_s=window_s)


def even(n: int, owners=(A,)) -> list[Part]:
    return [Part(p, p * H // n, (p + 1) * H // n, owners[p % len(owners)]) for p in range(n)]


def split_of_one(owner_lo=A, owner_hi=B) -> list[Part]:
    """p0 (the whole space) split into p1 (lower half) and p2 (upper half)."""
    return [Part(0, 0, H, A, closed=True, children=(1, 2)),
            Part(1, 0, H // 2, owner_lo, parents=(0,)), Part(2, H // 2, H, owner_hi, parents=(0,))]


def make_acc(parts: list[Part] | StreamInfo, **kwargs) -> Accumulator:
    options = dict(linger_s=0.0, max_pending_per_partition=10_000,
                   max_pending_bytes=limits.PRODUCER_PENDING_BYTES_MAX, retry_backoff_s=BACKOFF_S,
                   retry_backoff_max_s=BACKOFF_MAX_S, delivery_timeout_s=60.0, clock_ms=lambda: CLOCK_MS)
    options.update(kwargs)
    acc = Accumulator(STREAM, PID, **options)
    acc.set_map(parts if isinstance(parts, StreamInfo) else make_info(parts))
    return acc


def hash_tlv(hash_key: int) -> bytes:
    return bytes((wire.TAG_EXPLICIT_HASH_KEY, 16)) + hash_key.to_bytes(16, "big")


def record_size(key: bytes, data: bytes, hash_key: int) -> int:
    return len(key) + len(data) + SESSION_META_BYTES + len(hash_tlv(hash_key))


def add(acc: Accumulator, hash_key: int = LOW, data: bytes = b"x", now: float = 0.0, *, sssn: int | None = None,
        ordinal: int | None = None, key: bytes = b"k", outcome=None):
    """Queue one record (room() must have room for it); returns its outcome."""
    extra = hash_tlv(hash_key)
    size = record_size(key, data, hash_key)
    session = acc.room(hash_key, size, ordinal)
    assert isinstance(session, Session), session
    outcome = Outcome(data) if outcome is None else outcome
    acc.add(session, key, data, hash_key, extra, outcome, now, sssn)
    return outcome


@dataclass(frozen=True)
class Sent:
    """One entry of a request as an owner reads it."""

    session: int
    sssn: int
    submit_ms: int
    hash_key: int
    key: bytes
    data: bytes
    raw: bytes


def decode(request: PutRequest) -> list[Sent]:
    m = request.message
    assert m.stream == STREAM and m.producer_id == PID and m.count == len(request.records)
    sessions = wire.decode_ordinals(m.session_ordinals)
    out = []
    for e, session in zip(wire.iter_entries(m.entries, m.count), sessions, strict=True):
        meta = wire.decode_meta(e.meta)
        assert len(meta[wire.TAG_SSSN]) == 8 and len(meta[wire.TAG_SUBMIT_MS]) == 8
        out.append(Sent(session, int.from_bytes(meta[wire.TAG_SSSN], "big"),
                        int.from_bytes(meta[wire.TAG_SUBMIT_MS], "big"),
                        int.from_bytes(meta[wire.TAG_EXPLICIT_HASH_KEY], "big"), e.key, e.data,
                        bytes(m.entries[e.start:e.end])))
    for sent, record in zip(out, request.records, strict=True):
        assert (sent.session, sent.sssn) == (record.ordinal, record.sssn)
    return out


def sssns(request: PutRequest) -> list[int]:
    return [s.sssn for s in decode(request)]


def answer(request: PutRequest, *, errs: dict[int, str] | None = None, duplicates=(), missing=None,
           sns: list[int] | None = None, ordinals: list[int] | None = None) -> sms_pb2.PutRecordsResponse:
    """An owner's answer: every record stored (under SN counter j+1) unless named in errs."""
    errs = errs or {}
    if sns is None:
        sns = [0 if j in errs else seqno.make(CLOCK_MS, j + 1, r.ordinal) for j, r in enumerate(request.records)]
    if ordinals is None:
        ordinals = [r.ordinal for r in request.records]
    raw_sns, raw_ordinals = wire.encode_put_results(sns, ordinals)
    return sms_pb2.PutRecordsResponse(
        sequence_numbers=raw_sns, ordinals=raw_ordinals,
        errors=[sms_pb2.RecordError(index=j, name=name, message=f"injected {name}") for j, name in errs.items()],
        duplicates=list(duplicates),
        missing=[sms_pb2.MissingSssns(ordinal=o, sssns=s) for o, s in (missing or {}).items()])


def poll_one(acc: Accumulator, now: float, owner: str = A) -> PutRequest:
    requests, _ = acc.poll(now)
    assert [r.owner for r in requests] == [owner], [(r.owner, sssns(r)) for r in requests]
    return requests[0]


def by_owner(requests: list[PutRequest]) -> dict[str, PutRequest]:
    out = {r.owner: r for r in requests}
    assert len(out) == len(requests)
    return out


# --- sessions, SSSNs, HWM, one request per owner -------------------------------------------------

def test_records_of_one_partition_go_in_one_request_numbered_from_zero():
    acc = make_acc(even(1))
    outcomes = [add(acc, data=f"r{i}".encode()) for i in range(5)]
    request = poll_one(acc, 0.0)
    sent = decode(request)
    assert [s.sssn for s in sent] == [0, 1, 2, 3, 4]
    assert [s.data for s in sent] == [f"r{i}".encode() for i in range(5)]
    assert {s.session for s in sent} == {0} and {s.submit_ms for s in sent} == {CLOCK_MS}
    assert {s.hash_key for s in sent} == {LOW} and {s.key for s in sent} == {b"k"}
    assert dict(request.message.hwm) == {0: HWM_NONE}
    assert not any(o.done() for o in outcomes)
    acc.on_answer(request, answer(request), 0.1)
    for j, o in enumerate(outcomes):
        assert o.result == ProducerResult(seqno.make(CLOCK_MS, j + 1, 0), 0, j, False)
        assert o.result.partition_id == "p0000" and o.result.sequence_number == str(o.result.sn)
    stats = acc.statistics()
    assert stats["hwm"] == {0: 4} and stats["pending"] == {0: 0} and stats["pending_bytes"] == 0
    assert stats["sent_total"] == stats["acked_total"] == 5 and stats["requests_total"] == 1
    late = add(acc, now=0.2)
    request = poll_one(acc, 0.2)
    assert sssns(request) == [5] and dict(request.message.hwm) == {0: 4}
    acc.on_answer(request, answer(request), 0.3)
    assert late.result.sssn == 5
    assert acc.poll(0.3) == ([], float("inf"))


def test_at_most_one_request_per_owner_is_in_flight_and_owners_are_served_in_parallel():
    acc = make_acc(even(3, (A, B)))                            # p0: A, p1: B, p2: A
    hashes = [H // 6, H // 2, 5 * H // 6]
    first = [add(acc, hashes[p], f"p{p}".encode()) for p in range(3)]
    requests = by_owner(acc.poll(0.0)[0])
    assert sorted(requests) == [A, B]
    assert dict(requests[A].message.hwm) == {0: -1, 2: -1} and dict(requests[B].message.hwm) == {1: -1}
    assert sorted((s.session, s.sssn) for s in decode(requests[A])) == [(0, 0), (2, 0)]
    assert acc.statistics()["inflight_requests"] == 2 and acc.statistics()["inflight_records"] == 3
    second = [add(acc, hashes[p], f"p{p}-b".encode(), 0.1) for p in range(3)]
    assert acc.poll(0.1)[0] == []                             # both owners busy: nothing more
    assert acc.poll(5.0)[0] == []
    acc.on_answer(requests[B], answer(requests[B]), 5.1)
    again = poll_one(acc, 5.1, B)                             # B is free again; A still is not
    assert [(s.session, s.sssn) for s in decode(again)] == [(1, 1)] and dict(again.message.hwm) == {1: 0}
    acc.on_answer(requests[A], answer(requests[A]), 5.2)
    request = poll_one(acc, 5.2, A)
    assert sorted((s.session, s.sssn) for s in decode(request)) == [(0, 1), (2, 1)]
    assert dict(request.message.hwm) == {0: 0, 2: 0}
    acc.on_answer(request, answer(request), 5.3)
    acc.on_answer(again, answer(again), 5.3)
    assert all(o.result.sssn == 0 for o in first) and all(o.result.sssn == 1 for o in second)
    assert [o.result.partition_ordinal for o in second] == [0, 1, 2]


def test_the_hwm_is_one_below_the_lowest_unsettled_sssn():
    acc = make_acc(even(1))
    outcomes = [add(acc) for _ in range(6)]
    request = poll_one(acc, 0.0)
    assert dict(request.message.hwm) == {0: -1}
    # 0 and 2 stored, 1 throttled, 3 failed for good, 4 and 5 stored
    acc.on_answer(request, answer(request, errs={1: "Throttled", 3: "SessionConflict"}), 1.0)
    assert acc.statistics()["hwm"] == {0: 0}
    assert isinstance(outcomes[3].error, errors.SessionConflict) and not outcomes[1].done()
    add(acc, now=1.0)
    request = poll_one(acc, 1.0 + BACKOFF_S)
    assert sssns(request) == [1, 6] and dict(request.message.hwm) == {0: 0}
    acc.on_answer(request, answer(request), 2.0)
    assert acc.statistics()["hwm"] == {0: 6}


def test_linger_holds_a_record_until_it_is_due():
    acc = make_acc(even(1), linger_s=0.5)
    out = add(acc, now=1.0)
    assert acc.poll(1.0) == ([], 1.5)
    assert acc.poll(1.49) == ([], 1.5)
    add(acc, now=1.2)                                        # the first record's linger counts
    request = poll_one(acc, 1.5)
    assert sssns(request) == [0, 1]
    acc.on_answer(request, answer(request), 1.6)
    assert out.result.sssn == 0
    add(acc, now=2.0)                                         # flush: no linger
    assert acc.poll(2.0)[0] == []
    acc.flushing = 1
    assert sssns(poll_one(acc, 2.0)) == [2]
    acc.flushing = 0


def test_a_full_request_is_due_at_once_and_the_rest_lingers():
    acc = make_acc(even(1), linger_s=10.0)
    for _ in range(limits.PUT_RECORDS_COUNT_MAX + 3):
        add(acc)
    request = poll_one(acc, 0.0)
    assert request.message.count == limits.PUT_RECORDS_COUNT_MAX
    assert sssns(request) == list(range(limits.PUT_RECORDS_COUNT_MAX))
    acc.on_answer(request, answer(request), 0.1)
    assert acc.poll(0.1) == ([], 10.0)                        # 3 left: they linger
    assert sssns(poll_one(acc, 10.0)) == [500, 501, 502]


def test_a_request_holds_at_most_put_records_bytes_max():
    acc = make_acc(even(2, (A,)))
    big = b"x" * limits.RECORD_DATA_BYTES_MAX
    for _ in range(5):
        add(acc, LOW, big)
    add(acc, HIGH, big)
    request = poll_one(acc, 0.0)
    assert [(s.session, s.sssn) for s in decode(request)] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    acc.on_answer(request, answer(request), 0.1)
    request = poll_one(acc, 0.1)                              # the other session first this time
    assert [(s.session, s.sssn) for s in decode(request)] == [(1, 0), (0, 4)]
    assert len(request.message.entries) - 2 * wire.ENTRY.size <= limits.PUT_RECORDS_BYTES_MAX
    acc.on_answer(request, answer(request), 0.2)
    assert acc.statistics()["hwm"] == {0: 4, 1: 0} and acc.pending_bytes == 0


def test_a_failed_map_refresh_backs_off():
    acc = make_acc(even(1))
    acc.want_refresh()
    assert acc.poll(0.0) == ([], 0.0)                         # refresh now
    acc.refresh_failed(1.0)
    assert acc.poll(1.0) == ([], pytest.approx(1.0 + BACKOFF_S))
    acc.refresh_failed(1.1)
    assert acc.refresh_not_before_s == pytest.approx(1.1 + 2 * BACKOFF_S)
    acc.set_map(make_info(even(1), version=2))
    assert not acc.refresh_wanted and acc.refresh_failures == 0 and acc.totals["map_refreshes"] == 3
    assert acc.poll(2.0) == ([], float("inf"))


# --- pinned SSSNs ---------------------------------------------------------------------------------

def test_pinned_sssns_may_skip_and_gaps_never_block():
    acc = make_acc(even(1))
    outcomes = [add(acc, sssn=s, ordinal=0) for s in (100, 102, 105)]
    assert acc.statistics()["hwm"] == {0: 99}
    request = poll_one(acc, 0.0)
    assert sssns(request) == [100, 102, 105] and dict(request.message.hwm) == {0: 99}
    # an owner reports the SSSNs skipped over as missing: nothing to resend, nothing urgent
    acc.on_answer(request, answer(request, missing={0: [101, 103, 104]}), 0.1)
    assert [o.result.sssn for o in outcomes] == [100, 102, 105]
    assert acc.statistics()["hwm"] == {0: 105} and acc.statistics()["missing_resends_total"] == 0
    assert not acc.sessions[0].urgent
    # the HWM passes a gap once the record below it settles: 101 was never used
    outcomes = [add(acc, sssn=s, ordinal=0, now=1.0) for s in (110, 112)]
    request = poll_one(acc, 1.0)
    assert dict(request.message.hwm) == {0: 109}
    acc.on_answer(request, answer(request, errs={1: "Throttled"}), 1.1)
    assert acc.statistics()["hwm"] == {0: 111} and outcomes[0].result.sssn == 110
    request = poll_one(acc, 1.1 + BACKOFF_S)
    assert sssns(request) == [112] and dict(request.message.hwm) == {0: 111}
    acc.on_answer(request, answer(request), 1.3)
    assert acc.statistics()["hwm"] == {0: 112}
    unpinned = add(acc, now=2.0)                              # an unpinned record goes on from there
    request = poll_one(acc, 2.0)
    assert sssns(request) == [113] and dict(request.message.hwm) == {0: 112}
    acc.on_answer(request, answer(request), 2.1)
    assert unpinned.result.sssn == 113


def test_the_session_window_counts_records_not_sssn_distance():
    acc = make_acc(even(1))
    pinned = list(range(0, 10 * limits.PUT_RECORDS_COUNT_MAX, 10))       # 0, 10, ..., 4990
    assert pinned[-1] > accumulator_module.PRODUCER_SESSION_WINDOW_MAX
    for s in pinned:
        add(acc, sssn=s, ordinal=0)
    request = poll_one(acc, 0.0)
    assert sssns(request) == pinned and dict(request.message.hwm) == {0: -1}
    acc.on_answer(request, answer(request), 0.1)
    assert acc.statistics()["hwm"] == {0: pinned[-1]}


def test_the_session_window_holds_records_above_a_stuck_sssn(monkeypatch):
    monkeypatch.setattr(accumulator_module, "PRODUCER_SESSION_WINDOW_MAX", 4)
    acc = make_acc(even(1))
    for s in range(0, 120, 10):                               # 12 pinned records, 10 apart
        add(acc, sssn=s, ordinal=0)
    request = poll_one(acc, 0.0)
    assert sssns(request) == [0, 10, 20, 30]                  # 4 records, though 30 > hwm + 4
    acc.on_answer(request, answer(request, errs={0: "Throttled"}), 1.0)
    request = poll_one(acc, 1.0 + BACKOFF_S)
    assert sssns(request) == [0]                              # 40 is 5 records above the hwm
    acc.on_answer(request, answer(request), 1.2)
    request = poll_one(acc, 1.2)
    # every SSSN below 40 is settled or was never used: the HWM is 39
    assert sssns(request) == [40, 50, 60, 70] and dict(request.message.hwm) == {0: 39}


def test_a_pinned_sssn_below_the_next_rewinds_an_idle_session_and_is_a_bug_while_records_are_pending():
    acc = make_acc(even(1))
    for s in (10, 11, 12):
        add(acc, sssn=s, ordinal=0)
    request = poll_one(acc, 0.0)
    acc.on_answer(request, answer(request), 0.1)
    assert acc.statistics()["hwm"] == {0: 12}
    replay = add(acc, sssn=5, ordinal=0, now=1.0)            # idle: a replay starts the session at 5
    assert acc.statistics()["hwm"] == {0: 4}
    request = poll_one(acc, 1.0)
    assert sssns(request) == [5] and dict(request.message.hwm) == {0: 4}
    add(acc, sssn=6, ordinal=0, now=1.0)
    before = acc.statistics()
    session = acc.room(LOW, record_size(b"k", b"x", LOW), 0)
    with pytest.raises(errors.InvariantViolation, match="pinned sssn 3 below 7"):
        acc.add(session, b"k", b"x", LOW, hash_tlv(LOW), Outcome(), 1.0, 3)
    assert acc.statistics() == before                         # nothing changed
    acc.on_answer(request, answer(request), 1.1)
    assert replay.result.sssn == 5
    request = poll_one(acc, 1.1)
    assert sssns(request) == [6] and dict(request.message.hwm) == {0: 5}


# --- answers ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["Throttled", "TableFull", "WrongOwner", "Unavailable"])
def test_a_retriable_record_error_resends_the_same_entry_after_a_backoff(name):
    acc = make_acc(even(1))
    outcomes = [add(acc, data=f"r{i}".encode()) for i in range(3)]
    request = poll_one(acc, 0.0)
    first = decode(request)
    acc.on_answer(request, answer(request, errs={1: name}), 1.0)
    assert outcomes[0].result.sssn == 0 and outcomes[2].result.sssn == 2 and not outcomes[1].done()
    stats = acc.statistics()
    assert stats["pending"] == {0: 1} and stats["queued"] == {0: 1} and stats["hwm"] == {0: 0}
    assert stats["retries_total"] == 1
    refresh = errors.from_name(name, "").refresh_map
    assert acc.refresh_wanted is refresh
    requests, wake_s = acc.poll(1.0)
    assert requests == [] and wake_s == (0.0 if refresh else pytest.approx(1.0 + BACKOFF_S))
    assert acc.poll(1.0 + BACKOFF_S - 0.001)[0] == []
    request = poll_one(acc, 1.0 + BACKOFF_S)
    again = decode(request)
    assert [s.sssn for s in again] == [1] and again[0].raw == first[1].raw      # same bytes, same submit_ms
    assert dict(request.message.hwm) == {0: 0} and request.records[0].attempts == 2
    acc.on_answer(request, answer(request, errs={0: name}), 2.0)                 # the backoff doubles
    assert acc.poll(2.0 + 2 * BACKOFF_S - 0.001)[0] == []
    request = poll_one(acc, 2.0 + 2 * BACKOFF_S)
    assert decode(request)[0].raw == first[1].raw
    acc.on_answer(request, answer(request), 3.0)
    assert outcomes[1].result.sssn == 1 and acc.sessions[0].failures == 0
    assert acc.statistics()["hwm"] == {0: 2} and acc.statistics()["retries_total"] == 2


def test_the_backoff_is_capped():
    acc = make_acc(even(1))
    assert [acc.backoff_s(n) for n in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 0.8, 0.8])


@pytest.mark.parametrize("name,error", [("SessionConflict", errors.SessionConflict),
                                        ("StaleSubmission", errors.StaleSubmission),
                                        ("NoSuchErrorName", errors.InternalError)])
def test_a_non_retriable_record_error_fails_only_its_record(name, error):
    acc = make_acc(even(1))
    outcomes = [add(acc) for _ in range(3)]
    request = poll_one(acc, 0.0)
    acc.on_answer(request, answer(request, errs={1: name}), 0.1)
    assert type(outcomes[1].error) is error and "injected" in str(outcomes[1].error)
    assert [outcomes[0].result.sssn, outcomes[2].result.sssn] == [0, 2]
    stats = acc.statistics()
    assert stats["hwm"] == {0: 2} and stats["failed_total"] == 1 and stats["acked_total"] == 2
    assert stats["pending_bytes"] == 0 and stats["retries_total"] == 0


def test_a_retriable_call_failure_resends_every_record():
    acc = make_acc(even(2, (A,)))
    outcomes = [add(acc, h) for h in (LOW, HIGH, LOW)]
    request = poll_one(acc, 0.0)
    first = decode(request)
    acc.on_call_failed(request, errors.Unavailable("request lost"), 1.0)
    stats = acc.statistics()
    assert stats["call_failures_total"] == 1 and stats["retries_total"] == 3 and stats["inflight_requests"] == 0
    assert stats["queued"] == {0: 2, 1: 1} and acc.refresh_wanted
    assert not any(o.done() for o in outcomes)
    assert acc.poll(1.0 + BACKOFF_S - 0.001)[0] == []
    acc.set_map(make_info(even(2, (A,)), version=2))           # the refresh the error asked for
    request = poll_one(acc, 1.0 + BACKOFF_S)
    assert sorted(s.raw for s in decode(request)) == sorted(s.raw for s in first)
    acc.on_answer(request, answer(request), 2.0)
    assert [(o.result.partition_ordinal, o.result.sssn) for o in outcomes] == [(0, 0), (1, 0), (0, 1)]


def test_a_non_retriable_call_failure_fails_every_record():
    acc = make_acc(even(2, (A,)))
    outcomes = [add(acc, h) for h in (LOW, HIGH, LOW)]
    request = poll_one(acc, 0.0)
    acc.on_call_failed(request, errors.RequestTooLarge("too large, says the owner"), 0.1)
    assert all(type(o.error) is errors.RequestTooLarge for o in outcomes)
    assert len({id(o.error) for o in outcomes}) == 3            # an error of its own each
    stats = acc.statistics()
    assert stats["hwm"] == {0: 1, 1: 0} and stats["failed_total"] == 3 and stats["pending_bytes"] == 0
    assert acc.poll(0.1) == ([], float("inf"))


def test_a_duplicate_answer_is_a_result_marked_duplicate():
    acc = make_acc(even(1))
    outcomes = [add(acc) for _ in range(3)]
    request = poll_one(acc, 0.0)
    sn = seqno.make(CLOCK_MS, 7, 0)
    acc.on_answer(request, answer(request, duplicates=[0, 2], sns=[sn, seqno.make(CLOCK_MS, 8, 0), 0]), 0.1)
    assert outcomes[0].result == ProducerResult(sn, 0, 0, True)
    assert outcomes[1].result.duplicate is False
    assert outcomes[2].result == ProducerResult(None, 0, 2, True)      # below the owner's HWM: SN unknown
    assert outcomes[2].result.sequence_number == ""
    assert acc.statistics()["duplicates_total"] == 2 and acc.statistics()["acked_total"] == 3


def test_missing_sssns_make_their_session_urgent_skipping_the_backoff():
    acc = make_acc(even(1), retry_backoff_s=5.0, retry_backoff_max_s=5.0)
    outcomes = [add(acc) for _ in range(4)]
    request = poll_one(acc, 0.0)
    # the owner lost the write of 1 and reports it missing below 2 and 3
    acc.on_answer(request, answer(request, errs={1: "Unavailable"}, missing={0: [1]}), 1.0)
    assert acc.sessions[0].urgent and acc.statistics()["missing_resends_total"] == 1
    request = poll_one(acc, 1.0)                               # not after the 5 s backoff
    assert sssns(request) == [1] and not acc.sessions[0].urgent
    acc.on_answer(request, answer(request), 1.1)
    assert [o.result.sssn for o in outcomes] == [0, 1, 2, 3]


def test_missing_sssns_of_a_throttled_session_wait_for_the_backoff():
    acc = make_acc(even(1), retry_backoff_s=5.0, retry_backoff_max_s=5.0)
    [add(acc) for _ in range(3)]
    request = poll_one(acc, 0.0)
    acc.on_answer(request, answer(request, errs={0: "TableFull"}, missing={0: [0]}), 1.0)
    assert not acc.sessions[0].urgent and acc.statistics()["missing_resends_total"] == 0
    assert acc.poll(1.0) == ([], 6.0)
    assert sssns(poll_one(acc, 6.0)) == [0]


def test_missing_sssns_already_settled_are_ignored():
    acc = make_acc(even(1), retry_backoff_s=5.0, retry_backoff_max_s=5.0)
    add(acc)
    request = poll_one(acc, 0.0)
    acc.on_answer(request, answer(request), 0.1)
    add(acc, now=0.2)
    add(acc, now=0.2)
    request = poll_one(acc, 0.2)
    acc.on_answer(request, answer(request, errs={1: "Unavailable"}, missing={0: [0], 7: [1]}), 1.0)
    assert not acc.sessions[0].urgent and acc.statistics()["missing_resends_total"] == 0
    assert acc.poll(1.0)[0] == []


@pytest.mark.parametrize("shape", ["short sns", "long ordinals", "error index", "duplicate index"])
def test_an_answer_of_the_wrong_shape_fails_every_record_with_internal_error(shape):
    # InternalError is not retriable: _call_failed settles every record of the request with it
    assert errors.InternalError.retriable is False
    acc = make_acc(even(1))
    outcomes = [add(acc) for _ in range(3)]
    request = poll_one(acc, 0.0)
    response = answer(request)
    if shape == "short sns":
        response.sequence_numbers = response.sequence_numbers[:-1]
    elif shape == "long ordinals":
        response.ordinals += b"\x00\x00\x00\x00"
    elif shape == "error index":
        response.errors.append(sms_pb2.RecordError(index=3, name="Throttled", message="x"))
    else:
        response.duplicates.append(3)
    acc.on_answer(request, response, 0.1)
    assert all(type(o.error) is errors.InternalError for o in outcomes)
    assert all("PutRecords answer" in o.error.message for o in outcomes)
    stats = acc.statistics()
    assert stats["hwm"] == {0: 2} and stats["failed_total"] == 3 and stats["pending_bytes"] == 0
    assert stats["inflight_requests"] == 0 and acc.poll(0.1) == ([], float("inf"))


def test_a_cancelled_future_is_not_set_and_a_running_one_is():
    acc = make_acc(even(1))
    cancelled = concurrent.futures.Future()
    assert cancelled.cancel()
    running = concurrent.futures.Future()
    assert running.set_running_or_notify_cancel()
    add(acc, outcome=cancelled)
    add(acc, outcome=running)
    request = poll_one(acc, 0.0)
    acc.on_answer(request, answer(request), 0.1)
    assert cancelled.cancelled() and running.result().sssn == 1
    assert acc.statistics()["acked_total"] == 2 and acc.statistics()["hwm"] == {0: 1}


# --- deadlines and bounds ----------------------------------------------------------------------------

def test_a_queued_record_past_its_deadline_fails_with_timeout():
    acc = make_acc(even(1), delivery_timeout_s=2.0)
    in_flight = add(acc, now=0.0)
    request = poll_one(acc, 0.0)
    queued = add(acc, now=0.5)                                 # behind the request in flight
    assert acc.poll(2.4)[0] == [] and not queued.done()
    assert acc.poll(2.5)[0] == []                              # its deadline
    assert type(queued.error) is errors.Timeout and "0 attempts" in queued.error.message
    assert not in_flight.done()                                # a record in flight does not expire
    acc.on_answer(request, answer(request), 3.0)
    assert in_flight.result.sssn == 0
    stats = acc.statistics()
    assert stats["hwm"] == {0: 1} and stats["expired_total"] == 1 and stats["pending_bytes"] == 0
    # a record resent until its deadline (4.0 + 2.0)
    resent = add(acc, now=4.0)
    request = poll_one(acc, 4.0)
    acc.on_call_failed(request, errors.Unavailable("lost"), 5.0)
    request = poll_one(acc, 5.5)
    assert request.records[0].attempts == 2
    acc.on_call_failed(request, errors.Unavailable("lost"), 5.9)     # backoff to 6.1
    assert acc.poll(5.99) == ([], 0.0) and not resent.done()           # (0.0: a map refresh is wanted)
    assert acc.poll(6.0)[0] == []
    assert type(resent.error) is errors.Timeout and "2 attempts" in resent.error.message
    assert acc.statistics()["hwm"] == {0: 2} and acc.statistics()["expired_total"] == 2


def test_the_deadline_stays_inside_the_streams_dedup_window():
    acc = make_acc(make_info(even(1), window_s=60), delivery_timeout_s=120.0, linger_s=100.0)
    add(acc, now=0.0)
    expected = 60 - limits.DEDUP_CLOCK_SKEW_MS_MAX / 1000 - limits.PRODUCER_DEDUP_WINDOW_MARGIN_S
    assert acc.sessions[0].records[0].deadline_s == pytest.approx(expected)
    assert acc.poll(0.0) == ([], pytest.approx(expected))      # it wakes for the deadline, not the linger
    outcome = acc.sessions[0].records[0].outcome
    acc.poll(expected)
    assert type(outcome.error) is errors.Timeout


def test_room_bounds_records_per_partition_and_bytes_per_producer():
    acc = make_acc(even(2, (A, B)), max_pending_per_partition=2, max_pending_bytes=1000)
    big = add(acc, LOW, b"x" * 2000)                           # the first record always fits
    assert acc.room(HIGH, 10) == Room.PRODUCER_FULL
    request = poll_one(acc, 0.0)
    acc.on_answer(request, answer(request), 0.1)
    assert big.done() and acc.pending_bytes == 0
    add(acc, LOW)
    add(acc, LOW)
    size = record_size(b"k", b"x", LOW)
    assert acc.room(LOW, size) == Room.PARTITION_FULL
    assert isinstance(acc.room(HIGH, size), Session)           # another partition is not held up
    assert acc.pending_bytes == 2 * size
    assert acc.room(HIGH, 1000 - 2 * size) is acc.sessions[1]
    assert acc.room(HIGH, 1000 - 2 * size + 1) == Room.PRODUCER_FULL


def test_a_hash_no_open_partition_covers_raises_unavailable_and_wants_a_refresh():
    acc = make_acc([Part(0, 0, H // 2), Part(1, H // 2, H, closed=True)])
    assert not acc.refresh_wanted
    with pytest.raises(errors.Unavailable, match="no open partition"):
        acc.room(HIGH, 10)
    assert acc.refresh_wanted


# --- lineage: splits, merges, closed partitions -------------------------------------------------

def test_a_split_moves_never_sent_records_to_the_childrens_sessions():
    acc = make_acc(even(1))
    o0, o1 = add(acc, LOW, b"o0"), add(acc, HIGH, b"o1")
    first = poll_one(acc, 0.0)
    o2, o3, o4 = add(acc, LOW, b"o2", 0.1), add(acc, HIGH, b"o3", 0.1), add(acc, LOW, b"o4", 0.1)
    bytes_before = acc.pending_bytes
    acc.set_map(make_info(split_of_one(), version=2))
    assert acc.totals["moved"] == 3 and acc.pending_bytes == bytes_before
    assert [(r.sssn, r.outcome) for r in acc.sessions[1].queue] == [(0, o2), (1, o4)]
    assert [(r.sssn, r.outcome) for r in acc.sessions[2].queue] == [(0, o3)]
    assert not acc.sessions[0].queue and sorted(acc.sessions[0].records) == [0, 1]
    assert acc.statistics()["hwm"] == {0: -1, 1: -1, 2: -1}
    o5 = add(acc, LOW, b"o5", 0.2)                             # a new record goes after the moved ones
    assert acc.sessions[1].records[2].outcome is o5
    assert acc.poll(0.2)[0] == []                              # the children wait for p0 to settle
    acc.on_answer(first, answer(first, errs={1: "PartitionClosed"}), 0.3)
    assert o0.result.sssn == 0 and not o1.done() and acc.refresh_wanted
    assert acc.poll(0.3)[0] == []                              # p0's backoff; p1, p2 still wait
    request = poll_one(acc, 0.3 + BACKOFF_S, B)                # o1, still in p0's session, to p2's owner
    sent = decode(request)
    assert [(s.session, s.sssn, s.data) for s in sent] == [(0, 1, b"o1")]
    assert dict(request.message.hwm) == {0: 0}
    acc.on_answer(request, answer(request, ordinals=[2]), 0.5)
    assert o1.result.partition_ordinal == 2 and o1.result.sssn == 1
    assert acc.statistics()["hwm"][0] == 4                     # 2..4 were moved: never used in p0
    requests = by_owner(acc.poll(0.5)[0])
    assert sorted(requests) == [A, B]
    assert [(s.session, s.sssn, s.data) for s in decode(requests[A])] == [(1, 0, b"o2"), (1, 1, b"o4"),
                                                                          (1, 2, b"o5")]
    assert [(s.session, s.sssn, s.data) for s in decode(requests[B])] == [(2, 0, b"o3")]
    assert dict(requests[A].message.hwm) == {1: -1} and dict(requests[B].message.hwm) == {2: -1}
    for request in requests.values():
        acc.on_answer(request, answer(request), 0.6)
    assert [(o.result.partition_ordinal, o.result.sssn) for o in (o2, o3, o4, o5)] == [(1, 0), (2, 0), (1, 1),
                                                                                       (1, 2)]
    stats = acc.statistics()
    assert stats["sent_total"] == stats["acked_total"] == 6 and stats["pending_bytes"] == 0


def test_records_sent_before_a_split_stay_in_their_session_and_go_to_each_childs_owner():
    acc = make_acc(even(1))
    r0, r1, r2 = add(acc, LOW, b"r0"), add(acc, HIGH, b"r1"), add(acc, LOW, b"r2")
    request = poll_one(acc, 0.0)
    first = {s.sssn: s.raw for s in decode(request)}
    acc.set_map(make_info(split_of_one(A, B), version=2))
    assert acc.totals["moved"] == 0                            # in flight: nothing to move
    acc.on_answer(request, answer(request, errs={0: "PartitionClosed", 1: "PartitionClosed",
                                                 2: "PartitionClosed"}), 1.0)
    assert [r.sssn for r in acc.sessions[0].queue] == [0, 1, 2]
    request = poll_one(acc, 1.0 + BACKOFF_S, A)                # only p1's records: r1 goes to B later
    sent = decode(request)
    assert [(s.session, s.sssn) for s in sent] == [(0, 0), (0, 2)] and dict(request.message.hwm) == {0: -1}
    assert all(s.raw == first[s.sssn] for s in sent)
    assert acc.sessions[0].records[0].ordinal == 0             # still p0's session
    acc.on_answer(request, answer(request, errs={1: "Throttled"}, ordinals=[1, 1]), 1.2)
    assert r0.result.partition_ordinal == 1 and not r2.done()
    assert [r.sssn for r in acc.sessions[0].queue] == [1, 2]   # back in SSSN order
    t = 1.2 + 2 * BACKOFF_S
    assert acc.poll(t - 0.001)[0] == []
    request = poll_one(acc, t, B)
    assert [(s.session, s.sssn) for s in decode(request)] == [(0, 1)] and dict(request.message.hwm) == {0: 0}
    acc.on_answer(request, answer(request, ordinals=[2]), t + 0.1)
    assert acc.sessions[0].failures == 0
    request = poll_one(acc, t + 0.1, A)
    assert [(s.session, s.sssn) for s in decode(request)] == [(0, 2)] and dict(request.message.hwm) == {0: 1}
    acc.on_answer(request, answer(request, ordinals=[1]), t + 0.2)
    assert [(o.result.partition_ordinal, o.result.sssn) for o in (r0, r1, r2)] == [(1, 0), (2, 1), (1, 2)]
    assert acc.statistics()["hwm"] == {0: 2}


def test_pinned_records_never_move():
    acc = make_acc(even(1))
    low = add(acc, LOW, b"low", sssn=10, ordinal=0)
    high = add(acc, HIGH, b"high", sssn=11, ordinal=0)
    acc.set_map(make_info(split_of_one(A, B), version=2))
    assert acc.totals["moved"] == 0 and [r.sssn for r in acc.sessions[0].queue] == [10, 11]
    child = add(acc, LOW, b"child")                            # p1's session waits for p0's
    request = poll_one(acc, 0.0, A)
    assert [(s.session, s.sssn, s.data) for s in decode(request)] == [(0, 10, b"low")]
    assert dict(request.message.hwm) == {0: 9}
    acc.on_answer(request, answer(request, ordinals=[1]), 0.1)
    request = poll_one(acc, 0.1, B)
    assert [(s.session, s.sssn, s.data) for s in decode(request)] == [(0, 11, b"high")]
    assert dict(request.message.hwm) == {0: 10}
    assert not acc.poll(0.1)[0]                                # p1 waits while p0 holds 11
    acc.on_answer(request, answer(request, ordinals=[2]), 0.2)
    request = poll_one(acc, 0.2, A)
    assert [(s.session, s.sssn, s.data) for s in decode(request)] == [(1, 0, b"child")]
    acc.on_answer(request, answer(request), 0.3)
    assert (low.result.sssn, high.result.sssn, child.result.sssn) == (10, 11, 0)
    # a pinned record of a closed session added after the split stays there too
    late = add(acc, HIGH, b"late", sssn=20, ordinal=0, now=1.0)
    request = poll_one(acc, 1.0, B)
    assert [(s.session, s.sssn) for s in decode(request)] == [(0, 20)] and dict(request.message.hwm) == {0: 19}
    acc.on_answer(request, answer(request, ordinals=[2]), 1.1)
    assert late.result == ProducerResult(seqno.make(CLOCK_MS, 1, 0), 2, 20, False)


def test_a_grandchild_waits_while_a_grandparents_session_has_records():
    acc = make_acc(even(1))
    parent = add(acc, LOW, b"p", sssn=0, ordinal=0)
    request = poll_one(acc, 0.0, A)
    acc.set_map(make_info([
        Part(0, 0, H, A, closed=True, children=(1, 2)),
        Part(1, 0, H // 2, A, closed=True, parents=(0,), children=(3, 4)),
        Part(2, H // 2, H, B, parents=(0,)),
        Part(3, 0, H // 4, B, parents=(1,)), Part(4, H // 4, H // 2, B, parents=(1,))], version=3))
    grandchild = add(acc, H // 8, b"g")                       # p3, on B, which is idle
    child = add(acc, HIGH, b"c")                              # p2, on B
    assert acc.poll(1.0)[0] == []
    assert acc._ancestor_busy(3) and acc._ancestor_busy(2) and not acc._ancestor_busy(0)
    acc.on_answer(request, answer(request), 1.0)
    request = poll_one(acc, 1.0, B)
    assert sorted((s.session, s.data) for s in decode(request)) == [(2, b"c"), (3, b"g")]
    acc.on_answer(request, answer(request), 1.1)
    assert parent.result.sssn == 0 and grandchild.result.sssn == 0 and child.result.sssn == 0


def test_a_merge_moves_both_parents_never_sent_records_to_the_child():
    acc = make_acc(even(2, (A, B)), linger_s=1.0)
    lo = [add(acc, LOW, f"lo{i}".encode()) for i in range(2)]
    hi = [add(acc, HIGH, f"hi{i}".encode()) for i in range(2)]
    acc.set_map(make_info([Part(0, 0, H // 2, A, closed=True, children=(2,)),
                           Part(1, H // 2, H, B, closed=True, children=(2,)),
                           Part(2, 0, H, B, parents=(0, 1))], version=2))
    assert acc.totals["moved"] == 4
    assert [r.outcome for r in acc.sessions[2].queue] == lo + hi
    assert [r.sssn for r in acc.sessions[2].queue] == [0, 1, 2, 3]
    assert acc.statistics()["hwm"] == {0: 1, 1: 1, 2: -1}
    request = poll_one(acc, 1.0, B)
    assert [(s.session, s.sssn) for s in decode(request)] == [(2, 0), (2, 1), (2, 2), (2, 3)]
    acc.on_answer(request, answer(request), 1.1)
    assert [o.result.sssn for o in lo + hi] == [0, 1, 2, 3]


def test_a_closed_partition_without_an_open_cover_backs_off_until_a_map_has_one():
    acc = make_acc(even(1), linger_s=0.0)
    out = add(acc, HIGH)
    acc.set_map(make_info([Part(0, 0, H, A, closed=True)], version=2))      # no children yet
    assert acc.totals["moved"] == 0
    requests, wake_s = acc.poll(1.0)
    assert requests == [] and acc.refresh_wanted and acc.sessions[0].not_before_s == pytest.approx(1.0 + BACKOFF_S)
    acc.set_map(make_info(split_of_one(A, B), version=3))
    assert acc.totals["moved"] == 1 and not acc.refresh_wanted
    request = poll_one(acc, 1.0, B)
    assert [(s.session, s.sssn) for s in decode(request)] == [(2, 0)]
    acc.on_answer(request, answer(request), 1.1)
    assert out.result.partition_ordinal == 2


def test_records_of_a_partition_gone_from_the_map_fail_with_partition_closed():
    acc = make_acc(even(2, (A, B)), linger_s=5.0)
    gone = add(acc, HIGH)
    stays = add(acc, LOW)
    acc.set_map(make_info([Part(0, 0, H, A)], version=2))
    assert acc.poll(0.0)[0] == []
    assert type(gone.error) is errors.PartitionClosed and not stays.done()
    assert acc.statistics()["hwm"][1] == 0


def test_fail_all_fails_every_unsettled_record_once():
    acc = make_acc(even(2, (A, B)))
    outcomes = [add(acc, h) for h in (LOW, HIGH)]
    acc.poll(0.0)
    outcomes += [add(acc, h, now=0.1) for h in (LOW, HIGH, LOW)]
    acc.fail_all(lambda: errors.ProducerClosed("closed"))
    assert all(type(o.error) is errors.ProducerClosed for o in outcomes)
    stats = acc.statistics()
    assert stats["pending_bytes"] == 0 and stats["pending"] == {0: 0, 1: 0} and stats["hwm"] == {0: 2, 1: 1}
    assert stats["failed_total"] == stats["sent_total"] == 5


# --- random operations against a simulated owner ------------------------------------------------

KEYS = 8
KEY_HASHES = [(2 * k + 1) * H // (2 * KEYS) for k in range(KEYS)]
FAULTS = ("ok", "ok", "ok", "drop_request", "drop_response", "timeout", "duplicate", "throttle", "reject",
          "refuse")
EXPECTED_FAILURES = (errors.Timeout, errors.RecordTooLarge, errors.RequestTooLarge)


class Sim:
    """The accumulator, driven like its sender, against owners that answer like ingestion
    nodes: one DedupTable per producer session (the children of a split know their parents'
    sessions), one list of stored records per partition; checks every request as it is built."""

    def __init__(self, partitions: int, owners: tuple[str, ...]):
        self.now = 0.0
        self.parts: dict[int, Part] = {p.ordinal: p for p in even(partitions, owners)}
        self.version = 1
        self.acc = Accumulator(STREAM, PID, linger_s=0.01, max_pending_per_partition=6,
                               max_pending_bytes=limits.PRODUCER_PENDING_BYTES_MAX, retry_backoff_s=0.05,
                               retry_backoff_max_s=0.2, delivery_timeout_s=5.0, clock_ms=self.clock_ms)
        self.acc.set_map(self.info())
        self.tables: dict[int, DedupTable] = {}
        self.stored: dict[int, list[tuple[int, int, bytes]]] = defaultdict(list)   # partition -> (session, sssn, data)
        self.store_log: list[tuple[int, int, int, int]] = []   # (key, add index, session, sssn) in store order
        self.where: dict[tuple[int, int], int] = {}            # (session, sssn) -> the partition storing it
        self.sns: dict[tuple[int, int], int] = {}               # (session, sssn) -> SN
        self.counter = Counter()
        self.outcomes: list[Outcome] = []
        self.pinned: set[int] = set()                           # add indexes of records with pinned SSSNs
        self.inflight: dict[str, PutRequest] = {}
        self.sent_under: dict[tuple[int, int], Outcome] = {}    # (session, sssn) -> the record sent under it
        self.raw: dict[tuple[int, int], bytes] = {}
        self.keys_of: dict[int, set[tuple[int, int]]] = defaultdict(set)   # id(outcome) -> (session, sssn)s
        self.last_hwm: dict[int, int] = {}
        self.throttled: set[tuple[int, int]] = set()
        self.first_arrival: dict[tuple[int, int], list[int]] = defaultdict(list)   # (session, partition) -> sssns

    def clock_ms(self) -> int:
        return CLOCK_MS + int(self.now * 1000)

    def info(self) -> StreamInfo:
        return make_info([self.parts[o] for o in sorted(self.parts)], version=self.version)

    def open_for(self, hash_key: int) -> Part:
        (part,) = [p for p in self.parts.values() if not p.closed and p.lo <= hash_key < p.hi]
        return part

    # --- operations --------------------------------------------------------------------
    def add(self, key: int) -> None:
        i = len(self.outcomes)
        data = f"{key}:{i}".encode()
        h = KEY_HASHES[key]
        size = record_size(b"k%d" % key, data, h)
        session = self.acc.room(h, size)
        if not isinstance(session, Session):
            assert session == Room.PARTITION_FULL
            return
        outcome = Outcome((key, i, data))
        self.outcomes.append(outcome)
        self.acc.add(session, b"k%d" % key, data, h, hash_tlv(h), outcome, self.now)

    def pin(self, key: int, gap: int) -> None:
        """A record with a pinned SSSN (as SPS outputs send them): in the session of a
        partition, maybe closed, that covers its hash, `gap` above the session's next SSSN."""
        h = KEY_HASHES[key]
        covering = [p.ordinal for p in self.acc.info.partitions if p.hash_lo <= h < p.hash_hi]
        ordinal = covering[gap % len(covering)]
        session = self.acc.sessions.get(ordinal)
        sssn = (session.next_sssn if session is not None else 0) + gap
        i = len(self.outcomes)
        data = f"{key}:{i}".encode()
        size = record_size(b"k%d" % key, data, h)
        session = self.acc.room(h, size, ordinal)
        if not isinstance(session, Session):
            assert session == Room.PARTITION_FULL
            return
        outcome = Outcome((key, i, data))
        self.outcomes.append(outcome)
        self.pinned.add(i)
        self.acc.add(session, b"k%d" % key, data, h, hash_tlv(h), outcome, self.now, sssn)

    def move(self, which: int, owner: str) -> None:
        """The cluster moves an open partition to another owner (the producer's map is stale)."""
        opened = sorted(o for o, p in self.parts.items() if not p.closed)
        self.parts[opened[which % len(opened)]].owner = owner
        self.version += 1

    def split(self, which: int, owner_lo: str, owner_hi: str) -> None:
        opened = sorted(o for o, p in self.parts.items() if not p.closed)
        if len(self.parts) >= 9:
            return
        p = self.parts[opened[which % len(opened)]]
        mid = (p.lo + p.hi) // 2
        lo, hi = max(self.parts) + 1, max(self.parts) + 2
        p.closed, p.children = True, (lo, hi)
        self.parts[lo] = Part(lo, p.lo, mid, owner_lo, parents=(p.ordinal,))
        self.parts[hi] = Part(hi, mid, p.hi, owner_hi, parents=(p.ordinal,))
        self.version += 1

    def refresh(self) -> None:
        self.acc.set_map(self.info())

    def poll(self) -> float:
        if self.acc.refresh_wanted and self.now >= self.acc.refresh_not_before_s:
            self.refresh()
        requests, wake_s = self.acc.poll(self.now)
        for request in requests:
            assert request.owner not in self.inflight, f"two requests in flight to {request.owner}"
            busy = {r.ordinal for other in self.inflight.values() for r in other.records}
            assert not busy & {r.ordinal for r in request.records}, "one session in two requests"
            assert request.message.count <= limits.PUT_RECORDS_COUNT_MAX
            assert len(request.message.entries) - request.message.count * wire.ENTRY.size \
                <= limits.PUT_RECORDS_BYTES_MAX
            self.check_request(request)
            self.inflight[request.owner] = request
        assert set(self.acc.inflight) == set(self.inflight)
        return wake_s

    def answer(self, which: int, fault: str) -> None:
        if not self.inflight:
            return
        owner = sorted(self.inflight)[which % len(self.inflight)]
        request = self.inflight.pop(owner)
        acc = self.acc
        if fault == "drop_request":
            acc.on_call_failed(request, errors.Unavailable("request lost"), self.now)
        elif fault == "refuse":
            acc.on_call_failed(request, errors.RequestTooLarge("refused"), self.now)
        elif fault in ("drop_response", "timeout"):
            self.apply(request, "ok")
            error = errors.Unavailable("response lost") if fault == "drop_response" else errors.Timeout("late")
            acc.on_call_failed(request, error, self.now)
        elif fault == "duplicate":
            self.apply(request, "ok")
            acc.on_answer(request, self.apply(request, "ok"), self.now)
        else:
            acc.on_answer(request, self.apply(request, fault), self.now)

    # --- the owner ----------------------------------------------------------------------
    def check_request(self, request: PutRequest) -> None:
        """What the producer sends: each session's records start right above its HWM, in
        SSSN order; every SSSN up to the HWM that was ever sent has its outcome set; HWMs
        never go back; a resend is the same bytes as the first send, under the same SSSN."""
        sent = decode(request)
        by_session: dict[int, list[int]] = defaultdict(list)
        for s, record in zip(sent, request.records):
            by_session[s.session].append(s.sssn)
            k = (s.session, s.sssn)
            assert self.sent_under.setdefault(k, record.outcome) is record.outcome, f"{k} reused"
            assert self.raw.setdefault(k, s.raw) == s.raw, f"{k} resent with other bytes"
            self.keys_of[id(record.outcome)].add(k)
            assert len(self.keys_of[id(record.outcome)]) == 1, f"one record sent as {self.keys_of[id(record.outcome)]}"
        hwm = dict(request.message.hwm)
        assert set(hwm) == set(by_session), (hwm, by_session)
        for session, got in by_session.items():
            assert got[0] == hwm[session] + 1 and got == sorted(set(got)), (session, hwm[session], got)
            assert hwm[session] >= self.last_hwm.get(session, HWM_NONE), (session, hwm[session])
            self.last_hwm[session] = hwm[session]
            unsettled = [s for (o, s), out in self.sent_under.items()
                         if o == session and s <= hwm[session] and not out.done()]
            assert not unsettled, f"p{session}: HWM {hwm[session]} above unsettled {unsettled}"

    def apply(self, request: PutRequest, fault: str) -> sms_pb2.PutRecordsResponse:
        now_ms = self.clock_ms()
        hwm = dict(request.message.hwm)
        sns, ordinals, errs, duplicates = [], [], [], []
        missing: dict[int, list[int]] = defaultdict(list)
        for j, s in enumerate(decode(request)):
            part = self.open_for(s.hash_key)
            ordinals.append(part.ordinal)
            sn, error = 0, None
            arrivals = self.first_arrival[(s.session, part.ordinal)]
            if s.sssn not in arrivals:
                arrivals.append(s.sssn)
            if part.owner != request.owner:
                error = errors.WrongOwner(f"p{part.ordinal} is on {part.owner}")
            elif fault == "throttle" and j == 0:
                error = errors.TableFull("injected")
                self.throttled.add((s.session, s.sssn))
            elif fault == "reject" and j == 0:
                error = errors.RecordTooLarge("injected")
            else:
                table = self.tables.setdefault(s.session, DedupTable(f"{STREAM}/s{s.session}", 300_000))
                decision = table.submit(PID, s.sssn, hwm[s.session], s.submit_ms,
                                        hashing.signature(s.key + s.data), None, now_ms)
                missing[s.session].extend(decision.missing)
                if decision.kind is DecisionKind.WRITE:
                    self.counter[part.ordinal] += 1
                    sn = seqno.make(now_ms, self.counter[part.ordinal], part.ordinal)
                    self.stored[part.ordinal].append((s.session, s.sssn, s.data))
                    key, i = map(int, s.data.split(b":"))
                    self.store_log.append((key, i, s.session, s.sssn))
                    self.sns[(s.session, s.sssn)] = sn
                    self.where[(s.session, s.sssn)] = part.ordinal
                    assert table.committed(PID, s.sssn, sn) == []
                elif decision.kind is DecisionKind.DUPLICATE:
                    duplicates.append(j)
                    sn = decision.sn or 0
                    ordinals[-1] = self.where[(s.session, s.sssn)]     # where it was stored (maybe a parent)
                else:
                    raise AssertionError("queued: writes commit at once here")
                table.check_invariants()
            if error is not None:
                errs.append(sms_pb2.RecordError(index=j, name=error.name, message=error.message))
            sns.append(sn)
        raw_sns, raw_ordinals = wire.encode_put_results(sns, ordinals)
        return sms_pb2.PutRecordsResponse(
            sequence_numbers=raw_sns, ordinals=raw_ordinals, errors=errs, duplicates=duplicates,
            missing=[sms_pb2.MissingSssns(ordinal=o, sssns=sorted(set(m))) for o, m in missing.items() if m])

    # --- the end -------------------------------------------------------------------------
    def drain(self) -> None:
        self.acc.flushing = 1
        self.refresh()
        for _ in range(5000):
            while self.inflight:
                self.answer(0, "ok")
            wake_s = self.poll()
            if not self.inflight:
                if not any(True for _ in self.acc.unsettled()):
                    break
                assert wake_s != float("inf"), "records left and nothing to wake for"
                if wake_s > self.now:
                    # nothing is due before the time poll() asked to be woken at
                    settled = sum(o.done() for o in self.outcomes)
                    assert self.acc.poll((self.now + wake_s) / 2) == ([], wake_s)
                    assert sum(o.done() for o in self.outcomes) == settled
                    self.now = wake_s
        else:
            raise AssertionError("the accumulator did not drain")
        self.acc.flushing = 0

    def check(self) -> None:
        acc = self.acc
        assert all(o.calls == 1 for o in self.outcomes), [o.tag for o in self.outcomes if o.calls != 1]
        stored_keys = Counter((session, sssn) for records in self.stored.values() for session, sssn, _ in records)
        assert all(n == 1 for n in stored_keys.values()), [k for k, n in stored_keys.items() if n > 1]
        assert set(stored_keys) <= set(self.sent_under)
        data_of = {(session, sssn): (p, data) for p, records in self.stored.items() for session, sssn, data in records}
        for o in self.outcomes:
            keys = self.keys_of.get(id(o), set())
            if isinstance(o.value, ProducerResult):
                (k,) = keys
                assert k[1] == o.value.sssn
                p, data = data_of[k]
                assert data == o.tag[2] and p == o.value.partition_ordinal, (o.tag, k, p, o.value)
                assert o.value.sn is None or o.value.sn == self.sns[k]
            else:
                assert isinstance(o.value, EXPECTED_FAILURES), repr(o.value)
                if not keys:                                   # never sent: never stored
                    assert not any(d == o.tag[2] for _, d in data_of.values())
        for (session, partition), arrivals in self.first_arrival.items():
            assert arrivals == sorted(arrivals), (session, partition, arrivals)
        for partition, records in self.stored.items():
            by_session = defaultdict(list)
            for session, sssn, _ in records:
                if (session, sssn) not in self.throttled:
                    by_session[session].append(sssn)
            for session, got in by_session.items():
                assert got == sorted(got), f"p{partition}: session {session} stored out of order: {got}"
        by_key = defaultdict(list)
        for key, i, session, sssn in self.store_log:       # (a pinned record may go before older ones)
            if (session, sssn) not in self.throttled and i not in self.pinned:
                by_key[key].append(i)
        for key, got in by_key.items():
            assert got == sorted(got), f"key {key} stored out of order: {got}"
        stats = acc.statistics()
        results = [o.value for o in self.outcomes if isinstance(o.value, ProducerResult)]
        assert stats["pending_bytes"] == 0 and acc.pending_bytes == 0
        assert stats["sent_total"] == len(self.outcomes) == stats["acked_total"] + stats["failed_total"]
        assert stats["acked_total"] == len(results)
        assert stats["duplicates_total"] == sum(r.duplicate for r in results)
        assert stats["expired_total"] == sum(isinstance(o.value, errors.Timeout) for o in self.outcomes)
        assert stats["inflight_requests"] == 0 and not acc.inflight
        for ordinal, session in acc.sessions.items():
            assert not session.records and not session.queue and not session.order and session.queued_bytes == 0
            assert session.inflight == 0 and session.hwm == session.next_sssn - 1
        for table in self.tables.values():
            table.check_invariants()
        assert acc.poll(self.now) == ([], float("inf"))


ADD = st.tuples(st.just("add"), st.integers(0, KEYS - 1), st.integers(1, 4))
POLL = st.tuples(st.just("poll"))
ANSWER = st.tuples(st.just("answer"), st.integers(0, 1), st.sampled_from(FAULTS))
ADVANCE = st.tuples(st.just("advance"), st.sampled_from([0.0, 0.005, 0.02, 0.06, 0.06, 0.3, 2.0]))
OPS = st.one_of(ADD, ADD, POLL, POLL, ANSWER, ANSWER, ANSWER, ADVANCE, ADVANCE,
                st.tuples(st.just("pin"), st.integers(0, KEYS - 1), st.integers(0, 3)),
                st.tuples(st.just("split"), st.integers(0, 7), st.sampled_from([A, B]), st.sampled_from([A, B])),
                st.tuples(st.just("move"), st.integers(0, 7), st.sampled_from([A, B])),
                st.tuples(st.just("refresh")))


def run_ops(partitions: int, owners: int, ops) -> Sim:
    sim = Sim(partitions, (A, B)[:owners])
    for op in ops:
        if op[0] == "add":
            for _ in range(op[2]):
                sim.add(op[1])
        elif op[0] == "poll":
            sim.poll()
        elif op[0] == "answer":
            sim.answer(op[1], op[2])
        elif op[0] == "advance":
            sim.now += op[1]
        elif op[0] == "pin":
            sim.pin(op[1], op[2])
        elif op[0] == "split":
            sim.split(op[1], op[2], op[3])
        elif op[0] == "move":
            sim.move(op[1], op[2])
        else:
            sim.refresh()
    sim.drain()
    sim.check()
    return sim


@settings(max_examples=300, deadline=None)
@given(partitions=st.integers(1, 3), owners=st.integers(1, 2), ops=st.lists(OPS, min_size=30, max_size=150))
def test_random_operations_store_every_acked_record_once_and_keep_the_books(partitions, owners, ops):
    run_ops(partitions, owners, ops)


def test_a_fixed_busy_run_with_splits_and_every_fault():
    ops = []
    for round_ in range(12):
        ops += [("add", k, 2) for k in range(KEYS)]
        ops += [("poll",), ("answer", 0, FAULTS[round_ % len(FAULTS)]), ("advance", 0.06), ("poll",),
                ("answer", 1, FAULTS[(round_ + 3) % len(FAULTS)]), ("advance", 0.02)]
        if round_ in (3, 7):
            ops += [("split", round_, A, B), ("poll",), ("answer", 0, "ok")]
        if round_ in (5, 9):
            ops += [("refresh",)]
    sim = run_ops(2, 2, ops)
    assert sim.acc.totals["acked"] > 0 and len(sim.parts) == 6
