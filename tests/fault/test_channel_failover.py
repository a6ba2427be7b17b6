"""Channels under faults (issue 34; delivery/, docs/channels.md): real processes, real kill -9.

A producer writes to a two-partition stream delivered by two channels at once, one into
Parquet files and one into an Iceberg table (the cluster's SQLite catalog). The node that
delivers partition 0 (its chain head) is killed with SIGKILL in the middle of a commit:
the trial watches the destination for the commit's first trace (a file store's temp file;
a table's new data file that no snapshot holds yet), stops the node there (SIGSTOP), checks
that the commit is still unfinished, and kills it; or, in the pause trials, leaves it
stopped until another node has taken the partition over and committed, then lets it go on
with its commit (which must not land: a zombie writer; the pause trials run on ZooKeeper:
a process stopped on the embedded store may hold its LMDB writer lock and stall every
writer, metastore/embedded.py). Another node becomes the
partition's head and its worker resumes from what the destination holds. The checker proves, after
the load, that each destination holds every record of the stream exactly once (by SN),
and every record the producer saw acknowledged; and that the killed commit's trace is
there, unreferenced (the kill really was mid-commit).
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

import sms
from sms import limits
from sms.types import ChannelPartition
from node.launcher import LocalCluster
from tests.conftest import CLUSTER_NODES, read_stream, wait_until
from tests.fault.trials import backend_store
from tests.zkserver import skip_reason, zk_available

pytestmark = [pytest.mark.integration, pytest.mark.slow]

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("pyiceberg")

RECORDS = 6_000
DONE_WITHIN_S = limits.METASTORE_SESSION_TTL_S * 4 + 90
CATCH_WITHIN_S = 90


def _producer(client, stream: str, acked: set[bytes], stop: threading.Event) -> None:
    for start in range(0, RECORDS, 100):
        batch = [{"data": b"ev-%d" % i, "partition_key": f"k{i}"} for i in range(start, start + 100)]
        while batch:
            try:
                result = client.put_records(stream, batch)
            except sms.errors.SmsError:      # (while the head moves: again; a record stored twice is in the stream twice)
                continue
            acked.update(b["data"] for b, r in zip(batch, result.records) if r.ok)
            batch = [b for b, r in zip(batch, result.records) if not r.ok]
        if stop.is_set():
            return
        time.sleep(0.1)                      # (the load's pace: it still writes when the fault comes)


_catalogs: dict[str, object] = {}


def _catalog(cluster):
    """The cluster's catalog, opened once (opening one makes its tables: a write)."""
    from pyiceberg.catalog.sql import SqlCatalog
    if cluster.data_dir not in _catalogs:
        _catalogs[cluster.data_dir] = SqlCatalog("sms", uri=f"sqlite:///{cluster.data_dir}/channels/catalog.db",
                                                 warehouse=f"file://{cluster.data_dir}/channels/warehouse")
    return _catalogs[cluster.data_dir]


def _table_files(cluster) -> set[str] | None:
    """The data files of the table's current snapshot; None while the catalog's SQLite file
    is locked (a node stopped inside its catalog transaction holds the lock)."""
    import sqlalchemy.exc
    try:
        table = _catalog(cluster).load_table("events.stream")
    except sqlalchemy.exc.OperationalError as e:
        if "locked" in str(e):
            return None
        raise
    return {p.removeprefix("file://") for p in table.inspect.files().column("file_path").to_pylist()}


def _catalog_free(cluster) -> bool:
    """Whether no one holds the catalog's SQLite file for writing (a node stopped inside its
    catalog transaction would hold every other node's commits while it is stopped)."""
    import sqlite3
    con = sqlite3.connect(f"{cluster.data_dir}/channels/catalog.db", timeout=0)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


def _partition_of(path: str) -> str | None:
    try:
        return pq.read_table(path, columns=["partition_id"]).column(0)[0].as_py()
    except (OSError, pa.ArrowInvalid, IndexError):
        return None                          # (still being written)


def _stop(cluster, victim: str) -> None:
    """SIGSTOP, and wait until the process is stopped (a signal is delivered asynchronously:
    what is looked at next must be what the stopped process left)."""
    cluster.signal(victim, signal.SIGSTOP)
    pid = cluster.procs[victim].proc.pid

    def stopped() -> bool:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("T", "t")
    wait_until(stopped, 10, f"{victim} stopped")


def _catch_mid_commit(cluster, victim: str, trigger: str, out_dir: str, fault: str) -> str:
    """Stop `victim` (SIGSTOP) while it is in the middle of a commit of partition 0; the path
    of the commit's unfinished trace."""
    data_dir = f"{cluster.data_dir}/channels/warehouse/events.db/stream/data"
    seen: set[str] = set(glob.glob(f"{data_dir}/*.parquet"))
    deadline = time.monotonic() + CATCH_WITHIN_S
    while time.monotonic() < deadline:
        if trigger == "files":
            temps = glob.glob(f"{out_dir}/events/p0000/**/.*.tmp-*", recursive=True)
            if not temps:
                continue
            _stop(cluster, victim)
            if all(os.path.exists(t) for t in temps[:1]):
                return temps[0]
        else:
            new = set(glob.glob(f"{data_dir}/*.parquet")) - seen
            ours = [p for p in new if _partition_of(p) == "p0000"]
            seen |= {p for p in new if _partition_of(p) is not None}
            if not ours:
                continue
            _stop(cluster, victim)
            # (stopped inside the catalog's transaction, the SQLite file locked: it may be past its
            # commit point, and a pause there would hold every node's commits; the next one)
            referenced = _table_files(cluster) if _catalog_free(cluster) else None
            if referenced is not None and not set(ours) & referenced:
                return ours[0]
        cluster.signal(victim, signal.SIGCONT)         # (the commit had finished: the next one)
    raise AssertionError(f"no commit of partition 0 caught unfinished within {CATCH_WITHIN_S} s")


