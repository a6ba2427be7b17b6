"""Iterators against a real cluster: where each of the five types starts, long-poll,
millis_behind_latest, and continuing with next_iterator (DESIGN.md section 9)."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

import sms
from tests.conftest import wait_until

pytestmark = pytest.mark.integration


def put_group(client, stream: str, label: str, count: int, *, per_put: int = 1) -> list:
    """`count` records with data f"{label}-{i}", `per_put` records per request; acked results."""
    results = []
    for start in range(0, count, per_put):
        batch = [("key", f"{label}-{i}".encode()) for i in range(start, min(count, start + per_put))]
        out = client.put_records(stream, batch)
        assert out.failed_record_count == 0
        results.extend(out.records)
    return results


def drain(client, iterator: str, max_records: int = 10_000) -> tuple[list, str]:
    """Records from `iterator` until a read comes back empty; (records, next iterator)."""
    records = []
    for _ in range(1_000):
        result = client.get_next_records(iterator, max_records=max_records)
        iterator = result.next_iterator
        if not result.records:
            return records, iterator
        records.extend(result.records)
    raise AssertionError("not caught up after 1000 reads")


@pytest.fixture
def stream(client, unique_stream) -> str:
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    return unique_stream


def test_trim_horizon_starts_at_the_first_record(client, stream):
    acked = put_group(client, stream, "a", 7, per_put=3)
    result = client.get_next_records(client.get_iterator(stream, "p0000", "TRIM_HORIZON"), max_records=1)
    assert [r.sn for r in result.records] == [acked[0].sn]
    assert result.records[0].data == b"a-0"
    records, _ = drain(client, client.get_iterator(stream, 0, "TRIM_HORIZON"))
    assert [r.sn for r in records] == [r.sn for r in acked]


@pytest.mark.parametrize("index", [0, 1, 4, 5, 8])   # first, inside a batch, batch edges, last
def test_at_and_after_sequence_number(client, stream, index):
    acked = put_group(client, stream, "a", 9, per_put=3)
    sn = acked[index].sequence_number

    at, _ = drain(client, client.get_iterator(stream, 0, "AT_SEQUENCE_NUMBER", sequence_number=sn))
    assert [r.sn for r in at] == [r.sn for r in acked[index:]]
    assert at[0].data == f"a-{index}".encode()

    after, _ = drain(client, client.get_iterator(stream, 0, "AFTER_SEQUENCE_NUMBER", sequence_number=sn))
    assert [r.sn for r in after] == [r.sn for r in acked[index + 1:]]


def _ms_after(t_ms: int) -> int:
    """Poll the wall clock until it reads a millisecond after t_ms; that millisecond."""
    return wait_until(lambda: (now := int(time.time() * 1000)) > t_ms and now, 5, f"the clock to pass {t_ms}")


def test_at_timestamp_starts_at_the_first_record_at_or_after_it(client, stream):
    put_group(client, stream, "first", 5, per_put=2)
    first, _ = drain(client, client.get_iterator(stream, 0, "TRIM_HORIZON"))
    between_ms = _ms_after(first[-1].arrival_time_ms)
    _ms_after(between_ms)
    put_group(client, stream, "second", 5, per_put=2)
    everything, _ = drain(client, client.get_iterator(stream, 0, "TRIM_HORIZON"))
    second = everything[len(first):]
    assert first[-1].arrival_time_ms < between_ms < second[0].arrival_time_ms

    def from_timestamp(t_ms: int) -> list[int]:
        records, _ = drain(client, client.get_iterator(stream, 0, "AT_TIMESTAMP", timestamp_ms=t_ms))
        return [r.sn for r in records]

    assert from_timestamp(between_ms) == [r.sn for r in second]
    assert from_timestamp(second[0].arrival_time_ms) == [r.sn for r in second]     # >= t, not > t
    assert from_timestamp(first[0].arrival_time_ms) == [r.sn for r in everything]
    assert from_timestamp(0) == [r.sn for r in everything]
    assert from_timestamp(_ms_after(second[-1].arrival_time_ms)) == []


def test_latest_returns_only_records_written_after_it(client, stream):
    put_group(client, stream, "before", 4, per_put=2)
    iterator = client.get_iterator(stream, 0, "LATEST")
    result = client.get_next_records(iterator)
    assert result.records == []
    assert result.next_iterator is not None
    after = put_group(client, stream, "after", 3)
    records, _ = drain(client, result.next_iterator)
    assert [r.data for r in records] == [b"after-0", b"after-1", b"after-2"]
    assert [r.sn for r in records] == [r.sn for r in after]


def test_latest_on_an_empty_partition_sees_the_first_record(client, stream):
    iterator = client.get_iterator(stream, 0, "LATEST")
    acked = put_group(client, stream, "only", 1)
    records, _ = drain(client, iterator)
    assert [r.sn for r in records] == [acked[0].sn]


def test_long_poll_returns_promptly_when_a_record_arrives(cluster, client, stream):
    put_group(client, stream, "old", 2)
    _, iterator = drain(client, client.get_iterator(stream, 0, "TRIM_HORIZON"))
    with sms.Client(cluster.address) as writer, concurrent.futures.ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        poll = pool.submit(client.get_next_records, iterator, 100, 3000)
        acked = writer.put_record(stream, b"wake up", "key")
        result = poll.result(timeout=30)
        elapsed_s = time.monotonic() - started
    assert [(r.sn, r.data) for r in result.records] == [(acked.sn, b"wake up")]
    assert elapsed_s < 2.5, f"the long poll took {elapsed_s:.2f}s; it should return once the record commits"


def test_long_poll_returns_empty_when_nothing_arrives(client, stream):
    put_group(client, stream, "old", 2)
    _, iterator = drain(client, client.get_iterator(stream, 0, "TRIM_HORIZON"))
    result = client.get_next_records(iterator, max_records=100, wait_ms=3000)
    assert result.records == []
    assert result.next_iterator is not None
    assert result.millis_behind_latest == 0


def test_millis_behind_latest_is_zero_when_caught_up(client, stream):
    put_group(client, stream, "a", 30, per_put=10)
    iterator = client.get_iterator(stream, 0, "TRIM_HORIZON")
    behind = []
    while True:
        result = client.get_next_records(iterator, max_records=7)
        behind.append(result.millis_behind_latest)
        iterator = result.next_iterator
        if not result.records:
            break
    assert all(b >= 0 for b in behind)
    assert behind[-2:] == [0, 0], "the read that returns the last record and the empty one after it"


@pytest.mark.parametrize("max_records", [1, 4, 7, 10, 11])
def test_next_iterator_continues_without_gaps_or_repeats(client, stream, max_records):
    acked = put_group(client, stream, "a", 25, per_put=5)    # batches of 5: reads split them
    iterator = client.get_iterator(stream, 0, "TRIM_HORIZON")
    read, sizes = [], []
    while True:
        result = client.get_next_records(iterator, max_records=max_records)
        if not result.records:
            break
        sizes.append(len(result.records))
        read.extend(result.records)
        iterator = result.next_iterator
    assert [r.sn for r in read] == [r.sn for r in acked]
    assert [r.data for r in read] == [f"a-{i}".encode() for i in range(25)]
    assert all(0 < s <= max_records for s in sizes)
