"""Consumer groups in the client (issue 16 item 1; sms/consumer.py, control/groups.py):
`client.consumer(stream, group)` over a real TLS cluster, through the cluster's API only.

- One member reads every record once, checkpoints, and a restarted member resumes after
  the checkpoint.
- Two members share the partitions evenly, and together read every record exactly once
  when they stop cleanly; a member that stops hands its partitions over at once.
- A member killed with SIGKILL (a real separate process) loses its partitions after the
  failover time; the other reads on from the dead member's checkpoint: nothing is lost.
- Parents before children across a split, per key in SN order.
- The group is a registered consumer (protect_unread keeps what it has not read);
  `reset_group` moves it back, and running members follow.
- Two tenants' groups of the same name on streams of the same name never meet.
- Bad input gets a named error and changes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

import pytest

import sms
from sms import errors
from sms.proto import sms_pb2, sms_pb2_grpc
from tests.conftest import client_channel, wait_until

pytestmark = pytest.mark.integration

FAILOVER_S = 2.0
DEADLINE_S = 30.0


def _put(client: sms.Client, stream: str, n: int, start: int = 0, keys: int = 50) -> list[tuple[str, bytes]]:
    records = [(f"k{i % keys}", f"r{i}".encode()) for i in range(start, start + n)]
    for i in range(0, n, 500):
        assert client.put_records(stream, records[i:i + 500]).failed_record_count == 0
    return records


def _drain(consumer, want: int, timeout_s: float = DEADLINE_S) -> list:
    """Batches until `want` records came (or the deadline)."""
    got, deadline = [], time.monotonic() + timeout_s
    while sum(len(b.records) for b in got) < want and time.monotonic() < deadline:
        got.append(next(consumer))
    return got


def _datas(batches) -> list[bytes]:
    return [r.data for b in batches for r in b.records]


def test_one_member_reads_everything_once_and_resumes_after_its_checkpoint(client, unique_stream):
    client.create_stream(unique_stream, partitions=4, replication_factor=2)
    sent = _put(client, unique_stream, 2000)
    with client.consumer(unique_stream, "billing", failover_s=FAILOVER_S, wait_ms=200) as c:
        assert sorted(c.assigned) == ["p0000", "p0001", "p0002", "p0003"]
        first = _drain(c, 2000)
    assert Counter(_datas(first)) == Counter(d for _k, d in sent)
    for b in first:                                            # each batch: one partition, in SN order
        sns = [r.sn for r in b.records]
        assert sns == sorted(sns) and {r.partition_ordinal for r in b.records} == {int(b.partition_id[1:])}
    described = client.describe_group(unique_stream, "billing")
    assert {p.owner for p in described.partitions} == {""} and described.members == ()
    assert sum(p.records for p in described.partitions) == 2000
    assert all(p.lag_ms == 0 and p.lag_records == 0 for p in described.partitions)
    assert described["partitions"] == described.partitions            # (fields read by name, as the dicts were)
    more = _put(client, unique_stream, 300, start=2000)
    behind = client.describe_group(unique_stream, "billing")          # lag in records: exactly what is unread
    assert behind.lag_records == 300 and sum(p.lag_records for p in behind.partitions) == 300
    assert all(p.lag_ms >= 0 for p in behind.partitions)
    with client.consumer(unique_stream, "billing", failover_s=FAILOVER_S, wait_ms=200) as c:
        again = _drain(c, 300)
    assert Counter(_datas(again)) == Counter(d for _k, d in more)
    assert client.list_groups(unique_stream) == ["billing"]
    _registered(client, unique_stream, "billing")


def _registered(client, stream: str, group: str, registered: bool = True) -> None:
    """Every node describes the stream from its own view, which follows within a refresh."""
    wait_until(lambda: (group in client.get_stream_info(stream).consumers) == registered, DEADLINE_S,
               f"{group} {'' if registered else 'not '}among the stream's consumers")


class _Member(threading.Thread):
    """A member reading on a thread with a client of its own, as a process of its own would."""

    def __init__(self, cluster, stream: str, group: str, member_id: str):
        super().__init__(daemon=True)
        self.client = sms.Client(cluster.address)
        self.consumer = self.client.consumer(stream, group, member_id=member_id, failover_s=FAILOVER_S, wait_ms=200)
        self.consumer.__enter__()
        self.read: list[bytes] = []
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            for batch in self.consumer:
                self.read.extend(r.data for r in batch.records)
        except BaseException as e:       # (the test hears of it)
            self.error = e

    def stop(self) -> None:
        self.consumer.__exit__(None, None, None)
        self.join(DEADLINE_S)
        self.client.close()
        assert self.error is None, self.error


def test_two_members_share_the_partitions_and_hand_over_when_one_stops(cluster, client, unique_stream):
    client.create_stream(unique_stream, partitions=4, replication_factor=2)
    sent = _put(client, unique_stream, 1000)
    a = _Member(cluster, unique_stream, "g", "a")
    b = _Member(cluster, unique_stream, "g", "b")
    try:
        wait_until(lambda: len(a.consumer.assigned) == len(b.consumer.assigned) == 2, DEADLINE_S,
                   "two partitions each")
        assert set(a.consumer.assigned).isdisjoint(b.consumer.assigned)
        more = _put(client, unique_stream, 1000, start=1000)
        wait_until(lambda: len(a.read) + len(b.read) >= 1500, DEADLINE_S, "most records read")
        a.stop()                                                # a clean stop: b takes a's partitions at once
        t0 = time.monotonic()
        wait_until(lambda: len(b.consumer.assigned) == 4, FAILOVER_S * 3, "b holds all four")
        print(f"\nhandover after a clean stop: {time.monotonic() - t0:.2f} s (failover {FAILOVER_S} s)")
        wait_until(lambda: len(a.read) + len(b.read) >= 2000, DEADLINE_S, "every record read")
    finally:
        b.stop()
        if a.is_alive():
            a.stop()
    assert Counter(a.read + b.read) == Counter(d for _k, d in sent + more)        # every record once, none twice


MEMBER_SCRIPT = textwrap.dedent("""
    import json, sys
    import sms
    address, stream, group, out = sys.argv[1:5]
    with sms.Client(address) as client:
        with client.consumer(stream, group, member_id="doomed", failover_s=float(sys.argv[5]), wait_ms=200) as c:
            with open(out, "a") as f:
                for batch in c:
                    for r in batch.records:
                        f.write(json.dumps([batch.partition_id, r.data.decode()]) + "\\n")
                    f.flush()
