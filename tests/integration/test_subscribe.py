"""Push reads (`subscribe`, the Subscribe RPC) against a real cluster: records arrive as
they commit, in SN order, from every iterator type; a quiet partition sends heartbeats; a
closed partition's subscription ends with its children; a subscription survives the kill
of the replica it reads from; `read_stream(follow=True)` rides on it; bad input is refused
by name."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from sms import errors, limits
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.rpc import ERROR_KEY
from tests.conftest import client_channel, wait_until

pytestmark = pytest.mark.integration


def _collect(client, stream: str, partition, want: int, timeout_s: float = 30, **kwargs) -> list:
    """Records of a subscription until `want` arrived (in a thread, as a consumer would)."""
    out: list = []
    deadline = time.monotonic() + timeout_s
    for page in client.subscribe(stream, partition, **kwargs):
        out.extend(page.records)
        if len(out) >= want or time.monotonic() > deadline or page.next_iterator is None:
            break
    return out


def test_records_are_pushed_as_they_commit(cluster, client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    got: list = []
    ready = threading.Event()

    def consume():
        for page in client_sub.subscribe(unique_stream, 0, "LATEST", max_records=50):
            ready.set()
            got.extend(page.records)
            if len(got) >= 200:
                return

    import sms
    with sms.Client(cluster.address) as client_sub:
        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        # the first event is a heartbeat at the latest; records put after it are pushed
        wait_until(ready.is_set, limits.SUBSCRIBE_HEARTBEAT_S + 10, "the subscription's first event")
        for i in range(4):
            assert client.put_records(unique_stream, [("k", b"%d" % (50 * i + j)) for j in range(50)]) \
                .failed_record_count == 0
        reader.join(timeout=30)
        assert not reader.is_alive()
    assert [int(r.data) for r in got] == list(range(200))
    assert [r.sn for r in got] == sorted(r.sn for r in got)


def test_from_every_iterator_type(cluster, client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=2)
    out = client.put_records(unique_stream, [("k", b"%d" % i) for i in range(20)])
    sns = [r.sn for r in out.records]
    assert [int(r.data) for r in _collect(client, unique_stream, 0, 20, iterator_type="TRIM_HORIZON")] \
        == list(range(20))
    assert [r.sn for r in _collect(client, unique_stream, "p0000", 10, iterator_type="AT_SEQUENCE_NUMBER",
                                   sequence_number=sns[10])] == sns[10:20]
    assert [r.sn for r in _collect(client, unique_stream, 0, 9, iterator_type="AFTER_SEQUENCE_NUMBER",
                                   sequence_number=str(sns[10]))] == sns[11:20]


def test_a_closed_partition_ends_with_its_children(cluster, client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=1)
    client.put_records(unique_stream, [("k%d" % i, b"x") for i in range(10)])
    client.split(unique_stream, "p0000")
    pages = list(client.subscribe(unique_stream, 0, "TRIM_HORIZON"))
    assert sum(len(p.records) for p in pages) == 10
    assert pages[-1].next_iterator is None and len(pages[-1].child_partitions) == 2


def test_read_stream_follow_pushes_new_records(cluster, client, unique_stream):
    client.create_stream(unique_stream, partitions=2, replication_factor=2)
    client.put_records(unique_stream, [("a", b"0"), ("b", b"1")])
    seen: list = []

    def follow():
        import sms
        with sms.Client(cluster.address) as c:
            for r in c.read_stream(unique_stream, follow=True):
                seen.append(int(r.data))
                if len(seen) >= 102:
                    return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    wait_until(lambda: len(seen) >= 2, 30, "the records put before the reader started")
    for i in range(100):
        client.put_record(unique_stream, b"%d" % (i + 2), f"key-{i % 5}")
    reader.join(timeout=30)
    assert sorted(seen) == list(range(102))


@pytest.mark.slow
def test_a_subscription_survives_the_kill_of_its_replica(cluster, client, unique_stream):
    """kill -9 of the node it reads from: the subscription resumes on another replica
    from its last continuation; every record arrives once, in order."""
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    got: list = []
    errors_seen: list = []

    def consume():
        import sms
        try:
            with sms.Client(cluster.address) as c:
                for page in c.subscribe(unique_stream, 0, "TRIM_HORIZON", max_records=20):
                    got.extend(page.records)
                    if len(got) >= 300:
                        return
        except Exception as e:      # noqa: BLE001  (reported by the assertion below)
            errors_seen.append(e)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    client.put_records(unique_stream, [("k", b"%d" % i) for i in range(100)])
    wait_until(lambda: len(got) >= 100, 30, "the first records")
    chain = client.get_stream_info(unique_stream).partition(0).chain
    victim = next(n for n, p in cluster.procs.items() if p.address in {m.address for m in chain}
                  and n != "control" and p.address == chain[-1].address)
    cluster.kill(victim)
    for i in range(100, 300, 20):
        out = client.put_records(unique_stream, [("k", b"%d" % j) for j in range(i, i + 20)])
        assert out.failed_record_count == 0
    reader.join(timeout=60)
    assert not errors_seen
    assert [int(r.data) for r in got] == list(range(300))
    cluster.restart(victim)


@pytest.mark.parametrize("max_records", [0, limits.GET_RECORDS_COUNT_MAX + 1])
def test_bad_subscriptions_are_refused_by_name(cluster, client, unique_stream, max_records):
    client.create_stream(unique_stream, partitions=1, replication_factor=1)
    it = client.get_iterator(unique_stream, 0, "TRIM_HORIZON")
    node = client.get_stream_info(unique_stream).partition(0).chain[0].address
    with client_channel(node) as channel:
        stub = sms_pb2_grpc.RetrievalStub(channel)
        for request, expected in ((sms_pb2.SubscribeRequest(iterator=it, max_records=max_records),
                                   errors.InvalidArgument),
                                  (sms_pb2.SubscribeRequest(iterator=it[:-3], max_records=10),
                                   errors.InvalidIterator)):
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.Subscribe(request, timeout=10))
            assert dict(caught.value.trailing_metadata() or ()).get(ERROR_KEY) == expected.__name__
    assert client.put_record(unique_stream, b"still serving", "k").sn
