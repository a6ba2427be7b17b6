"""Rough edges a user hit (issue 29 part 5), each on a real TLS cluster through the API or
the `sms` command as a user runs it (a separate `python -m node` process):

- `sms stream describe` shows the retention the stream has: seconds when it is not whole
  hours ("retention 10 s"), not the hours it rounds to.
- Error messages answered to a tenant's caller never show the tenant's prefix of the
  stored stream names (kernel/rpc.py for_caller, set by control/auth.py scope_request).
- `sms key list` shows each key's tenant.
- `sms node undrain` cancels a drain; `sms node remove` forgets a drained, stopped node,
  its draining mark too (refused by name while it runs or holds replicas).
- Consumer group members started together on an idle stream each get their share within
  the failover time, also when three share four partitions.
- A command whose stdout is closed early exits quietly with 141, as git and coreutils do.

One module-scoped cluster serves every test but the node removal's, which stops nodes of
an `sms up` of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

import sms
from metastore import open_metastore
from node.cli import EXIT_STDOUT_CLOSED
from sms import errors, metadata, rpc
from sms.proto import sms_pb2, sms_pb2_grpc
from tests.conftest import client_channel, wait_until
from tests.integration import test_cli as cli

pytestmark = pytest.mark.integration

COMMAND_TIMEOUT_S = 60
DEADLINE_S = 30.0
TENANT = "rough"
FAILOVER_S = 3.0


def sms_cli(cluster, *args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    """`sms ARGS --address A` as a user runs it (the suite's CA and token come from the
    environment, tests/conftest.py)."""
    return subprocess.run([sys.executable, "-m", "node", *args, "--address", cluster.address], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def tenant_token(client) -> str:
    client.create_tenant(TENANT)
    return client.create_key("admin", tenant=TENANT, name="rough edges")[1]


# --- 1. retention as it is ----------------------------------------------------------------

def test_describe_shows_the_retention_the_stream_has(cluster, unique_stream):
    created = ok(sms_cli(cluster, "stream", "create", unique_stream, "--retention-s", "10"))
    assert "retention 10 s," in created, created
    described = ok(sms_cli(cluster, "stream", "describe", unique_stream))
    assert "retention 10 s," in described and "retention 1 h" not in described, described
    updated = ok(sms_cli(cluster, "stream", "update", unique_stream, "--retention-s", "5400", "--json"))
    assert json.loads(updated)["retention_s"] == 5400
    assert "retention 5,400 s," in ok(sms_cli(cluster, "stream", "describe", unique_stream))
    ok(sms_cli(cluster, "stream", "update", unique_stream, "--retention-s", "7200"))
    assert "retention 2 h," in ok(sms_cli(cluster, "stream", "describe", unique_stream))


# --- 2. a tenant's errors in its own names -------------------------------------------------

def test_errors_never_show_the_tenant_prefix(cluster, tenant_token):
    with sms.Client(cluster.address, token=tenant_token) as t:
        t.create_stream("scans", partitions=1)
        sn = int(t.put_record("scans", b"x", "k").sequence_number)
        retrieval = next(n.address for n in t.describe_cluster().nodes if "retrieval" in n.roles)
        calls = {
            "describe a missing stream": (lambda: t.get_stream_info("nowhere"), "nowhere"),
            "put to a missing stream": (lambda: t.put_record("nowhere", b"x", "k"), "nowhere"),
            "create a stream that exists": (lambda: t.create_stream("scans"), "scans"),
            "delete a missing stream": (lambda: t.delete_stream("nowhere"), "nowhere"),
            "update a missing stream": (lambda: t.update_retention("nowhere", hours=2), "nowhere"),
            "iterator of a missing partition": (lambda: t.get_iterator("scans", 7, "TRIM_HORIZON"), "scans"),
            "iterator of a missing partition, asked of a node": (lambda: _raw_get_iterator(retrieval, tenant_token,
                                                                                          "scans", "p0007"), "scans"),
            "a record not committed": (lambda: t.get_record("scans", str(sn + (1000 << 32))), "scans"),
            "delete a missing group": (lambda: t.delete_group("scans", "nobody"), "scans"),
        }
        seen = {}
        for what, (call, name) in calls.items():
            with pytest.raises(errors.SmsError) as e:
                call()
            seen[what] = f"{e.value.name}: {e.value.message}"
            assert name in e.value.message, f"{what}: {seen[what]}"       # (a message naming the stream)
        print("".join(f"\n{what}: {text}" for what, text in seen.items()))
        leaked = {what: text for what, text in seen.items() if "~" in text}       # (TENANT~ above all)
        assert not leaked, leaked


def _raw_get_iterator(address: str, token: str, stream: str, partition_id: str) -> None:
    """GetIterator straight to a node (the client checks the partition against its map
    before it asks), raising the answer's named error."""
    with client_channel(address, token=token) as channel:
        try:
            sms_pb2_grpc.RetrievalStub(channel).GetIterator(sms_pb2.GetIteratorRequest(
                stream=stream, partition_id=partition_id, iterator_type="TRIM_HORIZON"), timeout=DEADLINE_S)
        except grpc.RpcError as e:
            raise rpc.to_sms_error(e) from None


