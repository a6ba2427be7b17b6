"""De-duplicated ingestion through real processes (DESIGN.md section 6, docs/dedup.md).

Every test speaks the producer-session protocol on the wire (`session_wire.RawSession`:
explicit producer id, SSSNs, submit times, dedup keys and HWMs) and checks two things
against each other: what the ingestion node answered (SN, duplicate flag, named error,
missing SSSNs) and what is stored, read back with the session fields the node stores
with every record. The rules: a retry is acknowledged with the original SN and stored
once, whether it follows a lost ack or races the original; SSSNs never received are
reported missing; the HWM prunes the table yet keeps pruned SSSNs from being stored
again; a dedup key de-duplicates across sessions; bad session fields are named errors
that store nothing and leave the session usable; the other policies keep no table; the
table stays bounded under 100 producers; an ingestion node's restart (clean or kill -9)
keeps all of this.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import subprocess
import sys
import threading

import pytest

import sms
from sms import wire, errors, limits, metadata
from tests.conftest import read_partition, stream_name, wait_until
from tests.integration.session_wire import (Answer, Channels, RawSession, StoredSession, Submit, cumulative_hwm,
                                            encode, key_for_ordinal, now_ms, send_entries,
                                            stored_session_records)

pytestmark = pytest.mark.integration

READ_TIMEOUT_S = 20             # records of an acked write are readable by then
RESTART_READY_TIMEOUT_S = 60    # a restarted head answers (table rebuilt) by then
CLI_TIMEOUT_S = 60
A, B = b"producer-a", b"producer-b"


# --- helpers ---------------------------------------------------------------------------------

def records(sssns, key: str = "key", submit_ms: int | None = None, tag: str = "",
            dedup_key: bytes | None = None) -> list[Submit]:
    t = now_ms() if submit_ms is None else submit_ms
    return [Submit(s, key, f"record {s}{tag}".encode(), t, dedup_key) for s in sssns]


def stored(client, stream: str, ordinal: int = 0) -> list[StoredSession]:
    return stored_session_records(read_partition(client, stream, ordinal))


def assert_acked(answer: Answer, duplicate: bool | None = None) -> None:
    bad = [(i, a.error_name, a.error_message) for i, a in enumerate(answer.acks) if not a.ok or a.sn == 0]
    assert not bad, f"records not acknowledged with an SN: {bad[:5]}"
    if duplicate is not None:
        flags = [a.duplicate for a in answer.acks]
        assert flags == [duplicate] * len(flags), f"duplicate flags {flags}; expected all {duplicate}"


def assert_stored_once(rows: list[StoredSession], expected: dict[tuple[bytes, int], int]) -> None:
    """`rows` hold each (producer, SSSN) of `expected` exactly once, under that SN, and nothing else."""
    counts = collections.Counter((r.producer_id, r.sssn) for r in rows)
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, f"stored more than once: {sorted(twice.items())[:10]}"
    got = {(r.producer_id, r.sssn): r.sn for r in rows}
    assert got.keys() == expected.keys(), (f"missing {sorted(expected.keys() - got.keys())[:10]}, "
                                           f"unexpected {sorted(got.keys() - expected.keys())[:10]}")
    wrong = {k: (got[k], sn) for k, sn in expected.items() if got[k] != sn}
    assert not wrong, f"stored SN differs from the acknowledged SN (stored, acked): {list(wrong.items())[:5]}"


def assert_sssn_order(rows: list[StoredSession]) -> None:
    """Each producer's records are stored in SSSN order (SNs increase with SSSNs)."""
    last: dict[bytes, int] = {}
    for r in rows:
        assert r.sssn > last.get(r.producer_id, -1), \
            f"producer {r.producer_id!r}: SSSN {r.sssn} stored after SSSN {last[r.producer_id]}"
        last[r.producer_id] = r.sssn


def table_of(client, address: str, stream: str, ordinal: int = 0) -> dict | None:
    """The IngestionStatus entry of one partition on the node at `address` (None: not there)."""
    chain_id = metadata.chain_id(stream, ordinal)
    for p in client.ingestion_status(address)["partitions"]:
        if p["chain_id"] == chain_id:
            return p
    return None


@pytest.fixture(params=["records", "runs"])
def sessions(client, request):
    """RawSession(stream, producer_id) factory; every session is closed at teardown. Each
    test runs twice: without session partitions in the request (the owner decides record
    by record) and with them, as sms.Producer sends (a request in the usual form goes
    through the owner's runs: `wire.put_runs`, `DedupTable.submit_fresh`)."""
    made: list[RawSession] = []

    def make(stream: str, producer_id: bytes) -> RawSession:
        made.append(RawSession(client, stream, producer_id, session_ordinals=request.param == "runs"))
        return made[-1]

    yield make
    for s in made:
        s.close()


