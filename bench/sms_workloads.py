"""The SMS workloads of the benchmark suite (bench/run.py), each an async function against
a running cluster (`node.launcher.LocalCluster`) driven through one `sms.aio.Client`.

- `ingest`: records/s and MB/s of `records` records of `size` bytes, `batch` records per
  group, from `producers` concurrent producers. Dedup on: each producer is a
  de-duplicating `client.producer(...)` session on an "at_least_once_no_dup" stream, fed
  one batch per `Producer.send_batch` call; dedup off: `client.put_records` calls on an
  "at_least_once_dup_permitted" stream.
- `ack_latency`: open loop (common.open_loop) at fixed fractions of a measured max; each
  call is one batch of `batch` records through the same path as `ingest`, the latency runs
  from the call's scheduled start until every record of the batch is acknowledged.
- `end_to_end_latency`: records carry their send time in the payload; one tailing consumer
  per partition (long-polled get_next_records from LATEST) reports put -> receipt latency.
- `catch_up_read`: one consumer reads every partition from TRIM_HORIZON (the partitions
  concurrently, pages of `max_records`), counts the records and checks the count.
- `put_record_latency`: single `put_record` calls one at a time (closed loop, nothing
  else running): the latency of one record on an idle cluster.

Each takes a `meter` (bench/cpu.py) and reports, beside its figure, the CPU microseconds
per record of every process it measures, read over exactly the timed part.

Nothing here asserts a timing: the figures are for people, not for tests.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import struct
import time

from bench import common, cpu
from sms import aio
from sms.types import PartitionState

POLICY = {True: "at_least_once_no_dup", False: "at_least_once_dup_permitted"}
IN_FLIGHT = 4          # batches outstanding per producer (futures not yet settled / calls in flight)
_STAMP = struct.Struct("<4sdQ")   # magic, send time (perf_counter, this process), record number
_MAGIC = b"E2E!"


async def create(client: aio.Client, stream: str, partitions: int, replication: int, persistence: str,
                 dedup: bool) -> dict:
    """A fresh stream for one configuration; returns how long the creation took."""
    t0 = time.perf_counter()
    await client.create_stream(stream, partitions=partitions, replication_factor=replication,
                               persistence=persistence, ingestion_policy=POLICY[dedup])
    return {"stream": stream, "partitions": partitions, "replication": replication, "persistence": persistence,
            "ingestion_policy": POLICY[dedup], "create_s": round(time.perf_counter() - t0, 2)}


async def _send_group(producer, group: list[tuple[str, bytes]]) -> asyncio.Future:
    """One batch of (partition key, data) records into a de-duplicating producer
    (Producer.send_batch): one future of the batch's outcomes, a result or error per record."""
    return await producer.send_batch(group)


class _Tally:
    """Outcomes of the records of one workload: acked, failed (first errors kept), duplicates."""

    def __init__(self) -> None:
        self.acked = self.failed = self.duplicates = 0
        self.first_errors: list[str] = []

    def error(self, text: str, n: int = 1) -> None:
        self.failed += n
        if len(self.first_errors) < 3:
            self.first_errors.append(text[:300])

    def settle(self, results) -> bool:
        failed = getattr(results, "failed", None)
        if failed is not None:                   # a producer's BatchResults: its errors alone
            for _i, e in failed:
                self.error(repr(e))
            self.acked += len(results) - len(failed)
            self.duplicates += results.duplicates
            return not failed
        ok = True
        for r in results:
            if isinstance(r, BaseException):
                ok = False
                self.error(repr(r))
            else:
                self.acked += 1
                self.duplicates += bool(getattr(r, "duplicate", False))
        return ok

    def put_result(self, out) -> bool:
        bad = [r for r in out.records if not r.ok]
        for r in bad:
            self.error(f"{r.error_name}: {r.error_message}")
        self.acked += len(out.records) - len(bad)
        return not bad

    def as_dict(self) -> dict:
        return {"acked": self.acked, "failed": self.failed, "answered_duplicate": self.duplicates,
                "first_errors": self.first_errors}


