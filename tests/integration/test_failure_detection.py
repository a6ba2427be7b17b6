"""Failure detection faster than the metadata session (control/manager.py, storage/service.py).

Real processes: a 4-node cluster (control + 4 storage nodes), a stream of RF 3 taking
writes. A node killed with SIGKILL is removed from its chains because its port refuses
connections (the reason in the chain's history says so), not because its session expired;
a node paused with SIGSTOP for less than its session TTL (a long GC pause) is removed from
nothing. Timings are printed, never asserted.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

import sms
from sms import limits
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

HEAL_TIMEOUT_S = 30.0
STREAM = "fd"


class Writer:
    """Puts a record every few ms on a thread until stopped; counts acks and failures."""

    def __init__(self, address: str):
        self.client = sms.Client(address)
        self.stop = threading.Event()
        self.acked = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                self.client.put_records(STREAM, [(f"k{i % 16}-{j}", b"x") for j in range(8)])
                self.acked += 8
            except sms.errors.SmsError:
                pass
            i += 1

    def __enter__(self) -> "Writer":
        self.thread.start()
        wait_until(lambda: self.acked > 0, HEAL_TIMEOUT_S, "the first writes acknowledged")
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.client.close()


def _removal(client: sms.Client, victim: str, epochs: dict[int, int]):
    """The partitions' removals of `victim` since `epochs`, once every chain is without it."""
    info = client.get_stream_info(STREAM)
    held = [p for p in info.partitions if p.ordinal in epochs]
    if any(victim in [m.node_id for m in p.chain] for p in held):
        return None
    return [c for p in held for c in p.history if c["action"] == "removed" and c["node"] == victim
            and c["epoch"] > epochs[p.ordinal]]


@pytest.mark.parametrize("role", ["head", "middle", "tail", "only_a_head"])
def test_a_killed_node_is_removed_because_its_port_refuses(make_cluster, role):
    """`only_a_head`: one chain, so the victim ships to its successor and takes no stream
    from any peer: only the successor's incoming stream (storage/peerlink.py
    IncomingLinks), which ends when the victim dies, can find it before its session does."""
    cluster = make_cluster(nodes=4)
    with sms.Client(cluster.address) as client:
        info = client.create_stream(STREAM, partitions=1 if role == "only_a_head" else 2, replication_factor=3)
        index = {"head": 0, "middle": 1, "tail": 2, "only_a_head": 0}[role]
        victim = info.partition(0).chain[index].node_id
        epochs = {p.ordinal: p.chain_epoch for p in info.partitions if victim in [m.node_id for m in p.chain]}
        with Writer(cluster.address) as writer:
            killed = time.monotonic()
            cluster.kill(victim)
            removals = wait_until(lambda: _removal(client, victim, epochs), HEAL_TIMEOUT_S,
                                  f"{victim} ({role} of p0) removed from its chains")
            removed_s = time.monotonic() - killed
            acked = writer.acked
            wait_until(lambda: writer.acked > acked, HEAL_TIMEOUT_S, "writes acknowledged after the removal")
        print(f"\n{role} {victim} killed: removed from its chains after {removed_s:.2f} s "
              f"(session TTL {limits.METASTORE_SESSION_TTL_S} s)")
        assert removals and all("refuses connections" in c["reason"] for c in removals), removals


def test_a_paused_node_is_not_removed(make_cluster):
    """SIGSTOP of a chain's tail for a third of the link liveness bound (LINK_ACK_TIMEOUT_S)
    while writes flow: links to it stall but answer again within the bound, and its kernel
    still accepts connections, so nothing is reported and nothing changes. (A pause past the
    bound is found by link liveness: tests/netfault node_pause.)"""
    cluster = make_cluster(nodes=4)
    with sms.Client(cluster.address) as client:
        info = client.create_stream(STREAM, partitions=2, replication_factor=3)
        victim = info.partition(0).chain[2].node_id
        with Writer(cluster.address):
            cluster.signal(victim, signal.SIGSTOP)
            try:
                pause = threading.Event()
                pause.wait(limits.LINK_ACK_TIMEOUT_S / 3)        # the fault's length, not a wait for a result
            finally:
                cluster.signal(victim, signal.SIGCONT)
            after = client.get_stream_info(STREAM)
        assert [p.chain_epoch for p in after.partitions] == [p.chain_epoch for p in info.partitions]
        assert not [c for p in after.partitions for c in p.history if c["action"] == "removed"]
