"""Retention and trimming through real processes (issue 5).

Every storage node applies the trim point of each replica it holds once a second
(`StorageNode.apply_retention`): committed records below it are deleted, whole batches
at a time (the newest batch stays), and no read goes below it. These tests check it on
every replica of a chain, through each node's own NodeStatus (`first_sn`,
`trimmed_before`, `records`) and through reads served by each replica: retention by
age, `trim_stream` by time and by SN, unread-record protection for registered
consumers, and the drop of a closed partition that retention emptied (its map entry
and chain go; its children become the roots), and a de-duplicating stream, which hides
trimmed records at once but deletes them only after its dedup window. Nothing sleeps and hopes: conditions
are polled with `wait_until`; the only fixed windows observe that something does NOT
happen for a few retention intervals.
"""

from __future__ import annotations

import time

import grpc
import pytest

from sms import convert, errors, limits, seqno
from sms.hashing import HASH_SPACE
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.types import PartitionState, Record
from tests.conftest import client_channel, wait_until

pytestmark = pytest.mark.integration

LOW_HASH = 0                    # in the lower half of the hash space: p0 of a 2-partition stream
HIGH_HASH = HASH_SPACE - 1      # in the upper half: p1
RETENTION_PASS_S = limits.RETENTION_CHECK_INTERVAL_S
# A de-duplicating stream keeps its dedup window stored (hidden from readers once trimmed):
# these tests watch deletion happen, so their streams do not de-duplicate; the last test
# checks the de-duplicating case.
NO_DEDUP = "at_least_once_dup_permitted"


# --- helpers ---------------------------------------------------------------------------------

def now_ms() -> int:
    return int(time.time() * 1000)


def put(client, stream: str, tag: str, count: int, hash_key: int | None = None) -> list[int]:
    """One put_records call of `count` records; their SNs (one batch per partition)."""
    records = [{"partition_key": f"{tag}-{i}", "data": f"{tag}|{i}".encode()} for i in range(count)]
    if hash_key is not None:
        for r in records:
            r["explicit_hash_key"] = hash_key
    result = client.put_records(stream, records)
    assert result.failed_record_count == 0, [r for r in result.records if not r.ok][:3]
    return [r.sn for r in result.records]


def replica_status(address: str, chain_id: str):
    """This node's ReplicaStatus of the chain (first_sn, trimmed_before...), or None."""
    with client_channel(address) as channel:
        resp = sms_pb2_grpc.ControlStub(channel).NodeStatus(sms_pb2.NodeStatusRequest(), timeout=5)
    for r in resp.replicas:
        if r.chain_id == chain_id:
            return r
    return None


def replica_reads(address: str, stream: str, ordinal: int) -> list[Record]:
    """Everything one node's retrieval role serves of a partition from TRIM_HORIZON."""
    with client_channel(address) as channel:
        stub = sms_pb2_grpc.RetrievalStub(channel)
        iterator = stub.GetIterator(sms_pb2.GetIteratorRequest(
            stream=stream, partition_id=f"p{ordinal:04d}", iterator_type="TRIM_HORIZON"), timeout=5).iterator
        records: list[Record] = []
        for _ in range(100):
            resp = stub.GetNextRecords(sms_pb2.GetNextRecordsRequest(iterator=iterator, max_records=10_000),
                                       timeout=5)
            page = [r for s in resp.slices for r in convert.records_from_slice(s.batch, s.start, s.end, ordinal)]
            records.extend(page)
            if not resp.next_iterator or not page:
                return records
            iterator = resp.next_iterator
        raise AssertionError("not caught up after 100 reads")


def members(client, stream: str, ordinal: int) -> list[tuple[str, str]]:
    """(node id, address) of every member of the partition's chain."""
    chain = client.get_stream_info(stream).partition(ordinal).chain
    assert len(chain) == 3 and all(m.address for m in chain), chain
    return [(m.node_id, m.address) for m in chain]


