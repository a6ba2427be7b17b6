"""`Producer.send_batch` against a real cluster: one call queues many records with the
same guarantees as send() per record (order per key, stored once), one future carries
the batch's outcomes in order, bad input refuses the whole call, and it mixes with send()."""

from __future__ import annotations

import asyncio

import pytest

import sms
from sms import errors
from tests.conftest import read_stream, wait_until  # noqa: F401

pytestmark = pytest.mark.integration


def test_send_batch_stores_every_record_once_in_order_per_key(cluster, client, unique_stream):
    client.create_stream(unique_stream, partitions=3, replication_factor=2)

    async def main():
        async with sms.aio.Client(cluster.address) as aclient:
            async with aclient.producer(unique_stream, "batch-producer") as producer:
                batches = []
                for b in range(6):
                    batch = [(f"key-{i % 7}", f"{b}:{i}".encode()) for i in range(300)]
                    batches.append(await producer.send_batch(batch))
                single = await producer.send(b"single", "key-0")
                batches.append(await producer.send_batch([{"partition_key": "key-1", "data": b"as dict"},
                                                          ("key-2", b"explicit", 2 ** 127)]))
                await producer.flush()
                assert all(f.done() for f in batches)      # flush waits for batches too
                results = [r for f in batches[:6] for r in f.result()] + [single.result()] + batches[6].result()
                assert await (await producer.send_batch([])) == []
                cancelled = await producer.send_batch([("key-3", b"its caller stopped waiting")])
                cancelled.cancel()                          # the record is still sent, once
                await producer.flush()
                return results

    results = asyncio.run(main())
    assert len(results) == 6 * 300 + 3
    assert not any(isinstance(r, BaseException) for r in results)
    assert len({(r.partition_ordinal, r.sn) for r in results}) == len(results)
    stored = read_stream(client, unique_stream)
    data = [r.data for records in stored.values() for r in records]
    assert len(data) == len(results) + 1 and len(set(data)) == len(data)  # once each (+ the cancelled one)
    for records in stored.values():                                        # per key: send order
        by_key: dict[str, list[tuple[int, int]]] = {}
        for r in records:
            if b":" in r.data:
                b, i = r.data.decode().split(":")
                by_key.setdefault(r.partition_key, []).append((int(b), int(i)))
        for seq in by_key.values():
            assert seq == sorted(seq)


def test_send_batch_with_a_bad_record_raises_and_queues_none(cluster, client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=1)
    with client.producer(unique_stream, "bad-batch") as producer:
        with pytest.raises(errors.InvalidPartitionKey):
            producer.send_batch([("good", b"x"), ("", b"empty key")])
        with pytest.raises(errors.InvalidArgument):
            producer.send_batch([("good", b"x"), ("k", 3.5)])
        with pytest.raises(errors.InvalidArgument):
            producer.send_batch([("good", b"x"), 42])
        assert producer.statistics()["sent_total"] == 0
        future = producer.send_batch([("k", b"one"), ("k", b"two")])
        producer.flush()
        assert [r.sssn for r in future.result(timeout=30)] == [0, 1]
    assert [r.data for r in read_stream(client, unique_stream)[0]] == [b"one", b"two"]