""")


def test_a_killed_member_loses_its_partitions_after_the_failover_time(cluster, client, unique_stream, tmp_path):
    """A member in its own process, killed with SIGKILL: the survivor takes its partitions
    once they expire and reads on from its last checkpoint, so no record is lost (those
    after the checkpoint may be read twice: at least once)."""
    client.create_stream(unique_stream, partitions=4, replication_factor=2)
    out = tmp_path / "doomed.jsonl"
    out.touch()
    env = dict(os.environ)
    doomed = subprocess.Popen([sys.executable, "-c", MEMBER_SCRIPT, cluster.address, unique_stream, "g", str(out),
                               str(FAILOVER_S)], env=env)
    try:
        wait_until(lambda: any(p["owner"] == "doomed" for p in _partitions(client, unique_stream, "g")), DEADLINE_S,
                   "the doomed member holds the partitions")
        survivor = _Member(cluster, unique_stream, "g", "survivor")
        try:
            sent = _put(client, unique_stream, 1500)
            wait_until(lambda: sum(1 for _ in open(out)) >= 200, DEADLINE_S, "the doomed member read some")
            doomed.send_signal(signal.SIGKILL)
            doomed.wait()
            t0 = time.monotonic()
            read_by_doomed = Counter(json.loads(line)[1] for line in open(out))
            wait_until(lambda: len(survivor.consumer.assigned) == 4, DEADLINE_S, "the survivor holds all four")
            print(f"\nthe survivor took the dead member's partitions after {time.monotonic() - t0:.2f} s "
                  f"(failover {FAILOVER_S} s)")
            wanted = {d.decode() for _k, d in sent}
            wait_until(lambda: wanted <= set(read_by_doomed) | {d.decode() for d in survivor.read}, DEADLINE_S,
                       "every record read by one or the other")
        finally:
            survivor.stop()
    finally:
        if doomed.poll() is None:
            doomed.kill()
    assert set(read_by_doomed) | {d.decode() for d in survivor.read} == wanted            # nothing lost


def _partitions(client, stream, group):
    try:
        return client.describe_group(stream, group)["partitions"]
    except errors.GroupNotFound:
        return []


def test_parents_before_children_across_a_split(client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=2)
    before = _put(client, unique_stream, 500, keys=10)
    client.split(unique_stream, "p0000")
    after = _put(client, unique_stream, 500, start=500, keys=10)
    with client.consumer(unique_stream, "ordered", failover_s=FAILOVER_S, wait_ms=200) as c:
        batches = _drain(c, 1000)
    by_key: dict[str, list[int]] = {}
    for b in batches:
        for r in b.records:
            by_key.setdefault(r.partition_key, []).append(int(r.data[1:]))
    assert sum(len(v) for v in by_key.values()) == 1000 and len(before) + len(after) == 1000
    for key, seq in by_key.items():
        assert seq == sorted(seq), key                         # per key in the order written


def test_a_group_protects_what_it_has_not_read_and_can_be_reset(client, unique_stream):
    client.create_stream(unique_stream, partitions=2, replication_factor=2)
    client.update_stream(unique_stream, protect_unread=True)
    sent = _put(client, unique_stream, 400)
    with client.consumer(unique_stream, "audit", failover_s=FAILOVER_S, wait_ms=200) as c:
        assert Counter(_datas(_drain(c, 400))) == Counter(d for _k, d in sent)
    _registered(client, unique_stream, "audit")
    client.reset_group(unique_stream, "audit", to="TRIM_HORIZON")
    with client.consumer(unique_stream, "audit", failover_s=FAILOVER_S, wait_ms=200) as c:
        assert Counter(_datas(_drain(c, 400))) == Counter(d for _k, d in sent)     # everything again
    client.reset_group(unique_stream, "audit", to="LATEST")
    later = _put(client, unique_stream, 50, start=400)
    with client.consumer(unique_stream, "audit", failover_s=FAILOVER_S, wait_ms=200) as c:
        assert Counter(_datas(_drain(c, 50))) == Counter(d for _k, d in later)
    client.delete_group(unique_stream, "audit")
    assert client.list_groups(unique_stream) == []
    _registered(client, unique_stream, "audit", False)


def test_a_running_member_follows_a_reset(client, unique_stream):
    client.create_stream(unique_stream, partitions=2, replication_factor=2)
    sent = _put(client, unique_stream, 200)
    with client.consumer(unique_stream, "follow", failover_s=FAILOVER_S, wait_ms=200) as c:
        assert len(_datas(_drain(c, 200))) == 200
        c.checkpoint()
        client.reset_group(unique_stream, "follow", to="TRIM_HORIZON")
        again = _drain(c, 200)
    assert Counter(_datas(again)) == Counter(d for _k, d in sent)


def test_tenants_groups_of_the_same_name_never_meet(cluster, client):
    for name in ("t-one", "t-two"):
        client.create_tenant(name)
    tokens = {name: client.create_key("admin", tenant=name)[1] for name in ("t-one", "t-two")}
    got = {}
    for name, token in tokens.items():
        with sms.Client(cluster.address, ca_file=cluster.ca_file, token=token) as t:
            t.create_stream("orders", partitions=2, replication_factor=1)
            _put(t, "orders", 100 if name == "t-one" else 60)
    for name, token in tokens.items():
        with sms.Client(cluster.address, ca_file=cluster.ca_file, token=token) as t:
            with t.consumer("orders", "shared", failover_s=FAILOVER_S, wait_ms=200) as c:
                got[name] = len(_datas(_drain(c, 100 if name == "t-one" else 60)))
            assert t.list_groups("orders") == ["shared"]
    assert got == {"t-one": 100, "t-two": 60}


@pytest.mark.parametrize("request_, error", [
    (sms_pb2.GroupWriteRequest(group="bad/name", key="0", value=b"{}", version=-1), "InvalidArgument"),
    (sms_pb2.GroupWriteRequest(group="g", key="0", value=b"not json", version=-1), "InvalidArgument"),
    (sms_pb2.GroupWriteRequest(group="g", key="x", value=b"{}", version=-1), "InvalidArgument"),
    (sms_pb2.GroupWriteRequest(group="g", key="99", value=json.dumps(
        {"stream": "s", "ordinal": 99, "owner": "", "counter": 0, "heartbeat_ms": 0, "checkpoint": "TRIM_HORIZON",
         "pending_end": "", "parents": [], "records": 0, "rate": 0}).encode(), version=-1), "InvalidArgument"),
    (sms_pb2.GroupWriteRequest(group="g", member=True, key="m", value=b"x" * 5000, version=-1), "InvalidArgument"),
    (sms_pb2.GroupWriteRequest(group="g", key="0", value=json.dumps(        # an SN of another partition
        {"stream": "s", "ordinal": 0, "owner": "", "counter": 0, "heartbeat_ms": 0,
         "checkpoint": str((1 << 80) | (1 << 32) | 5), "pending_end": "", "parents": [], "records": 0,
         "rate": 0}).encode(), version=-1), "InvalidArgument"),
    (sms_pb2.GroupWriteRequest(group="g", key="0", value=json.dumps(        # a counter of the wrong type
        {"stream": "s", "ordinal": 0, "owner": "", "counter": "x", "heartbeat_ms": 0, "checkpoint": "TRIM_HORIZON",
         "pending_end": "", "parents": [], "records": 0, "rate": 0}).encode(), version=-1), "InvalidArgument"),
    (sms_pb2.GroupWriteRequest(group="..", key="0", value=b"{}", version=-1), "InvalidArgument"),
    (sms_pb2.GroupWriteRequest(group="g", member=True, key="m", value=b"{}", version=7), "LeaseLost"),
])
def test_bad_group_writes_are_named_and_change_nothing(cluster, client, unique_stream, request_, error):
    client.create_stream(unique_stream, partitions=1, replication_factor=1)
    request_.stream = unique_stream
    with client_channel(cluster.address) as channel:
        with pytest.raises(Exception) as e:
            sms_pb2_grpc.ControlStub(channel).GroupWrite(request_, timeout=10)
        assert dict(e.value.trailing_metadata()).get("sms-error") == error, e.value.details()
    assert client.list_groups(unique_stream) == []
    with pytest.raises(errors.StreamNotFound):
        client.list_groups("no-such-stream")
    with pytest.raises(errors.InvalidArgument):
        client.consumer(unique_stream, "g", start="EARLIEST")


def test_a_group_behind_a_trim_is_told_not_skipped(client, unique_stream):
    """Records deleted before the group read them end its iteration with RecordsTrimmed;
    a member made with skip_trimmed=True goes on from the oldest left (issue 16 item 7)."""
    client.create_stream(unique_stream, partitions=1, replication_factor=1, ingestion_policy="at_least_once_dup_permitted")
    first = _put(client, unique_stream, 10)
    with client.consumer(unique_stream, "late", failover_s=FAILOVER_S, wait_ms=200) as c:
        assert len(_datas(_drain(c, 10))) == 10
    more = [client.put_record(unique_stream, f"m{i}".encode(), "k").sequence_number for i in range(5)]
    client.trim_stream(unique_stream, before_sn=more[3])                # m0..m2 go unread
    it = client.get_iterator(unique_stream, 0, "TRIM_HORIZON")
    wait_until(lambda: client.get_next_records(it).records[0].sequence_number == more[3], DEADLINE_S,
               "the trim applied")
    with pytest.raises(errors.RecordsTrimmed, match="3 records"):
        with client.consumer(unique_stream, "late", failover_s=FAILOVER_S, wait_ms=200) as c:
            _drain(c, 2)
    with client.consumer(unique_stream, "late", failover_s=FAILOVER_S, wait_ms=200, skip_trimmed=True) as c:
        assert _datas(_drain(c, 2)) == [b"m3", b"m4"]
    assert len(first) == 10


def test_latest_is_fixed_when_claimed_so_a_handover_skips_nothing(client, unique_stream):
    """A member started at LATEST writes where LATEST was when it took the partition: what
    arrives after, read ahead but not handed out when it stops, is read by the next one."""
    client.create_stream(unique_stream, partitions=1, replication_factor=1)
    _put(client, unique_stream, 5)                                      # before: not for this group
    with client.consumer(unique_stream, "tail", start="LATEST", failover_s=FAILOVER_S, wait_ms=200) as c:
        assert c.assigned == ["p0000"]
        later = _put(client, unique_stream, 7, start=5)
        wait_until(lambda: not c._consumer._queue.empty(), DEADLINE_S, "the records read ahead")
    with client.consumer(unique_stream, "tail", start="LATEST", failover_s=FAILOVER_S, wait_ms=200) as c:
        assert Counter(_datas(_drain(c, 7))) == Counter(d for _k, d in later)


def test_group_writes_do_not_bring_back_a_deleted_stream(cluster, client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=1)
    _put(client, unique_stream, 3)
    with client.consumer(unique_stream, "gone", failover_s=FAILOVER_S, wait_ms=200) as c:
        _drain(c, 3)
    client.delete_stream(unique_stream)
    lease = json.dumps({"stream": unique_stream, "ordinal": 0, "owner": "", "counter": 9, "heartbeat_ms": 0,
                        "checkpoint": "TRIM_HORIZON", "pending_end": "", "parents": [], "records": 0,
                        "rate": 0}).encode()
    with client_channel(cluster.address) as channel:
        with pytest.raises(Exception) as e:
            sms_pb2_grpc.ControlStub(channel).GroupWrite(sms_pb2.GroupWriteRequest(
                stream=unique_stream, group="late", key="0", value=lease, version=-1), timeout=10)
        assert dict(e.value.trailing_metadata()).get("sms-error") == "StreamNotFound"
    assert unique_stream not in client.list_streams()
    client.create_stream(unique_stream, partitions=1, replication_factor=1)     # the name is free again