def all_replicas(client, stream: str, ordinal: int, check) -> bool:
    """`check(status)` holds for the partition's replica on every member of its chain."""
    chain_id = f"{stream}:{ordinal}"
    for _node, address in members(client, stream, ordinal):
        status = replica_status(address, chain_id)
        if status is None or not check(status):
            return False
    return True


def describe_replicas(client, stream: str, ordinal: int) -> str:
    out = []
    for node, address in members(client, stream, ordinal):
        s = replica_status(address, f"{stream}:{ordinal}")
        out.append(f"{node}: " + ("-" if s is None else
                                  f"first {s.first_sn} trimmed_before {s.trimmed_before} records {s.records} "
                                  f"batches {s.batches} last {s.last_sn}"))
    return "; ".join(out)


def sns_on_every_replica(client, stream: str, ordinal: int) -> dict[str, list[int]]:
    return {node: [r.sn for r in replica_reads(address, stream, ordinal)]
            for node, address in members(client, stream, ordinal)}


def assert_every_replica_serves(client, stream: str, ordinal: int, want: list[int]) -> None:
    for node, sns in sns_on_every_replica(client, stream, ordinal).items():
        assert sns == want, f"{stream} p{ordinal} on {node}: served {len(sns)} records, expected {len(want)}"


def wait_for_later_ms(sn: int) -> None:
    """Until the clock is past the millisecond of `sn`, so the next batch has a later time."""
    wait_until(lambda: now_ms() > seqno.timestamp_ms_of(sn), 5, "the clock to pass a record's millisecond")


# --- retention by age -----------------------------------------------------------------------

def test_retention_deletes_old_records_on_every_replica(client, unique_stream):
    retention_s = 10
    client.create_stream(unique_stream, partitions=1, replication_factor=3, ingestion_policy=NO_DEDUP)
    old = [sn for i in range(3) for sn in put(client, unique_stream, f"old{i}", 20)]
    fresh: list[int] = []
    last_write = [0.0]

    def write_now_and_then() -> None:
        """A few fresh records every 0.4 s: the old ones are never the newest batch."""
        if time.monotonic() - last_write[0] >= 0.4:
            fresh.extend(put(client, unique_stream, f"fresh{len(fresh)}", 3))
            last_write[0] = time.monotonic()

    # let them age a little while newer records arrive, then shorten the retention
    aged = time.monotonic() + 2
    wait_until(lambda: write_now_and_then() or time.monotonic() > aged, 10, "the old records to age")
    info = client.update_retention(unique_stream, seconds=retention_s)
    assert (info.retention_s, client.get_stream_info(unique_stream).retention_s) == (retention_s, retention_s)
    assert all_replicas(client, unique_stream, 0, lambda s: int(s.first_sn) == old[0]), \
        "records were deleted before they were old enough"

    def old_gone_everywhere() -> bool:
        write_now_and_then()
        return all_replicas(client, unique_stream, 0, lambda s: int(s.first_sn) > old[-1]
                            and int(s.trimmed_before) > old[-1] and s.records <= len(fresh))

    wait_until(old_gone_everywhere, retention_s + 15, "every replica to delete the records older than the "
               "retention: " + describe_replicas(client, unique_stream, 0))

    read_from_ms = now_ms()
    served = sns_on_every_replica(client, unique_stream, 0)
    read_to_ms = now_ms()
    young_ms = read_to_ms - (retention_s - 2) * 1000     # surely younger than the retention at every pass
    must_keep = [sn for sn in fresh if seqno.timestamp_ms_of(sn) >= young_ms]
    assert must_keep, "no record written in the last seconds"
    for node, sns in served.items():
        assert not set(sns) & set(old), f"{node} serves records older than the retention"
        assert sns == sorted(sns) and set(sns) <= set(fresh), node
        oldest_ms = min(seqno.timestamp_ms_of(sn) for sn in sns)
        # retention runs once a second: a served record is at most a few passes older than it
        assert oldest_ms >= read_from_ms - retention_s * 1000 - 5 * RETENTION_PASS_S * 1000, \
            f"{node} serves a record {read_from_ms - oldest_ms} ms old; retention is {retention_s} s"
        assert set(must_keep) <= set(sns), f"{node} deleted records younger than the retention"
    # the client's read of the whole stream from the trim horizon agrees
    streamed = [r.sn for r in client.read_stream(unique_stream)]
    assert not set(streamed) & set(old)
    assert set(must_keep) <= set(streamed)


