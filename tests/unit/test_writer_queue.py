"""ingestion/writer.py's queue: bounded by records and by bytes (a partition of large
records is throttled long before its record count would stop it), and what it counts
comes back as batches leave."""

from __future__ import annotations

import asyncio

import pytest

from ingestion.writer import PartitionWriter
from sms import errors, limits


async def _never() -> tuple[str, int]:
    raise AssertionError("not started: nothing resolves the head")


def test_the_queue_is_bounded_by_bytes_and_gives_them_back():
    async def main() -> None:
        writer = PartitionWriter("s:0", 1, _never)           # (never started: only the queue)
        chunk = b"x" * (limits.BATCH_BYTES_MAX // 2)
        futures = []
        while writer.queued_bytes + len(chunk) <= limits.INGEST_PENDING_BYTES_MAX:
            futures.append(writer.submit(chunk, 1))
        with pytest.raises(errors.Throttled) as e:
            writer.submit(chunk, 1)
        assert "bytes of records already queued" in e.value.message
        assert writer.queued_bytes == len(futures) * len(chunk) and writer.queued_records == len(futures)
        bodies, records, _chunks = writer._take_batch()
        assert records == len(bodies) == 1 and writer.queued_bytes == (len(futures) - 1) * len(chunk)
        writer.submit(chunk, 1)                               # room again
        empty = PartitionWriter("s:1", 1, _never)
        huge = b"y" * (limits.BATCH_BYTES_MAX - 1024)
        for _ in range(limits.INGEST_PENDING_BYTES_MAX // len(huge)):
            empty.submit(huge, 1)
        await empty.close()                                   # (fails what was queued: nothing left held)
        assert empty.queued_bytes == 0 and empty.queued_records == 0
        for f in futures:
            f.cancel()

    asyncio.run(main())