# --- retries ---------------------------------------------------------------------------------

def test_retry_after_lost_ack_gets_original_sn_flagged_duplicate_and_is_stored_once(client, unique_stream,
                                                                                    sessions):
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    s = sessions(unique_stream, A)
    batch = records(range(5))
    first = s.put(batch)               # the producer never sees this answer (lost ack) ...
    assert_acked(first, duplicate=False)
    retry = s.put(batch)               # ... so it sends the same SSSNs, data and submit time again
    assert_acked(retry, duplicate=True)
    assert [a.sn for a in retry.acks] == [a.sn for a in first.acks], "retry not acked with the original SNs"
    again = s.put(batch[2:3])          # a second retry of one of them, alone
    assert_acked(again, duplicate=True)
    assert again.acks[0].sn == first.acks[2].sn

    rows = stored(client, unique_stream)
    assert_stored_once(rows, {(A, r.sssn): a.sn for r, a in zip(batch, first.acks)})
    assert [r.data for r in rows] == [r.data for r in batch]


def test_duplicate_sent_concurrently_with_the_original_gets_the_same_sn_and_is_stored_once(
        cluster, client, unique_stream):
    """Several connections send the same request at the same moment: whichever is first
    writes, the others wait on its pending write (or find it committed); every answer
    carries the one SN, and exactly one answer per record is not flagged duplicate."""
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    senders, count = 4, 50
    batch = records(range(count))
    start = threading.Barrier(senders)
    connections = [Channels() for _ in range(senders)]     # separate channels: real concurrency

    def send(i: int) -> Answer:
        with RawSession(client, unique_stream, A, channels=connections[i]) as s:
            start.wait(timeout=30)
            return s.put(batch)

    try:
        with concurrent.futures.ThreadPoolExecutor(senders) as pool:
            answers = list(pool.map(send, range(senders)))
    finally:
        for c in connections:
            c.close()
    for answer in answers:
        assert_acked(answer)
    for i in range(count):
        sns = {answer.acks[i].sn for answer in answers}
        assert len(sns) == 1, f"SSSN {i} acked with different SNs {sns}"
        originals = [answer for answer in answers if not answer.acks[i].duplicate]
        assert len(originals) == 1, f"SSSN {i}: {len(originals)} answers not flagged duplicate; expected 1"
    rows = stored(client, unique_stream)
    assert_stored_once(rows, {(A, i): answers[0].acks[i].sn for i in range(count)})
    table = table_of(client, client.get_stream_info(unique_stream).partition(0).ingestion_owner.address,
                     unique_stream)["table"]
    assert (table["writes_total"], table["duplicates_total"]) == (count, (senders - 1) * count), table
    print(f"concurrent duplicates: {table['queued_total']} of {(senders - 1) * count} waited on a pending write")


def test_same_sssn_twice_in_one_request_waits_on_the_pending_write(client, unique_stream, sessions):
    """The deterministic form of a concurrent duplicate: the second copy arrives while the
    first is pending (same request), is queued on it and answered with its SN."""
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    s = sessions(unique_stream, A)
    r0, r1 = records(range(2))
    answer = s.put([r0, r1, r0, r0, r1])
    assert_acked(answer)
    assert [a.duplicate for a in answer.acks] == [False, False, True, True, True]
    assert answer.acks[0].sn == answer.acks[2].sn == answer.acks[3].sn
    assert answer.acks[1].sn == answer.acks[4].sn
    assert_stored_once(stored(client, unique_stream), {(A, 0): answer.acks[0].sn, (A, 1): answer.acks[1].sn})
    status = table_of(client, s.owner(0), unique_stream)
    assert status is not None and status["table"]["queued_total"] == 3 and status["table"]["queued"] == 0, status


# --- missing SSSNs and the HWM ---------------------------------------------------------------