# --- 3. the keys' tenants ------------------------------------------------------------------

def test_key_list_shows_each_keys_tenant(cluster, tenant_token):
    text = ok(sms_cli(cluster, "key", "list")).splitlines()
    assert text[0].split()[:3] == ["key", "tenant", "role"], text[0]
    rows = [line.split() for line in text[1:]]
    assert any(r[1] == TENANT and r[2] == "admin" for r in rows), text
    assert any(r[1] == "default" for r in rows), text
    keys = json.loads(ok(sms_cli(cluster, "key", "list", "--json")))
    assert {k["tenant"] for k in keys} >= {TENANT, "default"}


# --- 5. consumer group members share an idle stream at once ------------------------------

def test_members_started_together_on_an_idle_stream_share_it_within_the_failover_time(cluster, client,
                                                                                     unique_stream):
    client.create_stream(unique_stream, partitions=4, replication_factor=2)
    clients = [sms.Client(cluster.address) for _ in range(3)]
    members: list = []
    try:
        t0 = time.monotonic()
        members += _start_together(clients[:2], unique_stream)
        wait_until(lambda: sorted(len(m.assigned) for m in members) == [2, 2],
                   FAILOVER_S - (time.monotonic() - t0), "two partitions each")
        print(f"\ntwo members: 2 + 2 partitions after {time.monotonic() - t0:.2f} s (failover {FAILOVER_S} s)")
        t0 = time.monotonic()
        members += _start_together(clients[2:], unique_stream)
        wait_until(lambda: sorted(len(m.assigned) for m in members) == [1, 1, 2],
                   FAILOVER_S - (time.monotonic() - t0), "a third member's share")
        print(f"a third: 2 + 1 + 1 partitions after {time.monotonic() - t0:.2f} s")
        held = [p for m in members for p in m.assigned]
        assert sorted(held) == ["p0000", "p0001", "p0002", "p0003"]
    finally:
        for m in members:
            m.__exit__(None, None, None)
        for c in clients:
            c.close()