def _sns_of_files(out_dir: str) -> list[int]:
    files = [f for f in glob.glob(f"{out_dir}/**/*.parquet", recursive=True) if "/." not in f]
    return [int(s) for f in files for s in pq.read_table(f, columns=["sequence_number"]).column(0).to_pylist()]


def _sns_of_table(cluster) -> list[int]:
    rows = _catalog(cluster).load_table("events.stream").scan(selected_fields=("sequence_number",)).to_arrow()
    return [int(s) for s in rows.column("sequence_number").to_pylist()]


@contextlib.contextmanager
def _cluster(tmp_path_factory, name: str, metastore: str | None) -> Iterator[LocalCluster]:
    cluster = LocalCluster(str(tmp_path_factory.mktemp(name)), nodes=CLUSTER_NODES, port=0, metastore=metastore)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.parametrize("trigger,fault", [
    ("iceberg", "kill"), ("files", "pause"),
    pytest.param("files", "kill", marks=pytest.mark.sweep), pytest.param("iceberg", "pause", marks=pytest.mark.sweep)])
def test_a_fault_mid_commit_delivers_exactly_once(tmp_path_factory, tmp_path, trigger, fault):
    """kill: the stopped node is killed (SIGKILL). pause: it stays stopped until another
    node has taken its partition over and committed, then goes on with its commit, which
    must not land (the name exists; the table's position moved)."""
    out_dir = str(tmp_path / "files")
    if fault == "pause" and not zk_available():
        pytest.skip(skip_reason())
    # a paused node on the embedded store may hold LMDB's writer lock and stall every other
    # writer until it runs again (metastore/embedded.py: one host, cooperating processes):
    # the pause trials run on ZooKeeper, as a cluster of several hosts does
    with backend_store("zk" if fault == "pause" else "embedded", str(tmp_path)) as (url, _zk), \
            _cluster(tmp_path_factory, f"channel-{trigger}", url) as cluster, \
            sms.Client(cluster.address, **cluster.client_options()) as client:
        client.create_stream("events", partitions=2, replication_factor=3)
        client.create_channel("events", "to-files", f"file://{out_dir}", data_freshness_s=1)
        client.create_channel("events", "to-table", "iceberg://events.stream", data_freshness_s=1)
        acked: set[bytes] = set()
        stop = threading.Event()
        producer = threading.Thread(target=_producer, args=(client, "events", acked, stop), daemon=True)
        producer.start()
        wait_until(lambda: len(acked) >= RECORDS // 6, 60, "a sixth of the records written")
        victim = client.get_stream_info("events").partition(0).chain[0].node_id
        trace = _catch_mid_commit(cluster, victim, trigger, out_dir, fault)
        if fault == "kill":
            cluster.kill(victim)
        else:
            def p0(name: str) -> ChannelPartition:
                return next((p for p in client.describe_channel(name).partitions if p.ordinal == 0),
                            ChannelPartition(ordinal=0))
            stopped_at = {name: p0(name).files for name in ("to-files", "to-table")}

            def taken_over() -> bool:           # (another node committed records of partition 0 since)
                try:
                    now = {name: p0(name) for name in stopped_at}
                except sms.errors.SmsError:     # (while the cluster notices the pause)
                    return False
                return all(p.node != victim and p.files > stopped_at[name] for name, p in now.items())
            try:
                wait_until(taken_over, DONE_WITHIN_S, "another node delivering partition 0")
            finally:
                cluster.signal(victim, signal.SIGCONT)
        producer.join(180)
        assert not producer.is_alive()
        stream = read_stream(client, "events")
        stream_sns = sorted(r.sn for records in stream.values() for r in records)
        assert {r.data for records in stream.values() for r in records} >= acked
        try:
            wait_until(lambda: sorted(_sns_of_files(out_dir)) == stream_sns == sorted(_sns_of_table(cluster)),
                       DONE_WITHIN_S, "every record of the stream in both destinations")
        except AssertionError:
            files, table = _sns_of_files(out_dir), _sns_of_table(cluster)
            raise AssertionError(
                f"stream {len(stream_sns)} records; files {len(files)} ({len(files) - len(set(files))} twice, "
                f"{len(set(stream_sns) - set(files))} missing); table {len(table)} ({len(table) - len(set(table))} "
                f"twice, {len(set(stream_sns) - set(table))} missing); "
                f"{[(p.ordinal, p.position[-6:], p.node, p.error) for p in client.describe_channel('to-table').partitions]}"
            ) from None
        # the stopped commit left its trace, and nothing of it counts
        if trigger == "iceberg" or fault == "kill":
            assert os.path.exists(trace)
        if trigger == "iceberg":
            assert trace not in _table_files(cluster)
        if fault == "pause" and trigger == "files":
            # the woken node went on with its put, which found the name taken (the other node's
            # file of the same records) and took its temp file away: nothing of it is left
            wait_until(lambda: not os.path.exists(trace), 60, f"{victim}'s refused put cleaned up")
        if fault == "kill":           # (a paused node that wakes may be made the head again)
            new_head = client.get_stream_info("events").partition(0).chain[0].node_id
            assert new_head != victim
            wait_until(lambda: {p.node for p in client.describe_channel("to-files").partitions
                                if p.ordinal == 0} == {new_head}, 30, "the new head shown delivering")