def test_sssns_never_received_are_reported_missing_and_stored_when_resent(client, unique_stream, sessions):
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    s = sessions(unique_stream, A)
    r0, r1, r2, r3, r4 = records(range(5))
    first = s.put([r0])
    assert_acked(first, duplicate=False)
    assert first.missing == {}
    gap = s.put([r3], {0: 0})                          # SSSNs 1 and 2 were lost on the way
    assert_acked(gap, duplicate=False)
    assert gap.missing == {0: (1, 2)}, f"missing {gap.missing}; expected SSSNs 1, 2 of p0"
    resent = s.put([r1, r2], {0: 0})
    assert_acked(resent, duplicate=False)
    assert resent.missing == {}, f"missing {resent.missing} after SSSN 1 and 2 arrived"
    later = s.put([r4], {0: 0})
    assert_acked(later, duplicate=False)
    assert later.missing == {}

    rows = stored(client, unique_stream)
    acked = {(A, 0): first.acks[0].sn, (A, 3): gap.acks[0].sn, (A, 1): resent.acks[0].sn,
             (A, 2): resent.acks[1].sn, (A, 4): later.acks[0].sn}
    assert_stored_once(rows, acked)
    assert [r.sssn for r in rows] == [0, 3, 1, 2, 4], "storage order is the order the SSSNs arrived in"


def test_sssns_received_in_the_same_request_are_not_reported_missing(client, unique_stream, sessions):
    """proto: `missing` lists SSSNs "between the HWM and a submitted SSSN, never received"."""
    client.create_stream(unique_stream, partitions=1, replication_factor=1)
    s = sessions(unique_stream, A)
    r = records(range(4))
    assert_acked(s.put(r[:1]), duplicate=False)
    answer = s.put([r[3], r[1], r[2]], {0: 0})          # every SSSN up to 3 has now arrived
    assert_acked(answer, duplicate=False)
    assert answer.missing == {}, f"SSSNs received in this very request reported missing: {answer.missing}"


def test_sssns_at_or_below_the_hwm_are_pruned_and_never_stored_again(client, unique_stream, sessions):
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    s = sessions(unique_stream, A)
    batch = records(range(8))
    first = s.put(batch[:6])
    assert_acked(first, duplicate=False)
    status = table_of(client, s.owner(0), unique_stream)
    assert status["table"]["entries"] == 6, status
    acked = s.put(batch[6:7], {0: 5})                  # the producer holds the acks of 0..5
    assert_acked(acked, duplicate=False)
    status = table_of(client, s.owner(0), unique_stream)
    assert (status["table"]["sessions"], status["table"]["entries"]) == (1, 1), \
        f"entries at or below the HWM not pruned: {status}"

    for hwm in ({}, {0: 3}, {0: -1}):                  # an older HWM does not bring them back
        retry = s.put(batch[3:4], hwm)
        assert retry.acks[0].ok and retry.acks[0].duplicate, retry
        assert retry.acks[0].sn in (0, first.acks[3].sn), f"pruned SSSN 3 acked with SN {retry.acks[0].sn}"
    pruned_retry = s.put(batch[0:6], {0: -1})
    assert all(a.ok and a.duplicate for a in pruned_retry.acks), pruned_retry
    assert pruned_retry.missing == {}, "SSSNs below the session's HWM reported missing"
    after = s.put(batch[7:8], {0: 6})
    assert_acked(after, duplicate=False)

    expected = {(A, i): a.sn for i, a in enumerate(first.acks)}
    expected[(A, 6)], expected[(A, 7)] = acked.acks[0].sn, after.acks[0].sn
    assert_stored_once(stored(client, unique_stream), expected)


# --- dedup keys ------------------------------------------------------------------------------

def test_dedup_key_deduplicates_across_producer_sessions(client, unique_stream, sessions):
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    a, b = sessions(unique_stream, A), sessions(unique_stream, B)
    key = b"order-4711"
    first = a.put(records([0], tag=" from A", dedup_key=key))
    assert_acked(first, duplicate=False)
    twin = b.put(records([0], tag=" from B, other data", dedup_key=key))
    assert_acked(twin, duplicate=True)
    assert twin.acks[0].sn == first.acks[0].sn, "a record with a dedup key already written not acked with its SN"
    twin_retry = b.put(records([0], tag=" from B, other data", dedup_key=key, submit_ms=now_ms()))
    assert twin_retry.acks[0].duplicate and twin_retry.acks[0].sn == first.acks[0].sn, twin_retry
    b_next = b.put(records([1], tag=" from B"))          # B's session goes on
    assert_acked(b_next, duplicate=False)
    assert b_next.missing == {}
    # two records of one request with one new key: the second waits on the first's write
    twins = a.put(records([1], tag=" twin 1", dedup_key=b"order-4712") +
                  records([2], tag=" twin 2", dedup_key=b"order-4712"))
    assert_acked(twins)
    assert [x.duplicate for x in twins.acks] == [False, True] and twins.acks[0].sn == twins.acks[1].sn, twins

    rows = stored(client, unique_stream)
    assert_stored_once(rows, {(A, 0): first.acks[0].sn, (B, 1): b_next.acks[0].sn, (A, 1): twins.acks[0].sn})
    assert rows[0].dedup_key == key and rows[0].data == b"record 0 from A"
    assert rows[2].dedup_key == b"order-4712" and rows[2].data == b"record 1 twin 1"


