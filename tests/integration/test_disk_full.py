"""A storage node whose disk fills while writes flow (real processes, real LMDB on a real
tmpfs of a few MB mounted over the node's data directory; needs root, skipped otherwise).

Writes are refused with the named error StorageFull (the batch was not stored, nothing is
acknowledged), the node keeps serving and reports the failed writes in its status, and once
space returns writes succeed again; every acknowledged record is then read back exactly once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

import sms
from node.launcher import LocalCluster
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

TMPFS_BYTES = 48 * 1024 * 1024
HEADROOM_BYTES = 6 * 1024 * 1024          # left free beside the ballast: a few batches fit
RECORD = b"x" * 20_000
PUT = 50                                   # records per call: 1 MB
FILL_TIMEOUT_S = 60.0
RECOVER_TIMEOUT_S = 60.0


def _can_mount() -> str:
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount/umount"
    return ""


@pytest.fixture
def full_disk_cluster(tmp_path):
    reason = _can_mount()
    if reason:
        pytest.skip(reason)
    data = tmp_path / "cluster"
    node_dir = data / "n1"
    node_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(node_dir)], check=True)
    cluster = None
    try:
        cluster = LocalCluster(str(data), nodes=1).start()
        yield cluster, node_dir
    finally:
        if cluster is not None:
            cluster.stop()
        subprocess.run(["umount", "-l", str(node_dir)], check=False)


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