def _start_together(clients: list[sms.Client], stream: str) -> list:
    started: list = [None] * len(clients)
    barrier = threading.Barrier(len(clients))

    def start(i: int) -> None:
        member = clients[i].consumer(stream, "idle", member_id=f"m{len(clients)}-{i}", failover_s=FAILOVER_S)
        barrier.wait()
        started[i] = member.__enter__()

    threads = [threading.Thread(target=start, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    assert all(started), "a member did not start"
    return started


# --- 6. a closed stdout ----------------------------------------------------------------------

def test_a_closed_stdout_ends_a_command_quietly(cluster, client, unique_stream):
    client.create_stream(unique_stream, partitions=1)
    for args in (("stream", "update", unique_stream, "--retention-s", "20"), ("stream", "describe", unique_stream)):
        reader, writer = os.pipe()
        os.close(reader)                   # (the reader is gone before the command writes a byte)
        try:
            done = sms_cli(cluster, *args, stdout=writer)
        finally:
            os.close(writer)
        assert (done.returncode, done.stderr) == (EXIT_STDOUT_CLOSED, ""), (args, done.returncode, done.stderr)
    assert EXIT_STDOUT_CLOSED == 141
    assert client.get_stream_info(unique_stream).retention_s == 20        # (the update itself was done)


# --- 5. the operator's rough edges (issue 35 item 5) --------------------------------------------

def test_str_data_is_stored_as_its_utf8(client, unique_stream):
    """As boto3 takes a str for Kinesis's Data: put_record, put_records (both codec paths
    hand it to records.prepare_record) and the producer store its UTF-8; a str that is
    not valid Unicode is refused by name and stores nothing."""
    client.create_stream(unique_stream, partitions=1)
    client.put_record(unique_stream, "héllo", "k")
    assert not client.put_records(unique_stream, [("k", "wörld"), {"partition_key": "k", "data": "€"}]).failed_record_count
    with client.producer(unique_stream) as producer:
        producer.send("ünïcode", "k").result(timeout=DEADLINE_S)
    for bad in ("lone \ud800", 12345):
        with pytest.raises(errors.InvalidArgument):
            client.put_record(unique_stream, bad, "k")
        with pytest.raises(errors.InvalidArgument):          # (checked before anything is sent)
            client.put_records(unique_stream, [("k", b"fine"), ("k", bad)])
    got = [r.data for r in client.read_stream(unique_stream)]
    assert got == [s.encode() for s in ("héllo", "wörld", "€", "ünïcode")]


def test_config_show_of_a_running_node(cluster):
    """`sms config show --node N` asks the node for the settings it runs with (each with its
    source); an unknown node is a named error."""
    rows = json.loads(ok(sms_cli(cluster, "config", "show", "--node", "n1", "--json")))
    by_key = {r["key"]: r for r in rows}
    assert "metastore.session_ttl_s" in by_key and {"value", "source"} <= set(by_key["node.listen"])
    assert by_key["node.listen"]["source"] != "default"          # (the launcher gave it: --listen)
    text = ok(sms_cli(cluster, "config", "show", "--node", "n1"))
    assert "metastore.session_ttl_s" in text
    done = sms_cli(cluster, "config", "show", "--node", "n9")
    assert done.returncode == 1 and "NodeNotFound" in done.stderr and "n1" in done.stderr


def test_lag_in_records_and_one_partition_name(cluster, client, unique_stream):
    """`sms consumer describe` says how many records a group has not read, per partition and
    in all; `sms status` names replicas `stream/p0000` as everything else does."""
    client.create_stream(unique_stream, partitions=2, replication_factor=2)
    client.put_records(unique_stream, [(f"k{i}", b"x") for i in range(20)])
    with client.consumer(unique_stream, "lagging", failover_s=FAILOVER_S, wait_ms=200) as c:
        got = 0
        deadline = time.monotonic() + DEADLINE_S
        while got < 20 and time.monotonic() < deadline:
            batch = c.poll(1.0)
            got += len(batch.records) if batch else 0
        assert got == 20
    client.put_records(unique_stream, [(f"k{i}", b"y") for i in range(7)])
    described = json.loads(ok(sms_cli(cluster, "consumer", "describe", unique_stream, "lagging", "--json")))
    assert described["lag_records"] == 7
    assert sum(p["lag_records"] for p in described["partitions"]) == 7
    text = ok(sms_cli(cluster, "consumer", "describe", unique_stream, "lagging"))
    assert "lag 7 records" in text.splitlines()[0]
    status = ok(sms_cli(cluster, "status"))
    assert f"{unique_stream}/p0000" in status and f"{unique_stream}:0" not in status


def _complete(cluster, line: str, tmp_path) -> list[str]:
    """What bash's completion hook gets from `sms` for `line` (cursor at its end)."""
    out = tmp_path / "completions"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_IFS": "\v", "_ARGCOMPLETE_STDOUT_FILENAME": str(out)}
    done = subprocess.run([sys.executable, "-m", "node"], env=env, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done
    return sorted(c.strip() for c in out.read_text().split("\v") if c.strip())


def test_completion_names_streams_groups_and_nodes(cluster, client, unique_stream, tmp_path):
    client.create_stream(unique_stream, partitions=1)
    with client.consumer(unique_stream, "completed", failover_s=FAILOVER_S, wait_ms=100) as c:
        c.poll(1.0)
        wait_until(lambda: c.assigned, DEADLINE_S, "the member's lease")
    a = f"--address {cluster.address}"
    assert _complete(cluster, f"sms stream describe {a} {unique_stream[:-1]}", tmp_path) == [unique_stream]
    assert _complete(cluster, f"sms consumer describe {a} {unique_stream} comp", tmp_path) == ["completed"]
    assert _complete(cluster, f"sms node drain {a} n", tmp_path) == ["n1", "n2", "n3"]
    assert _complete(cluster, f"sms stream create {a} {unique_stream[:-1]}", tmp_path) == []     # a new name


# --- 4. undrain and remove (an `sms up` of its own: nodes stop) ---------------------------------

def _loads(c: sms.Client) -> dict:
    return {n.node_id: n for n in c.list_nodes()}


def _draining_mark(metastore: str, node_id: str) -> bool:
    """Whether the metadata store still marks the node as draining (a node started again
    under its id would take no replica)."""
    async def read() -> bool:
        store = open_metastore(metastore)
        await store.start()
        try:
            return await store.get(metadata.draining_path(node_id)) is not None
        finally:
            await store.close()
    return asyncio.run(read())


def _cluster_file(data_dir: str) -> dict:
    with open(os.path.join(data_dir, "cluster.json")) as f:
        return json.load(f)


def test_undrain_and_remove_a_node(tmp_path):
    """As a user of `sms up` does: drain, change one's mind, drain again, stop the node
    (SIGTERM: `sms up` leaves a node that exits cleanly down), remove it."""
    data_dir = str(tmp_path)
    up = cli.Up(data_dir, 2)
    try:
        up.wait_for_address()
        info = _cluster_file(data_dir)
        pids = {n["node_id"]: n["pid"] for n in info["nodes"]}
        with sms.Client.from_cluster_file(data_dir) as c:
            c.create_stream("kept", partitions=2, replication_factor=1)
            c.drain_node("n2")
            undrained = json.loads(cli.ok(cli.sms_cmd(data_dir, "node", "undrain", "n2", "--json")))
            assert {n["node_id"]: n["draining"] for n in undrained}["n2"] is False
            assert not _loads(c)["n2"].draining and not _draining_mark(info["metastore"], "n2")

            c.drain_node("n2")
            with pytest.raises(errors.NodeLive, match="node n2 is running"):
                c.remove_node("n2")
            wait_until(lambda: (lambda n: n.replicas + n.learners == 0)(_loads(c)["n2"]), DEADLINE_S, "n2 drained")
            os.kill(pids["n2"], signal.SIGTERM)
            wait_until(lambda: (lambda n: n is None or not n.live)(_loads(c).get("n2")), DEADLINE_S, "n2 stopped")
            assert _draining_mark(info["metastore"], "n2")
            removed = cli.ok(cli.sms_cmd(data_dir, "node", "remove", "n2"))
            assert removed.startswith(f"n2 removed: the cluster keeps no entry of it (nor does the local cluster "
                                      f"in {data_dir})"), removed
            assert "n2" not in _loads(c) and not _draining_mark(info["metastore"], "n2")
            assert "n2" not in {n["node_id"] for n in _cluster_file(data_dir)["nodes"]}
            with pytest.raises(errors.NodeNotFound):
                c.remove_node("n2")

            os.kill(pids["n1"], signal.SIGTERM)        # down with its replicas, not drained
            wait_until(lambda: not _loads(c)["n1"].live, DEADLINE_S, "n1 stopped")
            with pytest.raises(errors.NodeNotDrained):
                c.remove_node("n1")
            assert _loads(c)["n1"].replicas == 2
    finally:
        up.stop()