# --- bad input -------------------------------------------------------------------------------

def _conflict(s: RawSession):
    return s.put(records([0], tag=" with other data"))


def _conflicting_dedup_key(s: RawSession):
    return s.put(records([0], dedup_key=b"a key it did not have"))


def _invalid_hwm(s: RawSession):
    return s.put(records([1]), {0: 5})


def _in_future(s: RawSession):
    return s.put(records([1], submit_ms=now_ms() + limits.DEDUP_CLOCK_SKEW_MS_MAX + 60_000))


def _stale(s: RawSession):
    return s.put(records([1], submit_ms=now_ms() - 61_000))


def _key_too_large(s: RawSession):
    return s.put(records([1], dedup_key=b"k" * (limits.DEDUP_KEY_BYTES_MAX + 1)))


def _empty_key(s: RawSession):
    return s.put(records([1], dedup_key=b""))


def _no_sssn_meta(s: RawSession):
    good, bad = records([1, 2])
    entries = [encode(good), encode(bad, fields={wire.TAG_SUBMIT_MS: bad.submit_ms.to_bytes(8, "big")})]
    return send_entries(s.channels, s.owner(0), s.stream, s.producer_id, entries)


def _sssn_of_4_bytes(s: RawSession):
    r = records([1])[0]
    fields = {wire.TAG_SSSN: (1).to_bytes(4, "big"), wire.TAG_SUBMIT_MS: r.submit_ms.to_bytes(8, "big")}
    return send_entries(s.channels, s.owner(0), s.stream, s.producer_id, [encode(r, fields=fields)])


def _dedup_key_without_session(s: RawSession):
    return send_entries(s.channels, s.owner(0), s.stream, b"",
                        [encode(records([1], dedup_key=b"key")[0])])


def _producer_id_too_long(s: RawSession):
    return send_entries(s.channels, s.owner(0), s.stream, b"p" * (limits.PRODUCER_ID_BYTES_MAX + 1),
                        [encode(records([1])[0])])