# --- trim_stream ------------------------------------------------------------------------------

@pytest.mark.parametrize("persistence", ["disk", "disk_async", "memory"])
def test_trim_before_time_deletes_on_every_replica(client, unique_stream, persistence):
    client.create_stream(unique_stream, partitions=2, replication_factor=3, ingestion_policy=NO_DEDUP, persistence=persistence)
    before = {0: put(client, unique_stream, "a0", 10, LOW_HASH), 1: put(client, unique_stream, "a1", 10, HIGH_HASH)}
    wait_for_later_ms(max(before[0] + before[1]))
    cut_ms = max(seqno.timestamp_ms_of(sn) for sns in before.values() for sn in sns) + 1
    after = {0: put(client, unique_stream, "b0", 7, LOW_HASH), 1: put(client, unique_stream, "b1", 5, HIGH_HASH)}
    assert all(seqno.timestamp_ms_of(sn) >= cut_ms for sns in after.values() for sn in sns)

    client.trim_stream(unique_stream, before_time_ms=cut_ms)
    point = seqno.lower_bound_for_time(cut_ms)
    for ordinal in (0, 1):
        wait_until(lambda: all_replicas(client, unique_stream, ordinal, lambda s: int(s.trimmed_before) == point
                                        and int(s.first_sn) == after[ordinal][0]
                                        and s.records == len(after[ordinal]) and s.batches == 1),
                   10, f"p{ordinal}: every replica to delete the records before the cut: "
                   + describe_replicas(client, unique_stream, ordinal))
        assert_every_replica_serves(client, unique_stream, ordinal, after[ordinal])
        assert client.get_record(unique_stream, after[ordinal][0]).sn == after[ordinal][0]
        with pytest.raises(errors.RecordNotFound):
            client.get_record(unique_stream, before[ordinal][-1])
    assert sorted(r.sn for r in client.read_stream(unique_stream)) == sorted(after[0] + after[1])
    # reading from a time before the cut starts after it
    it = client.get_iterator(unique_stream, 0, "AT_TIMESTAMP", timestamp_ms=seqno.timestamp_ms_of(before[0][0]))
    assert [r.sn for r in client.get_next_records(it).records] == after[0]


def test_trim_before_sn_deletes_its_partition_on_every_replica(client, unique_stream):
    client.create_stream(unique_stream, partitions=2, replication_factor=3, ingestion_policy=NO_DEDUP)
    a = put(client, unique_stream, "a", 4, LOW_HASH)
    b = put(client, unique_stream, "b", 6, LOW_HASH)
    c = put(client, unique_stream, "c", 3, LOW_HASH)
    other = put(client, unique_stream, "other", 5, HIGH_HASH)
    assert {seqno.ordinal_of(sn) for sn in a + b + c} == {0} and {seqno.ordinal_of(sn) for sn in other} == {1}
    cut = b[2]                                    # inside batch b: its first two records go from reads

    client.trim_stream(unique_stream, before_sn=cut)
    wait_until(lambda: all_replicas(client, unique_stream, 0, lambda s: int(s.trimmed_before) == cut
                                    and int(s.first_sn) == b[0] and s.records == len(b + c)),
               10, "every replica of p0 to delete batch a and hide b's records below the cut: "
               + describe_replicas(client, unique_stream, 0))
    # batch b stays stored (some of its records are above the cut), but reads start at the cut
    assert_every_replica_serves(client, unique_stream, 0, b[2:] + c)
    # a reader at or after a trimmed record is told, never skipped past it in silence
    # (issue 16 item 7): it asks to go on from the oldest left, or reads from TRIM_HORIZON
    it = client.get_iterator(unique_stream, 0, "AT_SEQUENCE_NUMBER", sequence_number=b[0])
    with pytest.raises(errors.RecordsTrimmed, match="2 records") as e:
        client.get_next_records(it)
    assert e.value.name == "RecordsTrimmed"
    assert [r.sn for r in client.get_next_records(it, skip_trimmed=True).records] == b[2:] + c
    with pytest.raises(errors.RecordsTrimmed):
        list(client.read_stream(unique_stream, sequence_number=a[-1]))
    # ... but one whose next record is the oldest left lost nothing
    it = client.get_iterator(unique_stream, 0, "AFTER_SEQUENCE_NUMBER", sequence_number=b[1])
    assert [r.sn for r in client.get_next_records(it).records] == b[2:] + c
    it = client.get_iterator(unique_stream, 0, "TRIM_HORIZON")
    assert [r.sn for r in client.get_next_records(it).records] == b[2:] + c
    # the other partition keeps everything
    assert all_replicas(client, unique_stream, 1, lambda s: int(s.first_sn) == other[0] and s.records == len(other))
    assert_every_replica_serves(client, unique_stream, 1, other)
    assert sorted(r.sn for r in client.read_stream(unique_stream)) == sorted(b[2:] + c + other)

    # a later, lower cut of the same partition changes nothing
    client.trim_stream(unique_stream, before_sn=a[1])
    assert all_replicas(client, unique_stream, 0, lambda s: int(s.trimmed_before) == cut)
    assert_every_replica_serves(client, unique_stream, 0, b[2:] + c)


