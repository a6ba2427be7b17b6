"""End to end through real processes: put, replicate down the chain, read back.

Checks the properties DESIGN.md sections 4, 5 and 9 promise to a producer and a reader:
every acked record is read exactly once with its bytes and its acked SN, SNs increase
within a partition, a key's records keep their order and live in the partition whose
hash range holds md5(key), every chain member stores the same batches, nothing is
readable before the tail has it, and a restart on the same directory keeps the data.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time

import grpc
import lmdb
import pytest

import sms
import sms.aio
from sms import wire, convert, errors, limits, seqno
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.types import Persistence, Record
from storage.log import LogStore
from tests.conftest import client_channel, env_cluster, read_stream, stream_name, wait_until

pytestmark = pytest.mark.integration

BIG = 10**12
SEPARATOR = b"|"


def md5_hash_key(key: str) -> int:
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest(), "big")


def make_data(key: str, counter: int, rng: random.Random) -> bytes:
    """(key, per-key counter) then a random payload of varying size."""
    return f"{key}|{counter}|".encode() + rng.randbytes(rng.choice((0, 1, 17, 100, 1000, 4000)))


def key_and_counter(data: bytes) -> tuple[str, int]:
    key, counter, _payload = data.split(SEPARATOR, 2)
    return key.decode(), int(counter)


def check_stream(info, written: dict[tuple[str, int], bytes], acked: dict[tuple[str, int], tuple[int, int]],
                 read: dict[int, list[Record]]) -> None:
    """What was read is exactly what was acked, in the right partitions and order."""
    seen: dict[tuple[str, int], Record] = {}
    for partition in info.partitions:
        records = read[partition.ordinal]
        sns = [r.sn for r in records]
        assert all(a < b for a, b in zip(sns, sns[1:])), f"{partition.partition_id}: SNs not strictly increasing"
        last_counter: dict[str, int] = {}
        for r in records:
            ident = key_and_counter(r.data)
            assert ident not in seen, f"record {ident} read twice"
            seen[ident] = r
            key, counter = ident
            assert r.partition_key == key
            assert r.partition_ordinal == partition.ordinal
            assert seqno.ordinal_of(r.sn) == partition.ordinal
            assert partition.hash_lo <= md5_hash_key(key) < partition.hash_hi, \
                f"key {key} read from {partition.partition_id}, whose hash range does not hold md5(key)"
            assert counter > last_counter.get(key, -1), f"key {key}: counter {counter} after {last_counter[key]}"
            last_counter[key] = counter
    assert seen.keys() == written.keys(), (f"{len(written.keys() - seen.keys())} records missing, "
                                           f"{len(seen.keys() - written.keys())} unexpected")
    for ident, r in seen.items():
        assert r.data == written[ident], f"record {ident}: bytes differ"
        assert (r.sn, r.partition_ordinal) == acked[ident], f"record {ident}: read SN differs from acked SN"


def test_every_record_read_once_in_order_and_in_its_partition(client, unique_stream):
    rng = random.Random(20_000)
    info = client.create_stream(unique_stream, partitions=4, replication_factor=3)
    keys = [f"key-{i}" for i in range(500)]
    next_counter = dict.fromkeys(keys, 0)
    written: dict[tuple[str, int], bytes] = {}
    acked: dict[tuple[str, int], tuple[int, int]] = {}
    for _batch in range(40):
        batch = []
        for _ in range(limits.PUT_RECORDS_COUNT_MAX):
            key = rng.choice(keys)
            counter = next_counter[key]
            next_counter[key] += 1
            data = make_data(key, counter, rng)
            written[(key, counter)] = data
            batch.append((key, data))
        result = client.put_records(unique_stream, batch)
        assert result.failed_record_count == 0, [r for r in result.records if not r.ok][:3]
        for (key, data), r in zip(batch, result.records):
            acked[key_and_counter(data)] = (r.sn, r.partition_ordinal)
    assert len(written) == 20_000

    check_stream(info, written, acked, read_stream(client, unique_stream))


def test_async_client_concurrent_puts_keep_per_key_order(cluster, unique_stream):
    producers, puts_per_producer, records_per_put = 8, 6, 40

    async def main() -> tuple:
        async with sms.aio.Client(cluster.address) as aclient:
            info = await aclient.create_stream(unique_stream, partitions=4, replication_factor=3)
            written, acked = {}, {}

            async def produce(p: int) -> None:
                """Keys of this producer are written by sequentially awaited puts."""
                rng = random.Random(p)
                keys = [f"prod-{p}-key-{k}" for k in range(10)]
                counters = dict.fromkeys(keys, 0)
                for _ in range(puts_per_producer):
                    batch = []
                    for _ in range(records_per_put):
                        key = rng.choice(keys)
                        data = make_data(key, counters[key], rng)
                        written[(key, counters[key])] = data
                        counters[key] += 1
                        batch.append({"partition_key": key, "data": data})
                    result = await aclient.put_records(unique_stream, batch)
                    assert result.failed_record_count == 0
                    for record, r in zip(batch, result.records):
                        acked[key_and_counter(record["data"])] = (r.sn, r.partition_ordinal)

            await asyncio.gather(*(produce(p) for p in range(producers)))
            read = {}
            for partition in info.partitions:
                records, iterator = [], await aclient.get_iterator(unique_stream, partition.partition_id)
                while True:
                    result = await aclient.get_next_records(iterator, max_records=97)
                    if not result.records:
                        break
                    records.extend(result.records)
                    iterator = result.next_iterator
                read[partition.ordinal] = records
            return info, written, acked, read

    info, written, acked, read = asyncio.run(main())
    assert len(written) == producers * puts_per_producer * records_per_put
    check_stream(info, written, acked, read)


# --- every chain member holds the same log ----------------------------------------------

async def _stored_batches(node_dir: str, chain_id: str) -> tuple[int, list[bytes]]:
    """(last SN, every stored batch) of one chain's log on one stopped node."""
    store = LogStore(os.path.join(node_dir, "storage"))
    await store.start()
    try:
        plog = store.open_log(chain_id, Persistence.DISK)
        batches: list[bytes] = []
        next_sn = 0
        while next_sn <= plog.last_sn:
            slices = store.read(plog, next_sn, plog.last_sn, BIG, BIG)
            assert slices, f"{chain_id}: nothing readable from {next_sn} up to last SN {plog.last_sn}"
            for s in slices:
                assert (s.start, s.end) == (0, wire.read_header(s.batch).count), "a stored batch read in part"
                batches.append(s.batch)
            next_sn = wire.read_header(slices[-1].batch).last_sn + 1
        return plog.last_sn, batches
    finally:
        await store.close()