BAD_INPUT = {   # case -> (send, error class, whole request?)
    "same_sssn_other_data": (_conflict, errors.SessionConflict, False),
    "same_sssn_other_dedup_key": (_conflicting_dedup_key, errors.SessionConflict, False),
    "hwm_above_sssn": (_invalid_hwm, errors.InvalidHwm, False),
    "submitted_in_the_future": (_in_future, errors.SubmissionInFuture, False),
    "submitted_before_the_window": (_stale, errors.StaleSubmission, False),
    "dedup_key_of_129_bytes": (_key_too_large, errors.DedupKeyTooLarge, False),
    "empty_dedup_key": (_empty_key, errors.InvalidDedupKey, False),
    "record_without_sssn": (_no_sssn_meta, errors.InvalidArgument, True),
    "sssn_of_4_bytes": (_sssn_of_4_bytes, errors.InvalidArgument, True),
    "dedup_key_without_producer_id": (_dedup_key_without_session, errors.InvalidArgument, True),
    "producer_id_of_65_bytes": (_producer_id_too_long, errors.InvalidArgument, True),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_session_input_is_a_named_error_stores_nothing_and_the_session_goes_on(
        client, unique_stream, sessions, case):
    send, error_class, whole_request = BAD_INPUT[case]
    name = error_class.__name__
    assert issubclass(error_class, errors.InvalidArgument)
    client.create_stream(unique_stream, partitions=1, replication_factor=3, dedup_window_s=60)
    assert client.get_stream_info(unique_stream).dedup_window_s == 60
    s = sessions(unique_stream, A)
    r0 = records([0], tag="")[0]
    first = s.put([r0])
    assert_acked(first, duplicate=False)
    before = stored(client, unique_stream)
    status_before = table_of(client, s.owner(0), unique_stream)["table"]

    if whole_request:
        with pytest.raises(errors.SmsError) as raised:
            send(s)
        assert type(raised.value).__name__ == name, f"{type(raised.value).__name__}: {raised.value}"
    else:
        answer = send(s)
        assert [(a.error_name, a.sn, a.duplicate) for a in answer.acks] == [(name, 0, False)], answer
    assert stored(client, unique_stream) == before, "bad input changed what is stored"
    status_after = table_of(client, s.owner(0), unique_stream)["table"]
    sizes = ("sessions", "entries", "pending", "waiting", "queued", "dedup_keys")
    assert {k: status_after[k] for k in sizes} == {k: status_before[k] for k in sizes}, "bad input changed the table"

    retry = s.put([r0])                                # the session is as it was ...
    assert_acked(retry, duplicate=True)
    assert retry.acks[0].sn == first.acks[0].sn
    nxt = s.put(records([1], tag=" good"))             # ... and goes on with SSSN 1
    assert_acked(nxt, duplicate=False)
    assert nxt.missing == {}
    assert_stored_once(stored(client, unique_stream), {(A, 0): first.acks[0].sn, (A, 1): nxt.acks[0].sn})


# --- policies --------------------------------------------------------------------------------

def test_dup_permitted_policy_stores_the_same_producer_sssn_twice(client, unique_stream, sessions):
    """at_least_once_dup_permitted keeps no table: a resent (producer, SSSN) is stored again,
    by design, under a new SN."""
    client.create_stream(unique_stream, partitions=1, replication_factor=3,
                         ingestion_policy="at_least_once_dup_permitted")
    s = sessions(unique_stream, A)
    batch = records(range(3))
    first, second = s.put(batch), s.put(batch)
    assert_acked(first, duplicate=False)
    assert_acked(second, duplicate=False)
    assert not {a.sn for a in first.acks} & {a.sn for a in second.acks}, "a stored-again record reused an SN"
    rows = stored(client, unique_stream)
    assert [(r.producer_id, r.sssn) for r in rows] == [(A, 0), (A, 1), (A, 2)] * 2
    assert [r.sn for r in rows] == [a.sn for a in first.acks + second.acks]
    status = table_of(client, s.owner(0), unique_stream)
    assert status["policy"] == "at_least_once_dup_permitted" and status["table"]["sessions"] == 0, status


def test_best_effort_policy_answers_and_records_become_readable(client, unique_stream, sessions):
    client.create_stream(unique_stream, partitions=1, replication_factor=3, ingestion_policy="best_effort")
    s = sessions(unique_stream, A)
    batch = records(range(20))
    answer = s.put(batch)
    assert all(a.ok and not a.duplicate for a in answer.acks), answer     # SN 0 allowed: not yet known
    rows = wait_until(lambda: (got := stored(client, unique_stream)) and len(got) >= len(batch) and got,
                      READ_TIMEOUT_S, "the best-effort records to become readable")
    assert sorted((r.producer_id, r.sssn, r.data) for r in rows) == sorted((A, r.sssn, r.data) for r in batch)
    acked_sns = {a.sn for a in answer.acks if a.sn}
    assert acked_sns <= {r.sn for r in rows}, "a best-effort answer named an SN that is not stored"


# --- bounds ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_table_stays_bounded_with_100_producers_acking_their_hwm(cluster, client, unique_stream):
    producers, batches, per_request, partitions = 100, 30, 10, 2
    client.create_stream(unique_stream, partitions=partitions, replication_factor=3)
    info = client.get_stream_info(unique_stream)
    owners = {o: info.partition(o).ingestion_owner.address for o in range(partitions)}
    channels = Channels()
    stop = threading.Event()
    seen: list[dict] = []       # table stats of every poll, tagged with the ordinal

    def poll_once() -> None:
        for ordinal, address in owners.items():
            status = table_of(client, address, unique_stream, ordinal)
            if status is not None:
                seen.append({"ordinal": ordinal, **status["table"]})

    def monitor() -> None:
        while not stop.is_set():
            poll_once()
            stop.wait(0.05)     # a polling period, not a wait for an outcome

    def produce(p: int) -> dict[tuple[bytes, int, int], int]:
        producer_id = f"producer-{p:03d}".encode()
        keys = {o: key_for_ordinal(info, o, f"p{p}") for o in range(partitions)}
        next_sssn = dict.fromkeys(range(partitions), 0)
        acked: dict[tuple[bytes, int, int], int] = {}
        hwm = dict.fromkeys(range(partitions), -1)
        with RawSession(client, unique_stream, producer_id, channels=channels) as s:
            for b in range(batches):
                batch = []
                for j in range(per_request):
                    o = j % partitions
                    batch.append(Submit(next_sssn[o], keys[o], f"{p}/{o}/{next_sssn[o]}".encode(), now_ms()))
                    next_sssn[o] += 1
                answer = s.put_until_settled(batch, hwm).answer
                assert_acked(answer, duplicate=False)
                for r, a in zip(batch, answer.acks):
                    acked[(producer_id, a.ordinal, r.sssn)] = a.sn
                for o in range(partitions):
                    hwm[o] = cumulative_hwm((k[2] for k in acked if k[1] == o), hwm[o])
        return acked

    watcher = threading.Thread(target=monitor, name="table-monitor")
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(produce, range(producers)))
    finally:
        stop.set()
        watcher.join()
        channels.close()
    poll_once()
    during, final = seen[:-partitions], seen[-partitions:]
    assert len(during) >= 10, f"only {len(during)} polls while the producers wrote"

    sessions_max, entries_bound = producers, producers * per_request * 2
    for st in seen:
        assert st["sessions"] <= sessions_max, f"p{st['ordinal']}: {st['sessions']} sessions > {sessions_max}"
        assert st["entries"] <= st["sessions"] * limits.DEDUP_ENTRIES_PER_SESSION_MAX, st
        assert st["entries"] <= entries_bound, f"p{st['ordinal']}: {st['entries']} entries with HWMs acked: {st}"
        assert st["queued"] <= st["pending"] * limits.DEDUP_WAITERS_PER_ENTRY_MAX, st
    assert max(st["sessions"] for st in during) > 1, "the polls never saw the producers' sessions"
    per_partition = producers * batches * per_request // partitions
    for st in final:
        # only each session's last request is above its HWM
        assert st["sessions"] == producers, st
        assert st["entries"] <= producers * per_request // partitions, st
        assert (st["pending"], st["waiting"], st["queued"]) == (0, 0, 0), st
        assert (st["writes_total"], st["duplicates_total"]) == (per_partition, 0), st

    acked = {k: sn for r in results for k, sn in r.items()}
    for o in range(partitions):
        rows = stored(client, unique_stream, o)
        assert_stored_once(rows, {(pid, sssn): sn for (pid, ordinal, sssn), sn in acked.items() if ordinal == o})
        assert_sssn_order(rows)

    # `sms status --json` shows the same tables
    out = subprocess.run([sys.executable, "-m", "node", "status", "--json", "--address", cluster.address],
                         capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                         env={k: v for k, v in os.environ.items() if k != "SMS_ADDRESS"})
    assert out.returncode == 0, out.stderr[-2000:]
    shown = {p["chain_id"]: p for n in json.loads(out.stdout)["nodes"] for p in n.get("ingestion", [])}
    for o in range(partitions):
        p = shown.get(metadata.chain_id(unique_stream, o))
        assert p is not None, f"`sms status` lists no ingestion table for p{o}: {sorted(shown)[:10]}"
        assert p["ready"] and p["table"]["sessions"] == producers, p