def test_a_reader_whose_every_next_record_went_is_told(client, unique_stream):
    """Everything after the reader's position trimmed, nothing left to read: the empty page
    says so (RecordsTrimmed) instead of moving the reader past the loss in silence."""
    client.create_stream(unique_stream, partitions=1, replication_factor=3, ingestion_policy=NO_DEDUP)
    sns = put(client, unique_stream, "r", 5)
    it = client.get_iterator(unique_stream, 0, "AFTER_SEQUENCE_NUMBER", sequence_number=sns[0])
    after_all = seqno.make(seqno.timestamp_ms_of(sns[-1]), seqno.counter_of(sns[-1]) + 1, 0)
    client.trim_stream(unique_stream, before_sn=after_all)
    wait_until(lambda: all_replicas(client, unique_stream, 0, lambda s: int(s.trimmed_before) > sns[-1]),
               10, "every replica to apply the cut (capped at the commit watermark)")
    with pytest.raises(errors.RecordsTrimmed, match="4 records"):
        client.get_next_records(it)
    assert client.get_next_records(it, skip_trimmed=True).records == []
    # a reader that had read everything lost nothing
    done = client.get_iterator(unique_stream, 0, "AFTER_SEQUENCE_NUMBER", sequence_number=sns[-1])
    assert client.get_next_records(done).records == []


def test_get_record_does_not_return_a_record_below_the_trim_point(client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=3, ingestion_policy=NO_DEDUP)
    b = put(client, unique_stream, "b", 6)
    c = put(client, unique_stream, "c", 2)
    client.trim_stream(unique_stream, before_sn=b[3])
    wait_until(lambda: all_replicas(client, unique_stream, 0, lambda s: int(s.trimmed_before) == b[3]),
               10, "every replica to apply the cut")
    assert_every_replica_serves(client, unique_stream, 0, b[3:] + c)
    for sn in b[:3]:
        with pytest.raises(errors.RecordNotFound):
            client.get_record(unique_stream, sn)


def test_trim_requests_are_checked(client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=3, ingestion_policy=NO_DEDUP)
    sns = put(client, unique_stream, "r", 3)
    with pytest.raises(errors.InvalidArgument):
        client.trim_stream(unique_stream)                                  # neither a time nor an SN
    with pytest.raises(errors.InvalidArgument):
        client.trim_stream(unique_stream, before_time_ms=now_ms() + 3_600_000)      # the future
    with pytest.raises(errors.InvalidSequenceNumber):
        client.trim_stream(unique_stream, before_sn=seqno.make(now_ms(), 1, 7))     # no partition p0007
    with pytest.raises(errors.InvalidSequenceNumber):
        client.trim_stream(unique_stream, before_sn="not-a-number")
    with pytest.raises(errors.StreamNotFound):
        client.trim_stream(unique_stream + "-missing", before_time_ms=now_ms())
    assert client.get_stream_info(unique_stream).partitions[0].state is PartitionState.OPEN
    assert_every_replica_serves(client, unique_stream, 0, sns)