def test_every_replica_holds_the_same_batches(make_cluster):
    local = make_cluster()
    stream = stream_name("replicas")
    with sms.Client(local.address) as c:
        info = c.create_stream(stream, partitions=4, replication_factor=3)
        rng = random.Random(3)
        written = {}
        for start in range(0, 3_000, 300):
            batch = [(f"key-{i % 97}", f"record {i}".encode() + rng.randbytes(rng.randrange(200)))
                     for i in range(start, start + 300)]
            result = c.put_records(stream, batch)
            assert result.failed_record_count == 0
            written.update({r.sn: data for (_key, data), r in zip(batch, result.records)})
    local.stop()

    stored_records = {}
    for partition in info.partitions:
        members = [m.node_id for m in partition.chain]
        assert len(members) == 3
        chain_id = f"{stream}:{partition.ordinal}"
        logs = {node_id: asyncio.run(_stored_batches(os.path.join(local.data_dir, node_id), chain_id))
                for node_id in members}
        head_last_sn, head_batches = logs[members[0]]
        assert head_batches, f"{chain_id}: the head stores nothing"
        for node_id, (last_sn, batches) in logs.items():
            assert last_sn == head_last_sn, f"{chain_id}: {node_id} last SN {last_sn}, head {head_last_sn}"
            assert batches == head_batches, f"{chain_id}: {node_id} stores other batches than the head"
        for batch in head_batches:
            header = wire.read_header(batch)
            for r in convert.records_from_slice(batch, 0, header.count, partition.ordinal):
                stored_records[r.sn] = r.data
    assert stored_records == written