def test_session_at_its_entry_bound_is_throttled_until_it_advances_its_hwm(client, unique_stream, sessions):
    """A session holds at most DEDUP_ENTRIES_PER_SESSION_MAX un-acked entries: one more is
    TableFull (retriable, nothing stored, nothing else refused) until the HWM prunes them."""
    client.create_stream(unique_stream, partitions=1, replication_factor=1)
    a, b = sessions(unique_stream, A), sessions(unique_stream, B)
    bound, per_request = limits.DEDUP_ENTRIES_PER_SESSION_MAX, limits.PUT_RECORDS_COUNT_MAX
    batch = records(range(bound + 1))
    acked = {}
    for start in range(0, bound, per_request):
        answer = a.put(batch[start:start + per_request])
        assert_acked(answer, duplicate=False)
        acked.update({(A, r.sssn): x.sn for r, x in zip(batch[start:start + per_request], answer.acks)})
    assert table_of(client, a.owner(0), unique_stream)["table"]["entries"] == bound

    full = a.put(batch[bound:])
    assert [(x.error_name, x.sn) for x in full.acks] == [(errors.TableFull.__name__, 0)], full
    assert issubclass(errors.TableFull, errors.Throttled) and errors.TableFull.retriable
    other = b.put(records([0], tag=" from B"))             # another session is not refused
    assert_acked(other, duplicate=False)
    acked[(B, 0)] = other.acks[0].sn
    assert_stored_once(stored(client, unique_stream), acked)

    after = a.put(batch[bound:], {0: bound - 1})           # acks held: the table prunes, then takes it
    assert_acked(after, duplicate=False)
    acked[(A, bound)] = after.acks[0].sn
    assert table_of(client, a.owner(0), unique_stream)["table"]["entries"] == 2      # A's SSSN 1000, B's 0
    assert_stored_once(stored(client, unique_stream), acked)


