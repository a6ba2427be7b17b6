"""The Kinesis endpoint under big concurrent PutRecords (issue 32): 100 boto3 callers at
once, each sending PutRecords of 256 KiB records round-robin to every storage node's
endpoint, the load that runs kinesis-mock (LocalStack's emulator) out of memory. Every
node's memory stays bounded while it runs, and every record boto3 saw acknowledged reads
back, its data intact.

What is bounded is the resident memory the kernel cannot take back from a node: its
anonymous pages (RssAnon of /proc/PID/status: the heap, where request bodies, decoded
records and batches live) plus its shared-memory pages (RssShmem), the memory an
out-of-memory kill is about. A node's file-backed resident pages (RssFile) are the LMDB
data files it maps: page cache the kernel drops under pressure, growing with the data
stored and read, not with the load; they are sampled and printed (in VmRSS too), not
bounded."""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import threading
import time

import pytest

boto3 = pytest.importorskip("boto3")
from botocore.config import Config  # noqa: E402
from botocore.exceptions import BotoCoreError, ClientError  # noqa: E402

import sms  # noqa: E402
from sms import security  # noqa: E402
from tests.conftest import assert_all_alive, stream_name  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODE_RESIDENT_BYTES_MAX = 1024 ** 3   # a node's RssAnon + RssShmem, at most (the 1 GiB)
CALLERS = 100                     # PutRecords calls in flight at once
RECORD_BYTES = 256 * 1024
RECORDS_PER_CALL = 8              # 2 MiB of data a call (2.7 MiB of JSON once base64'd)
ROUNDS = 4                        # calls each caller makes: CALLERS * ROUNDS * 2 MiB (0.8 GiB) of data in all (the
                                  # peak, CALLERS calls in flight, is the same with more rounds: 8 took 30 s more)
SHARDS = 4
SAMPLE_INTERVAL_S = 0.1
DISK_HEADROOM = 2                 # free space wanted: the data times its replicas, times this (LMDB pages, logs)
REPLICAS = 3                      # CreateStream's replication factor on a 3-storage-node cluster
CALL_TIMEOUT_S = 120              # a call's read timeout: under this load one may wait its turn long
WRITE_DEADLINE_S = 600            # the callers are all done by then, or the test fails (a hang, not slowness)


def _memory(pid: int) -> dict[str, int]:
    """A process's resident memory in bytes: VmRSS, RssAnon, RssFile, RssShmem and VmHWM
    (the peak of VmRSS, as the kernel kept it); {} once it is gone."""
    wanted = {"VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"}
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in wanted:
                    out[name] = int(value.split()[0]) * 1024       # (kB)
    except (FileNotFoundError, ProcessLookupError):
        return {}
    return out