# --- unread records -------------------------------------------------------------------------

def test_protect_unread_keeps_what_a_consumer_has_not_read(client, unique_stream):
    client.create_stream(unique_stream, partitions=2, replication_factor=3, ingestion_policy=NO_DEDUP)
    info = client.update_stream(unique_stream, protect_unread=True)
    assert info.protect_unread
    client.register_consumer(unique_stream, "reader")
    wait_until(lambda: client.get_stream_info(unique_stream).consumers == ("reader",), 5,
               "the stream to list its registered consumer")
    a = put(client, unique_stream, "a", 5, LOW_HASH)
    b = put(client, unique_stream, "b", 5, LOW_HASH)
    c = put(client, unique_stream, "c", 5, LOW_HASH)
    d = put(client, unique_stream, "d", 4, HIGH_HASH)
    e = put(client, unique_stream, "e", 4, HIGH_HASH)
    wait_for_later_ms(max(c + e))

    # the consumer read p1 up to the end of d, and nothing of p0
    client.checkpoint_consumer(unique_stream, "reader", {1: d[-1]})
    client.trim_stream(unique_stream, before_time_ms=now_ms())          # past every record
    wait_until(lambda: all_replicas(client, unique_stream, 1, lambda s: int(s.trimmed_before) == d[-1] + 1
                                    and int(s.first_sn) == e[0]),
               10, "p1: every replica to delete what the consumer read: "
               + describe_replicas(client, unique_stream, 1))
    assert_every_replica_serves(client, unique_stream, 1, e)
    # the pass that trimmed p1 used the same facts for p0: the consumer allows nothing there
    assert all_replicas(client, unique_stream, 0, lambda s: int(s.first_sn) == a[0]
                        and s.records == len(a + b + c) and int(s.trimmed_before) < a[0])
    assert_every_replica_serves(client, unique_stream, 0, a + b + c)

    # it reads p0 up to the end of a: a goes, b and c stay
    client.checkpoint_consumer(unique_stream, "reader", {"p0000": a[-1]})
    wait_until(lambda: all_replicas(client, unique_stream, 0, lambda s: int(s.trimmed_before) == a[-1] + 1
                                    and int(s.first_sn) == b[0]),
               10, "p0: every replica to delete batch a: " + describe_replicas(client, unique_stream, 0))
    assert_every_replica_serves(client, unique_stream, 0, b + c)

    # further, into the middle of b: b stays stored, reads start after the checkpoint
    client.checkpoint_consumer(unique_stream, "reader", {0: b[1]})
    wait_until(lambda: all_replicas(client, unique_stream, 0, lambda s: int(s.trimmed_before) == b[1] + 1),
               10, "p0: every replica to hide b up to the checkpoint: " + describe_replicas(client, unique_stream, 0))
    assert all_replicas(client, unique_stream, 0, lambda s: int(s.first_sn) == b[0])
    assert_every_replica_serves(client, unique_stream, 0, b[2:] + c)

    # once it deregisters, the trim request applies in full (the newest batches stay stored, unread)
    client.deregister_consumer(unique_stream, "reader")
    wait_until(lambda: client.get_stream_info(unique_stream).consumers == (), 5,
               "the stream to list no consumer any more")
    for ordinal, newest in ((0, c), (1, e)):
        wait_until(lambda: all_replicas(client, unique_stream, ordinal, lambda s: int(s.first_sn) == newest[0]
                                        and int(s.trimmed_before) == newest[-1] + 1),
                   10, f"p{ordinal}: every replica to apply the trim request in full: "
                   + describe_replicas(client, unique_stream, ordinal))
        assert_every_replica_serves(client, unique_stream, ordinal, [])
    assert list(client.read_stream(unique_stream)) == []
    fresh = put(client, unique_stream, "fresh", 2, LOW_HASH)
    assert_every_replica_serves(client, unique_stream, 0, fresh)


