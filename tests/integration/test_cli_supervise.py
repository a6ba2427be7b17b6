"""`sms up` restarts a node that died (node/launcher.py, LocalCluster.supervise).

A real `sms up` whose storage node is killed with SIGKILL: one line on its stderr, a new
pid in cluster.json, and the node serving again. The restart limit is tested on
LocalCluster.supervise itself, with real short-lived processes in place of nodes.
"""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from node.launcher import LocalCluster
from sms import limits
from tests.conftest import wait_until
from tests.integration import test_cli
from tests.integration.test_cli import assert_stops_cleanly, ok, sms_cmd

pytestmark = pytest.mark.integration

RESTART_TIMEOUT_S = 60
EXIT_TIMEOUT_S = 10

up_factory = test_cli.up_factory          # (the fixture: each `sms up` stopped at the end)


def _cluster_pids(data_dir: str) -> dict[str, int]:
    with open(os.path.join(data_dir, "cluster.json")) as f:
        return {n["node_id"]: n["pid"] for n in json.load(f)["nodes"]}


def test_up_restarts_a_killed_node(up_factory):
    up = up_factory(nodes=2)
    d = up.data_dir
    up.wait_for_address()
    ok(sms_cmd(d, "stream", "create", "s", "--partitions", "1", "--rf", "2"))
    ok(sms_cmd(d, "put", "s", "before", "--key", "k"))
    old_pid = _cluster_pids(d)["n1"]

    os.kill(old_pid, signal.SIGKILL)
    line = up.wait_for_line(r"^node n1 ", RESTART_TIMEOUT_S)
    assert line == (f"node n1 (pid {old_pid}) killed by SIGKILL; restarting (1 of {limits.NODE_RESTARTS_MAX} "
                    f"in the last {limits.NODE_RESTART_WINDOW_S:g} s)"), line
    new_pid = wait_until(lambda: (pid := _cluster_pids(d)["n1"]) != old_pid and pid,
                         RESTART_TIMEOUT_S, "a new pid of n1 in cluster.json")

    def n1_serving() -> bool:
        status = sms_cmd(d, "status", "--json")
        if status.returncode != 0:
            return False
        n1 = {n["node_id"]: n for n in json.loads(status.stdout)["nodes"]}.get("n1")
        return bool(n1) and n1["pid"] == new_pid and "error" not in n1

    wait_until(n1_serving, RESTART_TIMEOUT_S, "n1 listed by `sms status` with its new pid, answering")
    ok(sms_cmd(d, "put", "s", "after", "--key", "k"))
    assert [json.loads(r)["data"] for r in ok(sms_cmd(d, "read", "s", "--json")).splitlines()] == ["before", "after"]

    assert_stops_cleanly(up, signal.SIGTERM)          # the new n1 too; and nothing restarted on the way out
    assert [line for line in up.output if line.startswith("node ")] == [line], up.output


def test_ctrl_c_in_a_terminal_restarts_nothing(up_factory):
    """Ctrl-C in a terminal signals the whole foreground process group: `sms up` and its
    nodes at once. The nodes exiting of it are not restarted."""
    up = up_factory(nodes=2)
    up.wait_for_address()
    pids = [up.proc.pid, *_cluster_pids(up.data_dir).values()]
    for pid in pids:
        os.kill(pid, signal.SIGINT)
    assert up.proc.wait(timeout=test_cli.UP_STOP_TIMEOUT_S) == 0
    output = up.rest_of_output()
    assert "stopped" in output and not [line for line in output if "restarting" in line], output
    for pid in pids[1:]:
        wait_until(lambda: test_cli._gone(pid), test_cli.UP_STOP_TIMEOUT_S, f"node process {pid} to exit")


# --- the limit, on LocalCluster.supervise with stand-in processes ----------------------------

class StandIns(LocalCluster):
    """A LocalCluster whose nodes are shell commands (no node is started): `sh -c SCRIPT`
    takes the node's own command line as its (ignored) arguments."""

    def __init__(self, data_dir: str, scripts: dict[str, str]):
        super().__init__(data_dir, nodes=len(scripts) - 1, tls=False)
        self.scripts = scripts

    def command_prefix(self, node_id: str) -> list[str]:
        return ["sh", "-c", self.scripts[node_id]]


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "NODE_RESTARTS_MAX", 3)
    clusters: list[StandIns] = []

    def make(**scripts: str) -> StandIns:
        cluster = StandIns(str(tmp_path / f"c{len(clusters)}"), scripts)
        clusters.append(cluster)
        os.makedirs(cluster.data_dir)
        for node_id in cluster.procs:
            cluster.spawn(node_id)
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            cluster.stop()


def _supervise_until(cluster: LocalCluster, lines_wanted: int, timeout_s: float) -> list[str]:
    lines: list[str] = []
    wait_until(lambda: lines.extend(cluster.supervise()) or len(lines) >= lines_wanted, timeout_s,
               f"{lines_wanted} lines from supervise: {lines}")
    return lines


