"""Queues on a stream (issue 34; control/queues.py, docs/queues.md): their definitions,
through the real client on a real TLS cluster with keys and tenants.

- Create, describe, list, update and delete, with the Kinesis defaults (LATEST, 30 s, 6).
- Bad input is a named error and changes nothing.
- A queue is one tenant's: another tenant sees no such queue and cannot put one on a
  stream that is not its own; a key limited to other streams sees none of it; a consumer
  key cannot make one.
- A queue made again under the same name is another queue (a new uid: its handles are new).
"""

from __future__ import annotations

import time

import pytest

import sms
from sms import errors, limits
from sms.types import QueueStatus
from tests.conftest import wait_until

pytestmark = pytest.mark.integration


def _with(cluster, token: str) -> sms.Client:
    return sms.Client(cluster.address, ca_file=cluster.ca_file, token=token)


@pytest.fixture(scope="module")
def stream(client):
    client.create_stream("queued", partitions=2, replication_factor=3)
    client.create_stream("queued-other", partitions=1, replication_factor=3)
    return "queued"


def test_create_describe_list_update_delete(client, stream):
    before = int(time.time() * 1000)
    q = client.create_queue(stream, "jobs")
    assert (q.name, q.stream, q.status, q.start) == ("jobs", stream, QueueStatus.ACTIVE, "LATEST")
    assert (q.visibility_s, q.max_receive_count) == (limits.QUEUE_VISIBILITY_S_DEFAULT,
                                                     limits.QUEUE_MAX_RECEIVE_COUNT_DEFAULT) == (30, 6)
    assert before <= q.created_ms <= int(time.time() * 1000) and q.uid > 0
    assert client.describe_queue("jobs") == q
    other = client.create_queue("queued-other", "audit", starting_position="AT_TIMESTAMP", timestamp_ms=before,
                                visibility_timeout_s=0, max_receive_count=0)
    assert (other.start, other.timestamp_ms, other.visibility_s, other.max_receive_count) == (
        "AT_TIMESTAMP", before, 0, 0)
    assert [x.name for x in client.list_queues()] == ["audit", "jobs"]
    assert [x.name for x in client.list_queues(stream)] == ["jobs"]
    changed = client.update_queue("jobs", visibility_timeout_s=120)
    assert (changed.visibility_s, changed.max_receive_count, changed.uid) == (120, 6, q.uid)
    changed = client.update_queue("jobs", max_receive_count=0)
    assert (changed.visibility_s, changed.max_receive_count) == (120, 0)
    assert client.describe_queue("jobs") == changed
    client.delete_queue("jobs")
    client.delete_queue("audit")
    with pytest.raises(errors.QueueNotFound):
        client.describe_queue("jobs")
    assert client.list_queues() == []
    again = client.create_queue(stream, "jobs", starting_position="TRIM_HORIZON")
    assert again.uid != q.uid and again.start == "TRIM_HORIZON"
    client.delete_queue("jobs")


@pytest.mark.parametrize("call, error", [
    (lambda c, s: c.create_queue(s, "bad name"), errors.InvalidArgument),
    (lambda c, s: c.create_queue(s, "x" * (limits.QUEUE_NAME_CHARS_MAX + 1)), errors.InvalidArgument),
    (lambda c, s: c.create_queue(s, ".."), errors.InvalidArgument),
    (lambda c, s: c.create_queue(s, "a~b"), errors.InvalidArgument),
    (lambda c, s: c.create_queue(s, "q", starting_position="NEWEST"), errors.InvalidArgument),
    (lambda c, s: c.create_queue(s, "q", starting_position="AT_TIMESTAMP"), errors.InvalidArgument),
    (lambda c, s: c.create_queue(s, "q", timestamp_ms=5), errors.InvalidArgument),
    (lambda c, s: c.create_queue(s, "q", visibility_timeout_s=limits.QUEUE_VISIBILITY_S_MAX + 1),
     errors.InvalidArgument),
    (lambda c, s: c.create_queue(s, "q", visibility_timeout_s=-1), errors.InvalidArgument),
    (lambda c, s: c.create_queue(s, "q", max_receive_count=limits.QUEUE_MAX_RECEIVE_COUNT_MAX + 1),
     errors.InvalidArgument),
    (lambda c, s: c.create_queue(s, "q", max_receive_count=True), errors.InvalidArgument),
    (lambda c, s: c.create_queue("no-such-stream", "q"), errors.StreamNotFound),
    (lambda c, s: c.describe_queue("no-such-queue"), errors.QueueNotFound),
    (lambda c, s: c.update_queue("no-such-queue", visibility_timeout_s=5), errors.QueueNotFound),
    (lambda c, s: c.delete_queue("no-such-queue"), errors.QueueNotFound),
    (lambda c, s: c.list_queues("bad stream name"), errors.InvalidArgument),
])
def test_bad_input_is_named_and_changes_nothing(client, stream, call, error):
    with pytest.raises(error):
        call(client, stream)
    assert client.list_queues() == []


