"""A storage node whose disk fills while writes flow (real processes, real LMDB on a real
tmpfs of a few MB mounted over the node's data directory; needs root, skipped otherwise).

Writes are refused with the named error StorageFull (the batch was not stored, nothing is
acknowledged), the node keeps serving and reports the failed writes in its status, and once
space returns writes succeed again; every acknowledged record is then read back exactly once.
The disk fills on the head of a one-node chain, and on a member of RF 3 chains that is
middle and tail of some (and head of another) under load with de-duplicating producers,
checked by the fault trials' history checker: a middle or tail that cannot store a batch
holds back its chain's commits, so nothing it lacks is acknowledged, and the chain goes on,
unchanged, once space returns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time

import pytest

import sms
from node.launcher import LocalCluster
from tests.conftest import wait_until
from tests.fault.history import check
from tests.fault.workload import Workload, read_back

pytestmark = pytest.mark.integration

TMPFS_BYTES = 48 * 1024 * 1024
HEADROOM_BYTES = 6 * 1024 * 1024          # left free beside the ballast: a few batches fit
RECORD = b"x" * 20_000
PUT = 50                                   # records per call: 1 MB
FILL_TIMEOUT_S = 60.0
RECOVER_TIMEOUT_S = 60.0
# the RF 3 trial: 3 nodes, 3 partitions; n2 is middle of one chain, head of one, tail of one
CHAIN_VICTIM = "n2"
CHAIN_HEADROOM_BYTES = 1024 * 1024         # left free beside the ballast: filled within a second or two
CHAIN_PAYLOAD_BYTES = 2_000
WARMUP_ACKS = 300
AFTER_ACKS = 300
FULL_HOLD_S = 1.5                          # the disk stays full this long (several link retries) ...
REFUSALS_HELD = 10                         # ... and refuses at least so many more transactions
ACK_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def _can_mount() -> str:
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount/umount"
    return ""


@contextlib.contextmanager
def _cluster_with_a_small_disk(tmp_path, nodes: int, victim: str):
    """A cluster of `nodes` nodes whose node `victim` has its data directory on a tmpfs of
    TMPFS_BYTES; yields (cluster, that directory)."""
    reason = _can_mount()
    if reason:
        pytest.skip(reason)
    data = tmp_path / "cluster"
    node_dir = data / victim
    node_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(node_dir)], check=True)
    cluster = None
    try:
        cluster = LocalCluster(str(data), nodes=nodes).start()
        yield cluster, node_dir
    finally:
        if cluster is not None:
            cluster.stop()
        subprocess.run(["umount", "-l", str(node_dir)], check=False)


@pytest.fixture
def full_disk_cluster(tmp_path):
    with _cluster_with_a_small_disk(tmp_path, 1, "n1") as it:
        yield it


def test_a_full_disk_refuses_writes_by_name_and_recovers(full_disk_cluster):
    cluster, node_dir = full_disk_cluster
    acked: dict[str, int] = {}
    seen: set[str] = set()
    with sms.Client(cluster.address) as client:
        client.create_stream("df", partitions=1, replication_factor=1)
        ballast = node_dir / "ballast"
        with open(ballast, "wb") as f:
            f.truncate(0)
            free = shutil.disk_usage(node_dir).free
            f.write(b"\0" * max(0, free - HEADROOM_BYTES))
        calls = 0

        def put() -> list[str]:
            nonlocal calls
            calls += 1
            keys = [f"c{calls}-{i}" for i in range(PUT)]
            out = client.put_records("df", [(k, RECORD) for k in keys])
            for k, r in zip(keys, out.records):
                if r.ok:
                    acked[k] = r.sn
                else:
                    seen.add(r.error_name)
            return [r.error_name for r in out.records if not r.ok]

        wait_until(lambda: "StorageFull" in put() or "StorageFull" in seen, FILL_TIMEOUT_S,
                   "a write refused with StorageFull")
        assert seen <= {"StorageFull", "Unavailable"}, seen
        assert cluster.procs["n1"].proc.poll() is None, "the node died"
        status = client.node_status(cluster.procs["n1"].address)          # what `sms status` shows
        assert status["storage_write_failures"] > 0 and status["storage_last_error"].startswith("StorageFull")
        before = len(acked)
        assert put(), "a write succeeded on a full disk"
        assert len(acked) == before

        os.unlink(ballast)                         # space returns
        wait_until(lambda: not put(), RECOVER_TIMEOUT_S, "writes accepted again once space returned")

        read = {}
        for record in client.read_stream("df"):
            read.setdefault(record.partition_key, []).append(record.sn)
        missing = [k for k in acked if k not in read]
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:3]}"
        assert all(len(sns) == 1 for sns in read.values()), "a record stored twice"
        assert all(read[k] == [sn] for k, sn in acked.items())


@pytest.fixture
def full_chain_member(tmp_path):
    """A 3-node cluster whose node CHAIN_VICTIM has its data directory on a small tmpfs."""
    with _cluster_with_a_small_disk(tmp_path, 3, CHAIN_VICTIM) as it:
        yield it


def _sn(text: str) -> int:
    return int(text or 0)


def _replicas(client, cluster, node_id: str) -> dict[str, dict]:
    return {r["chain_id"]: r for r in client.node_status(cluster.procs[node_id].address)["replicas"]}


def test_a_full_disk_on_a_middle_and_a_tail_under_load_holds_commits_back(full_chain_member):
    cluster, node_dir = full_chain_member
    victim = CHAIN_VICTIM
    stream = "df-chain"
    with sms.Client(cluster.address) as client:
        info = client.create_stream(stream, partitions=3, replication_factor=3)
        roles = {p.ordinal: next(m.role for m in p.chain if m.node_id == victim) for p in info.partitions}
        assert {"middle", "tail"} <= set(roles.values()), f"{victim}'s roles by partition: {roles}"
        heads = {f"{stream}:{p.ordinal}": p.chain[0].node_id for p in info.partitions}
        held_back = [cid for cid, head in heads.items() if head != victim]     # victim is middle or tail

        def acks_within_what_the_victim_stored() -> None:
            # the heads' watermarks first: the victim's last SN only grows meanwhile
            committed = {cid: _sn(_replicas(client, cluster, heads[cid])[cid]["committed_sn"]) for cid in held_back}
            stored = _replicas(client, cluster, victim)
            for cid in held_back:
                assert committed[cid] <= _sn(stored[cid]["last_sn"]), (
                    f"{cid}: head {heads[cid]} committed {committed[cid]} beyond what {victim} stored")

        with Workload(cluster.address, stream, producers=2, keys=12, consumers=1, rate_per_s=400,
                      payload_bytes=CHAIN_PAYLOAD_BYTES, name="d") as load:
            load.wait_acks(WARMUP_ACKS, ACK_TIMEOUT_S)
            ballast = node_dir / "ballast"
            with open(ballast, "wb") as f:
                f.write(b"\0" * max(0, shutil.disk_usage(node_dir).free - CHAIN_HEADROOM_BYTES))

            def status():
                return client.node_status(cluster.procs[victim].address)

            first = wait_until(lambda: (s := status())["storage_write_failures"] > 0 and s, FILL_TIMEOUT_S,
                               f"{victim} refusing a write on its full disk")
            assert first["storage_last_error"].startswith("StorageFull"), first["storage_last_error"]
            load.mark_fault("disk_full", partitions=list(roles))     # writes resume only once space returns
            full_since = time.monotonic()

            def held() -> bool:
                acks_within_what_the_victim_stored()
                return (status()["storage_write_failures"] >= first["storage_write_failures"] + REFUSALS_HELD
                        and time.monotonic() - full_since >= FULL_HOLD_S)

            wait_until(held, FILL_TIMEOUT_S, f"{REFUSALS_HELD} more writes refused on {victim}")
            assert cluster.procs[victim].proc.poll() is None, "the node died"
            stored = {cid: _sn(r["last_sn"]) for cid, r in _replicas(client, cluster, victim).items()}

            os.unlink(ballast)                     # space returns
            load.wait_acks(load.acked_count() + AFTER_ACKS, ACK_TIMEOUT_S)
            wait_until(lambda: all(_sn(_replicas(client, cluster, victim)[cid]["last_sn"]) > stored[cid]
                                   for cid in held_back), RECOVER_TIMEOUT_S, f"{victim} storing again")
            acks_within_what_the_victim_stored()
            after = client.get_stream_info(stream, refresh=True)
            assert all(p.chain_epoch == 1 and victim in {m.node_id for m in p.chain} for p in after.partitions), (
                "a full disk reconfigured a chain: " + str([(p.ordinal, p.chain_epoch, p.history)
                                                            for p in after.partitions]))
            load.stop(STOP_TIMEOUT_S)
        final = read_back(client, stream, history=load.history)
    result = check(load.history, final)
    print(result.summary())
    result.assert_ok()
    assert result.lost == 0 and result.duplicates == 0
    assert result.recoveries and all(r.resumed for r in result.recoveries), result.summary()