def test_registered_consumer_shows_at_once(client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=3, ingestion_policy=NO_DEDUP)
    client.get_stream_info(unique_stream)                # the control node's view of the stream is fresh
    started = time.monotonic()
    client.register_consumer(unique_stream, "eager")
    consumers = client.get_stream_info(unique_stream).consumers
    if time.monotonic() - started > 0.8 * limits.CONFIG_REFRESH_INTERVAL_S:
        pytest.skip("too slow to tell a stale view from a fresh one")
    assert consumers == ("eager",)


def test_protect_unread_can_be_switched_off(client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=3, ingestion_policy=NO_DEDUP)
    client.update_stream(unique_stream, protect_unread=True)
    client.register_consumer(unique_stream, "idle")
    a = put(client, unique_stream, "a", 3)
    b = put(client, unique_stream, "b", 3)
    wait_for_later_ms(b[-1])
    client.trim_stream(unique_stream, before_time_ms=now_ms())
    info = client.update_stream(unique_stream, protect_unread=False)
    assert not info.protect_unread
    wait_until(lambda: all_replicas(client, unique_stream, 0, lambda s: int(s.first_sn) == b[0]
                                    and int(s.trimmed_before) == b[-1] + 1),
               10, "every replica to trim once unread records are no longer protected: "
               + describe_replicas(client, unique_stream, 0))
    assert all_replicas(client, unique_stream, 0, lambda s: s.records == len(b) and int(s.first_sn) > a[-1])
    assert_every_replica_serves(client, unique_stream, 0, [])


# --- closed partitions leave once empty -------------------------------------------------------

def _split_with_records(client, stream: str):
    """A 1-partition stream split in two, with records before and after the split."""
    client.create_stream(stream, partitions=1, replication_factor=3, ingestion_policy=NO_DEDUP)
    before = put(client, stream, "before", 8) + put(client, stream, "before2", 8)
    info = client.split(stream, 0)
    parent = info.partition(0)
    assert parent.state is PartitionState.CLOSED and parent.ending_sn == before[-1], parent
    assert sorted(parent.children) == [1, 2]
    children = {o: put(client, stream, f"child{o}", 6, info.partition(o).hash_lo) for o in parent.children}
    assert all(seqno.ordinal_of(sn) == o for o, sns in children.items() for sn in sns)
    assert all(sn > before[-1] for sns in children.values() for sn in sns)
    return parent, before, children


def _storage_addresses(client) -> list[str]:
    return [n.address for n in client.describe_cluster().nodes if "storage" in n.roles]


def _held_anywhere(client, chain_id: str) -> list[str]:
    return [address for address in _storage_addresses(client) if replica_status(address, chain_id) is not None]