_REBUILD_ERRORS_IN_A_CLIENT = """
import json, sys
import sms.aio, sms.client
from sms import errors
assert not [m for m in sys.modules if m.split(".")[0] == "ingestion"], "a client process imported ingestion"
out = {}
for name in sys.argv[1:]:
    e = errors.from_name(name, "message")
    out[name] = [type(e).__name__, e.retriable]
print(json.dumps(out))
"""


def test_a_client_process_rebuilds_each_dedup_error_by_name():
    """The names the ingestion node answers with (the wire tests above see them) mean the
    same class, and the same retriable flag, in a process that only imports the client.
    (Regression: while these classes lived in ingestion/dedup.py, a client rebuilt every
    one of them as a non-retriable InternalError, so TableFull was never retried.)"""
    named = [errors.StaleSubmission, errors.SubmissionInFuture, errors.InvalidDedupKey, errors.DedupKeyTooLarge,
             errors.InvalidSession, errors.InvalidProducerId, errors.InvalidSssn, errors.InvalidHwm,
             errors.SessionConflict, errors.TableFull]
    out = subprocess.run([sys.executable, "-c", _REBUILD_ERRORS_IN_A_CLIENT, *(c.__name__ for c in named)],
                         capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-2000:]
    rebuilt = json.loads(out.stdout)
    assert rebuilt == {c.__name__: [c.__name__, c.retriable] for c in named}


# --- restarts --------------------------------------------------------------------------------

def _write_sessions(s_by_producer: dict[bytes, RawSession], sssns: int, per_request: int,
                    submit_ms: int) -> tuple[dict[bytes, list[Submit]], dict[tuple[bytes, int], int]]:
    sent: dict[bytes, list[Submit]] = {}
    acked: dict[tuple[bytes, int], int] = {}
    for pid, s in s_by_producer.items():
        sent[pid] = [Submit(i, f"key-{pid.decode()}", f"{pid.decode()} record {i}".encode(), submit_ms)
                     for i in range(sssns)]
        for start in range(0, sssns, per_request):
            batch = sent[pid][start:start + per_request]
            answer = s.put(batch)
            assert_acked(answer, duplicate=False)
            acked.update({(pid, r.sssn): a.sn for r, a in zip(batch, answer.acks)})
    return sent, acked


@pytest.mark.slow
def test_ingestion_node_restart_keeps_dedup(make_cluster):
    """The head (and ingestion owner) restarts: its table is rebuilt from storage before it
    answers, so every resent record is a duplicate with its original SN, and a dedup key
    written before the restart still de-duplicates another session's record after it."""
    local = make_cluster()
    stream = stream_name("dedup-restart")
    producers = [f"producer-{i}".encode() for i in range(3)]
    sssns, per_request = 100, 10
    with sms.Client(local.address) as c:
        c.create_stream(stream, partitions=1, replication_factor=3)
        s_by_producer = {pid: RawSession(c, stream, pid) for pid in [*producers, A, B]}
        try:
            sent, acked = _write_sessions({pid: s_by_producer[pid] for pid in producers}, sssns, per_request,
                                          now_ms())
            keyed = s_by_producer[A].put(records([0], dedup_key=b"order-1", tag=" keyed"))
            assert_acked(keyed, duplicate=False)
            acked[(A, 0)] = keyed.acks[0].sn
            head = c.get_stream_info(stream).partition(0).ingestion_owner
            local.restart(head.node_id)

            # the first resend reaches the restarted node (new address), which answers once
            # its table is rebuilt; the table then holds every stored record
            first_pid = producers[0]
            first = s_by_producer[first_pid].put_until_settled(sent[first_pid][:per_request],
                                                               timeout_s=RESTART_READY_TIMEOUT_S).answer
            address = s_by_producer[first_pid].owner(0)
            status = wait_until(lambda: (st := table_of(c, address, stream)) and st["ready"] and st,
                                RESTART_READY_TIMEOUT_S, "the restarted head's table to be ready")
            assert (status["table"]["sessions"], status["table"]["entries"], status["table"]["dedup_keys"]) == \
                (4, 3 * sssns + 1, 1), f"rebuilt table does not hold the stored records: {status}"

            s_by_producer[B].refresh()
            twin = s_by_producer[B].put(records([0], dedup_key=b"order-1", tag=" twin from B"))
            assert_acked(twin, duplicate=True)
            assert twin.acks[0].sn == keyed.acks[0].sn, "dedup key forgotten across the restart"

            answers = {(first_pid, 0): first}
            for pid in producers:
                s = s_by_producer[pid]
                s.refresh()
                for start in range(0, sssns, per_request):
                    if (pid, start) not in answers:
                        answers[(pid, start)] = s.put(sent[pid][start:start + per_request])
            for (pid, start), answer in answers.items():
                assert_acked(answer, duplicate=True)
                got = [a.sn for a in answer.acks]
                want = [acked[(pid, r.sssn)] for r in sent[pid][start:start + per_request]]
                assert got == want, f"{pid!r} SSSNs {start}..: resends acked with other SNs"

            rows = stored(c, stream)
            assert_stored_once(rows, acked)
            assert_sssn_order(rows)
            after = table_of(c, address, stream)["table"]
            assert after["writes_total"] == 0 and after["duplicates_total"] >= 3 * sssns + 1, after
        finally:
            for s in s_by_producer.values():
                s.close()


