"""The archive tier through real processes, with a `file://` fragment store (issue 18).

A stream archives committed batches older than archive_after_s to fragment files; once a
fragment is verified and local retention has passed, every replica deletes its local copy
and reads below the local trim point are served from the archive. These tests drop local
copies (checked on every node through NodeStatus `first_sn`) and read back every record
once, in order, by every iterator type, through get_record, read_stream, a consumer group
and Spark's source; then the archive's retention, and updates while the stream runs.

The nodes archive at once (archive.flush_s = 0 through SMS_ARCHIVE_FLUSH_S) and check
every 0.2 s, so a test waits a few seconds, polling, for records to move tier.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import sys
from typing import NamedTuple

import pytest

import sms
from sms import convert, errors, seqno
from sms.proto import sms_pb2, sms_pb2_grpc
from tests.conftest import client_channel, env_cluster, stream_name, wait_until

pytestmark = pytest.mark.integration

NO_DEDUP = "at_least_once_dup_permitted"      # a de-duplicating stream keeps its dedup window locally
ENV = {"SMS_ARCHIVE_FLUSH_S": "0", "SMS_ARCHIVE_CHECK_INTERVAL_S": "0.2", "SMS_RETENTION_CHECK_INTERVAL_S": "0.2"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with env_cluster(tmp_path_factory, ENV, "archive-cluster") as local:
        yield local


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("fragments"))


def node_addresses(client) -> list[str]:
    return [n.address for n in client.describe_cluster().nodes if "storage" in n.roles]


def replicas(address: str, stream: str) -> list:
    with client_channel(address) as channel:
        resp = sms_pb2_grpc.ControlStub(channel).NodeStatus(sms_pb2.NodeStatusRequest(), timeout=5)
    return [r for r in resp.replicas if r.chain_id.rpartition(":")[0] == stream]


def local_firsts(client, stream: str) -> dict[str, list[int]]:
    """chain id -> every replica's first stored SN."""
    out: dict[str, list[int]] = {}
    for address in node_addresses(client):
        for r in replicas(address, stream):
            out.setdefault(r.chain_id, []).append(int(r.first_sn))
    return out


class Acked(NamedTuple):
    sn: int
    ordinal: int
    data: bytes


def put_rounds(client, stream: str, rounds: int, per_round: int, tag: str = "r") -> list[Acked]:
    """`rounds` put_records calls (a batch per partition each); every acked record, in order."""
    acked = []
    for n in range(rounds):
        records = [(f"k{i}", f"{tag}{n}-{i}".encode()) for i in range(per_round)]
        out = client.put_records(stream, records)
        assert out.failed_record_count == 0
        acked.extend(Acked(r.sn, r.partition_ordinal, data) for r, (_k, data) in zip(out.records, records))
    return acked


def wait_dropped_locally(client, stream: str, below: dict[int, int], timeout_s: float = 60) -> None:
    """Until every replica of each partition stores nothing below `below[ordinal]`."""
    def dropped():
        firsts = local_firsts(client, stream)
        return all(firsts.get(f"{stream}:{o}") and all(f >= sn for f in firsts[f"{stream}:{o}"])
                   for o, sn in below.items())
    wait_until(dropped, timeout_s, f"{stream}: local copies below {below} deleted on every replica")


def drain(client, iterator: str) -> list:
    records = []
    for _ in range(10_000):
        result = client.get_next_records(iterator, max_records=137)     # pages that cut batches
        records.extend(result.records)
        iterator = result.next_iterator
        if not result.records:
            return records
    raise AssertionError("not caught up")


@pytest.fixture(scope="module")
def archived(cluster, store_dir):
    """A 2-partition stream whose first 30 rounds are archived and gone from every replica;
    then 3 more rounds kept locally. (client, stream, acked records by ordinal)."""
    client = sms.Client(cluster.address)
    stream = stream_name("archived")
    client.create_stream(stream, partitions=2, replication_factor=3, ingestion_policy=NO_DEDUP,
                         archive=f"file://{store_dir}", archive_after_s=1, local_retention_s=2, retention_s=3600)
    old = put_rounds(client, stream, 30, 40, "old")
    new = put_rounds(client, stream, 1, 40, "new")     # (a log's newest batch always stays)
    wait_dropped_locally(client, stream, {o: min(r.sn for r in new if r.ordinal == o) for o in (0, 1)})
    new += put_rounds(client, stream, 2, 40, "new")
    by: dict[int, list] = {0: [], 1: []}
    for r in old + new:
        by[r.ordinal].append(r)
    try:
        yield client, stream, by
    finally:
        client.close()