def test_closed_partition_is_dropped_once_retention_empties_it(client, unique_stream):
    parent, before, children = _split_with_records(client, unique_stream)
    assert [r.sn for r in client.read_stream(unique_stream)][:len(before)] == before
    assert len(_held_anywhere(client, f"{unique_stream}:0")) == 3

    client.trim_stream(unique_stream, before_time_ms=parent.valid_to_ms)     # the split's boundary
    wait_until(lambda: 0 not in {p.ordinal for p in client.get_stream_info(unique_stream).partitions}, 15,
               "the control leader to drop the emptied parent from the map")
    info = client.get_stream_info(unique_stream)
    assert sorted(p.ordinal for p in info.partitions) == [1, 2]
    assert sorted(p.ordinal for p in info.roots()) == [1, 2]
    assert all(p.parents == (0,) and p.state is PartitionState.OPEN for p in info.partitions)
    # its chain is gone: no node holds the replica any more
    wait_until(lambda: not _held_anywhere(client, f"{unique_stream}:0"), 10,
               "every node to drop the parent's replica")
    with pytest.raises(errors.PartitionNotFound):
        client.get_iterator(unique_stream, 0, "TRIM_HORIZON")
    with pytest.raises(errors.InvalidSequenceNumber):
        client.trim_stream(unique_stream, before_sn=before[-1])

    # the children keep their records, on every replica, and a read starts at them
    for ordinal, sns in children.items():
        assert all_replicas(client, unique_stream, ordinal, lambda s: s.records == len(sns))
        assert_every_replica_serves(client, unique_stream, ordinal, sns)
    streamed = [r.sn for r in client.read_stream(unique_stream)]
    assert sorted(streamed) == sorted(children[1] + children[2])
    more = put(client, unique_stream, "after-drop", 4, HIGH_HASH)
    assert sorted(r.sn for r in client.read_stream(unique_stream)) == sorted(children[1] + children[2] + more)
    # from a time or an SN before the split: the dropped parent's children are read too
    # (they are roots now, younger than the start)
    everything = sorted(children[1] + children[2] + more)
    before_split = parent.valid_to_ms - 1
    assert sorted(r.sn for r in client.read_stream(unique_stream, timestamp_ms=before_split)) == everything
    first_p1 = min(children[1])
    assert sorted(r.sn for r in client.read_stream(unique_stream, sequence_number=first_p1)) == \
        [sn for sn in everything if seqno.ordinal_of(sn) != 1 or sn >= first_p1]


def test_closed_partition_with_unread_records_stays_until_read_to_its_end(client, unique_stream):
    parent, before, children = _split_with_records(client, unique_stream)
    client.update_stream(unique_stream, protect_unread=True)
    client.register_consumer(unique_stream, "slow")
    client.trim_stream(unique_stream, before_time_ms=parent.valid_to_ms)

    # the consumer has read nothing: the parent and its records stay (a few retention passes)
    observe_until = time.monotonic() + 3 * RETENTION_PASS_S
    while time.monotonic() < observe_until:
        assert 0 in {p.ordinal for p in client.get_stream_info(unique_stream).partitions}
        assert all_replicas(client, unique_stream, 0, lambda s: int(s.first_sn) == before[0])
    assert_every_replica_serves(client, unique_stream, 0, before)

    # part of it read: still there, the read part hidden
    client.checkpoint_consumer(unique_stream, "slow", {0: before[7]})
    wait_until(lambda: all_replicas(client, unique_stream, 0, lambda s: int(s.trimmed_before) == before[7] + 1),
               10, "the parent's replicas to apply the checkpoint: " + describe_replicas(client, unique_stream, 0))
    assert 0 in {p.ordinal for p in client.get_stream_info(unique_stream).partitions}
    assert_every_replica_serves(client, unique_stream, 0, before[8:])

    # read to its end: it goes, the children stay
    client.checkpoint_consumer(unique_stream, "slow", {0: "SHARD_END"})
    wait_until(lambda: 0 not in {p.ordinal for p in client.get_stream_info(unique_stream).partitions}, 15,
               "the parent to be dropped once the consumer read it to its end")
    wait_until(lambda: not _held_anywhere(client, f"{unique_stream}:0"), 10,
               "every node to drop the parent's replica")
    # the children's records are all after the cut: they stay
    for ordinal, sns in children.items():
        assert_every_replica_serves(client, unique_stream, ordinal, sns)
    assert sorted(r.sn for r in client.read_stream(unique_stream)) == sorted(children[1] + children[2])