def test_a_queue_name_is_taken_once(client, stream):
    client.create_queue(stream, "once")
    try:
        with pytest.raises(errors.QueueAlreadyExists):
            client.create_queue("queued-other", "once")
        assert client.describe_queue("once").stream == stream
        with pytest.raises(errors.InvalidArgument):
            client.update_queue("once", visibility_timeout_s=limits.QUEUE_VISIBILITY_S_MAX + 1)
        assert client.describe_queue("once").visibility_s == 30
    finally:
        client.delete_queue("once")


def test_a_queue_is_its_tenants_own(cluster, client, stream):
    client.create_tenant("qacme")
    client.create_tenant("qglobex")
    acme = _with(cluster, client.create_key("admin", tenant="qacme")[1])
    globex = _with(cluster, client.create_key("admin", tenant="qglobex")[1])
    try:
        acme.create_stream("orders", partitions=1)
        q = acme.create_queue("orders", "work", starting_position="TRIM_HORIZON")
        assert (q.name, q.stream) == ("work", "orders")                 # shown under the tenant's names
        assert [x.name for x in acme.list_queues()] == ["work"]
        assert globex.list_queues() == [] and client.list_queues() == []
        # the owner (a node's own client) reads the tenant's stream by its stored name
        acme.put_records("orders", [{"data": b"job", "partition_key": "k"}])
        got = wait_until(lambda: acme.queue("work").receive(1, wait_s=1), 30, "the tenant's record received")
        assert got[0].data == b"job" and acme.queue("work").ack(got).successful
        with pytest.raises(errors.QueueNotFound):
            globex.describe_queue("work")
        with pytest.raises(errors.QueueNotFound):
            globex.delete_queue("work")
        with pytest.raises(errors.StreamNotFound):
            globex.create_queue("orders", "mine")          # acme's stream is not globex's to queue
        with pytest.raises(errors.StreamNotFound):
            acme.create_queue(stream, "theirs")            # nor the default tenant's
        g = globex.create_queue  # a tenant's queue names are its own: the same name is free elsewhere
        globex.create_stream("orders", partitions=1)
        assert g("orders", "work").uid != q.uid
        assert acme.describe_queue("work").uid == q.uid
        globex.delete_queue("work")
        acme.delete_queue("work")
    finally:
        acme.close()
        globex.close()


def test_keys_need_their_rights(cluster, client, stream):
    client.create_queue(stream, "guarded")
    consumer = _with(cluster, client.create_key("consumer", name="queue reader")[1])
    elsewhere = _with(cluster, client.create_key("consumer", streams=["queued-other"])[1])
    try:
        assert consumer.describe_queue("guarded").stream == stream
        assert [x.name for x in consumer.list_queues()] == ["guarded"]
        with pytest.raises(errors.PermissionDenied):
            consumer.create_queue(stream, "mine")
        with pytest.raises(errors.PermissionDenied):
            consumer.delete_queue("guarded")
        with pytest.raises(errors.PermissionDenied):
            consumer.update_queue("guarded", visibility_timeout_s=1)
        with pytest.raises(errors.QueueNotFound):
            elsewhere.describe_queue("guarded")            # a key limited to other streams sees none of it
        assert elsewhere.list_queues() == []
        assert client.describe_queue("guarded").visibility_s == 30
    finally:
        consumer.close()
        elsewhere.close()
        client.delete_queue("guarded")


def test_a_queue_keeps_its_state_log_and_its_stream(cluster, client, stream):
    """A queue's state log is a stream of its own (docs/queues.md): made and deleted with the
    queue, not listed, not a name anyone else may take; a stream with queues stays."""
    q = client.create_queue(stream, "logged")
    log_name = f"queue-state.{q.uid:016x}"
    info = client.get_stream_info(log_name)
    source = client.get_stream_info(stream)
    assert len(info.partitions) == len(source.partitions) and info.replication_factor == source.replication_factor
    assert log_name not in client.list_streams() and stream in client.list_streams()
    with pytest.raises(errors.StreamInUse):
        client.delete_stream(stream)
    with pytest.raises(errors.InvalidArgument):
        client.delete_stream(log_name)
    with pytest.raises(errors.InvalidStreamName):
        client.create_stream("queue-state.mine")
    with pytest.raises(errors.StreamNotFound):
        client.create_queue(log_name, "of-a-log")
    client.delete_queue("logged")

    def gone() -> bool:                             # (a deleted stream goes once its replicas are dropped)
        try:
            client.get_stream_info(log_name)
        except errors.StreamNotFound:
            return True
        return False
    wait_until(gone, 30, "the state log of a deleted queue to go")
    client.create_stream("queued-doomed", partitions=1)
    client.create_queue("queued-doomed", "brief")
    client.delete_queue("brief")
    client.delete_stream("queued-doomed")               # no queue left: it goes