def test_archived_records_read_back_once_in_order_from_trim_horizon(archived):
    client, stream, by = archived
    for ordinal, acked in by.items():
        got = drain(client, client.get_iterator(stream, ordinal, "TRIM_HORIZON"))
        assert [(r.sn, r.data) for r in got] == [(a.sn, a.data) for a in acked]
        assert len({r.sn for r in got}) == len(got)


def test_fragments_are_files_named_by_their_range(archived, store_dir):
    _client, stream, by = archived
    names = []
    for root, _dirs, files in os.walk(store_dir):
        names += [os.path.join(root, f) for f in files if stream in root]
    assert names, "no fragment file was written"
    for path in names:
        name = os.path.basename(path)
        assert name.endswith(".zst"), name
        first, last, _check = name[:-4].split("-")
        assert int(first, 16) <= int(last, 16)


@pytest.mark.parametrize("where", ["first", "middle", "last_archived"])
def test_at_and_after_sequence_number_in_the_archive(archived, where):
    client, stream, by = archived
    acked = by[0]
    old = [a for a in acked if a.data.startswith(b"old")]
    i = {"first": 0, "middle": len(old) // 2 + 3, "last_archived": len(old) - 1}[where]
    sn = acked[i].sn
    at = drain(client, client.get_iterator(stream, 0, "AT_SEQUENCE_NUMBER", sequence_number=sn))
    assert [r.sn for r in at] == [a.sn for a in acked[i:]]
    after = drain(client, client.get_iterator(stream, 0, "AFTER_SEQUENCE_NUMBER", sequence_number=sn))
    assert [r.sn for r in after] == [a.sn for a in acked[i + 1:]]


def test_at_timestamp_across_the_boundary(archived):
    client, stream, by = archived
    acked = by[1]
    for i in (0, len(acked) // 3, len(acked) - 60):
        ts = seqno.timestamp_ms_of(acked[i].sn)
        got = drain(client, client.get_iterator(stream, 1, "AT_TIMESTAMP", timestamp_ms=ts))
        expected = [a.sn for a in acked if seqno.timestamp_ms_of(a.sn) >= ts]
        assert [r.sn for r in got] == expected


def test_latest_and_get_record(archived):
    client, stream, by = archived
    assert drain(client, client.get_iterator(stream, 0, "LATEST")) == []
    for a in (by[0][0], by[0][len(by[0]) // 2], by[1][5]):
        record = client.get_record(stream, a.sn)
        assert record.sn == a.sn


def test_read_stream_walks_archived_and_local_records(archived):
    client, stream, by = archived
    got = list(client.read_stream(stream))
    for ordinal, acked in by.items():
        assert [r.sn for r in got if seqno.ordinal_of(r.sn) == ordinal] == [a.sn for a in acked]
    assert len(got) == sum(len(v) for v in by.values())


def test_every_node_serves_the_archive_and_counts_it(archived, cluster):
    client, stream, by = archived
    sns = [a.sn for a in by[0]]
    for address in node_addresses(client):
        with sms.Client(address) as one:
            got = drain(one, one.get_iterator(stream, 0, "TRIM_HORIZON"))
            assert [r.sn for r in got] == sns
    status = {r.chain_id: r for address in node_addresses(client) for r in replicas(address, stream)
              if int(r.archived_sn or 0)}
    assert set(status) == {f"{stream}:0", f"{stream}:1"}, "the tails report what they archived"
    for r in status.values():
        assert int(r.verified_sn) == int(r.archived_sn) and r.archive_error == ""


def test_describe_and_update_the_archive_while_it_runs(archived):
    client, stream, _by = archived
    info = client.get_stream_info(stream)
    assert info.archive.startswith("file://") and info.archive_after_s == 1 and info.local_retention_s == 2
    info = client.update_stream(stream, local_retention_s=5, compression="none")
    assert info.local_retention_s == 5 and info.compression == "none"
    with pytest.raises(errors.InvalidStreamConfig):
        client.update_stream(stream, archive="file:///elsewhere")
    with pytest.raises(errors.InvalidStreamConfig):
        client.update_stream(stream, local_retention_s=0)
    client.update_stream(stream, local_retention_s=2)


def test_bad_archive_settings_are_refused(cluster):
    with sms.Client(cluster.address) as client:
        name = stream_name("bad-archive")
        for kwargs in ({"archive": "ftp://x"}, {"archive": "file://relative"},
                       {"archive": "file:///tmp/x", "archive_after_s": 10, "local_retention_s": 5},
                       {"archive": "file:///tmp/x", "compression": "lz4"},
                       {"archive_after_s": 10}):
            with pytest.raises(errors.InvalidStreamConfig):
                client.create_stream(name, **kwargs)
        assert name not in client.list_streams()


def test_archive_retention_deletes_fragments_and_their_index(cluster, store_dir):
    with sms.Client(cluster.address) as client:
        stream = stream_name("archive-retention")
        client.create_stream(stream, partitions=1, replication_factor=2, ingestion_policy=NO_DEDUP,
                             archive=f"file://{store_dir}", archive_after_s=1, local_retention_s=2, retention_s=3600)
        acked = put_rounds(client, stream, 5, 20)
        tail = put_rounds(client, stream, 1, 5, "tail")
        wait_dropped_locally(client, stream, {0: tail[0].sn})

        def files():
            return [f for root, _d, fs in os.walk(store_dir) if f"/{stream}/" in root + "/" for f in fs]
        assert files()
        client.update_stream(stream, retention_s=10)
        wait_until(lambda: not files(), 60, "the archive's retention deleted every fragment below the trim point")
        with pytest.raises(errors.RecordsTrimmed):
            it = client.get_iterator(stream, 0, "AT_SEQUENCE_NUMBER", sequence_number=acked[0].sn)
            client.get_next_records(it)
        remaining = drain(client, client.get_iterator(stream, 0, "TRIM_HORIZON"))
        assert all(r.sn > acked[-1].sn for r in remaining)


def test_deleting_the_stream_deletes_its_archive(cluster, store_dir):
    with sms.Client(cluster.address) as client:
        stream = stream_name("deleted-archive")
        client.create_stream(stream, partitions=1, replication_factor=1, ingestion_policy=NO_DEDUP,
                             archive=f"file://{store_dir}", archive_after_s=1, local_retention_s=2, retention_s=3600)
        put_rounds(client, stream, 3, 10)
        root = os.path.join(store_dir, stream)
        wait_until(lambda: any(files for _r, _d, files in os.walk(root)), 30, "a fragment written")
        client.delete_stream(stream)
        wait_until(lambda: not any(files for _r, _d, files in os.walk(root)), 30, "the deleted stream's fragments gone")


def sms_cli(cluster, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "node", *args, "--address", cluster.address], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, f"{args}: {proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_cli_creates_updates_and_shows_an_archive(cluster, store_dir):
    stream = stream_name("cli-archive")
    out = sms_cli(cluster, "stream", "create", stream, "--ingestion-policy", NO_DEDUP, "--retention-s", "3600",
                  "--archive", f"file://{store_dir}", "--archive-after-s", "1", "--local-retention-s", "2",
                  "--compression", "none")
    assert f"archive file://{store_dir} (none): records older than 1 s, kept locally 2 s" in out
    d = json.loads(sms_cli(cluster, "stream", "update", stream, "--local-retention-s", "4", "--json"))
    assert d["archive"] == {"store": f"file://{store_dir}", "archive_after_s": 1, "local_retention_s": 4,
                            "compression": "none"}
    with sms.Client(cluster.address) as client:
        put_rounds(client, stream, 2, 10)
    wait_until(lambda: "archived to" in sms_cli(cluster, "status") and
               f"{stream}/p0000" in sms_cli(cluster, "status"), 30, "sms status shows what the tail archived")
    status = json.loads(sms_cli(cluster, "status", "--json"))
    tails = [r for n in status["nodes"] for r in n.get("replicas", []) if r["chain_id"] == f"{stream}:0"
             and r.get("archive")]
    assert len(tails) == 1 and tails[0]["archive"]["error"] == ""


def test_a_consumer_group_reads_archived_records_once(archived):
    client, stream, by = archived
    want = sum(len(v) for v in by.values())
    got: list = []
    with client.consumer(stream, "archive-readers", wait_ms=200) as consumer:
        deadline = time.monotonic() + 60
        while sum(len(b.records) for b in got) < want and time.monotonic() < deadline:
            batch = consumer.poll(1.0)
            if batch is not None:
                got.append(batch)
    for ordinal, acked in by.items():
        sns = [r.sn for b in got if b.partition_id == f"p{ordinal:04d}" for r in b.records]
        assert sns == [a.sn for a in acked]


def test_spark_reads_archived_records(archived, cluster):
    pytest.importorskip("pyspark")
    from spark_sps.datasource import register
    from spark_sps.engine import spark_session
    client, stream, by = archived
    session = spark_session("local[2]", "sms-archive-test")
    try:
        register(session)
        rows = (session.read.format("sms").option("address", cluster.address).option("stream", stream)
                .load().select("sequence_number", "data").collect())
    finally:
        session.stop()
    assert sorted((int(r.sequence_number), bytes(r.data)) for r in rows) == sorted(
        (a.sn, a.data) for acked in by.values() for a in acked)


def test_replication_traffic_compressed_with_gzip(make_cluster, monkeypatch):
    """replication.compression = gzip: chains replicate (gRPC's message compression) and
    every replica serves what was acknowledged."""
    monkeypatch.setenv("SMS_REPLICATION_COMPRESSION", "gzip")
    local = make_cluster(nodes=3)
    with sms.Client(local.address) as client:
        stream = stream_name("gzip-replication")
        client.create_stream(stream, partitions=1, replication_factor=3, ingestion_policy=NO_DEDUP)
        acked = put_rounds(client, stream, 5, 200)
        for address in node_addresses(client):      # each node's own replica
            with client_channel(address) as channel:
                stub = sms_pb2_grpc.RetrievalStub(channel)
                it = stub.GetIterator(sms_pb2.GetIteratorRequest(stream=stream, partition_id="p0000",
                                                                 iterator_type="TRIM_HORIZON"), timeout=5).iterator
                resp = stub.GetNextRecords(sms_pb2.GetNextRecordsRequest(iterator=it, max_records=10_000), timeout=5)
            got = [r for s in resp.slices for r in convert.records_from_slice(s.batch, s.start, s.end, 0)]
            assert [(r.sn, r.data) for r in got] == [(a.sn, a.data) for a in acked]
    logs = os.path.join(local.data_dir, "logs")
    assert all("replication.compression='gzip'" in open(os.path.join(logs, f"n{i}.log")).read() for i in (1, 2, 3))


def test_unread_records_stay_in_the_archive_after_they_leave_the_replicas(cluster, store_dir):
    """protect_unread covers both tiers: past local retention, unread records leave the
    replicas (the archive holds them); a trim past them deletes nothing of the archive
    until the consumer has read them."""
    with sms.Client(cluster.address) as client:
        stream = stream_name("archive-unread")
        client.create_stream(stream, partitions=1, replication_factor=2, ingestion_policy=NO_DEDUP,
                             archive=f"file://{store_dir}", archive_after_s=1, local_retention_s=2, retention_s=3600)
        client.update_stream(stream, protect_unread=True)
        client.register_consumer(stream, "slow")
        acked = put_rounds(client, stream, 4, 10)
        tail = put_rounds(client, stream, 1, 5, "tail")
        wait_dropped_locally(client, stream, {0: tail[0].sn})           # gone from the replicas, unread
        root = os.path.join(store_dir, stream)

        def fragments() -> int:
            return sum(len(files) for _r, _d, files in os.walk(root))
        held = fragments()
        assert held
        client.trim_stream(stream, before_time_ms=seqno.timestamp_ms_of(tail[0].sn))
        got = drain(client, client.get_iterator(stream, 0, "TRIM_HORIZON"))     # still all there
        assert [r.sn for r in got] == [a.sn for a in acked + tail]
        client.checkpoint_consumer(stream, "slow", {0: acked[-1].sn})
        wait_until(lambda: fragments() == 0 or all(
            int(f.split("-")[1], 16) >= tail[0].sn for _r, _d, fs in os.walk(root) for f in fs), 30,
            "the archive's fragments below the trim point deleted once the consumer read them")
        wait_until(lambda: [r.sn for r in drain(client, client.get_iterator(stream, 0, "TRIM_HORIZON"))]
                   == [a.sn for a in tail], 30, "readers to start after what the consumer read")