def test_closed_partitions_without_records_and_merged_parents_are_dropped(client, unique_stream):
    client.create_stream(unique_stream, partitions=2, replication_factor=3, ingestion_policy=NO_DEDUP)
    # p0 closes before it holds any record (ending SN 0); p1 holds records when it is merged
    info = client.split(unique_stream, 0)
    empty = info.partition(0)
    assert empty.state is PartitionState.CLOSED and empty.ending_sn == 0 and empty.children == (2, 3)
    p1 = put(client, unique_stream, "p1", 5, HIGH_HASH)
    info = client.merge(unique_stream, 3, 1)
    merged = info.partition(4)
    assert sorted(merged.parents) == [1, 3] and info.partition(3).ending_sn == 0
    assert info.partition(1).ending_sn == p1[-1]
    kept = {2: put(client, unique_stream, "p2", 3, LOW_HASH), 4: put(client, unique_stream, "p4", 4, HIGH_HASH)}

    client.trim_stream(unique_stream, before_time_ms=merged.valid_from_ms)     # past every closed partition
    wait_until(lambda: sorted(p.ordinal for p in client.get_stream_info(unique_stream).partitions) == [2, 4], 15,
               "the closed partitions p0, p1 and p3 to be dropped")
    info = client.get_stream_info(unique_stream)
    assert sorted(p.ordinal for p in info.roots()) == [2, 4]
    for ordinal in (0, 1, 3):
        wait_until(lambda: not _held_anywhere(client, f"{unique_stream}:{ordinal}"), 10,
                   f"every node to drop the replica of p{ordinal}")
    for ordinal, sns in kept.items():
        assert_every_replica_serves(client, unique_stream, ordinal, sns)
    assert sorted(r.sn for r in client.read_stream(unique_stream)) == sorted(kept[2] + kept[4])


# --- updating the retention ------------------------------------------------------------------

def test_update_retention_while_running_and_bad_values(client, unique_stream):
    info = client.create_stream(unique_stream, partitions=1, replication_factor=3, ingestion_policy=NO_DEDUP, retention_hours=2)
    assert (info.retention_hours, info.retention_s) == (2, 7200)
    sns = put(client, unique_stream, "r", 5)

    info = client.update_retention(unique_stream, seconds=30)
    assert info.retention_s == 30
    assert client.get_stream_info(unique_stream).retention_s == 30
    for bad in ({"seconds": 5}, {"seconds": limits.RETENTION_S_MIN - 1},
                {"seconds": limits.RETENTION_HOURS_MAX * 3600 + 1}, {"hours": limits.RETENTION_HOURS_MAX + 1}):
        with pytest.raises(errors.InvalidStreamConfig):
            client.update_retention(unique_stream, **bad)
        current = client.get_stream_info(unique_stream)
        assert current.retention_s == 30, f"{bad} changed the retention to {current.retention_s} s"
    with pytest.raises(errors.StreamNotFound):
        client.update_retention(unique_stream + "-missing", seconds=30)

    info = client.update_retention(unique_stream, hours=3)
    assert (info.retention_hours, info.retention_s) == (3, 3 * 3600)
    info = client.update_retention(unique_stream, seconds=limits.RETENTION_S_MIN)
    assert info.retention_s == limits.RETENTION_S_MIN
    assert client.get_stream_info(unique_stream).retention_s == limits.RETENTION_S_MIN
    # other settings are untouched by a retention change, and nothing young was deleted
    assert not info.protect_unread and info.partitions[0].state is PartitionState.OPEN
    assert_every_replica_serves(client, unique_stream, 0, sns)


def test_a_deduplicating_stream_hides_trimmed_records_at_once_and_keeps_them_for_retries(client, unique_stream):
    """Trimmed records of an at_least_once_no_dup stream leave every reader at once, but stay
    stored through the dedup window: a producer's retry of one whose ack was lost is still
    answered as a duplicate by a child partition's owner, which rebuilds its table from them."""
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    with client.producer(unique_stream, "retrying-producer") as producer:
        first = producer.put(b"kept for dedup", "k")
    later = put(client, unique_stream, "later", 3)
    client.trim_stream(unique_stream, before_sn=later[0])
    wait_until(lambda: all_replicas(client, unique_stream, 0, lambda s: int(s.trimmed_before) >= later[0]),
               10, "every replica to hide the trimmed record")
    assert [r.sn for r in client.read_stream(unique_stream)] == later
    for node in client.describe_cluster().nodes:
        if "storage" in node.roles:
            status = replica_status(node.address, f"{unique_stream}:0")
            assert int(status.first_sn) <= first.sn, f"{node.node_id} deleted a record inside the dedup window"
    with pytest.raises(errors.RecordNotFound):
        client.get_record(unique_stream, first.sn)
