"""Payloads by reference through real processes (issue 18 item 5): records larger than
RECORD_DATA_BYTES_MAX go to the stream's archive store in chunks, and the stream carries a
small reference record (sms/payloads.py).

- a 3 MiB record comes back in `Record.data` (or as its reference, on request), through
  get_next_records, get_record and read_stream, and a de-duplicating producer stores it once;
- a 200 MiB payload goes in from a file and comes back equal, streamed by a reader in a
  separate process whose memory stays within a few chunks;
- a reader killed (SIGKILL) mid-payload resumes where it stopped;
- a corrupt chunk is a named error; a stream without an archive refuses big records;
- uploads never claimed are collected after the grace period, and retention deletes
  payloads with their records.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import sms
from sms import errors, limits
from tests.conftest import env_cluster, stream_name, wait_until

pytestmark = pytest.mark.integration

NO_DEDUP = "at_least_once_dup_permitted"
GRACE_S = 4
ENV = {"SMS_ARCHIVE_PAYLOAD_GRACE_S": str(GRACE_S), "SMS_ARCHIVE_PAYLOAD_GC_INTERVAL_S": "0.5",
       "SMS_ARCHIVE_CHECK_INTERVAL_S": "0.2", "SMS_RETENTION_CHECK_INTERVAL_S": "0.2"}
MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with env_cluster(tmp_path_factory, ENV, "payload-cluster") as local:
        yield local


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("payload-store"))


@pytest.fixture(scope="module")
def client(cluster):
    with sms.Client(cluster.address) as c:
        yield c


@pytest.fixture
def stream(client, store_dir) -> str:
    name = stream_name("payloads")
    client.create_stream(name, partitions=2, replication_factor=2, ingestion_policy=NO_DEDUP,
                         archive=f"file://{store_dir}", archive_after_s=3600, retention_s=7200)
    return name


def pattern(size: int, seed: int = 0) -> bytes:
    """Bytes that differ at every offset (a misplaced chunk would show)."""
    block = hashlib.sha256(str(seed).encode()).digest() * (MiB // 32)
    out = bytearray()
    i = 0
    while len(out) < size:
        out += block[:16] + i.to_bytes(16, "big") + block[32:MiB]
        i += 1
    return bytes(out[:size])


def upload_files(store_dir: str, stream: str) -> list[str]:
    return [os.path.join(r, f) for r, _d, fs in os.walk(os.path.join(store_dir, stream)) for f in fs
            if "/payloads/" in r + "/"]


def test_a_big_record_comes_back_in_place_or_as_its_reference(client, cluster, stream):
    data = pattern(3 * MiB + 17, 1)
    result = client.put_record(stream, data, "big")
    small = client.put_record(stream, b"small", "big")
    it = client.get_iterator(stream, result.partition_ordinal, "TRIM_HORIZON")
    records = client.get_next_records(it).records
    assert [r.sn for r in records] == [result.sn, small.sn]
    assert records[0].data == data and records[1].data == b"small"
    ref = records[0].payload
    assert ref is not None and ref.size == len(data) and ref.chunks == 1 and records[1].payload is None
    assert client.get_record(stream, result.sn).data == data
    assert [r.data for r in client.read_stream(stream)] == [data, b"small"]
    with sms.Client(cluster.address, payloads="reference") as by_ref:
        got = by_ref.get_next_records(by_ref.get_iterator(stream, result.partition_ordinal, "TRIM_HORIZON")).records
        assert got[0].data == ref.to_bytes() and got[0].payload == ref
        with by_ref.open_payload(got[0]) as f:
            assert f.read() == data


def test_a_deduplicating_producer_stores_a_payload_once(client, store_dir):
    name = stream_name("payload-dedup")
    client.create_stream(name, partitions=1, replication_factor=2, archive=f"file://{store_dir}",
                         archive_after_s=3600, retention_s=7200)
    data = pattern(2 * MiB, 2)
    with client.producer(name) as producer:
        outcome = producer.put(data, "k")
        producer.put(b"after", "k")
    records = list(client.read_stream(name))
    assert [r.data for r in records] == [data, b"after"] and records[0].sn == outcome.sn


def test_a_stream_without_an_archive_refuses_big_records(client):
    name = stream_name("no-archive")
    client.create_stream(name, partitions=1, ingestion_policy=NO_DEDUP)
    with pytest.raises(errors.RecordTooLarge, match="no archive"):
        client.put_record(name, b"x" * (limits.RECORD_DATA_BYTES_MAX + 1), "k")
    assert list(client.read_stream(name)) == []


READER = textwrap.dedent("""
    import hashlib, resource, sys, sms
    address, stream, out, offset, chunk = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    with sms.Client(address, payloads="reference") as client:
        record = next(r for r in client.read_stream(stream) if r.payload is not None)
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        digest = hashlib.sha256()
        with client.open_payload(record, offset) as f, open(out, "ab") as sink:
            while True:
                piece = f.read(chunk)
                if not piece:
                    break
                digest.update(piece)
                if out != "-":
                    sink.write(piece)
                    sink.flush()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(digest.hexdigest(), base * 1024, peak * 1024, flush=True)