# --- nothing is readable before commit ----------------------------------------------------

def _raw_read_all(address: str, stream: str, ordinal: int) -> list[Record]:
    """Everything one node's retrieval role serves of a partition from TRIM_HORIZON."""
    with client_channel(address) as channel:
        stub = sms_pb2_grpc.RetrievalStub(channel)
        iterator = stub.GetIterator(sms_pb2.GetIteratorRequest(
            stream=stream, partition_id=f"p{ordinal:04d}", iterator_type="TRIM_HORIZON"), timeout=5).iterator
        records = []
        for _ in range(100):
            resp = stub.GetNextRecords(sms_pb2.GetNextRecordsRequest(iterator=iterator, max_records=10_000),
                                       timeout=5)
            batch = [r for s in resp.slices for r in convert.records_from_slice(s.batch, s.start, s.end, ordinal)]
            if not batch:
                return records
            records.extend(batch)
            iterator = resp.next_iterator
        raise AssertionError("not caught up after 100 reads")


def _pause_outside_metastore_writes(local, node_id: str, attempts: int = 5) -> None:
    """SIGSTOP a node, retrying until it is not stopped inside a write transaction of the
    shared embedded metadata store (that would stall every other process's writes; see
    metastore/embedded.py): a write transaction from here must get the lock."""
    env = lmdb.open(local.metastore.removeprefix("embedded://"), subdir=False, lock=True,
                    max_dbs=8, map_size=limits.METASTORE_MAP_BYTES)
    try:
        for _ in range(attempts):
            local.signal(node_id, signal.SIGSTOP)
            got_lock = threading.Event()

            def probe() -> None:
                env.begin(write=True).abort()
                got_lock.set()

            prober = threading.Thread(target=probe, daemon=True)
            prober.start()
            if got_lock.wait(1.0):
                prober.join()
                return
            local.signal(node_id, signal.SIGCONT)
            prober.join()
        raise AssertionError(f"{node_id} held the metadata store's writer lock at every pause")
    finally:
        env.close()


def test_nothing_readable_before_the_tail_has_it(tmp_path_factory):
    # (a tail paused this long would be taken out of its chain by link liveness, its
    # predecessor becoming tail and committing: here the commit rule itself is under test,
    # so the link ack timeout is raised past the observation)
    with env_cluster(tmp_path_factory, {"SMS_REPLICATION_LINK_ACK_TIMEOUT_S": "30"}, "commit") as local:
        _nothing_readable_before_the_tail_has_it(local)


def _nothing_readable_before_the_tail_has_it(local) -> None:
    stream = stream_name("commit")
    with sms.Client(local.address) as c, concurrent.futures.ThreadPoolExecutor(1) as pool:
        info = c.create_stream(stream, partitions=1, replication_factor=3)
        first = c.put_record(stream, b"committed before the pause", "k")
        head, middle, tail = info.partitions[0].chain
        assert (head.role, middle.role, tail.role) == ("head", "middle", "tail")
        _pause_outside_metastore_writes(local, tail.node_id)
        try:
            put = pool.submit(c.put_record, stream, b"written while the tail is paused", "k")

            def stored_uncommitted() -> bool:
                status = {r["chain_id"]: r for r in c.node_status(middle.address)["replicas"]}
                replica = status[f"{stream}:0"]
                return int(replica["last_sn"]) > int(replica["committed_sn"])

            wait_until(stored_uncommitted, 10, "the middle replica to store the record uncommitted")
            observe_until = time.monotonic() + 1.5
            reads = 0
            while time.monotonic() < observe_until:
                for member in (head, middle):
                    records = _raw_read_all(member.address, stream, 0)
                    assert [r.sn for r in records] == [first.sn], \
                        f"{member.node_id} ({member.role}) served a record the tail does not have"
                    reads += 1
                assert not put.done(), "the put was acknowledged before the tail stored the record"
            assert reads >= 4
        finally:
            local.signal(tail.node_id, signal.SIGCONT)
        wait_until(put.done, 20, "the put to complete once the tail runs again")
        second = put.result()
        assert second.sn > first.sn
        for member in (head, middle, tail):
            def readable() -> bool:
                return [r.sn for r in _raw_read_all(member.address, stream, 0)] == [first.sn, second.sn]
            wait_until(readable, 10, f"{member.node_id} to serve the committed record")
        record = c.get_record(stream, second.sequence_number)
        assert (record.sn, record.data) == (second.sn, b"written while the tail is paused")


