"""The archive tier under faults (issue 18, item 6), through real processes and a real
`file://` fragment store: a chain tail killed while it writes fragments, a store that is
unreachable or full for a while, and fragments corrupted or deleted in the store, before
and after the replicas dropped their local copies of them.

Whatever the fault, nothing acknowledged is lost or read twice: each test reads every
partition back from TRIM_HORIZON (or shows the named error a damaged fragment gives),
and every node process stays up (but the one a test kills, which it starts again).

The nodes archive at once (SMS_ARCHIVE_FLUSH_S=0), check every 0.2 s, and verify
fragments only when their records are due to leave the replicas
(SMS_ARCHIVE_VERIFY_AHEAD_S=0), so a test can corrupt a fragment before it is verified.
"""

from __future__ import annotations

import errno
import os
import shutil
import ssl
import subprocess
import threading
import time
import urllib.request
from collections import defaultdict
from typing import NamedTuple

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

import sms
from archive import fragment
from archive.fragment import FragmentRef
from sms import errors, seqno
from sms.proto import sms_pb2, sms_pb2_grpc
from tests.conftest import client_channel, env_cluster, stream_name, wait_until

pytestmark = [pytest.mark.integration]

NO_DEDUP = "at_least_once_dup_permitted"      # a de-duplicating stream keeps its dedup window locally
ENV = {"SMS_ARCHIVE_FLUSH_S": "0", "SMS_ARCHIVE_CHECK_INTERVAL_S": "0.2", "SMS_RETENTION_CHECK_INTERVAL_S": "0.2",
       "SMS_ARCHIVE_VERIFY_AHEAD_S": "0"}
ARCHIVE_AFTER_S = 1
LOCAL_RETENTION_S = 2
TIMEOUT_S = 60
TMPFS_BYTES = 512 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with env_cluster(tmp_path_factory, ENV, "archive-faults") as local:
        yield local


@pytest.fixture
def client(cluster):
    c = sms.Client(cluster.address)
    try:
        yield c
    finally:
        c.close()


# --- helpers ---------------------------------------------------------------------------

class Acked(NamedTuple):
    sn: int
    ordinal: int
    data: bytes


def put_rounds(client, stream: str, rounds: int, per_round: int, tag: str) -> list[Acked]:
    """`rounds` put_records calls (a batch per partition each); every record acked, in order."""
    acked = []
    for n in range(rounds):
        records = [(f"k{i}", f"{tag}{n}-{i}-{os.urandom(6).hex()}".encode()) for i in range(per_round)]
        out = client.put_records(stream, records)
        assert out.failed_record_count == 0, [r for r in out.records if not r.ok][:3]
        acked.extend(Acked(r.sn, r.partition_ordinal, data) for r, (_k, data) in zip(out.records, records))
    return acked


def by_ordinal(acked: list[Acked]) -> dict[int, list[Acked]]:
    out: dict[int, list[Acked]] = defaultdict(list)
    for a in acked:
        out[a.ordinal].append(a)
    return out


def firsts_of(acked: list[Acked]) -> dict[int, int]:
    """The first SN of each partition among `acked`."""
    return {o: min(a.sn for a in v) for o, v in by_ordinal(acked).items()}


def live_addresses(cluster) -> list[str]:
    gone = cluster.exited()
    return [n.address for node_id, n in cluster.procs.items() if n.roles != "control" and node_id not in gone]


def replicas(address: str, stream: str) -> list:
    """The node's replicas of `stream` ([] if the node does not answer: stopping, starting)."""
    try:
        with client_channel(address) as channel:
            resp = sms_pb2_grpc.ControlStub(channel).NodeStatus(sms_pb2.NodeStatusRequest(), timeout=5)
    except grpc.RpcError:
        return []
    return [r for r in resp.replicas if r.chain_id.rpartition(":")[0] == stream]