class MemorySampler:
    """Samples every node process's memory every SAMPLE_INTERVAL_S in a thread, keeping
    each figure's peak per node, and the peak of RssAnon + RssShmem ("Unreclaimable")."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.peaks: dict[str, dict[str, int]] = {node: {} for node in pids}
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "MemorySampler":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)
        self.sample()

    def sample(self) -> None:
        for node, pid in self.pids.items():
            sample = _memory(pid)
            if sample:
                sample["Unreclaimable"] = sample.get("RssAnon", 0) + sample.get("RssShmem", 0)
            for name, value in sample.items():
                self.peaks[node][name] = max(self.peaks[node].get(name, 0), value)
        self.samples += 1

    def _run(self) -> None:
        while not self.stop.wait(SAMPLE_INTERVAL_S):
            self.sample()


def _data(caller: int, round_: int, index: int, filler: bytes) -> bytes:
    """A record's data: RECORD_BYTES, unique by its header, the rest a caller's random filler."""
    header = f"{caller}/{round_}/{index}/".encode()
    return header + filler[len(header):]


def test_100_concurrent_put_records_of_256_kib_records_keep_every_node_bounded(make_cluster):
    cluster = make_cluster()
    data_bytes = CALLERS * ROUNDS * RECORDS_PER_CALL * RECORD_BYTES
    free = shutil.disk_usage(cluster.data_dir).free
    if free < data_bytes * REPLICAS * DISK_HEADROOM:
        pytest.skip(f"{free >> 20} MiB free under {cluster.data_dir}; the test stores {data_bytes >> 20} MiB "
                    f"{REPLICAS} times and wants {DISK_HEADROOM}x that free")
    endpoints = [n.kinesis_address for n in cluster.procs.values() if n.kinesis_address and n.roles != "control"]
    assert len(endpoints) >= 2, f"storage nodes' Kinesis endpoints: {endpoints}"
    key_id, secret = security.aws_credentials(cluster.admin_token)
    config = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=10,
                    read_timeout=CALL_TIMEOUT_S, max_pool_connections=CALLERS)
    # one client per endpoint, shared by the callers it serves (boto3 clients are thread-safe)
    clients = [boto3.client("kinesis", endpoint_url=url, region_name="us-east-1", aws_access_key_id=key_id,
                            aws_secret_access_key=secret, verify=cluster.ca_file, config=config)
               for url in endpoints]
    name = stream_name("k-memory")
    clients[0].create_stream(StreamName=name, ShardCount=SHARDS)
    clients[0].get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})

    acked: dict[tuple[str, str], bytes] = {}      # (partition key, sequence number) -> the data's digest
    refused = [0]                                 # records answered with an ErrorCode
    failures: list[str] = []                      # calls that failed after boto3's retries
    in_flight = [0, 0]                            # calls under way now, and the most at once
    lock = threading.Lock()
    start = threading.Barrier(CALLERS)

    def caller(i: int) -> None:
        try:
            put(i)
        except BaseException as e:      # (a bug of the test: reported, not lost with its thread)
            with lock:
                failures.append(f"caller {i} crashed: {type(e).__name__}: {e}")
            raise

    def put(i: int) -> None:
        kinesis = clients[i % len(clients)]
        filler = os.urandom(RECORD_BYTES)
        start.wait(60)
        for round_ in range(ROUNDS):
            keys = [f"c{i}-r{round_}-{j}" for j in range(RECORDS_PER_CALL)]
            records = [{"PartitionKey": k, "Data": _data(i, round_, j, filler)} for j, k in enumerate(keys)]
            digests = [hashlib.blake2b(r["Data"], digest_size=16).digest() for r in records]
            with lock:
                in_flight[0] += 1
                in_flight[1] = max(in_flight[1], in_flight[0])
            try:
                answer = kinesis.put_records(StreamName=name, Records=records)
            except (ClientError, BotoCoreError) as e:
                with lock:
                    failures.append(f"{type(e).__name__}: {str(e)[:200]}")
                continue
            finally:
                with lock:
                    in_flight[0] -= 1
                del records
            with lock:
                for k, digest, r in zip(keys, digests, answer["Records"]):
                    if "SequenceNumber" in r:
                        acked[(k, r["SequenceNumber"])] = digest
                    else:
                        refused[0] += 1

    pids = {node_id: n.pid for node_id, n in cluster.procs.items()}
    began = time.monotonic()
    with MemorySampler(pids) as memory:
        threads = [threading.Thread(target=caller, args=(i,), name=f"caller-{i}", daemon=True)
                   for i in range(CALLERS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + WRITE_DEADLINE_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hung = [t.name for t in threads if t.is_alive()]
    took = time.monotonic() - began
    assert not hung, f"{len(hung)} callers still under way: {hung[:5]}"
    assert_all_alive(cluster)

    def mib(node: str, figure: str) -> str:
        return f"{memory.peaks[node].get(figure, 0) / 2 ** 20:.0f}"
    summary = "; ".join(f"{node} anon {mib(node, 'RssAnon')} shmem {mib(node, 'RssShmem')} "
                        f"file {mib(node, 'RssFile')} rss {mib(node, 'VmRSS')} hwm {mib(node, 'VmHWM')}"
                        for node in pids)
    print(f"\nkinesis memory: {len(acked)} records acked ({len(acked) * RECORD_BYTES / 2 ** 20:.0f} MiB), "
          f"{refused[0]} refused, {len(failures)} calls failed, {in_flight[1]} calls in flight at most, "
          f"{took:.1f}s writing ({memory.samples} samples); peaks in MiB: {summary}")

    # every acknowledged record reads back intact (streamed through: only digests are held)
    read_back, changed = 0, []
    with sms.Client(cluster.address) as native:
        for record in native.read_stream(name):
            digest = acked.pop((record.partition_key, record.sequence_number), None)
            if digest is None:
                continue            # (a call boto3 resent after its answer was lost: stored twice)
            read_back += 1
            if len(record.data) != RECORD_BYTES or hashlib.blake2b(record.data, digest_size=16).digest() != digest:
                changed.append(f"{record.partition_key} at {record.sequence_number} ({len(record.data)} bytes)")
    print(f"kinesis memory: {read_back} acknowledged records read back, {len(changed)} of them changed, "
          f"{len(acked)} missing")

    over = {node: peaks.get("Unreclaimable", 0) >> 20 for node, peaks in memory.peaks.items()
            if peaks.get("Unreclaimable", 0) > NODE_RESIDENT_BYTES_MAX}
    assert not over, (f"nodes over {NODE_RESIDENT_BYTES_MAX >> 20} MiB of anonymous + shared resident memory "
                      f"(MiB): {over}")
    assert in_flight[1] >= CALLERS * 9 // 10, f"only {in_flight[1]} calls were ever in flight at once"
    assert read_back, f"no record acknowledged; failures: {failures[:3]}"
    assert not changed, f"{len(changed)} acknowledged records read back changed, e.g. {changed[:3]}"
    assert not acked, f"{len(acked)} acknowledged records not read back, e.g. {list(itertools.islice(acked, 3))}"
