"""The asyncio client's reads: iterators, pages, push subscriptions, `read_stream` along the
lineage, `get_record`, payloads by reference; each read goes to a replica of its
partition, another member when one fails."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import AsyncGenerator, Iterable, Mapping
from typing import Any, cast

import grpc

from sms import wire, convert, errors, limits, metadata, payloads, rpc, seqno
from sms.batch import RecordBatch
from sms.payloads import PayloadRef
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.tokens import Position, peek
from sms.types import (GetRecordBatchResult, GetRecordsResult, IteratorType, PartitionInfo, PartitionState, Record,
                       parse_partition_id)
from sms.aio.admin import Admin

_log = logging.getLogger(__name__)


def _page(ordinal: int, slices: Iterable[Any], next_iterator: str, behind_ms: int,
          children: Iterable[str]) -> GetRecordsResult:
    """A page of a GetNextRecords answer or a Subscribe event, decoded into `Record`s."""
    records: list[Record] = []
    for s in slices:
        records.extend(wire.decode_records(s.batch, s.start, s.end, ordinal))
    return GetRecordsResult(records=records, next_iterator=next_iterator or None, millis_behind_latest=behind_ms,
                            child_partitions=tuple(children))


def _descendants_and(by: Mapping[int, PartitionInfo], ordinals: set[int]) -> set[int]:
    out: set[int] = set()
    todo = list(ordinals)
    while todo:
        o = todo.pop()
        if o in out:
            continue
        out.add(o)
        if o in by:
            todo.extend(by[o].children)
    return out


class Reads(Admin):
    """The reads part of `sms.aio.Client` (sms/aio/__init__.py); each part builds on the
    ones before it: transport, admin, reads, writes, groups."""

    async def _with_payloads(self, stream: str, records: list[Record]) -> tuple[list[Record], int | None]:
        """`records` with each payload stored by reference read back into `data` (this
        client's `payloads="inline"`, each up to PAYLOAD_INLINE_READ_BYTES_MAX), and the SN
        of the first record left out when the page's payloads passed
        PAYLOAD_INLINE_PAGE_BYTES_MAX (None: none was). A reference header that does not
        parse, or that names anything but the stream's own store, is left as stored."""
        if self.payloads != "inline" or not records:
            return records, None
        info = self._streams.get(stream) or await self.get_stream_info(stream, refresh=False)
        if not info.archive:
            return records, None
        out = records
        inlined = 0
        for j, r in enumerate(records):
            if not (r.meta and b"sms-payload" in r.meta):
                continue
            try:
                ref = r.payload
            except errors.InvalidArgument:   # (a header of that name that is not a reference: an ordinary record)
                ref = None
            if ref is None:
                continue
            if ref.store != info.archive or not ref.key.startswith(info.payload_prefix):
                # a reference outside the stream's own store (a forged record) is never followed
                _log.warning("record %s of %s names a payload outside the stream's archive (%s %s): not read",
                             r.sn, stream, ref.store[:80], ref.key[:80])
                continue
            if ref.size > limits.PAYLOAD_INLINE_READ_BYTES_MAX:
                continue
            if inlined and inlined + ref.size > limits.PAYLOAD_INLINE_PAGE_BYTES_MAX:
                return out[:j], r.sn          # (the rest next page: memory stays bounded)
            inlined += ref.size
            if out is records:
                out = list(records)
            out[j] = r._replace(data=await asyncio.to_thread(payloads.read_all, ref))
        return out, None

    def open_payload(self, record: Record | PayloadRef, offset: int = 0, *,
                     stream: str | None = None) -> payloads.PayloadReader:
        """A record's payload stored by reference, as a binary file object read chunk by
        chunk (at most two chunks in memory, checksums verified), from `offset` -- where
        a reader that stopped goes on. Its reads block: call them from a thread in async
        code.

        `stream`: the stream the record was read from, to check that the reference names
        that stream's own archive (pass it when writers are not trusted: a forged record
        could name any store the reader can reach).

        Raises:
            InvalidArgument (a record without a payload by reference, an offset past its
            end, or one outside `stream`'s archive); its reads raise FragmentCorrupt,
            FragmentMissing, ArchiveUnavailable."""
        ref = record if isinstance(record, PayloadRef) else record.payload
        if ref is None:
            raise errors.InvalidArgument("the record carries its data inline, not a payload by reference")
        if stream is not None:
            info = self._streams.get(stream)
            if info is None or ref.store != info.archive or not ref.key.startswith(info.payload_prefix):
                raise errors.InvalidArgument(f"the payload ({ref.store[:80]} {ref.key[:80]}) is not in stream "
                                             f"{stream!r}'s archive (or the stream was not read by this client)")
        return payloads.open_payload(ref, offset)

    # --- reads ----------------------------------------------------------------------------
    async def _read_address(self, stream: str, ordinal: int, refresh: bool) -> str:
        """The replica of the partition this client reads from (one per partition, kept
        until it fails: `_next_replica`)."""
        info = await self.get_stream_info(stream, refresh=refresh or stream not in self._streams)
        try:
            partition = info.partition(ordinal)
        except LookupError:
            raise errors.PartitionNotFound(f"stream {stream!r} has no partition p{ordinal:04d}") from None
        members = [m for m in partition.chain if m.address]
        if not members:
            raise errors.Unavailable(f"partition p{ordinal:04d} of {stream!r} has no live replica")
        key = (stream, ordinal)
        if key not in self._read_member:
            self._read_member[key] = random.randrange(len(members))
        return members[self._read_member[key] % len(members)].address

    def _position(self, iterator: str) -> Position:
        """Where an iterator points, its stream as this client names it: on a secure
        cluster a tenant's stream is stored, and named in its tokens, as tenant~name
        (docs/security.md), and its clients know it by the name alone; a node's own client
        (queue owners, channel workers) names every stream by its stored name."""
        pos = peek(iterator)
        if self.tls is not None and self._ports_source is None and metadata.TENANT_SEP in pos.stream:
            pos = dataclasses.replace(pos, stream=pos.stream.partition(metadata.TENANT_SEP)[2])
        return pos

    def _next_replica(self, stream: str, ordinal: int) -> None:
        key = (stream, ordinal)
        self._read_member[key] = self._read_member.get(key, 0) + 1

    async def _read_call(self, stream: str, ordinal: int, method: str, request: Any,
                         timeout_s: float | None = None) -> Any:
        """Send a retrieval call to a replica of the partition, failing over along the chain."""
        last: errors.SmsError | None = None
        for attempt in range(limits.CLIENT_UNAVAILABLE_RETRIES_MAX):
            address = await self._read_address(stream, ordinal, refresh=attempt > 0)
            try:
                return await self._call(address, sms_pb2_grpc.RetrievalStub, method, request, timeout_s)
            except errors.SmsError as e:
                if not e.retriable:
                    raise
                last = e
                self._next_replica(stream, ordinal)
                await asyncio.sleep(limits.CLIENT_REDIRECT_BACKOFF_S)
        raise last or errors.Unavailable("no replica answered")

    async def subscribe(self, stream: str, partition_id: str | int, iterator_type: str | IteratorType = "LATEST", *,
                        sequence_number: str | int | None = None, timestamp_ms: int | None = None,
                        max_records: int = limits.SUBSCRIBE_RECORDS_MAX_DEFAULT, iterator: str | None = None,
                        skip_trimmed: bool = False) -> AsyncGenerator[GetRecordsResult, None]:
        """Push reads of one partition (Kinesis's SubscribeToShard): an async iterator of
        pages (`GetRecordsResult`) as records commit, from the position the iterator type
        names. A quiet partition sends an empty page every SUBSCRIBE_HEARTBEAT_S. The
        subscription resumes by itself when its server session ends or its replica fails;
        it ends after the page that reads a closed partition to its end (that page names
        the children and has no next iterator). Reading slowly slows the sender: pages wait
        in HTTP/2 flow control, not in an unbounded buffer. `iterator`: start where an
        iterator from get_iterator (or a page's next_iterator) points, instead.
        `skip_trimmed`: as get_next_records. The other arguments as `get_iterator`.

        Raises:
            StreamNotFound, PartitionNotFound, InvalidIteratorType, InvalidSequenceNumber,
            InvalidIterator, ExpiredIterator, RecordsTrimmed; Unavailable once the
            replicas failed CLIENT_UNAVAILABLE_RETRIES_MAX times in a row."""
        it = iterator or await self.get_iterator(stream, partition_id, iterator_type, sequence_number=sequence_number,
                                                 timestamp_ms=timestamp_ms)
        async for page in self._subscription(it, max_records, skip_trimmed):
            yield page

    async def _subscription(self, iterator: str, max_records: int,
                            skip_trimmed: bool = False) -> AsyncGenerator[GetRecordsResult, None]:
        pos = self._position(iterator)
        failures = 0
        while True:
            address = await self._read_address(pos.stream, pos.ordinal, refresh=failures > 0)
            call = sms_pb2_grpc.RetrievalStub(self._channel(address)).Subscribe(
                sms_pb2.SubscribeRequest(iterator=iterator, max_records=max_records, skip_trimmed=skip_trimmed),
                metadata=self._metadata)
            try:
                async for event in call:
                    failures = 0
                    page = _page(pos.ordinal, event.slices, event.continuation, event.millis_behind_latest,
                                 event.child_partitions)
                    records, cut = await self._with_payloads(pos.stream, page.records)
                    while cut is not None:       # (a page over the inline budget: in parts)
                        yield dataclasses.replace(page, records=records, child_partitions=(),
                                                  next_iterator=await self.get_iterator(
                                                      pos.stream, pos.ordinal, IteratorType.AT_SEQUENCE_NUMBER,
                                                      sequence_number=cut))
                        rest = [r for r in page.records if r.sn >= cut]
                        records, cut = await self._with_payloads(pos.stream, rest)
                    yield page if records is page.records else dataclasses.replace(page, records=records)
                    if not event.continuation:
                        return
                    iterator = event.continuation
            except grpc.aio.AioRpcError as e:
                error = rpc.to_sms_error(e)
                if not error.retriable or failures >= limits.CLIENT_UNAVAILABLE_RETRIES_MAX:
                    raise error from None
                failures += 1
                self._next_replica(pos.stream, pos.ordinal)
                await asyncio.sleep(min(limits.CLIENT_REDIRECT_BACKOFF_S * 2 ** failures, 2.0))
            finally:
                call.cancel()

    async def get_iterator(self, stream: str, partition_id: str | int, iterator_type: str | IteratorType = "TRIM_HORIZON",
                           *, sequence_number: str | int | None = None, timestamp_ms: int | None = None) -> str:
        """An iterator (an opaque token) at a position of one partition, for
        `get_next_records`.

        Args:
            stream: the stream.
            partition_id: its id ("p0003") or ordinal.
            iterator_type: TRIM_HORIZON, LATEST, AT_SEQUENCE_NUMBER, AFTER_SEQUENCE_NUMBER
                (with `sequence_number`) or AT_TIMESTAMP (with `timestamp_ms`).

        Raises:
            StreamNotFound, PartitionNotFound, InvalidIteratorType, InvalidSequenceNumber."""
        ordinal = partition_id if isinstance(partition_id, int) else parse_partition_id(partition_id)
        kind = iterator_type.value if isinstance(iterator_type, IteratorType) else str(iterator_type)
        req = sms_pb2.GetIteratorRequest(
            stream=stream, partition_id=f"p{ordinal:04d}", iterator_type=kind,
            sequence_number="" if sequence_number is None else str(sequence_number),
            timestamp_ms=timestamp_ms or 0)
        resp = await self._read_call(stream, ordinal, "GetIterator", req)
        iterator: str = resp.iterator
        return iterator

    async def get_next_records(self, iterator: str, max_records: int = 1000, wait_ms: int = 0, *,
                               skip_trimmed: bool = False) -> GetRecordsResult:
        """The next records after the iterator's position (long-polling up to `wait_ms`
        for new ones), the next iterator, and, at the end of a closed partition, its
        children and no next iterator. Records after the position that retention or a
        trim deleted before this read are RecordsTrimmed, never skipped in silence;
        `skip_trimmed=True` goes on from the oldest record left.

        Args:
            iterator: from `get_iterator` or a page's `next_iterator`.
            max_records: at most this many records (1..GET_RECORDS_COUNT_MAX).
            wait_ms: wait up to this long for a record when there is none (0: answer at once).
            skip_trimmed: see above.

        Raises:
            InvalidIterator, ExpiredIterator, RecordsTrimmed, StreamNotFound,
            PartitionNotFound, InvalidArgument."""
        pos, resp = await self._get_next(iterator, max_records, wait_ms, skip_trimmed)
        page = _page(pos.ordinal, resp.slices, resp.next_iterator, resp.millis_behind_latest, resp.child_partitions)
        records, cut = await self._with_payloads(pos.stream, page.records)
        if cut is not None:       # the next page starts at the first record left out
            return dataclasses.replace(page, records=records, child_partitions=(), next_iterator=await self.get_iterator(
                pos.stream, pos.ordinal, IteratorType.AT_SEQUENCE_NUMBER, sequence_number=cut))
        return page if records is page.records else dataclasses.replace(page, records=records)

    async def get_next_record_batch(self, iterator: str, max_records: int = 1000,
                                    wait_ms: int = 0, *, skip_trimmed: bool = False) -> GetRecordBatchResult:
        """get_next_records as columns: the page's records as one `RecordBatch`
        (`to_arrow()`, `records()`), decoded without an object per record. Arguments
        and errors as `get_next_records`."""
        pos, resp = await self._get_next(iterator, max_records, wait_ms, skip_trimmed)
        return GetRecordBatchResult(batch=RecordBatch(pos.ordinal, [(s.batch, s.start, s.end) for s in resp.slices]),
                                    next_iterator=resp.next_iterator or None,
                                    millis_behind_latest=resp.millis_behind_latest,
                                    child_partitions=tuple(resp.child_partitions))

    async def _get_next(self, iterator: str, max_records: int, wait_ms: int,
                        skip_trimmed: bool = False) -> tuple[Position, Any]:
        pos = self._position(iterator)
        req = sms_pb2.GetNextRecordsRequest(iterator=iterator, max_records=max_records, wait_ms=wait_ms,
                                            skip_trimmed=skip_trimmed)
        timeout_s = self.timeout_s + wait_ms / 1000
        try:
            resp = await self._read_call(pos.stream, pos.ordinal, "GetNextRecords", req, timeout_s)
        except (errors.StreamNotFound, errors.PartitionNotFound, errors.InvalidStreamName):
            # the client routed by the token's unverified name; let a node verify the
            # token and say what is wrong with it (forged, or its stream is gone)
            cluster = self._cluster or await self.describe_cluster()
            readers = [n.address for n in cluster.nodes if "retrieval" in n.roles]
            if not readers:
                raise
            resp = await self._call(random.choice(readers), sms_pb2_grpc.RetrievalStub, "GetNextRecords", req,
                                    timeout_s)
        return pos, resp

    async def read_stream(self, stream: str, *, start: str = "TRIM_HORIZON", timestamp_ms: int | None = None,
                          sequence_number: int | str | None = None, follow: bool = False,
                          max_records: int = 1000, wait_ms: int = 1000,
                          skip_trimmed: bool = False) -> AsyncGenerator[Record, None]:
        """Every record of the stream once, walking its lineage: a partition's records come
        only after all of its parents' (so per key, in SN order across splits and merges).

        Starts at the oldest record (TRIM_HORIZON), at LATEST, at `timestamp_ms` (in the
        partitions whose validity holds that time) or at `sequence_number` (its partition
        from that record, the others from its time). Without `follow` it ends once every
        partition is read to its current end; with it, it tails for ever, each partition
        by a subscription (`subscribe`: records pushed as they commit; `wait_ms` is no
        longer used and stays for callers that pass it). An async iterator of `Record`.
        Records deleted (retention, a trim) while the read was behind them raise
        RecordsTrimmed; `skip_trimmed=True` goes on from the oldest left.

        Raises:
            StreamNotFound, InvalidSequenceNumber, RecordsTrimmed, and a partition's
            read error once it failed READ_STREAM_RETRIES_MAX times in a row."""
        info = await self.get_stream_info(stream)
        by = {p.ordinal: p for p in info.partitions}
        starts: dict[int, tuple[str, dict[str, Any]]] = {}
        if sequence_number is not None or timestamp_ms is not None:
            sn = None if sequence_number is None else seqno.parse(sequence_number)
            # (timestamp_ms is given when sequence_number is not)
            ts = cast(int, timestamp_ms) if sn is None else seqno.timestamp_ms_of(sn)
            # the partitions valid at ts, and the roots younger than ts: those whose parents
            # retention dropped cover the hash ranges of partitions no longer in the map
            for p in info.partitions_at(ts) + [r for r in info.roots() if r.valid_from_ms > ts]:
                starts[p.ordinal] = ("AT_TIMESTAMP", {"timestamp_ms": ts})
            if sn is not None:
                starts[seqno.ordinal_of(sn)] = ("AT_SEQUENCE_NUMBER", {"sequence_number": sn})
        elif start == "LATEST":
            starts = {p.ordinal: ("LATEST", {}) for p in info.partitions if p.state is PartitionState.OPEN}
        else:
            starts = {p.ordinal: ("TRIM_HORIZON", {}) for p in info.roots()}
        # the partitions this read covers: the starting cut and everything after it
        scope = _descendants_and(by, set(starts))
        done: set[int] = set()
        started: set[int] = set()
        # (what, ordinal, payload): ("records", o, [Record]), ("end", o, [child ordinals]),
        # ("idle", o, None) or ("error", o, exception)
        queue: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue(maxsize=limits.READ_STREAM_PAGES_QUEUED_MAX)
        tasks: dict[int, asyncio.Task[None]] = {}

        async def read_partition(ordinal: int, kind: str, kw: dict[str, Any]) -> None:
            last_sn = None           # after a retriable failure the read resumes after it
            failures = 0
            try:
                it: str | None = await self.get_iterator(stream, ordinal, kind, **kw)
                pages = self._subscription(it, max_records, skip_trimmed) if follow and it else None
                while it:
                    try:
                        if pages is not None:       # follow: records pushed as they commit
                            page = await anext(pages)
                        else:
                            page = await self.get_next_records(it, max_records, 0, skip_trimmed=skip_trimmed)
                        failures = 0
                    except errors.PartitionNotFound:
                        # retention dropped it while we read: nothing of it is left to read
                        current = await self.get_stream_info(stream)
                        children = [p.ordinal for p in current.partitions if ordinal in p.parents]
                        await queue.put(("end", ordinal, children))
                        return
                    except errors.SmsError as e:
                        if not e.retriable or failures >= limits.READ_STREAM_RETRIES_MAX:
                            raise
                        failures += 1          # (a replica restarting, a connection reset)
                        await asyncio.sleep(min(limits.CLIENT_REDIRECT_BACKOFF_S * 2 ** failures, 2.0))
                        if last_sn is None:
                            it = await self.get_iterator(stream, ordinal, kind, **kw)
                        else:
                            it = await self.get_iterator(stream, ordinal, "AFTER_SEQUENCE_NUMBER",
                                                         sequence_number=last_sn)
                        if pages is not None:
                            await pages.aclose()
                            pages = self._subscription(it, max_records, skip_trimmed)
                        continue
                    if page.records:
                        last_sn = page.records[-1].sn
                        await queue.put(("records", ordinal, page.records))
                    it = page.next_iterator
                    if it and not page.records and not follow and page.millis_behind_latest == 0:
                        break        # caught up with an open partition
                    if it is None:
                        await queue.put(("end", ordinal, [parse_partition_id(c) for c in page.child_partitions]))
                        return
                await queue.put(("idle", ordinal, None))
            except Exception as e:           # (a cancelled reader puts nothing: nobody reads)
                await queue.put(("error", ordinal, e))

        def start_partition(ordinal: int, kind: str, kw: dict[str, Any]) -> None:
            started.add(ordinal)
            tasks[ordinal] = asyncio.get_running_loop().create_task(read_partition(ordinal, kind, kw))

        for ordinal, (kind, kw) in starts.items():
            start_partition(ordinal, kind, kw)
        try:
            running = len(tasks)
            while running:
                what, ordinal, payload = await queue.get()
                if what == "records":
                    for record in payload:
                        yield record
                    continue
                running -= 1
                if what == "error":
                    raise payload
                if what == "idle":
                    continue
                done.add(ordinal)
                children = payload
                if any(c not in by for c in children):
                    info = await self.get_stream_info(stream)
                    by = {p.ordinal: p for p in info.partitions}
                scope |= _descendants_and(by, set(children))
                for c in children:
                    if c in started or c not in by:
                        continue
                    if all(p in done or p not in scope or p not in by for p in by[c].parents):
                        start_partition(c, "TRIM_HORIZON", {})
                        running += 1
        finally:
            for task in tasks.values():
                task.cancel()

    async def get_record(self, stream: str, sequence_number: str | int) -> Record:
        """The record of that sequence number.

        Raises:
            InvalidSequenceNumber, StreamNotFound, PartitionNotFound, RecordNotFound,
            RecordsTrimmed."""
        sn = seqno.parse(sequence_number)
        resp = await self._read_call(stream, seqno.ordinal_of(sn), "GetRecord",
                                     sms_pb2.GetRecordRequest(stream=stream, sequence_number=str(sn)))
        record = convert.records_from_slice(resp.slice.batch, resp.slice.start, resp.slice.end, seqno.ordinal_of(sn))[0]
        return (await self._with_payloads(stream, [record]))[0][0]

    async def partitions(self, stream: str) -> list[PartitionInfo]:
        """The stream's partitions (open and closed), from a fresh map. Raises
        StreamNotFound."""
        return list((await self.get_stream_info(stream)).partitions)