def all_replicas(cluster, stream: str) -> dict[int, list]:
    """ordinal -> the status of every replica of it, on every live node."""
    out: dict[int, list] = defaultdict(list)
    for address in live_addresses(cluster):
        for r in replicas(address, stream):
            out[int(r.chain_id.rpartition(":")[2])].append(r)
    return out


def tails(cluster, stream: str) -> dict[int, object]:
    """ordinal -> its tail's status (the one with the archive's figures); the newest
    epoch's, should an old tail not have heard of a chain change yet."""
    out = {}
    for ordinal, rs in all_replicas(cluster, stream).items():
        ts = [r for r in rs if r.role in ("tail", "head+tail")]
        if ts:
            out[ordinal] = max(ts, key=lambda r: r.epoch)
    return out


def wait_archived(cluster, stream: str, upto: dict[int, int], timeout_s: float = TIMEOUT_S) -> None:
    """Until each partition's tail reports `archived_sn` >= upto[ordinal]."""
    def done():
        t = tails(cluster, stream)
        return all(o in t and int(t[o].archived_sn or 0) >= sn for o, sn in upto.items())
    wait_until(done, timeout_s, f"{stream}: archived up to {upto}")


def wait_dropped_locally(cluster, stream: str, below: dict[int, int], timeout_s: float = TIMEOUT_S) -> None:
    """Until every replica of each partition stores nothing below `below[ordinal]`."""
    def dropped():
        reps = all_replicas(cluster, stream)
        return all(reps.get(o) and all(int(r.first_sn) >= sn for r in reps[o]) for o, sn in below.items())
    wait_until(dropped, timeout_s, f"{stream}: local copies below {below} deleted on every replica")


def drain(client, stream: str, ordinal: int, iterator_type: str = "TRIM_HORIZON", page: int = 137, **kw) -> list:
    """Every record from a position on, in pages (137: pages that cut batches)."""
    iterator = client.get_iterator(stream, ordinal, iterator_type, **kw)
    records = []
    for _ in range(10_000):
        result = client.get_next_records(iterator, max_records=page)
        records.extend(result.records)
        iterator = result.next_iterator
        if not result.records:
            return records
    raise AssertionError("not caught up")


def assert_read_back_once(client, stream: str, acked: list[Acked], page: int = 137,
                          extra_allowed: bool = False) -> dict[int, list]:
    """Every acked record is read back exactly once from TRIM_HORIZON, in order per
    partition, with its data; no SN comes twice. `extra_allowed`: records stored without
    an ack (a put that failed after storing them; the stream permits duplicates) may be
    read too (the caller checks they were sent). What was read, by ordinal."""
    out = {}
    for ordinal, want in by_ordinal(acked).items():
        got = out[ordinal] = drain(client, stream, ordinal, page=page)
        sns = [r.sn for r in got]
        assert all(a < b for a, b in zip(sns, sns[1:])), f"p{ordinal}: SNs read out of order or twice"
        if not extra_allowed:
            assert [(r.sn, r.data) for r in got] == [(a.sn, a.data) for a in want], f"p{ordinal}"
            continue
        read = {r.sn: r.data for r in got}
        lost = [a.sn for a in want if a.sn not in read]
        assert not lost, f"p{ordinal}: {len(lost)} acked records not read back, first {lost[:3]}"
        changed = [a.sn for a in want if read[a.sn] != a.data]
        assert not changed, f"p{ordinal}: acked records read back with other data: {changed[:3]}"
    return out


def assert_alive(cluster) -> None:
    exited = cluster.exited()
    assert not exited, f"node processes exited: {exited} (logs in {cluster.data_dir}/logs)"


def scrape_total(cluster, name: str, **labels) -> float:
    """`name` summed over every storage node's /metrics, for samples with `labels`."""
    total = 0.0
    context = ssl.create_default_context(cafile=cluster.ca_file) if cluster.tls else None
    for node_id, node in cluster.procs.items():
        if node.roles == "control" or node_id in cluster.exited():
            continue
        url = f"{'https' if cluster.tls else 'http'}://{node.metrics_address}/metrics"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {cluster.admin_token}"})
        text = urllib.request.urlopen(request, context=context, timeout=10).read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
    return total