@pytest.mark.slow
def test_kill_9_of_the_head_while_producers_retry_stores_every_sssn_once_in_order(make_cluster):
    """Producers write sessions in a loop, each request retried (same SSSNs, submit times,
    HWM) until no record is answered with a retriable error; the head, which is also the
    ingestion owner, is killed with SIGKILL mid-stream and restarted. Every SSSN is stored
    exactly once, in SSSN order per session, under the SN of its final answer; every
    answer that named an SN named that one."""
    local = make_cluster()
    stream = stream_name("dedup-kill")
    producers = [f"producer-{i}".encode() for i in range(3)]
    per_request, requests = 10, 60
    with sms.Client(local.address) as c:
        c.create_stream(stream, partitions=1, replication_factor=3)
        head = c.get_stream_info(stream).partition(0).ingestion_owner
        progress = collections.Counter()          # requests acked, per producer
        retried = collections.Counter()           # requests sent more than once
        recovered = collections.Counter()         # records whose final answer was a duplicate
        lock = threading.Lock()

        def produce(pid: bytes) -> tuple[dict[int, int], dict[int, set[int]]]:
            final: dict[int, int] = {}
            named: dict[int, set[int]] = collections.defaultdict(set)
            hwm = -1
            with RawSession(c, stream, pid) as s:
                for n in range(requests):
                    batch = [Submit(n * per_request + j, f"key-{pid.decode()}",
                                    f"{pid.decode()} {n * per_request + j}".encode(), now_ms())
                             for j in range(per_request)]
                    settled = s.put_until_settled(batch, {0: hwm}, timeout_s=RESTART_READY_TIMEOUT_S)
                    answer = settled.answer
                    assert_acked(answer)
                    for a in settled.answers:
                        for r, ack in zip(batch, a.acks):
                            if ack.sn:
                                named[r.sssn].add(ack.sn)
                    final.update({r.sssn: ack.sn for r, ack in zip(batch, answer.acks)})
                    hwm = cumulative_hwm(final, hwm)
                    with lock:
                        progress[pid] += 1
                        retried[pid] += settled.attempts > 1
                        recovered[pid] += sum(a.duplicate for a in answer.acks)
            return final, named

        with concurrent.futures.ThreadPoolExecutor(len(producers)) as pool:
            futures = {pid: pool.submit(produce, pid) for pid in producers}
            wait_until(lambda: min(progress[p] for p in producers) >= 5 or any(f.done() for f in futures.values()),
                       60, "every producer to have 5 requests acked")
            with lock:
                killed_at = dict(progress)
            local.kill(head.node_id)
            assert all(n < requests for n in killed_at.values()), f"producers done before the kill: {killed_at}"
            local.restart(head.node_id)
            results = {pid: f.result(timeout=300) for pid, f in futures.items()}
        assert all(progress[p] == requests for p in producers), progress

        rows = stored(c, stream)
        expected = {(pid, sssn): sn for pid, (final, _named) in results.items() for sssn, sn in final.items()}
        assert len(expected) == len(producers) * requests * per_request
        assert_stored_once(rows, expected)
        assert_sssn_order(rows)
        for pid, (final, named) in results.items():
            conflicting = {sssn: sns for sssn, sns in named.items() if sns != {final[sssn]}}
            assert not conflicting, f"{pid!r}: answers named other SNs: {list(conflicting.items())[:5]}"
        assert sum(retried.values()) >= 1, "no request was retried: the kill did not hit the producers"
        print(f"killed at {killed_at}; requests retried {dict(retried)}; records acked as duplicates "
              f"after a retry {dict(recovered)}")
