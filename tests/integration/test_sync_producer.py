"""SyncProducer's hand-off (sms/producer.py) against a real cluster: send() from threads
reaches the loop by the batch, and still stores every record once, in each thread's
order per key, with bad input refused in the caller's thread, room waited for within
the bounds, and nothing lost at close."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from sms import errors, limits
from tests.conftest import read_stream, stream_name

pytestmark = pytest.mark.integration


def stored(client, stream: str) -> list:
    return [r for _o, records in sorted(read_stream(client, stream).items()) for r in records]


def by_key(records) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = defaultdict(list)
    for r in records:
        out[r.partition_key].append(r.data)
    return out


def test_send_and_send_batch_from_one_thread_store_each_record_once_in_order(client):
    stream = stream_name("sync-order")
    client.create_stream(stream, partitions=3, replication_factor=3)
    sent: list[tuple[str, bytes]] = []
    with client.producer(stream, producer_id="sync-order") as producer:
        futures, batches = [], []
        for i in range(4000):
            if i % 1000 == 500:
                batch = [(f"key-{(i + j) % 17}", b"batch %d.%d" % (i, j)) for j in range(100)]
                sent.extend(batch)
                batches.append(producer.send_batch(batch))
            key = f"key-{i % 17}"
            sent.append((key, b"send %d" % i))
            futures.append(producer.send(b"send %d" % i, key))
        producer.flush()
        assert all(f.done() for f in futures) and all(b.done() for b in batches)
    results = [f.result() for f in futures] + [r for b in batches for r in b.result()]
    assert not any(isinstance(r, BaseException) for r in results)
    records = stored(client, stream)
    assert len(records) == len(sent) == 4400
    expected: dict[str, list[bytes]] = defaultdict(list)
    for key, data in sent:
        expected[key].append(data)
    assert by_key(records) == expected, "each key's records are stored once, in the order the thread sent them"
    assert {r.sn for r in records} == {r.sn for r in results}


def test_threads_sending_at_once_each_keep_their_order(client):
    stream = stream_name("sync-threads")
    client.create_stream(stream, partitions=4, replication_factor=2)
    with client.producer(stream, producer_id="sync-threads") as producer:
        def run(t: int) -> None:
            for i in range(1500):
                producer.send(b"%d:%d" % (t, i), f"t{t}-k{i % 5}")
        threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        producer.flush()
    keys = by_key(stored(client, stream))
    assert sum(len(v) for v in keys.values()) == 6000
    for key, datas in keys.items():
        t, k = key[1:].split("-k")
        assert datas == [b"%s:%d" % (t.encode(), i) for i in range(int(k), 1500, 5)], key


def test_send_waits_for_room_within_the_hand_off_bounds(client, monkeypatch):
    stream = stream_name("sync-room")
    client.create_stream(stream, partitions=2, replication_factor=1)
    monkeypatch.setattr(limits, "PRODUCER_SYNC_HANDOFF_RECORDS_MAX", 40)
    most = 0
    with client.producer(stream, producer_id="sync-room", max_pending_per_partition=15) as producer:
        futures = []
        for i in range(1500):
            futures.append(producer.send(b"r%d" % i, f"k{i % 30}"))
            most = max(most, len(producer._handoff))
        producer.flush()
        stats = producer.statistics()
    assert most <= 40, "the hand-off never holds more than its bound"
    assert stats["acked_total"] == 1500 and stats["handed_off"] == 0
    assert len(stored(client, stream)) == 1500
    assert all(f.result().sn for f in futures)


def test_bad_input_raises_in_the_callers_thread_and_queues_nothing(client):
    stream = stream_name("sync-bad")
    client.create_stream(stream, partitions=1, replication_factor=1)
    with client.producer(stream, producer_id="sync-bad") as producer:
        producer.send(b"first", "k").result(timeout=30)
        with pytest.raises(errors.InvalidPartitionKey):
            producer.send(b"x", "")
        with pytest.raises(errors.InvalidArgument):
            producer.send(12345, "k")                         # type: ignore[arg-type]
        with pytest.raises(errors.InvalidArgument):
            producer.send("lone \ud800", "k")                # (a str is stored as UTF-8: this one has none)
        with pytest.raises(errors.InvalidDedupKey):
            producer.send(b"x", "k", dedup_key=b"")
        with pytest.raises(errors.InvalidRecordHeader):
            producer.send(b"x", "k", headers={"": b"v"})
        producer.flush()
        assert producer.statistics()["sent_total"] == 1
    with client.producer(stream_name("sync-missing"), producer_id="sync-missing") as missing:
        with pytest.raises(errors.StreamNotFound):
            missing.send(b"x", "k")


def test_close_delivers_what_was_handed_off_and_refuses_more(client):
    stream = stream_name("sync-close")
    client.create_stream(stream, partitions=2, replication_factor=2)
    producer = client.producer(stream, producer_id="sync-close")
    futures = [producer.send(b"c%d" % i, f"k{i % 7}") for i in range(3000)]
    producer.close()
    assert all(f.done() for f in futures), "close() flushes every record handed off"
    assert [f.exception() for f in futures if f.exception() is not None] == []
    with pytest.raises(errors.ProducerClosed):
        producer.send(b"late", "k")
    with pytest.raises(errors.ProducerClosed):
        producer.send_batch([("k", b"late")])
    producer.close()                                          # idempotent
    assert len(stored(client, stream)) == 3000
