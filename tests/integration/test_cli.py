"""The `sms` command as a user runs it: `sms up` in one terminal, commands in another.

Every command is a separate `python -m node` process; `sms up` is stopped with SIGTERM
(and, in a smaller run, SIGINT) and must take every node process down with it.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from node import certs
from sms import security
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

UP_READY_TIMEOUT_S = 60
UP_STOP_TIMEOUT_S = 30
COMMAND_TIMEOUT_S = 60
ADDRESS_LINE = re.compile(r"^address: (\S+:\d+)$")


# the suite's CA and admin token (tests/conftest.py) are left out: `sms up` here makes its
# own, as on a new user's machine, and the commands find them in DIR/cluster.json
_NOT_PASSED = {"SMS_ADDRESS", "SMS_CA_FILE", "SMS_CA_DIR", "SMS_TOKEN", "SMS_BOOTSTRAP_TOKEN"}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _NOT_PASSED}


class Up:
    """A running `sms up`: its process and the lines it printed, read by a thread."""

    def __init__(self, data_dir: str, nodes: int, *extra: str):
        self.data_dir = data_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "node", "up", "--data-dir", data_dir, "--port", "0", "--nodes", str(nodes), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, env=_env(),
            cwd=data_dir)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for_address(self) -> str:
        return ADDRESS_LINE.match(self.wait_for_line(ADDRESS_LINE.pattern, UP_READY_TIMEOUT_S)).group(1)

    def wait_for_line(self, pattern: str, timeout_s: float) -> str:
        """The first line `sms up` prints (stdout or stderr) from now on that matches."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"`sms up` printed no line matching {pattern!r} in {timeout_s}s: {self.output}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"`sms up` exited with {self.proc.wait()}: {self.output}")
            self.output.append(line)
            if re.search(pattern, line):
                return line

    def rest_of_output(self) -> list[str]:
        self.reader.join(timeout=UP_STOP_TIMEOUT_S)
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return self.output
            if line is not None:
                self.output.append(line)

    def stop(self) -> None:
        """Teardown: make sure the launcher (and so its children) is gone."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=UP_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def sms_cmd(data_dir: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node", *args, "--data-dir", data_dir], input=stdin,
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, env=_env(), cwd=data_dir)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _gone(pid: int) -> bool:
    """The process has exited: no such pid, or a zombie nobody has reaped yet (a child
    of a killed launcher is re-parented to init, which may be slow to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def assert_stops_cleanly(up: Up, sig: int) -> None:
    with open(os.path.join(up.data_dir, "cluster.json")) as f:
        child_pids = [n["pid"] for n in json.load(f)["nodes"]]
    assert child_pids and all(not _gone(pid) for pid in child_pids)
    up.proc.send_signal(sig)
    assert up.proc.wait(timeout=UP_STOP_TIMEOUT_S) == 0
    assert "stopped" in up.rest_of_output()
    for pid in child_pids:
        wait_until(lambda: _gone(pid), UP_STOP_TIMEOUT_S, f"node process {pid} to exit after {sig.name}")


@pytest.fixture
def up_factory(tmp_path) -> Iterator:
    started: list[Up] = []

    def start(nodes: int) -> Up:
        data_dir = tmp_path / f"up{len(started)}"
        data_dir.mkdir()
        up = Up(str(data_dir), nodes)
        started.append(up)
        return up

    try:
        yield start
    finally:
        for up in started:
            up.stop()


def test_up_is_secure_by_default_and_keys_have_roles(up_factory):
    """`sms up` makes a CA, node certificates and an admin key in its directory; the
    commands use them through cluster.json (mode 0600); a consumer key cannot write, and
    a revoked key is refused."""
    up = up_factory(nodes=1)
    d = up.data_dir
    up.wait_for_address()
    path = os.path.join(d, "cluster.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        cluster = json.load(f)
    assert cluster["ca_file"] == os.path.join(d, "tls", "ca", "ca.pem") and cluster["token"].startswith("sms_")
    after = [up.lines.get(timeout=UP_READY_TIMEOUT_S) for _ in range(2)]      # (the console's line, then TLS's)
    assert any(line.startswith("tls: CA ") for line in up.output + after), after
    # the console's address, and how to give it the key, never the token itself
    assert any(line.startswith("console: https://") and "?token=<the token in cluster.json>" in line
               and cluster["token"] not in line for line in after), after
    ok(sms_cmd(d, "stream", "create", "s", "--partitions", "1"))
    key = json.loads(ok(sms_cmd(d, "key", "create", "--role", "consumer", "--stream", "s", "--name", "r", "--json")))
    assert key["role"] == "consumer" and key["streams"] == ["s"] and key["token"].startswith("sms_")
    refused = sms_cmd(d, "put", "s", "x", "--key", "k", "--token", key["token"])
    assert refused.returncode == 1 and "PermissionDenied" in refused.stderr, refused
    ok(sms_cmd(d, "put", "s", "x", "--key", "k"))                   # the admin token of cluster.json
    assert "x" in ok(sms_cmd(d, "read", "s", "--token", key["token"]))
    listed = json.loads(ok(sms_cmd(d, "key", "list", "--json")))
    assert key["key_id"] in {k["key_id"] for k in listed} and all("sha256" not in k for k in listed)
    ok(sms_cmd(d, "key", "revoke", key["key_id"]))
    wait_until(lambda: "Unauthenticated" in sms_cmd(d, "read", "s", "--token", key["token"]).stderr,
               COMMAND_TIMEOUT_S, "the revoked key refused")
    plain = sms_cmd(d, "stream", "list", "--ca-file", "", "--address", cluster["address"])
    assert plain.returncode == 1 and "TlsHandshakeFailed" in plain.stderr, plain
    # a node certificate whose key leaked: revoked by its file
    leaked = certs.issue(os.path.join(d, "tls", "ca"), os.path.join(d, "leaked"), node="n9")
    ok(sms_cmd(d, "certs", "revoke", leaked.cert_file, "--reason", "laptop stolen"))
    assert [(c["serial"], c["reason"]) for c in json.loads(ok(sms_cmd(d, "certs", "revoked", "--json")))] == \
        [(security.cert_serial(leaked.cert_file), "laptop stolen")]
    # a tenant: its own streams under its own names
    ok(sms_cmd(d, "tenant", "create", "acme"))
    assert "acme" in {t["name"] for t in json.loads(ok(sms_cmd(d, "tenant", "list", "--json")))}
    limited = json.loads(ok(sms_cmd(d, "tenant", "update", "acme", "--write-records-per-s", "1000", "--json")))
    assert limited["write_records_per_s"] == 1000
    capped = json.loads(ok(sms_cmd(d, "tenant", "update", "acme", "--streams-max", "5", "--read-bytes-per-s",
                                   "1000000", "--json")))
    assert (capped["streams_max"], capped["read_bytes_per_s"], capped["write_records_per_s"]) == (5, 1_000_000, 1000)
    assert "streams_max 5" in ok(sms_cmd(d, "tenant", "list"))
    acme = json.loads(ok(sms_cmd(d, "key", "create", "--role", "admin", "--tenant", "acme", "--json")))["token"]
    ok(sms_cmd(d, "stream", "create", "s", "--partitions", "1", "--token", acme))      # its own "s"
    ok(sms_cmd(d, "put", "s", "acme's", "--key", "k", "--token", acme))
    assert json.loads(ok(sms_cmd(d, "stream", "list", "--json", "--token", acme))) == ["s"]
    assert "acme's" in ok(sms_cmd(d, "read", "s", "--token", acme))
    assert "acme's" not in ok(sms_cmd(d, "read", "s"))                                 # the default tenant's "s"
    # a consumer group: it reads from its checkpoint; --max checkpoints only what it showed
    for i in range(3):
        ok(sms_cmd(d, "put", "s", f"g{i}", "--key", f"k{i}"))
    first = ok(sms_cmd(d, "read", "s", "--group", "g", "--max", "2"))
    rest = ok(sms_cmd(d, "read", "s", "--group", "g"))
    assert first.count("\n") == 2 and (first + rest).count("\n") == 4 and "g2" in rest    # x (put before), g0..g2
    assert ok(sms_cmd(d, "read", "s", "--group", "g")) == ""
    groups = json.loads(ok(sms_cmd(d, "consumer", "list", "s", "--json")))
    assert groups["groups"] == ["g"]
    described = json.loads(ok(sms_cmd(d, "consumer", "describe", "s", "g", "--json")))
    assert described["partitions"][0]["records"] == 4 and described["members"] == []
    plan = ok(sms_cmd(d, "consumer", "reset", "s", "g", "--to", "TRIM_HORIZON"))      # (a plan: nothing changes)
    assert "--execute" in plan and "p0000" in plan and "to TRIM_HORIZON" in plan, plan
    assert json.loads(ok(sms_cmd(d, "consumer", "reset", "s", "g", "--json")))["executed"] is False
    assert ok(sms_cmd(d, "read", "s", "--group", "g")) == ""
    ok(sms_cmd(d, "consumer", "reset", "s", "g", "--to", "TRIM_HORIZON", "--execute"))
    assert ok(sms_cmd(d, "read", "s", "--group", "g")).count("\n") == 4
    ok(sms_cmd(d, "consumer", "delete", "s", "g"))
    missing = sms_cmd(d, "consumer", "describe", "s", "g")
    assert missing.returncode == 1 and "GroupNotFound" in missing.stderr, missing


@pytest.mark.slow
def test_up_streams_put_read_status_and_sigterm(up_factory):
    up = up_factory(nodes=3)
    d = up.data_dir
    address = up.wait_for_address()
    with open(os.path.join(d, "cluster.json")) as f:
        cluster = json.load(f)
    assert cluster["address"] == address
    assert cluster["launcher_pid"] == up.proc.pid

    created = json.loads(ok(sms_cmd(d, "stream", "create", "s1", "--partitions", "2", "--rf", "3", "--json")))
    assert created["name"] == "s1" and len(created["partitions"]) == 2
    assert json.loads(ok(sms_cmd(d, "stream", "list", "--json"))) == ["s1"]
    # $SMS_DATA_DIR stands for --data-dir on every command (here from another directory)
    listed = subprocess.run([sys.executable, "-m", "node", "stream", "list", "--json"], capture_output=True,
                            text=True, timeout=COMMAND_TIMEOUT_S, env={**_env(), "SMS_DATA_DIR": d},
                            cwd=os.path.dirname(d))
    assert json.loads(ok(listed)) == ["s1"]
    described = json.loads(ok(sms_cmd(d, "stream", "describe", "s1", "--json")))
    assert [p["partition_id"] for p in described["partitions"]] == ["p0000", "p0001"]
    for p in described["partitions"]:
        assert len(p["chain"]) == 3 and len({m["node_id"] for m in p["chain"]}) == 3
        assert [m["role"] for m in p["chain"]] == ["head", "middle", "tail"]

    put_args = ok(sms_cmd(d, "put", "s1", "a", "b", "c", "--key", "k", "--json"))
    acked_args = json.loads(put_args)
    assert len(acked_args) == 3 and all("sequence_number" in r for r in acked_args)
    assert len({r["partition_id"] for r in acked_args}) == 1, "one key, one partition"
    acked_stdin = json.loads(ok(sms_cmd(d, "put", "s1", "--json", stdin="line one\nline two\nline three\n")))
    assert len(acked_stdin) == 3

    read = [json.loads(line) for line in ok(sms_cmd(d, "read", "s1", "--json")).splitlines()]
    assert sorted(r["data"] for r in read) == sorted(["a", "b", "c", "line one", "line two", "line three"])
    assert sorted(r["sequence_number"] for r in read) == \
           sorted(r["sequence_number"] for r in acked_args + acked_stdin)
    keyed = sorted((r for r in read if r["partition_key"] == "k"), key=lambda r: int(r["sequence_number"]))
    assert [r["data"] for r in keyed] == ["a", "b", "c"]
    assert ok(sms_cmd(d, "read", "s1", "--from", "LATEST", "--json")).strip() == ""

    status = json.loads(ok(sms_cmd(d, "status", "--json")))
    assert status["control"] == address
    by_id = {n["node_id"]: n for n in status["nodes"]}
    assert sorted(by_id) == ["control", "n1", "n2", "n3"]
    assert {n["node_id"]: n["pid"] for n in cluster["nodes"]} == {i: n["pid"] for i, n in by_id.items()}
    for node_id in ("n1", "n2", "n3"):
        chains = {r["chain_id"] for r in by_id[node_id]["replicas"]}
        assert chains == {"s1:0", "s1:1"}, f"{node_id} replicas {chains}"
    records = sum(r["records"] for r in by_id["n1"]["replicas"])
    assert records == 6
    # every head and middle ships its chains to a successor node on one stream per peer
    outgoing = [(node_id, link["peer"]) for node_id in ("n1", "n2", "n3")
                for link in by_id[node_id]["links"] if link["direction"] == "out"]
    assert outgoing and len(outgoing) == len(set(outgoing))
    assert all(link["connected"] for n in ("n1", "n2", "n3") for link in by_id[n]["links"] if link["chains"])
    text = ok(sms_cmd(d, "status"))
    assert "link -> " in text and "link <- " in text
    # each node's Prometheus endpoint (node/metrics.py), as cluster.json lists it
    assert {n["node_id"]: n["metrics_address"] for n in cluster["nodes"]} == \
           {i: n["metrics_address"] for i, n in by_id.items()}
    assert all(n["metrics_address"] and f"metrics {n['metrics_address']}" in text for n in by_id.values())

    missing = sms_cmd(d, "stream", "describe", "nope")
    assert missing.returncode == 1
    assert "StreamNotFound" in missing.stderr
    assert json.loads(ok(sms_cmd(d, "stream", "list", "--json"))) == ["s1"]

    # resize while it holds records: the lineage shows, and a read walks it
    split = json.loads(ok(sms_cmd(d, "stream", "repartition", "s1", "--split", "p0000", "--json")))
    by_pid = {p["partition_id"]: p for p in split["partitions"]}
    assert by_pid["p0000"]["state"] == "CLOSED" and by_pid["p0000"]["children"] == [2, 3]
    assert by_pid["p0000"]["ending_sn"] is not None and by_pid["p0002"]["parents"] == [0]
    described = ok(sms_cmd(d, "stream", "describe", "s1"))
    assert "into p0002, p0003" in described and "3 open partitions (1 closed)" in described, described
    history = re.compile(r"^\s+\d\d:\d\d:\d\d epoch \d+: ", re.M)      # (each chain's changes: --history only)
    assert not history.search(described)
    assert ok(sms_cmd(d, "stream", "describe", "s1", "--history")).startswith(described.split("\n", 1)[0])
    ok(sms_cmd(d, "put", "s1", "d", "--key", "k", "--json"))
    keyed = [r for r in (json.loads(line) for line in ok(sms_cmd(d, "read", "s1", "--json")).splitlines())
             if r["partition_key"] == "k"]
    assert [r["data"] for r in keyed] == ["a", "b", "c", "d"], "parents before children, per key in order"
    scaled = json.loads(ok(sms_cmd(d, "stream", "repartition", "s1", "--scale", "1", "--json")))
    opened = [p for p in scaled["partitions"] if p["state"] == "OPEN"]
    assert len(opened) == 1 and opened[0]["hash_lo"] == "0" and opened[0]["hash_hi"] == str(1 << 128)
    adjacent = sms_cmd(d, "stream", "repartition", "s1", "--merge", "p0000", "p0001")
    assert adjacent.returncode == 1 and "PartitionNotOpen" in adjacent.stderr
    updated = json.loads(ok(sms_cmd(d, "stream", "update", "s1", "--retention-s", "3600", "--protect-unread",
                                    "true", "--json")))
    assert updated["retention_s"] == 3600 and updated["protect_unread"] is True
    bad = sms_cmd(d, "stream", "update", "s1", "--retention-s", "5")
    assert bad.returncode == 1 and "InvalidStreamConfig" in bad.stderr
    assert "trim of s1 requested" in ok(sms_cmd(d, "stream", "trim", "s1", "--before-time-ms", "1"))

    assert_stops_cleanly(up, signal.SIGTERM)


def test_up_stops_on_sigint(up_factory):
    up = up_factory(nodes=1)
    up.wait_for_address()
    ok(sms_cmd(up.data_dir, "stream", "create", "s", "--rf", "1"))
    assert_stops_cleanly(up, signal.SIGINT)


def test_nodes_exit_when_up_is_killed(up_factory):
    """No SIGTERM handler runs on SIGKILL: the nodes must notice that `sms up` is gone."""
    up = up_factory(nodes=1)
    up.wait_for_address()
    with open(os.path.join(up.data_dir, "cluster.json")) as f:
        child_pids = [n["pid"] for n in json.load(f)["nodes"]]
    up.proc.kill()
    up.proc.wait(timeout=UP_STOP_TIMEOUT_S)
    for pid in child_pids:
        wait_until(lambda: _gone(pid), UP_STOP_TIMEOUT_S, f"node process {pid} to exit after its launcher died")


def test_node_add_list_and_drain(up_factory):
    """`sms node add` starts a node that takes its share of replicas and stops with `sms
    up`; `sms node drain --wait` returns once the node holds nothing."""
    up = up_factory(nodes=2)
    up.wait_for_address()
    ok(sms_cmd(up.data_dir, "stream", "create", "s", "--partitions", "4", "--rf", "2"))
    added = json.loads(ok(sms_cmd(up.data_dir, "node", "add", "--json")))
    assert added["node_id"] == "n3" and added["pid"] > 0

    def loads() -> dict:
        return {n["node_id"]: n for n in json.loads(ok(sms_cmd(up.data_dir, "node", "list", "--json")))}

    wait_until(lambda: loads().get("n3", {}).get("replicas", 0) >= 2 and not loads()["n3"]["learners"],
               COMMAND_TIMEOUT_S, "n3 taking its share of replicas")
    text = ok(sms_cmd(up.data_dir, "node", "list"))
    assert re.search(r"^n3\s+127\.0\.0\.1:\d+\s+live\s+[2-9]", text, re.M), text
    drained = json.loads(ok(sms_cmd(up.data_dir, "node", "drain", "n1", "--wait", "--json")))
    n1 = next(n for n in drained if n["node_id"] == "n1")
    assert n1["draining"] and n1["replicas"] == 0 and n1["learners"] == 0
    bad = sms_cmd(up.data_dir, "node", "drain", "nope")
    assert bad.returncode == 1 and "NodeNotFound" in bad.stderr
    assert_stops_cleanly(up, signal.SIGTERM)       # n3 too, although `sms up` did not start it