def partition_dir(store: str, client, stream: str, ordinal: int) -> str:
    info = client.get_stream_info(stream)
    return os.path.join(store, fragment.partition_prefix(stream, info.created_ms, ordinal))


def fragment_files(directory: str) -> list[tuple[FragmentRef, str]]:
    """The fragment files of a partition directory (no temp files), oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    refs = [(ref, os.path.join(directory, n)) for n in names if (ref := FragmentRef.parse(n)) is not None]
    return sorted(refs, key=lambda x: x[0].first_sn)


def corrupt_middle(path: str) -> bytes:
    """Flip 16 bytes in the middle of a file (its size unchanged); the new contents."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        mid = max(fragment.HEADER.size, len(data) // 2 - 8)
        assert len(data) >= mid + 16, f"{path}: {len(data)} bytes, too short to corrupt its body"
        data[mid:mid + 16] = bytes(b ^ 0xFF for b in data[mid:mid + 16])
        f.seek(mid)
        f.write(data[mid:mid + 16])
        f.flush()
        os.fsync(f.fileno())
    with pytest.raises(errors.FragmentCorrupt):
        fragment.decode(FragmentRef.parse(os.path.basename(path)), bytes(data))
    return bytes(data)


# --- a store that fails for a while ---------------------------------------------------

def outage(cluster, client, store: str, break_store, restore_store, expect: str) -> None:
    """A 2-partition stream archives to `store`; `break_store()` makes its writes fail;
    records put meanwhile are acked, the tails report the error and a growing lag, and no
    replica deletes what is not archived; `restore_store()`: archiving catches up, local
    copies go, and every record reads back once."""
    stream = stream_name("outage")
    client.create_stream(stream, partitions=2, replication_factor=2, ingestion_policy=NO_DEDUP,
                         archive=f"file://{store}", archive_after_s=ARCHIVE_AFTER_S,
                         local_retention_s=LOCAL_RETENTION_S, retention_s=3600)
    broken = False
    try:
        before = put_rounds(client, stream, 3, 30, "before")
        wait_archived(cluster, stream, {o: max(a.sn for a in v) for o, v in by_ordinal(before).items()})
        break_store()
        broken = True
        during = put_rounds(client, stream, 4, 30, "during")      # (writes go on: every record acked)
        unarchived = firsts_of(during)                            # nothing of these can be archived now

        def failing():
            t = tails(cluster, stream)
            return all(o in t and t[o].archive_error and t[o].archive_lag_ms > 0 for o in unarchived) and t
        first = wait_until(failing, 20, f"{stream}: the tails report the store's failure and a lag")
        for o, r in first.items():
            assert "ArchiveUnavailable" in r.archive_error, r.archive_error     # (writing, or verifying)
            assert expect in r.archive_error, r.archive_error
            assert int(r.archived_sn) < unarchived[o]
        # over a few archive and retention intervals, until the unarchived records are well
        # past local retention: no replica deletes any of them (an observation of something
        # that must NOT happen, hence a fixed window)
        until = seqno.timestamp_ms_of(max(a.sn for a in during)) / 1000 + LOCAL_RETENTION_S + 2.5
        lags = {o: r.archive_lag_ms for o, r in first.items()}
        while time.time() < until:
            for o, rs in all_replicas(cluster, stream).items():
                for r in rs:
                    assert 0 < int(r.first_sn) <= unarchived[o], (
                        f"p{o}: a replica deleted records the archive does not hold: first_sn {r.first_sn}"
                        f" > {unarchived[o]}")
            time.sleep(0.2)

        def grown():
            t = tails(cluster, stream)
            for o in unarchived:
                assert t[o].archive_error, f"p{o}: the error cleared while the store still fails"
                assert int(t[o].archived_sn) < unarchived[o], f"p{o}: archived while the store fails"
            return all(t[o].archive_lag_ms > lags[o] for o in unarchived)
        wait_until(grown, 20, f"{stream}: the archive lag grows while the store fails (first {lags})")
        assert scrape_total(cluster, "sms_archive_errors_total", stream=stream, error="ArchiveUnavailable") >= 2
        assert_alive(cluster)

        restore_store()
        broken = False
        last = put_rounds(client, stream, 1, 30, "after")         # (a log's newest batch always stays)

        def caught_up():
            t = tails(cluster, stream)
            return all(o in t and not t[o].archive_error and int(t[o].verified_sn) >= max(a.sn for a in v)
                       for o, v in by_ordinal(during).items())
        wait_until(caught_up, TIMEOUT_S, f"{stream}: archiving caught up after the store came back")
        wait_dropped_locally(cluster, stream, firsts_of(last))
        assert_read_back_once(client, stream, before + during + last)
        assert_alive(cluster)
    finally:
        if broken:
            restore_store()
        client.delete_stream(stream)