# --- delivery ----------------------------------------------------------------------------------

def _drain(q, want: int, wait_s: float = 5.0, ack: bool = True) -> list:
    """Receive until `want` records came (acking each batch unless told not to)."""
    got: list = []
    deadline = time.monotonic() + 60
    while len(got) < want and time.monotonic() < deadline:
        batch = q.receive(10, wait_s=wait_s)
        got += batch
        if batch and ack:
            result = q.ack(batch)
            assert not result.failed, result.failed
    return got


def test_every_record_is_delivered_and_an_acked_one_never_again(client):
    client.create_stream("jobs-all", partitions=3, replication_factor=3)
    client.put_records("jobs-all", [(f"k{i}", b"before-%d" % i) for i in range(20)])
    client.create_queue("jobs-all", "all", starting_position="TRIM_HORIZON", visibility_timeout_s=2)
    client.put_records("jobs-all", [(f"k{i}", b"after-%d" % i, None, {"n": str(i)}) for i in range(30)])
    q = client.queue("all")
    got = _drain(q, 50)
    assert sorted(r.data for r in got) == sorted([b"before-%d" % i for i in range(20)] +
                                                 [b"after-%d" % i for i in range(30)])
    assert len({r.record_id for r in got}) == 50 and all(r.receive_count == 1 for r in got)
    after = [r for r in got if r.data.startswith(b"after")]
    assert all(r.headers == {"n": r.data.split(b"-")[1]} for r in after)
    assert {r.partition_id for r in got} == {"p0000", "p0001", "p0002"}
    assert all(r.arrival_ms <= r.first_receive_ms for r in got)
    assert q.receive(10, wait_s=3) == []                     # acked: past their visibility, still none
    client.delete_queue("all")


def test_latest_starts_at_the_queues_creation(client):
    client.create_stream("jobs-latest", partitions=2, replication_factor=3)
    client.put_records("jobs-latest", [(f"k{i}", b"old") for i in range(10)])
    client.create_queue("jobs-latest", "fresh")
    client.put_records("jobs-latest", [(f"k{i}", b"new") for i in range(5)])
    got = _drain(client.queue("fresh"), 5)
    assert [r.data for r in got] == [b"new"] * 5
    assert client.queue("fresh").receive(10, wait_s=1) == []
    client.delete_queue("fresh")


def test_an_unacknowledged_record_comes_back_then_becomes_a_dead_letter(client):
    client.create_stream("jobs-dead", partitions=1, replication_factor=3)
    client.create_queue("jobs-dead", "flaky", starting_position="TRIM_HORIZON", visibility_timeout_s=1,
                        max_receive_count=2)
    client.put_records("jobs-dead", [("k", b"poison"), ("k", b"fine")])
    q = client.queue("flaky")
    first = _drain(q, 2, ack=False)
    assert sorted(r.data for r in first) == [b"fine", b"poison"]
    q.ack([r for r in first if r.data == b"fine"])
    again = _drain(q, 1, ack=False)                          # back after its visibility timeout
    assert [(r.data, r.receive_count, r.record_id) for r in again] == [
        (b"poison", 2, [r.record_id for r in first if r.data == b"poison"][0])]
    assert again[0].first_receive_ms == [r for r in first if r.data == b"poison"][0].first_receive_ms
    stale = q.ack([r for r in first if r.data == b"poison"])  # the first delivery's handle: expired
    assert [f[1] for f in stale.failed] == ["ReceiptHandleExpired"]
    assert q.receive(10, wait_s=2.5) == []                   # received twice: a dead letter now
    dead = wait_until(lambda: q.receive_dead_letters(10, wait_s=1), 10, "the dead letter")
    assert [(r.data, r.receive_count) for r in dead] == [(b"poison", 2)]
    refused = q.ack(dead)
    assert [f[1] for f in refused.failed] == ["InvalidDeadLetterHandle"]
    restored = q.restore_dead_letters(dead)
    assert not restored.failed
    back = _drain(q, 1, ack=False)
    assert [(r.data, r.receive_count) for r in back] == [(b"poison", 1)]
    assert not q.ack(back).failed
    assert q.receive(10, wait_s=1.5) == [] and q.receive_dead_letters(10) == []
    client.delete_queue("flaky")


