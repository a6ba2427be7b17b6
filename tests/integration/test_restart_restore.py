"""A restart restores the cluster it stopped (issue 29): `sms up` on an existing data
directory starts every node that belonged to it (a node `sms node add` made included),
every chain comes back whole on its own members, a drain in progress is shown, and a
chain short of replicas shows in `sms status`, the console, the metrics and `sms up`'s
own lines until it is whole again.

The first test runs the real `sms up` twice on one directory (separate processes, real
LMDB, TLS); the others check DIR/nodes.json (node/launcher.py) and what `sms up` says
(ReplicaWatch) without processes.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import urllib.request

import pytest

from node import launcher
from node.launcher import ReplicaWatch
from sms.types import NodeLoad
from tests.conftest import wait_until
from tests.integration import test_cli
from tests.integration.test_cli import Up, ok, sms_cmd
from tests.integration.test_metrics import scrape, total

pytestmark = pytest.mark.integration

STREAM = "orders"
PARTITIONS = 4
RF = 3
SETTLE_TIMEOUT_S = 60


def _status(d: str) -> dict:
    return json.loads(ok(sms_cmd(d, "status", "--json")))


def _chains(d: str) -> dict[str, dict]:
    """partition id -> its entry in `sms status --json` (chain, learners, history)."""
    [stream] = [s for s in _status(d)["streams"] if s["name"] == STREAM]
    return {p["partition_id"]: p for p in stream["partitions"]}


def _members(p: dict) -> list[str]:
    return [m["node_id"] for m in p["chain"]]


def _stop(up: Up) -> None:
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(timeout=test_cli.UP_STOP_TIMEOUT_S) == 0
    up.rest_of_output()
    up.stop()


def _console_state(d: str) -> dict:
    with open(os.path.join(d, "cluster.json")) as f:
        info = json.load(f)
    request = urllib.request.Request(info["console"].replace("/console/", "/api/state"),
                                     headers={"Authorization": f"Bearer {info['token']}"})
    context = ssl.create_default_context(cafile=info["ca_file"])
    return json.loads(urllib.request.urlopen(request, context=context, timeout=30).read())


def _control_metrics(d: str) -> dict:
    with open(os.path.join(d, "cluster.json")) as f:
        info = json.load(f)
    [control] = [n for n in info["nodes"] if n["node_id"] == "control"]
    return scrape(f"https://{control['metrics_address']}/metrics", info["ca_file"], info["token"])


def test_a_restart_brings_back_added_nodes_whole_chains_and_the_drain(tmp_path):
    d = str(tmp_path)
    up = Up(d, 3)
    try:
        up.wait_for_address()
        ok(sms_cmd(d, "stream", "create", STREAM, "--partitions", str(PARTITIONS), "--rf", str(RF)))
        ok(sms_cmd(d, "put", STREAM, "a", "b", "c", "--key", "k"))
        assert json.loads(ok(sms_cmd(d, "node", "add", "--json")))["node_id"] == "n4"
        ok(sms_cmd(d, "node", "drain", "n1", "--wait", "--timeout", str(SETTLE_TIMEOUT_S)))
        before = wait_until(lambda: (c := _chains(d)) and not any(p["learners"] for p in c.values())
                            and all(len(p["chain"]) == RF for p in c.values()) and c,
                            SETTLE_TIMEOUT_S, "every chain settled with RF members off n1")
    finally:
        _stop(up)
    assert all("n1" not in _members(p) for p in before.values())

    up = Up(d, 3)                     # the same command again: n4 comes back too
    try:
        up.wait_for_address()
        data = up.wait_for_line(r"^data: ", test_cli.UP_READY_TIMEOUT_S)
        assert "4 storage nodes: n1, n2, n3, n4" in data, data
        up.wait_for_line(r"^node n1 is draining and holds no replica", SETTLE_TIMEOUT_S)
        nodes = {n["node_id"]: n for n in json.loads(ok(sms_cmd(d, "node", "list", "--json")))}
        assert nodes["n4"]["live"] and nodes["n1"]["draining"], nodes

        # every chain on its own members again: restored as they were, in their order, with
        # one new epoch (not rebuilt from the first node back: no learner, nobody removed)
        def since_restart(p: dict) -> list[dict]:
            return [h for h in p["history"] if h["epoch"] > before[p["partition_id"]]["chain_epoch"]]

        after = wait_until(lambda: (c := _chains(d)) and all(since_restart(p) for p in c.values()) and c,
                           SETTLE_TIMEOUT_S, "every chain restored")
        for pid, p in after.items():
            changes = [(h["epoch"], h["action"], h["node"]) for h in since_restart(p)]
            epoch = before[pid]["chain_epoch"] + 1
            assert changes[:RF] == [(epoch, "restored", m) for m in _members(before[pid])], (pid, changes)
            assert not [c for c in changes if c[1] in ("removed", "learner", "promoted")], (pid, changes)
            assert sorted(_members(p)) == sorted(_members(before[pid])) and not p["learners"], (pid, p)
        # (a restarted head learns the commit point again from its successor: until then it
        # serves a shorter committed prefix)
        wait_until(lambda: [json.loads(r)["data"] for r in ok(sms_cmd(d, "read", STREAM, "--json")).splitlines()]
                   == ["a", "b", "c"], SETTLE_TIMEOUT_S, "the records read back after the restart")
        status = _status(d)
        assert status["under_replicated"] == []

        # n4 stops for good (a clean exit stays down): its chains are short, and nothing can
        # take its place (n1 drains, n2 and n3 hold every chain) until n1 takes replicas again
        os.kill(_pid(d, "n4"), signal.SIGTERM)
        line = up.wait_for_line(r"^under-replicated: ", SETTLE_TIMEOUT_S)
        assert line.startswith(f"under-replicated: {PARTITIONS} partitions with fewer live members") and \
            f"({STREAM}: {PARTITIONS})" in line, line
        short = _status(d)["under_replicated"]
        assert sorted(p["partition_id"] for p in short) == sorted(before)
        assert all(p["stream"] == STREAM and p["live_members"] == RF - 1 and p["replication_factor"] == RF
                   for p in short), short
        text = ok(sms_cmd(d, "status"))
        assert f"under-replicated: {PARTITIONS} partitions" in text and f"{STREAM}/p0000: 2 of 3" in text, text
        assert total(_control_metrics(d), "sms_under_replicated_partitions", stream=STREAM) == PARTITIONS
        console = _console_state(d)
        assert len(console["under_replicated"]) == PARTITIONS
        [card] = [s for s in console["streams"] if s["name"] == STREAM]
        assert all(p["under_replicated"] for p in card["partitions"])

        ok(sms_cmd(d, "node", "drain", "n1", "--undo"))
        up.wait_for_line(r"^replication: every partition has its replication factor again", SETTLE_TIMEOUT_S)
        assert _status(d)["under_replicated"] == []
        assert total(_control_metrics(d), "sms_under_replicated_partitions", stream=STREAM) == 0
        assert "replication: every partition has its replication factor" in ok(sms_cmd(d, "status"))
    finally:
        _stop(up)
    assert launcher.recorded_node_ids(d) == ["n1", "n2", "n3", "n4"]


def _pid(d: str, node_id: str) -> int:
    with open(os.path.join(d, "cluster.json")) as f:
        return next(n["pid"] for n in json.load(f)["nodes"] if n["node_id"] == node_id)


# --- DIR/nodes.json, without processes ----------------------------------------------------

def test_the_record_keeps_added_nodes_and_forgets_removed_ones(tmp_path):
    d = str(tmp_path)
    assert launcher.storage_node_ids(d, 3) == ["n1", "n2", "n3"]          # a new directory
    for node_id in ("n1", "n2", "n3"):
        launcher.record_node(d, node_id)
    assert launcher.next_node_id(d) == "n4"
    launcher.record_node(d, "n4")                                          # (`sms node add`)
    assert launcher.storage_node_ids(d, 3) == ["n1", "n2", "n3", "n4"]    # the next `sms up`
    assert launcher.storage_node_ids(d, 1) == ["n1", "n2", "n3", "n4"]    # (the record wins)
    assert launcher.next_node_id(d) == "n5"
    assert launcher.forget_node(d, "n2") and not launcher.forget_node(d, "n9")
    assert launcher.storage_node_ids(d, 3) == ["n1", "n3", "n4"]          # n2 is not started again
    assert launcher.removed_node_ids(d) == {"n2", "n9"}
    assert launcher.next_node_id(d) == "n5"                                # nor given again
    with open(os.path.join(d, launcher.NODES_FILE)) as f:
        assert json.load(f) == {"nodes": ["n1", "n3", "n4"], "removed": ["n2", "n9"]}
    assert launcher.LocalCluster(d, nodes=3).procs.keys() == {"control", "n1", "n3", "n4"}


def test_a_directory_of_an_older_release_keeps_its_added_nodes(tmp_path):
    """No nodes.json: the nodes its cluster.json lists, and the n<k> data directories
    (a node `sms node add` made, which a restart had left out)."""
    d = str(tmp_path)
    nodes = [{"node_id": n, "roles": "control" if n == "control" else launcher.STORAGE_ROLES}
             for n in ("control", "n1", "n2", "n3")]
    with open(os.path.join(d, "cluster.json"), "w") as f:
        json.dump({"nodes": nodes}, f)
    for name in ("control", "n1", "n4", "logs"):
        os.mkdir(os.path.join(d, name))
    assert launcher.storage_node_ids(d, 3) == ["n1", "n2", "n3", "n4"]
    assert launcher.next_node_id(d) == "n5"
    launcher.record_node(d, "n1")
    assert launcher.recorded_node_ids(d) == ["n1", "n2", "n3", "n4"]


def test_a_record_that_cannot_be_read_is_named(tmp_path):
    (tmp_path / launcher.NODES_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="nodes.json cannot be read"):
        launcher.LocalCluster(str(tmp_path), nodes=3)
    up = sms_cmd(str(tmp_path), "up", "--port", "0")
    assert up.returncode == 1 and "nodes.json cannot be read" in up.stderr, up.stderr


def _load(node_id: str, replicas: int, draining: bool = True, learners: int = 0) -> NodeLoad:
    return NodeLoad(node_id=node_id, address="", live=True, draining=draining, replicas=replicas, heads=0,
                    learners=learners)


def test_what_up_says_of_drains_and_short_chains():
    watch = ReplicaWatch()
    assert watch.lines([_load("n1", 3, learners=1), _load("n2", 4, draining=False)], {}) == [
        "node n1 is draining: 4 replicas left to move to the other nodes; the drain goes on "
        "(`sms node drain n1 --undo` stops it)"]
    assert watch.lines([_load("n1", 1)], {"s": 2, "t": 1}) == [
        "under-replicated: 3 partitions with fewer live members than their replication factor "
        "(s: 2, t: 1); `sms status` shows them"]
    assert watch.lines([_load("n1", 1)], {"s": 1}) == []                   # only what changed
    assert watch.lines([_load("n1", 0)], {}) == [
        "node n1 is drained: it holds no replica and may be stopped",
        "replication: every partition has its replication factor again"]
    assert watch.lines([_load("n1", 0, draining=False)], {}) == ["node n1 is no longer draining"]
    many = ReplicaWatch().lines([], {f"s{i:02d}": 1 for i in range(10)})
    assert many[0].startswith("under-replicated: 10 partitions") and "s07: 1 and 2 more streams)" in many[0]
    assert ReplicaWatch().lines([_load("n5", 0)], {}) == [
        "node n5 is draining and holds no replica: it may be stopped (`sms node drain n5 --undo` takes it back)"]
