"""A storage node stopped with SIGTERM while writes flow (real processes, real LMDB).

It exits by itself with code 0 (the launcher would SIGKILL it after NODE_STOP_TIMEOUT_S),
and its data directory then holds, for every replica, a commit watermark at or above
every SN acknowledged before the signal (readers of a restarted node are served at once
up to what was committed): read back from the node's LMDB files after it exited. The stop
time is printed, not asserted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time

import pytest

import sms
from sms import limits, metadata
from sms.types import Persistence
from storage.log import LogStore
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

STREAM = "gs"
PARTITIONS = 2
LOAD_TIMEOUT_S = 30.0


class Load:
    """put_records on a thread; the highest acknowledged SN per partition."""

    def __init__(self, address: str):
        self.address = address
        self.stop = threading.Event()
        self.acked: dict[int, int] = {}
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with sms.Client(self.address) as client:
            i = 0
            while not self.stop.is_set():
                try:
                    out = client.put_records(STREAM, [(f"k{i}-{j}", b"x" * 100) for j in range(50)])
                except sms.errors.SmsError:
                    continue
                with self.lock:
                    for r in out.records:
                        if r.ok:
                            p = r.partition_ordinal
                            self.acked[p] = max(self.acked.get(p, 0), r.sn)
                i += 1

    def snapshot(self) -> dict[int, int]:
        with self.lock:
            return dict(self.acked)


def _stored_watermarks(data_dir: str) -> dict[int, tuple[int, int]]:
    """partition -> (committed SN, last SN) as the node's LMDB files hold them."""
    async def read() -> dict[int, tuple[int, int]]:
        store = LogStore(os.path.join(data_dir, "storage"))
        try:
            out = {}
            for p in range(PARTITIONS):
                plog = store.open_log(metadata.chain_id(STREAM, p), Persistence.DISK)
                out[p] = (plog.committed_sn, plog.last_sn)
            return out
        finally:
            for env in store.envs.values():
                env.close()
    return asyncio.run(read())


def test_sigterm_under_load_stops_the_node_with_its_watermarks_stored(make_cluster):
    cluster = make_cluster(nodes=3)
    with sms.Client(cluster.address) as client:
        client.create_stream(STREAM, partitions=PARTITIONS, replication_factor=3)
    load = Load(cluster.address)
    load.thread.start()
    try:
        wait_until(lambda: len(load.snapshot()) == PARTITIONS, LOAD_TIMEOUT_S, "acks from every partition")
        victim = "n2"
        proc = cluster.procs[victim].proc
        acked = load.snapshot()                    # acknowledged before the signal
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=limits.NODE_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{victim} did not stop within {limits.NODE_STOP_TIMEOUT_S} s of SIGTERM")
        print(f"\n{victim} stopped {time.monotonic() - started:.2f} s after SIGTERM, under load")
        assert code == 0
    finally:
        load.stop.set()
        load.thread.join()
    stored = _stored_watermarks(os.path.join(cluster.data_dir, victim))
    for p, sn in acked.items():
        committed, last = stored[p]
        assert sn <= committed <= last, (p, sn, committed, last)


def test_sigterm_after_the_load_stores_the_exact_watermark(make_cluster):
    """Once the acked writes have settled, the stored watermark of every replica is exactly
    the highest acknowledged SN (not one batch behind it), on head, middle and tail alike:
    a restart serves every acknowledged record at once."""
    cluster = make_cluster(nodes=3)
    with sms.Client(cluster.address) as client:
        info = client.create_stream(STREAM, partitions=PARTITIONS, replication_factor=3)
        load = Load(cluster.address)
        load.thread.start()
        try:
            wait_until(lambda: len(load.snapshot()) == PARTITIONS, LOAD_TIMEOUT_S, "acks from every partition")
        finally:
            load.stop.set()
            load.thread.join()
        acked = load.snapshot()
        chains = {p.ordinal: [m.node_id for m in p.chain] for p in info.partitions}

        def settled() -> bool:
            for node in ("n1", "n2", "n3"):
                for r in client.node_status(cluster.procs[node].address)["replicas"]:
                    ordinal = metadata.parse_chain_id(r["chain_id"])[1]
                    if r["chain_id"].startswith(STREAM + ":") and int(r["committed_sn"]) != acked[ordinal]:
                        return False
            return True
        wait_until(settled, LOAD_TIMEOUT_S, "every replica's watermark at the last acknowledged SN")
    for node in ("n1", "n2", "n3"):
        proc = cluster.procs[node].proc
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=limits.NODE_STOP_TIMEOUT_S) == 0
        stored = _stored_watermarks(os.path.join(cluster.data_dir, node))
        for p, sn in acked.items():
            role = chains[p].index(node)
            assert stored[p] == (sn, sn), (node, f"member {role} of p{p}", stored[p], sn)
