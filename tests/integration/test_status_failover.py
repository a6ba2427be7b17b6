"""`sms status` after a failover: each chain's epoch and members, and which node was
replaced and why; the same in --json. Real processes: a 4-node cluster, one node
killed with SIGKILL, the chain manager reconfigures and restores replication."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sms
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

FAILOVER_TIMEOUT_S = 30.0


def _status(address: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node", "status", "--address", address, *extra],
                          capture_output=True, text=True, timeout=60)


def test_status_names_the_replaced_node_and_why(make_cluster):
    cluster = make_cluster(nodes=4)
    with sms.Client(cluster.address) as client:
        info = client.create_stream("st", partitions=2, replication_factor=3)
        victim = info.partition(0).chain[0].node_id
        cluster.kill(victim)

        def healed():
            now = client.get_stream_info("st")
            return all(victim not in [m.node_id for m in p.chain] and len(p.chain) == 3 and not p.learners
                       for p in now.partitions) and now
        now = wait_until(healed, FAILOVER_TIMEOUT_S, f"{victim} replaced in every chain")
        assert now.partition(0).chain_epoch > info.partition(0).chain_epoch
        put = client.put_record("st", b"after", "k")
        assert put.sn > 0

    text = _status(cluster.address)
    assert text.returncode == 0, text.stderr
    # (found by the failure detector's probes, or else when its session expired)
    assert (f"removed {victim}: node refuses connections" in text.stdout
            or f"removed {victim}: node is not registered" in text.stdout), text.stdout
    assert "promoted" in text.stdout and "(epoch " in text.stdout
    doc = json.loads(_status(cluster.address, "--json").stdout)
    [stream] = [s for s in doc["streams"] if s["name"] == "st"]
    p0 = stream["partitions"][0]
    assert victim not in [m["node_id"] for m in p0["chain"]]
    removed = [h for h in p0["history"] if h["action"] == "removed"]
    assert removed and removed[0]["node"] == victim
    assert "refuses connections" in removed[0]["reason"] or "not registered" in removed[0]["reason"]
    assert p0["chain_epoch"] == max(h["epoch"] for h in p0["history"])