def test_store_unavailable_keeps_local_copies_until_it_is_back(cluster, client, tmp_path):
    store = str(tmp_path / "store")
    os.mkdir(store)
    away = store + ".away"

    def break_store():
        # a regular file where the store's directory was: every put fails (EEXIST/ENOTDIR)
        os.rename(store, away)
        with open(store, "w") as f:
            f.write("not a directory\n")

    def restore_store():
        os.unlink(store)
        os.rename(away, store)

    outage(cluster, client, store, break_store, restore_store, "fragment store")


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs (TMPFS_BYTES), unmounted at teardown; skipped where mounting is refused."""
    mount = str(tmp_path / "tmpfs")
    os.mkdir(mount)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", mount],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root / CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", mount], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mount], check=True)


def test_store_full_keeps_local_copies_until_there_is_room(cluster, client, tmpfs):
    store = os.path.join(tmpfs, "archive")
    filler = os.path.join(tmpfs, "filler")

    def fill():
        with open(filler, "wb", buffering=0) as f:
            for size in (64 << 10, 4 << 10, 1):
                try:
                    while True:
                        f.write(b"\0" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
        assert shutil.disk_usage(tmpfs).free < 4096

    outage(cluster, client, store, fill, lambda: os.unlink(filler), "is full")


# --- corrupt and missing fragments ------------------------------------------------------

def test_fragment_corrupted_while_records_are_local_is_rewritten(cluster, client, tmp_path):
    """Verification (when the records are due to leave the replicas) finds the damage and
    writes the fragment again from the tail's copy; only then do local copies go."""
    store = str(tmp_path / "store")
    stream = stream_name("repair")
    local_retention_s = 8
    client.create_stream(stream, partitions=1, replication_factor=2, ingestion_policy=NO_DEDUP,
                         archive=f"file://{store}", archive_after_s=ARCHIVE_AFTER_S,
                         local_retention_s=local_retention_s, retention_s=3600)
    repairs_before = scrape_total(cluster, "sms_archive_repairs_total", stream=stream)
    acked = put_rounds(client, stream, 8, 40, "old")
    directory = partition_dir(store, client, stream, 0)
    ref, path = wait_until(lambda: fragment_files(directory)[:1], 20, f"{stream}: a first fragment file")[0]
    # verified only once its records are local_retention_s old: there is time to damage it
    assert time.time() < seqno.timestamp_ms_of(ref.first_sn) / 1000 + local_retention_s - 2, "too slow to corrupt"
    bad = corrupt_middle(path)
    last = put_rounds(client, stream, 1, 10, "new")          # (a log's newest batch always stays)

    wait_dropped_locally(cluster, stream, firsts_of(last), timeout_s=TIMEOUT_S)
    with open(path, "rb") as f:
        now = f.read()
    assert now != bad and len(now) == len(bad)
    assert fragment.decode(ref, now).ref == ref              # whole again (FragmentCorrupt otherwise)
    assert scrape_total(cluster, "sms_archive_repairs_total", stream=stream) >= repairs_before + 1
    t = tails(cluster, stream)[0]
    assert t.archive_error == "" and int(t.verified_sn) >= ref.last_sn
    assert_read_back_once(client, stream, acked + last)
    assert_alive(cluster)