async def ingest(client: aio.Client, stream: str, records: int, size: int, batch: int, producers: int,
                 dedup: bool, in_flight: int = IN_FLIGHT, tag: str = "ingest", meter: cpu.Meter = cpu.NONE) -> dict:
    """`records` records of `size` bytes (common.records: 1000 keys) split evenly over
    `producers` concurrent producers, in groups of `batch`; at most `in_flight` groups
    outstanding per producer. The stream must have the ingestion policy POLICY[dedup]."""
    recs = common.records(records, size)
    share = -(-len(recs) // producers)
    slices = [recs[i:i + share] for i in range(0, len(recs), share)]
    tally = _Tally()
    group_latency: list[float] = []

    async def dedup_producer(p: int, mine: list) -> None:
        async with client.producer(stream, f"{tag}-{stream}-{p}") as producer:
            pending: collections.deque = collections.deque()

            async def settle_oldest() -> None:
                t, fut = pending.popleft()
                tally.settle(await fut)
                group_latency.append(time.perf_counter() - t)

            for group in common.batches(mine, batch):
                pending.append((time.perf_counter(), await _send_group(producer, group)))
                while len(pending) > in_flight:
                    await settle_oldest()
            while pending:
                await settle_oldest()
            await producer.flush()

    async def put_producer(p: int, mine: list) -> None:
        groups = iter(common.batches(mine, batch))

        async def lane() -> None:
            for group in groups:
                t = time.perf_counter()
                try:
                    tally.put_result(await client.put_records(stream, group))
                except Exception as e:
                    tally.error(repr(e), len(group))
                group_latency.append(time.perf_counter() - t)

        await asyncio.gather(*(lane() for _ in range(in_flight)))

    one = dedup_producer if dedup else put_producer
    meter.start()
    t0 = time.perf_counter()
    await asyncio.gather(*(one(p, mine) for p, mine in enumerate(slices)))
    secs = time.perf_counter() - t0
    cpu_per_record = meter.stop(tally.acked)
    return {"records": len(recs), "size": size, "batch": batch, "producers": len(slices), "dedup": dedup,
            "in_flight_per_producer": in_flight,
            "path": "client.producer().send_batch(batch), one future per batch" if dedup
                    else "client.put_records(batch)",
            "seconds": round(secs, 3), "records_per_s": round(tally.acked / secs),
            "mb_per_s": round(tally.acked * size / secs / 1e6, 2), **tally.as_dict(),
            "batch_completion_latency_closed_loop": common.percentiles_ms(group_latency),
            "cpu_per_record": cpu_per_record}


def sync_producer_ingest(address: str, stream: str, records: int, size: int, meter: cpu.Meter = cpu.NONE,
                         tag: str = "sync") -> dict:
    """The README's way: one `sms.Client` and one de-duplicating producer in this one
    thread, `producer.send(data, key)` per record (`common.records`: 1000 keys), then
    flush(). Runs in a thread of its own (call it through asyncio.to_thread). The stream
    must be de-duplicating."""
    import sms
    recs = common.records(records, size)
    tally = _Tally()
    with sms.Client(address) as client, client.producer(stream, f"{tag}-{stream}") as producer:
        producer.send(b"warm-up", "warm-up").result()      # (the map, the epoch: not part of the figure)
        meter.start()
        t0 = time.perf_counter()
        futures = [producer.send(data, key) for key, data in recs]
        producer.flush()
        secs = time.perf_counter() - t0
        tally.settle([f.exception() or f.result() for f in futures])
        cpu_per_record = meter.stop(tally.acked)
    return {"records": len(recs), "size": size, "producers": 1, "dedup": True,
            "path": "sms.Client().producer().send(data, key) per record, one thread, then flush()",
            "seconds": round(secs, 3), "records_per_s": round(tally.acked / secs),
            **tally.as_dict(), "cpu_per_record": cpu_per_record}


class _BatchSender:
    """One call = one batch of `batch` records through the path of `ingest` (a pool of
    `producers` de-duplicating producers used round-robin, or put_records). `payload(i)`
    makes the data of the call's i-th record (default: the pre-made records)."""

    def __init__(self, client: aio.Client, stream: str, size: int, batch: int, producers: int, dedup: bool,
                 tag: str):
        self.client, self.stream, self.batch, self.dedup = client, stream, batch, dedup
        self.groups = common.batches(common.records(batch * 64, size), batch)
        self.calls = itertools.count()
        self.producers = [client.producer(stream, f"{tag}-{stream}-{p}") for p in range(producers)] if dedup else []
        self.tally = _Tally()

    async def close(self) -> None:
        for p in self.producers:
            await p.close()

    async def send(self, stamp=None) -> None:
        n = next(self.calls)
        group = self.groups[n % len(self.groups)]
        if stamp is not None:
            group = stamp(group)
        if self.dedup:
            producer = self.producers[n % len(self.producers)]
            results = await (await _send_group(producer, group))
            if not self.tally.settle(results):
                raise next(r for r in results if isinstance(r, BaseException))
        else:
            out = await self.client.put_records(self.stream, group)
            if not self.tally.put_result(out):
                bad = next(r for r in out.records if not r.ok)
                raise RuntimeError(f"{bad.error_name}: {bad.error_message}")


async def ack_latency(client: aio.Client, stream: str, size: int, batch: int, producers: int, dedup: bool,
                      max_records_per_s: float, fractions: tuple[float, ...], duration_s: float,
                      tag: str = "ack", meter: cpu.Meter = cpu.NONE) -> list[dict]:
    """Per fraction: open-loop calls of one batch at fraction * max_records_per_s / batch
    calls/s for `duration_s`; latency from each call's scheduled start to its last ack."""
    sender = _BatchSender(client, stream, size, batch, producers, dedup, tag)
    out = []
    try:
        await sender.send()        # warm up: sessions opened, the map loaded
        for f in fractions:
            rate = f * max_records_per_s / batch
            common.progress(f"sms ack latency: {f:.0%} of {max_records_per_s:,.0f} rec/s = {rate:.1f} calls/s "
                            f"of {batch} for {duration_s} s")
            meter.start()
            r = await common.open_loop(sender.send, rate, duration_s)
            r.update(fraction_of_max=f, offered_records_per_s=round(rate * batch), records_per_call=batch,
                     cpu_per_record=meter.stop(r["completed"] * batch))
            out.append(r)
            common.progress(f"sms ack latency {f:.0%}: p50 {r['latency'].get('p50_ms')} ms, "
                            f"p99 {r['latency'].get('p99_ms')} ms, errors {r['errors']}")
    finally:
        await sender.close()
    return out


async def end_to_end_latency(client: aio.Client, stream: str, size: int, batch: int, producers: int, dedup: bool,
                             rate_records_per_s: float, duration_s: float, wait_ms: int = 1000,
                             drain_timeout_s: float = 10.0, tag: str = "e2e", meter: cpu.Meter = cpu.NONE,
                             subscribe: bool = False) -> dict:
    """Put -> receipt by a tailing consumer. One consumer task per partition long-polls
    get_next_records (`wait_ms`) from LATEST, or with `subscribe` holds a subscription
    (records pushed as they commit); the records are sent open loop in batches of
    `batch` at `rate_records_per_s`, each carrying the time its batch was handed to the
    client (time.perf_counter of this process, so no clock skew) and its number."""
    size = max(size, _STAMP.size)
    info = await client.get_stream_info(stream)
    ordinals = [p.ordinal for p in info.partitions if p.state is PartitionState.OPEN]
    iterators = {o: await client.get_iterator(stream, o, "LATEST") for o in ordinals}
    latencies: list[float] = []
    seen: set[int] = set()
    foreign = 0
    sent = 0
    stop = asyncio.Event()
    numbers = itertools.count()
    pad = b"\0" * (size - _STAMP.size)

    async def pages(ordinal: int):
        if subscribe:
            async for page in client.subscribe(stream, ordinal, iterator=iterators[ordinal], max_records=10_000):
                yield page
            return
        it = iterators[ordinal]
        while it:
            page = await client.get_next_records(it, max_records=10_000, wait_ms=wait_ms)
            yield page
            it = page.next_iterator

    async def tail(ordinal: int) -> None:
        nonlocal foreign
        async for page in pages(ordinal):
            if stop.is_set():
                return
            now = time.perf_counter()
            for r in page.records:
                if len(r.data) < _STAMP.size or not r.data.startswith(_MAGIC):
                    foreign += 1
                    continue
                _, t, n = _STAMP.unpack_from(r.data)
                seen.add(n)
                latencies.append(now - t)

    def stamp(group: list) -> list:
        nonlocal sent
        t = time.perf_counter()
        sent += len(group)
        return [(key, _STAMP.pack(_MAGIC, t, next(numbers)) + pad) for key, _ in group]

    sender = _BatchSender(client, stream, size, batch, producers, dedup, tag)
    tails = [asyncio.create_task(tail(o)) for o in ordinals]
    try:
        rate = rate_records_per_s / batch
        common.progress(f"sms end-to-end latency: {rate_records_per_s:,.0f} rec/s in batches of {batch} for "
                        f"{duration_s} s, {len(ordinals)} tailing readers")
        meter.start()
        acks = await common.open_loop(lambda: sender.send(stamp), rate, duration_s)
        deadline = time.perf_counter() + drain_timeout_s
        while len(seen) < sender.tally.acked and time.perf_counter() < deadline:
            if any(t.done() for t in tails):
                break
            await asyncio.sleep(0.02)
        cpu_per_record = meter.stop(sender.tally.acked)
    finally:
        stop.set()
        await sender.close()
        for t in tails:
            t.cancel()
        done = await asyncio.gather(*tails, return_exceptions=True)
    reader_errors = [repr(e)[:300] for e in done if isinstance(e, BaseException)
                     and not isinstance(e, asyncio.CancelledError)]
    lat = common.percentiles_ms(latencies)
    common.progress(f"sms end-to-end latency: p50 {lat.get('p50_ms')} ms, p99 {lat.get('p99_ms')} ms, "
                    f"received {len(seen)}/{sender.tally.acked}")
    return {"offered_records_per_s": round(rate_records_per_s), "batch": batch, "duration_s": duration_s,
            "wait_ms": wait_ms, "records_sent": sent, "records_acked": sender.tally.acked,
            "records_received": len(latencies), "distinct_received": len(seen),
            "missing": max(0, sender.tally.acked - len(seen)), "foreign_records": foreign,
            "reader_errors": reader_errors, "latency": lat, "cpu_per_record": cpu_per_record,
            "ack_latency": acks["latency"], "ack_errors": acks["errors"], "first_ack_error": acks["first_error"],
            "consumer": "one task per partition: get_iterator(LATEST), then "
                        + ("subscribe(iterator=...) (pushed as records commit)" if subscribe else
                           f"get_next_records(max_records=10000, wait_ms={wait_ms}) in a loop")
                        + "; latency = page receipt - batch send time; "
                        "cpu_per_record covers writing and tailing, per record acked"}


async def catch_up_read(client: aio.Client, stream: str, expected: int, max_records: int = 10_000,
                        meter: cpu.Meter = cpu.NONE, columns: bool = False) -> dict:
    """One consumer reads every partition of `stream` from TRIM_HORIZON to its end (the
    partitions concurrently, in this one client) and counts records and data bytes: as
    `Record`s (get_next_records), or with `columns` as Arrow tables (get_next_record_batch,
    RecordBatch.to_arrow)."""
    if columns:
        import pyarrow  # noqa: F401  (loaded before the clock starts)
    info = await client.get_stream_info(stream)
    counts: dict[int, int] = {}
    nbytes = 0

    async def page_of(it: str) -> tuple[int, int, str | None]:
        """(records, data bytes, next iterator) of one page."""
        if columns:
            page = await client.get_next_record_batch(it, max_records=max_records)
            table = page.batch.to_arrow()
            data = table.column("data")
            return table.num_rows, sum(c.buffers()[2].size if c.buffers()[2] else 0 for c in data.chunks), \
                page.next_iterator
        page = await client.get_next_records(it, max_records=max_records)
        return len(page.records), sum(len(r.data) for r in page.records), page.next_iterator

    async def read(ordinal: int) -> None:
        nonlocal nbytes
        n = 0
        it = await client.get_iterator(stream, ordinal, "TRIM_HORIZON")
        while it:
            got, size, it = await page_of(it)
            if not got:
                break
            n += got
            nbytes += size
        counts[ordinal] = n

    common.progress(f"sms catch-up read{' as columns' if columns else ''}: {expected:,} records of {stream!r}, "
                    f"{len(info.partitions)} partitions from TRIM_HORIZON")
    meter.start()
    t0 = time.perf_counter()
    await asyncio.gather(*(read(p.ordinal) for p in info.partitions))
    secs = time.perf_counter() - t0
    n = sum(counts.values())
    cpu_per_record = meter.stop(n)
    out = {"records_expected": expected, "records_read": n, "count_matches": n == expected,
           "seconds": round(secs, 3), "records_per_s": round(n / secs) if secs > 0 else None,
           "mb_per_s": round(nbytes / secs / 1e6, 2) if secs > 0 else None,
           "per_partition": {str(k): v for k, v in sorted(counts.items())}, "cpu_per_record": cpu_per_record,
           "consumer": f"one client, every partition concurrently, "
                       f"{'get_next_record_batch + to_arrow' if columns else 'get_next_records'}"
                       f"(max_records={max_records}) until an empty page"}
    common.progress(f"sms catch-up read: {n:,} records in {secs:.2f} s = {out['records_per_s']:,} rec/s"
                    + ("" if n == expected else f"  COUNT MISMATCH (expected {expected:,})"))
    return out


async def put_record_latency(client: aio.Client, stream: str, calls: int, size: int,
                             meter: cpu.Meter = cpu.NONE) -> dict:
    """`calls` single `client.put_record` calls, one at a time (each starts when the last
    one returned), over common.records' keys; the latency of each call. One warm-up call
    first (the stream's map loaded), not counted."""
    recs = common.records(calls + 1, size)
    await client.put_record(stream, recs[0][1], partition_key=recs[0][0])
    latencies: list[float] = []
    errors: list[str] = []
    common.progress(f"sms put_record latency: {calls} calls of one {size} B record, one at a time")
    meter.start()
    for key, data in recs[1:]:
        t = time.perf_counter()
        try:
            await client.put_record(stream, data, partition_key=key)
        except Exception as e:  # counted, shown in the result
            errors.append(repr(e)[:300])
            continue
        latencies.append(time.perf_counter() - t)
    lat = common.percentiles_ms(latencies)
    common.progress(f"sms put_record latency: p50 {lat.get('p50_ms')} ms, p99 {lat.get('p99_ms')} ms, "
                    f"{len(errors)} errors")
    return {"calls": calls, "size": size, "errors": len(errors), "first_error": errors[0] if errors else None,
            "latency": lat, "cpu_per_record": meter.stop(len(latencies)),
            "path": "client.put_record(stream, data, partition_key=key), closed loop, one call in flight"}