def test_a_node_that_keeps_dying_stays_down_after_the_limit(stand_ins):
    cluster = stand_ins(control="exec sleep 60", n1="exit 3")
    control_pid = cluster.procs["control"].pid
    pids: list[int] = []
    lines: list[str] = []
    for _ in range(limits.NODE_RESTARTS_MAX + 1):
        pids.append(cluster.procs["n1"].pid)
        lines += _supervise_until(cluster, 1, EXIT_TIMEOUT_S)
    window = f"in the last {limits.NODE_RESTART_WINDOW_S:g} s"
    assert lines == [f"node n1 (pid {pids[k]}) exited with code 3; restarting ({k + 1} of 3 {window})"
                     for k in range(3)] + \
        [f"node n1 (pid {pids[3]}) exited with code 3; it stays down: restarted 3 times {window} (see "
         f"{cluster.data_dir}/logs/n1.log and {cluster.data_dir}/logs/n1.out)"]
    assert len(set(pids)) == 4
    for _ in range(3):                       # no more tries, no more lines
        assert cluster.supervise() == []
    assert cluster.procs["n1"].pid == pids[3] and cluster.procs["control"].pid == control_pid


def test_restarts_outside_the_window_do_not_count(stand_ins):
    cluster = stand_ins(control="exec sleep 60", n1="exit 3")
    now = [1000.0]
    cluster.clock = lambda: now[0]
    counts = []
    for advance_s in (0, limits.NODE_RESTART_WINDOW_S + 1, 0, limits.NODE_RESTART_WINDOW_S + 1, 0, 0):
        now[0] += advance_s
        (line,) = _supervise_until(cluster, 1, EXIT_TIMEOUT_S)
        counts.append(re.search(r"restarting \((\d) of 3", line).group(1))
    assert counts == ["1", "1", "2", "1", "2", "3"]


def test_a_node_that_stopped_cleanly_stays_down(stand_ins):
    """Exit code 0 (a SIGTERM after `sms node drain`, say) is a stop, not a death."""
    cluster = stand_ins(control="exec sleep 60", n1="exit 0")
    (line,) = _supervise_until(cluster, 1, EXIT_TIMEOUT_S)
    assert line.startswith("node n1 ") and line.endswith("stopped cleanly; it stays down until `sms up` starts again")
    assert cluster.supervise() == []


def test_nodes_stopped_on_purpose_stay_down(stand_ins):
    cluster = stand_ins(control="exec sleep 60", n1="exec sleep 60", n2="exec sleep 60")
    cluster.kill("n1")
    cluster.signal("n2", signal.SIGKILL)          # (not through the launcher: a death)
    cluster.procs["n2"].proc.wait(timeout=EXIT_TIMEOUT_S)
    assert cluster.supervise(stopping=lambda: True) == []       # the launcher is stopping: no restart
    (line,) = cluster.supervise()
    assert line.startswith("node n2 ") and "killed by SIGKILL; restarting (1 of 3" in line
    assert cluster.procs["n1"].proc.poll() is not None and cluster.procs["n2"].proc.poll() is None
    cluster.stop()
    assert cluster.supervise() == [] and all(n.proc.poll() is not None for n in cluster.procs.values())


def test_a_restarted_node_is_written_to_cluster_json_once_ready(stand_ins):
    """The ready file a real node writes (node/server.py) is what supervise waits for;
    nodes that `sms node add` appended to cluster.json stay in it."""
    script = 'exec sleep 60'
    cluster = stand_ins(control=script, n1=script)
    cluster._write_cluster_json()
    path = os.path.join(cluster.data_dir, "cluster.json")
    with open(path) as f:
        info = json.load(f)
    info["nodes"].append({"node_id": "n2", "roles": "storage", "pid": 1, "address": "x:1", "metrics_address": ""})
    with open(path, "w") as f:
        json.dump(info, f)
    old_pid = cluster.procs["n1"].pid
    cluster.signal("n1", signal.SIGKILL)
    cluster.procs["n1"].proc.wait(timeout=EXIT_TIMEOUT_S)
    assert len(cluster.supervise()) == 1
    new_pid = cluster.procs["n1"].pid
    assert new_pid != old_pid and _cluster_pids(cluster.data_dir)["n1"] == old_pid    # not ready yet
    ready, _ = cluster._paths("n1")
    with open(ready, "w") as f:
        json.dump({"address": "127.0.0.1:1234"}, f)
    assert cluster.supervise() == []
    assert _cluster_pids(cluster.data_dir) == {"control": cluster.procs["control"].pid, "n1": new_pid, "n2": 1}
    assert cluster.procs["n1"].address == "127.0.0.1:1234"