""")


def reader(cluster, stream: str, out: str, offset: int = 0, chunk: int = MiB) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", READER, cluster.address, stream, out, str(offset), str(chunk)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.client_env())


def test_a_200_mib_payload_streams_back_equal_with_bounded_memory(client, cluster, stream, tmp_path):
    size = 200 * MiB
    source = tmp_path / "big.bin"
    digest = hashlib.sha256()
    with open(source, "wb") as f:
        for i in range(size // (8 * MiB)):
            block = pattern(8 * MiB, 100 + i)
            digest.update(block)
            f.write(block)
    with open(source, "rb") as f:
        result = client.put_record(stream, f, "huge")          # a file: read a chunk at a time
    assert result.ok
    proc = reader(cluster, stream, os.devnull)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    got, base, peak = out.split()
    assert got == digest.hexdigest()
    # the reader held at most a few chunks (PAYLOAD_CHUNK_BYTES each) beyond what it needed
    # before reading, never the payload: 200 MiB would show as 200 MiB more
    assert int(peak) - int(base) < 6 * limits.PAYLOAD_CHUNK_BYTES, (int(peak) - int(base)) / MiB


def test_a_reader_killed_mid_payload_resumes_where_it_stopped(client, cluster, stream, tmp_path):
    data = pattern(48 * MiB, 3)
    client.put_record(stream, data, "resume")
    out = tmp_path / "copy.bin"
    first = reader(cluster, stream, str(out), chunk=256 * 1024)
    try:
        wait_until(lambda: out.exists() and out.stat().st_size >= 12 * MiB, 120, "the reader to be a quarter in")
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    stopped = out.stat().st_size
    assert 0 < stopped < len(data)
    second = reader(cluster, stream, str(out), offset=stopped)
    _out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert out.read_bytes() == data


def test_a_corrupt_chunk_is_a_named_error(client, cluster, stream, store_dir):
    data = pattern(9 * MiB, 4)
    client.put_record(stream, data, "corrupt")
    with sms.Client(cluster.address, payloads="reference") as by_ref:
        record = next(r for r in by_ref.read_stream(stream) if r.payload is not None)
        chunk = os.path.join(store_dir, record.payload.chunk_name(1))
        with open(chunk, "r+b") as f:
            f.seek(1000)
            f.write(b"\x00" * 8 if f.read(8) != b"\x00" * 8 else b"\xff" * 8)
        with by_ref.open_payload(record) as f:
            assert len(f.read(limits.PAYLOAD_CHUNK_BYTES)) == limits.PAYLOAD_CHUNK_BYTES     # chunk 0 is whole
            with pytest.raises(errors.FragmentCorrupt):
                f.read(limits.PAYLOAD_CHUNK_BYTES)
    with pytest.raises(errors.FragmentCorrupt):              # inline reads say so too
        list(client.read_stream(stream))


def test_unclaimed_uploads_are_collected_after_the_grace_period(client, stream, store_dir):
    info = client.get_stream_info(stream)
    client.put_record(stream, pattern(2 * MiB, 5), "kept")          # claimed: stays
    abandoned = os.path.join(store_dir, info.payload_prefix, "2026010100", "1767225600000-00000000deadbeef")
    os.makedirs(abandoned)
    with open(os.path.join(abandoned, "000000"), "wb") as f:       # a chunk, never claimed
        f.write(b"\x00" * 64)
    wait_until(lambda: not os.path.exists(os.path.join(abandoned, "000000")), 30,
               "the archiver to delete an upload never claimed")
    assert len(list(client.read_stream(stream))) == 1
    assert len([f for f in upload_files(store_dir, stream) if f.endswith("claimed")]) == 1


def test_retention_deletes_payloads_with_their_records(client, store_dir):
    name = stream_name("payload-retention")
    client.create_stream(name, partitions=1, ingestion_policy=NO_DEDUP, archive=f"file://{store_dir}",
                         archive_after_s=1, local_retention_s=1, retention_s=10)
    client.put_record(name, pattern(2 * MiB, 6), "k")
    assert upload_files(store_dir, name)
    wait_until(lambda: not upload_files(store_dir, name), 60,
               "the payload deleted once its record left the stream (retention + grace)")


def test_a_header_named_like_a_reference_never_blocks_readers(client, stream):
    """A record whose `sms-payload` header is not a reference (any writer may set headers)
    reads back as it was stored; the records around it read on."""
    first = client.put_record(stream, b"before", "h")
    odd = client.put_record(stream, b"not a reference", "h", headers={"sms-payload": b"not json"})
    last = client.put_record(stream, b"after", "h")
    got = client.get_next_records(client.get_iterator(stream, first.partition_ordinal, "TRIM_HORIZON")).records
    assert [(r.sn, r.data) for r in got] == [(first.sn, b"before"), (odd.sn, b"not a reference"), (last.sn, b"after")]


def test_records_from_a_generator_with_big_ones_are_all_stored(client, stream):
    big = pattern(2 * MiB, 7)
    result = client.put_records(stream, ((k, d) for k, d in [("g", b"small"), ("g", big), ("g", b"tail")]))
    assert result.failed_record_count == 0 and len(result.records) == 3
    got = client.get_next_records(client.get_iterator(stream, result.records[0].partition_ordinal,
                                                      "TRIM_HORIZON")).records
    assert [r.data for r in got] == [b"small", big, b"tail"]


def test_a_page_of_payloads_is_cut_at_the_inline_budget(client, stream, monkeypatch):
    monkeypatch.setattr(limits, "PAYLOAD_INLINE_PAGE_BYTES_MAX", 5 * MiB)     # (this process: the reader's)
    datas = [pattern(2 * MiB + i, 20 + i) for i in range(5)]
    result = client.put_records(stream, [("budget", d) for d in datas])
    it = client.get_iterator(stream, result.records[0].partition_ordinal, "TRIM_HORIZON")
    pages = []
    while it:
        page = client.get_next_records(it, max_records=100)
        if not page.records:
            break
        pages.append([r.data for r in page.records])
        it = page.next_iterator
    assert [len(p) for p in pages] == [2, 2, 1]                 # 2 x 2 MiB fit in 5 MiB, a third does not
    assert [d for p in pages for d in p] == datas


def test_an_update_from_a_client_without_the_archive_fields_works(client, stream):
    from sms.proto import sms_pb2
    before = client.get_stream_info(stream)
    client._run(client._aio._admin_call("UpdateStream", sms_pb2.UpdateStreamRequest(name=stream, retention_s=5400)))
    after = client.get_stream_info(stream)
    assert after.retention_s == 5400 and after.archive == before.archive
    assert after.archive_after_s == before.archive_after_s
    assert after.local_retention_s == min(before.local_retention_s, 5400)      # (never past the retention)
