"""A cluster that grows and shrinks while data flows (control/chains.py rules 6, 7 and 8).

Real processes: control + 3 storage nodes, a stream of 8 partitions at replication
factor 3 under de-duplicating load with a tailing consumer (tests/fault/workload.py). A
fourth node started with `sms serve` (it only registers) takes its share of replicas
and of heads (rule 8's handoffs) within a minute, while writes go on; then a node is
drained until it holds nothing. The history checker (tests/fault/history.py) proves that nothing acknowledged was lost
or duplicated and that no reader saw a record that later vanished; the chains' history
shows that no chain had fewer members than its replication factor. Timings are
printed, never asserted.
"""

from __future__ import annotations

import time

import pytest

import sms
from node.launcher import STORAGE_ROLES, NodeProcess
from sms import limits
from tests.conftest import env_cluster, wait_until
from tests.fault.history import check
from tests.fault.workload import Workload, read_back

pytestmark = pytest.mark.integration

STREAM = "grow"
PARTITIONS = 8
RF = 3
SETTLE_TIMEOUT_S = 60.0
ACK_TIMEOUT_S = 30.0


def _balanced(client: sms.Client, nodes: set[str]):
    loads = {n.node_id: n for n in client.list_nodes() if n.live}
    if set(loads) != nodes or any(n.learners for n in loads.values()):
        return None
    counts = [loads[n].replicas for n in nodes]
    if max(counts) - min(counts) >= limits.REBALANCE_IMBALANCE_MIN or not all(loads[n].heads for n in nodes):
        return None
    return loads


def _never_below_rf(info) -> list[str]:
    """Every chain's member count after each change in its history, below RF: none."""
    bad = []
    for p in info.partitions:
        members = len(p.chain)
        if members < RF:
            bad.append(f"{p.partition_id} has {members} members")
        for change in p.history:
            if change["action"] == "removed" and "replication factor" not in change["reason"]:
                bad.append(f"{p.partition_id}: {change['node']} removed: {change['reason']}")
    return bad


# Four storage nodes, the control node, 4,000 records/s with its consumer and learners
# copying, all on the 2 cores of a test machine: a node can go without the CPU for longer
# than the link liveness bound (0.4 s), which would take it out of its chains (safe, but the
# chain drops below RF, which this test is about). It runs with the bound of a loaded host.
RELAXED_LIVENESS = {"SMS_REPLICATION_LINK_ACK_TIMEOUT_S": "3.0"}


def test_a_node_added_under_load_takes_its_share_and_a_drained_node_empties(tmp_path_factory):
    with env_cluster(tmp_path_factory, RELAXED_LIVENESS, "rebalance", nodes=3) as cluster:
        _grow_and_drain(cluster)


def _grow_and_drain(cluster) -> None:
    with sms.Client(cluster.address) as client:
        client.create_stream(STREAM, partitions=PARTITIONS, replication_factor=RF)
        with Workload(cluster.address, STREAM, producers=2, keys=32, consumers=1, rate_per_s=2_000,
                      name="grow") as load:
            load.wait_acks(2_000, ACK_TIMEOUT_S)
            # a fourth storage node registers (what `sms serve` on a new host does)
            cluster.procs["n4"] = NodeProcess("n4", STORAGE_ROLES, "127.0.0.1:0")
            cluster.spawn("n4")
            cluster.wait_ready(["n4"])
            added = time.monotonic()
            acked_before = load.acked_count()
            loads = wait_until(lambda: _balanced(client, {"n1", "n2", "n3", "n4"}), SETTLE_TIMEOUT_S,
                               "replicas rebalanced onto n4")
            settle_s = time.monotonic() - added
            assert loads["n4"].replicas >= PARTITIONS * RF // 4 - 1 and loads["n4"].heads >= 1
            assert load.acked_count() > acked_before, "writes stopped while replicas moved"
            print(f"\nn4 took {loads['n4'].replicas} replicas in {settle_s:.1f} s: "
                  + ", ".join(f"{n} {l.replicas}r/{l.heads}h" for n, l in sorted(loads.items())))

            # drain n1 while writes go on: it ends holding nothing; every chain keeps RF
            client.drain_node("n1")
            drained = time.monotonic()
            acked_before = load.acked_count()
            wait_until(lambda: [n for n in client.list_nodes() if n.node_id == "n1" and n.replicas + n.learners == 0],
                       SETTLE_TIMEOUT_S, "n1 drained")
            print(f"n1 drained in {time.monotonic() - drained:.1f} s")
            load.wait_acks(load.acked_count() + 1_000, ACK_TIMEOUT_S)
            assert load.acked_count() > acked_before
            stats = load.stop()
        info = client.get_stream_info(STREAM)
        assert not [m for p in info.partitions for m in p.chain if m.node_id == "n1"]
        assert _never_below_rf(info) == []
        final = read_back(client, STREAM, history=load.history)
        # a drained node takes nothing new: a stream created now avoids it
        fresh = client.create_stream(STREAM + "-after", partitions=4, replication_factor=RF)
        assert not [m for p in fresh.partitions for m in p.chain if m.node_id == "n1"]
        client.drain_node("n1", undo=True)
        assert not [n for n in client.list_nodes() if n.draining]
    result = check(load.history, final)
    print(f"history: {result.summary()}; workload {stats}")
    assert result.ok, result.summary()


def test_drain_names_its_errors(cluster):
    with sms.Client(cluster.address) as client:
        with pytest.raises(sms.errors.NodeNotFound, match="no storage node 'nope'"):
            client.drain_node("nope")
        with pytest.raises(sms.errors.InvalidArgument):
            client.drain_node("")
        assert not [n for n in client.list_nodes() if n.draining]
