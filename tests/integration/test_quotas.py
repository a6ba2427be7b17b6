"""Per-partition limits (issue 15 item 5; kernel/ratelimit.py, ingestion/service.py,
retrieval/service.py), on a real cluster under load.

- A partition limited to R records/s acknowledges at most R * (t + burst) + one request
  by time t, while an unlimited stream beside it keeps taking far more: the bound is
  the limiter's own arithmetic, so a slow machine only makes the numbers smaller.
- Writes over the limit are answered Throttled, store nothing, and a de-duplicating
  producer backs off and delivers everything without an error.
- A read limit slows a reader down; it never loses or repeats a record.
- A negative or absurd limit is refused by name and changes nothing.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import sms
from sms import aio, errors, limits
from sms.proto import sms_pb2
from tests.conftest import read_stream, wait_until

pytestmark = pytest.mark.integration

RATE = 200                      # records/s of the limited partition
LOAD_S = 3.0
BATCH = 50


@pytest.mark.parametrize("bad", [-2, limits.PARTITION_WRITE_RECORDS_PER_S_MAX + 1])
def test_an_absurd_limit_is_refused(client, unique_stream, bad):
    client.create_stream(unique_stream, partitions=1)
    with pytest.raises(errors.InvalidStreamConfig, match="write_records_per_s"):
        client.update_stream(unique_stream, write_records_per_s=bad)
    with pytest.raises(errors.InvalidStreamConfig, match="read_bytes_per_s"):
        client.update_stream(unique_stream, read_bytes_per_s=limits.PARTITION_BYTES_PER_S_MAX + 1)
    info = client.get_stream_info(unique_stream)
    assert (info.write_records_per_s, info.write_bytes_per_s, info.read_bytes_per_s) == (0, 0, 0)


def _in_force(client: sms.Client, stream: str, **limit: int) -> None:
    """Wait until the node that holds the stream's partition 0 sees the limit (every node
    answers DescribeStream from its own view of the metadata, which follows changes
    within a poll of the store)."""
    node = client.get_stream_info(stream).partition(0).chain[0].address
    (name, value), = limit.items()
    with sms.Client(node) as there:
        wait_until(lambda: getattr(there.get_stream_info(stream), name) == value, 10.0,
                   f"{name}={value} in force on {node}")


async def _hammer(client: aio.Client, stream: str, deadline: float) -> tuple[int, int, float]:
    """put_records of BATCH as fast as they come back until the deadline: (acked,
    throttled answers, seconds from the first call to the last answer)."""
    acked = throttled = 0
    t0 = time.monotonic()
    i = 0
    while time.monotonic() < deadline:
        out = await client.put_records(stream, [(f"k{i}-{j}", b"x" * 20) for j in range(BATCH)])
        acked += sum(1 for r in out.records if r.error_name == "")
        throttled += sum(1 for r in out.records if r.error_name == "Throttled")
        i += 1
    return acked, throttled, time.monotonic() - t0


def test_a_limited_partition_holds_its_limit_while_others_keep_going(cluster, client, unique_stream):
    limited, free = f"{unique_stream}-lim", f"{unique_stream}-free"
    for name in (limited, free):
        client.create_stream(name, partitions=1, replication_factor=3)
    info = client.update_stream(limited, write_records_per_s=RATE)
    assert info.write_records_per_s == RATE
    _in_force(client, limited, write_records_per_s=RATE)

    async def run():
        async with aio.Client(cluster.address) as c:
            info = await c.get_stream_info(limited)
            await c.get_stream_info(free)
            deadline = time.monotonic() + LOAD_S
            loads = await asyncio.gather(_hammer(c, limited, deadline), _hammer(c, free, deadline))
            # right after: one raw request (no client retries) of more than a second's worth
            entries = aio._encode_puts([(f"raw-{i}", b"z") for i in range(2 * RATE)])
            raw = await c.send_put_records(info.partition(0).ingestion_owner.address, sms_pb2.PutRecordsRequest(
                stream=limited, count=len(entries), entries=b"".join(e for e, _h in entries)))
            return loads, raw
    ((lim_acked, _t, lim_s), (free_acked, free_throttled, _free_s)), raw = asyncio.run(run())
    bound = RATE * (lim_s + limits.PARTITION_LIMIT_BURST_S) + BATCH
    print(f"\nlimited: {lim_acked} acked in {lim_s:.1f} s (bound {bound:.0f}); free: {free_acked} acked")
    assert lim_acked <= bound                   # put_records retried what was throttled: the limit held
    assert free_acked > bound and free_throttled == 0      # the free stream was not held back with it
    assert raw.errors and {e.name for e in raw.errors} == {"Throttled"}
    assert all("retry in" in e.message for e in raw.errors)
    stored = read_stream(client, limited)[0]
    assert len(stored) == lim_acked + 2 * RATE - len(raw.errors)   # a throttled record was never stored


def test_a_producer_backs_off_and_delivers_everything(client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    client.update_stream(unique_stream, write_records_per_s=100)
    _in_force(client, unique_stream, write_records_per_s=100)
    records = 400
    with client.producer(unique_stream, "quota-producer") as producer:
        futures = [producer.send(f"r{i}".encode(), f"k{i % 7}") for i in range(records)]
        producer.flush()
        results = [f.result() for f in futures]
        stats = producer.statistics()
    assert all(r.sequence_number for r in results)
    assert stats["retries_total"] > 0, stats              # it was throttled, and said nothing
    stored = read_stream(client, unique_stream)[0]
    assert sorted(r.data for r in stored) == sorted(f"r{i}".encode() for i in range(records))


def test_a_read_limit_slows_a_reader_and_loses_nothing(client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=1)
    payload = b"y" * 1000
    for _ in range(4):
        assert client.put_records(unique_stream, [(f"k{i}", payload) for i in range(100)]).failed_record_count == 0
    client.update_stream(unique_stream, read_bytes_per_s=100_000)      # about 100 records/s
    _in_force(client, unique_stream, read_bytes_per_s=100_000)
    t0 = time.monotonic()
    got = []
    it = client.get_iterator(unique_stream, 0, "TRIM_HORIZON")
    while it and len(got) < 400:
        page = client.get_next_records(it, max_records=50)
        got.extend(page.records)
        it = page.next_iterator
    took = time.monotonic() - t0
    print(f"\n400 records of 1 KB read in {took:.2f} s at a limit of 100 KB/s")
    assert len(got) == 400 and len({r.sequence_number for r in got}) == 400
    # the limiter's arithmetic: 400 KB (plus headers) at 100 KB/s after a 100 KB burst
    assert took >= (400_000 - 100_000 - 50 * 1100) / 100_000


def test_a_batch_over_the_write_limit_is_cut_not_taken_into_debt(client, unique_stream):
    """50 records/s and put_records of 200: the records that fit are stored, the rest are
    answered Throttled per record, with the wait until the next token as the hint (before:
    all 200 taken at once, and the next call throttled for about 3 s)."""
    client.create_stream(unique_stream, partitions=1, replication_factor=2)
    client.update_stream(unique_stream, write_records_per_s=50)
    _in_force(client, unique_stream, write_records_per_s=50)
    out = client.put_records(unique_stream, [(f"k{i}", b"v") for i in range(200)])
    admitted = [i for i, r in enumerate(out.records) if r.ok]
    refused = [r for r in out.records if not r.ok]
    assert 50 <= len(admitted) < 100 and admitted == list(range(len(admitted))), admitted   # the prefix that fit
    assert out.failed_record_count == len(refused) and {r.error_name for r in refused} == {"Throttled"}
    hints_ms = {int(r.error_message.rsplit("retry in ", 1)[1].split()[0]) for r in refused}
    assert max(hints_ms) <= 1000 // 50 + 1, hints_ms          # the next token, not a debt of seconds
    assert len(read_stream(client, unique_stream)[0]) == len(admitted)


def test_a_read_page_is_cut_to_the_read_limit(client, unique_stream):
    """2,000 bytes/s and a partition of one 400-record batch: a page holds what the limit
    allows (at least one record), and the next page is not refused (before: the first
    page took the whole batch, ran 20 s into debt, and the next read got Throttled)."""
    client.create_stream(unique_stream, partitions=1, replication_factor=1)
    assert client.put_records(unique_stream, [(f"k{i}", b"y" * 100) for i in range(400)]).failed_record_count == 0
    client.update_stream(unique_stream, read_bytes_per_s=2_000)
    _in_force(client, unique_stream, read_bytes_per_s=2_000)
    it = client.get_iterator(unique_stream, 0, "TRIM_HORIZON")
    first = client.get_next_records(it, max_records=1000)
    assert 1 <= len(first.records) <= 2_000 // 100, len(first.records)
    second = client.get_next_records(first.next_iterator, max_records=1000)   # waits one record off, at most
    assert 1 <= len(second.records) <= 2_000 // 100
    assert second.records[0].sequence_number > first.records[-1].sequence_number