def test_damaged_fragment_after_local_copies_are_gone_is_a_named_error(cluster, client, tmp_path):
    """Once no replica holds its records, a corrupt fragment cannot be repaired: reading
    inside it is FragmentCorrupt, inside a deleted one FragmentMissing; the rest of the
    stream reads on, and the nodes stay up. (A fresh stream: no node has cached or
    prefetched any of its fragments before they are damaged.)"""
    store = str(tmp_path / "store")
    stream = stream_name("damaged")
    client.create_stream(stream, partitions=1, replication_factor=2, ingestion_policy=NO_DEDUP,
                         archive=f"file://{store}", archive_after_s=ARCHIVE_AFTER_S,
                         local_retention_s=LOCAL_RETENTION_S, retention_s=3600)
    rounds = []
    for n in range(3):                                   # a fragment each: archived before the next
        rounds.append(put_rounds(client, stream, 1, 30, f"a{n}-"))
        wait_archived(cluster, stream, {0: rounds[-1][-1].sn})
    local = put_rounds(client, stream, 1, 30, "local")  # (a log's newest batch always stays)
    wait_dropped_locally(cluster, stream, firsts_of(local))
    t = tails(cluster, stream)[0]
    assert int(t.verified_sn) >= rounds[-1][-1].sn

    files = fragment_files(partition_dir(store, client, stream, 0))
    holding = []
    for rnd in rounds:
        holding.append(next(x for x in files if x[0].first_sn <= rnd[0].sn and rnd[-1].sn <= x[0].last_sn))
    assert len({ref for ref, _p in holding}) == 3, holding
    (corrupt_ref, corrupt_path), (missing_ref, missing_path), _whole = holding
    corrupt_middle(corrupt_path)
    os.unlink(missing_path)

    inside = rounds[0][len(rounds[0]) // 2].sn
    with pytest.raises(errors.FragmentCorrupt) as caught:
        drain(client, stream, 0, "AT_SEQUENCE_NUMBER", sequence_number=inside)
    assert not isinstance(caught.value, errors.FragmentMissing)
    assert corrupt_ref.name in str(caught.value), str(caught.value)
    with pytest.raises(errors.FragmentCorrupt):         # from the start too: it is the first fragment
        drain(client, stream, 0, "TRIM_HORIZON")
    with pytest.raises(errors.FragmentMissing):
        drain(client, stream, 0, "AT_SEQUENCE_NUMBER", sequence_number=rounds[1][5].sn)
    with pytest.raises(errors.FragmentCorrupt):         # again: the error is not cached away as data
        drain(client, stream, 0, "AT_SEQUENCE_NUMBER", sequence_number=inside)

    # the rest reads on: the whole third fragment, then the local tier
    rest = rounds[2] + local
    got = drain(client, stream, 0, "AT_SEQUENCE_NUMBER", sequence_number=rounds[2][0].sn)
    assert [(r.sn, r.data) for r in got] == [(a.sn, a.data) for a in rest]
    got = drain(client, stream, 0, "AT_SEQUENCE_NUMBER", sequence_number=local[3].sn)
    assert [r.sn for r in got] == [a.sn for a in local[3:]]
    assert client.get_record(stream, rounds[2][7].sn).data == rounds[2][7].data
    with pytest.raises(errors.FragmentMissing):
        client.get_record(stream, rounds[1][0].sn)
    assert_alive(cluster)
    assert tails(cluster, stream)[0].archive_error == "", "the archiver is not disturbed by what it verified before"


# --- a tail killed while it writes fragments -------------------------------------------

class Producer(threading.Thread):
    """Puts records until stopped, retrying what fails; keeps only acked results."""

    def __init__(self, address: str, stream: str):
        super().__init__(name="producer", daemon=True)
        self.client = sms.Client(address)
        self.stream = stream
        self.stop = threading.Event()
        self.acked: list[Acked] = []
        self.sent: set[bytes] = set()
        self.failures = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            pending: list[tuple[str, bytes]] = []
            n = 0
            while not self.stop.is_set():
                while len(pending) < 20:
                    n += 1
                    pending.append((f"k{n % 50}", f"load-{n}-{os.urandom(4).hex()}".encode()))
                    self.sent.add(pending[-1][1])
                try:
                    out = self.client.put_records(self.stream, pending)
                except errors.SmsError:
                    self.failures += 1
                    self.stop.wait(0.1)                      # (retry pacing)
                    continue
                retry = []
                for r, record in zip(out.records, pending):
                    if r.ok:
                        self.acked.append(Acked(r.sn, r.partition_ordinal, record[1]))
                    else:
                        retry.append(record)
                        self.failures += 1
                pending = retry
                self.stop.wait(0.02)                         # (load pacing on a 2-core machine)
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            self.error = e
        finally:
            self.client.close()


def test_tail_killed_while_writing_fragments(cluster, client, tmp_path):
    store = str(tmp_path / "store")
    stream = stream_name("killed-tail")
    client.create_stream(stream, partitions=2, replication_factor=3, ingestion_policy=NO_DEDUP,
                         archive=f"file://{store}", archive_after_s=ARCHIVE_AFTER_S,
                         local_retention_s=LOCAL_RETENTION_S, retention_s=3600)
    p0 = partition_dir(store, client, stream, 0)
    producer = Producer(cluster.address, stream)
    producer.start()
    try:
        wait_until(lambda: len(fragment_files(p0)) >= 3 or producer.error, 30, f"{stream}: fragments being written")
        assert producer.error is None, producer.error
        victim = client.get_stream_info(stream).partitions[0].chain[-1].node_id
        archived_then = int(tails(cluster, stream)[0].archived_sn)
        acked_then = acked_at_kill = len(producer.acked)
        cluster.kill(victim)
        assert set(cluster.exited()) == {victim}

        # load goes on, and so does archiving, by the new tail
        wait_until(lambda: len(producer.acked) >= acked_then + 400 or producer.error, TIMEOUT_S,
                   "puts acked again after the kill")
        assert producer.error is None, producer.error

        def archived_by_another():
            t = tails(cluster, stream).get(0)
            return t is not None and int(t.archived_sn) > archived_then and not t.archive_error
        wait_until(archived_by_another, TIMEOUT_S, "p0 archived on by its new tail")
        assert set(cluster.exited()) == {victim}, "only the killed node is down"

        cluster.restart(victim)
        acked_then = len(producer.acked)
        wait_until(lambda: len(producer.acked) >= acked_then + 200 or producer.error, TIMEOUT_S,
                   "puts acked while the restarted node rejoins")
    finally:
        producer.stop.set()
        producer.join(30)
    assert not producer.is_alive()
    assert producer.error is None, producer.error

    def chains_whole():
        parts = client.get_stream_info(stream).partitions
        return all(len(p.chain) == 3 and not p.learners for p in parts)
    wait_until(chains_whole, TIMEOUT_S, f"{stream}: every chain has its 3 members again")
    last = put_rounds(client, stream, 1, 40, "final")       # (a log's newest batch always stays)
    # everything acked before the final round is archived, verified and gone from every replica
    wait_dropped_locally(cluster, stream, firsts_of(last))
    t = tails(cluster, stream)
    for o, v in by_ordinal(producer.acked).items():
        assert int(t[o].verified_sn) >= max(a.sn for a in v) and t[o].archive_error == "", t[o]
    assert len(producer.acked) > acked_at_kill + 600
    read = assert_read_back_once(client, stream, producer.acked + last, page=1000, extra_allowed=True)
    sent = producer.sent | {a.data for a in last}
    for ordinal, got in read.items():
        unknown = [r.sn for r in got if r.data not in sent]
        assert not unknown, f"p{ordinal}: records read back that were never sent: {unknown[:3]}"
    assert_alive(cluster)