# --- single records, restarts -------------------------------------------------------------

def test_get_record_returns_exactly_that_record(client, unique_stream):
    client.create_stream(unique_stream, partitions=2, replication_factor=3)
    batch = [(f"key-{i}", f"value {i}".encode()) for i in range(20)]
    result = client.put_records(unique_stream, batch)
    assert result.failed_record_count == 0
    for (key, data), r in zip(batch, result.records):
        record = client.get_record(unique_stream, r.sequence_number)
        assert (record.partition_key, record.data, record.sn, record.partition_ordinal) == \
               (key, data, r.sn, r.partition_ordinal)

    r = result.records[0]
    ts, counter, ordinal = seqno.timestamp_ms_of(r.sn), seqno.counter_of(r.sn), seqno.ordinal_of(r.sn)
    never_written = {
        "below the watermark": seqno.make(ts - 1, counter, ordinal),     # counter belongs to ts
        "above the watermark": seqno.make(ts, counter + 1_000_000, ordinal),
    }
    for where, sn in never_written.items():
        try:
            got = client.get_record(unique_stream, str(sn))
        except errors.RecordNotFound:
            continue
        pytest.fail(f"get_record of a never-written SN {where} returned {got}")


@pytest.mark.slow
def test_restart_on_the_same_directory_keeps_streams_and_records(make_cluster):
    local = make_cluster()
    stream = stream_name("restart")
    with sms.Client(local.address) as c:
        c.create_stream(stream, partitions=3, replication_factor=3)
        batch = [(f"key-{i}", f"before restart {i}".encode()) for i in range(300)]
        assert c.put_records(stream, batch).failed_record_count == 0
        before = read_stream(c, stream)
    local.stop()

    again = make_cluster(local.data_dir)
    with sms.Client(again.address) as c:
        assert stream in c.list_streams()
        # a restarted head or middle learns the commit watermark again from its successor;
        # until then it serves a shorter committed prefix
        wait_until(lambda: read_stream(c, stream) == before, 15, "every record to read back after the restart")
        assert sum(len(v) for v in before.values()) == 300
        after = c.put_records(stream, [(key, b"after restart") for key, _ in batch[:30]])
        assert after.failed_record_count == 0
        for r in after.records:
            assert r.sn > before[r.partition_ordinal][-1].sn, "an SN assigned after the restart is not greater"
        total = read_stream(c, stream)
        assert sum(len(v) for v in total.values()) == 330


_START_CLUSTERS_WHILE_BUSY = """
import sys, tempfile, threading
import sms
from node.launcher import LocalCluster

first = LocalCluster(tempfile.mkdtemp(dir=sys.argv[1]), nodes=1, port=0).start()
client = sms.Client(first.address)
stop = threading.Event()

def busy():
    while not stop.is_set():
        client.list_streams()

traffic = threading.Thread(target=busy)
traffic.start()
try:
    for attempt in range(6):
        local = LocalCluster(tempfile.mkdtemp(dir=sys.argv[1]), nodes=3, port=0)
        try:
            local.start()
        except RuntimeError as e:
            print(f"start {attempt} failed: {str(e).splitlines()[0]}", flush=True)
            sys.exit(1)
        finally:
            local.stop()
finally:
    stop.set()
    traffic.join()
    client.close()
    first.stop()
"""


@pytest.mark.slow
def test_cluster_starts_while_the_launching_process_uses_grpc(tmp_path):
    """Tests start and restart nodes while their clients are connected. A launcher that
    ran Python between fork and exec (preexec_fn) let gRPC's fork handlers break the
    child: it died with SIGABRT or SIGSEGV before exec, within a few starts. Runs in a
    fresh interpreter so that only its own channels are live."""
    proc = subprocess.run([sys.executable, "-c", _START_CLUSTERS_WHILE_BUSY, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