def test_visibility_can_be_extended_or_dropped(client):
    client.create_stream("jobs-vis", partitions=1, replication_factor=3)
    client.create_queue("jobs-vis", "vis", starting_position="TRIM_HORIZON", visibility_timeout_s=1)
    client.put_records("jobs-vis", [("k", b"slow"), ("k", b"retry")])
    q = client.queue("vis")
    got = {r.data: r for r in _drain(q, 2, ack=False)}
    assert not q.change_visibility([got[b"slow"]], 30).failed
    assert not q.change_visibility([got[b"retry"]], 0).failed
    now = q.receive(10, wait_s=2, visibility_timeout_s=30)      # (this receive's own timeout)
    assert [(r.data, r.receive_count) for r in now] == [(b"retry", 2)]
    assert q.receive(10, wait_s=2) == []                     # "slow" is in flight for 30 s
    assert not q.ack([got[b"slow"]]).failed and not q.ack(now).failed
    client.delete_queue("vis")


@pytest.mark.parametrize("call", [
    lambda q: q.receive(0), lambda q: q.receive(11), lambda q: q.receive(1, wait_s=21),
    lambda q: q.receive(1, visibility_timeout_s=-1), lambda q: q.ack([]), lambda q: q.ack(["x"] * 11),
    lambda q: q.change_visibility(["x"], 50_000),
])
def test_bad_queue_calls_are_named(client, stream, call):
    if "badcalls" not in [x.name for x in client.list_queues()]:
        client.create_queue(stream, "badcalls")
    with pytest.raises(errors.InvalidArgument):
        call(client.queue("badcalls"))


def test_handles_no_queue_issued_fail_one_by_one(client, stream):
    client.create_queue(stream, "forged")
    try:
        result = client.queue("forged").ack(["not-a-handle", "A" * 51, ""])
        assert result.successful == [] and [f[1] for f in result.failed] == ["InvalidArgument"] * 3
        with pytest.raises(errors.QueueNotFound):
            client.queue("no-such-queue").receive(1)
    finally:
        client.delete_queue("forged")


def test_a_queue_keeps_what_it_has_not_acknowledged(client):
    """A queue is a registered consumer of its stream: while the stream protects unread
    records, a trim keeps every record the queue has not finished (docs/queues.md)."""
    client.create_stream("jobs-kept", partitions=1, replication_factor=3)
    client.update_stream("jobs-kept", protect_unread=True)
    q = client.create_queue("jobs-kept", "kept", starting_position="TRIM_HORIZON", visibility_timeout_s=60)
    assert f"queue.{q.uid:016x}" in client.get_stream_info("jobs-kept").consumers
    client.put_records("jobs-kept", [("k", b"job-%d" % i) for i in range(10)])
    got = sorted(_drain(client.queue("kept"), 10, ack=False), key=lambda r: int(r.record_id))
    assert not client.queue("kept").ack(got[:4]).failed        # the four lowest are done

    def kept() -> list[bytes]:
        client.trim_stream("jobs-kept", before_time_ms=int(time.time() * 1000))
        return [r.data for r in client.read_stream("jobs-kept")]
    wait_until(lambda: kept() == [b"job-%d" % i for i in range(4, 10)], 30,
               "a trim to take the acknowledged records and keep the rest")
    assert not client.queue("kept").ack(got[4:]).failed
    wait_until(lambda: kept() == [], 30, "a trim to take the rest once they are acknowledged")
    client.delete_queue("kept")
    assert f"queue.{q.uid:016x}" not in client.get_stream_info("jobs-kept").consumers


def test_a_queues_state_is_in_its_owners_metrics(cluster, client):
    """sms_queue_records by state and sms_queue_oldest_age_seconds, on the partition's head
    (docs/operations.md, the metrics)."""
    from tests.integration.test_metrics import scrape
    client.create_stream("jobs-metered", partitions=1, replication_factor=3)
    client.create_queue("jobs-metered", "metered", starting_position="TRIM_HORIZON", visibility_timeout_s=60)
    client.put_records("jobs-metered", [("k", b"job-%d" % i) for i in range(12)])
    q = client.queue("metered")
    got = _drain(q, 5, ack=False)                 # (in flight for 60 s: 5 or more, the rest available)
    head = client.get_stream_info("jobs-metered").partition(0).chain[0].node_id
    url = f"https://{cluster.procs[head].metrics_address}/metrics"

    def states() -> dict[str, float]:
        samples = scrape(url, cluster.ca_file, cluster.admin_token)
        return {labels["state"]: v for labels, v in samples.get("sms_queue_records", [])
                if labels["queue"] == "metered" and labels["stream"] == "jobs-metered"}
    counts = wait_until(lambda: (s := states()) and s, 10, "the queue's series")
    assert counts["available"] + counts["in_flight"] == 12 and counts["in_flight"] >= len(got) and counts["dead"] == 0
    samples = scrape(url, cluster.ca_file, cluster.admin_token)
    [(_labels, age)] = [(labels, v) for labels, v in samples["sms_queue_oldest_age_seconds"]
                        if labels["queue"] == "metered"]
    assert 0 < age < 120
    client.delete_queue("metered")
