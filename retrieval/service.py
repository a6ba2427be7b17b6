"""The retrieval role: GetIterator, GetNextRecords (with long-poll), Subscribe (push) and GetRecord.

Reads are served from this node's replica of the partition, never past its commit
watermark, so nothing uncommitted is ever returned and any replica may serve. Answers
carry stored batches as they are plus the record range that belongs to the answer;
the client decodes them. A node without a replica of the partition answers WrongOwner
and the client picks another member of the chain.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import NamedTuple

from archive.reader import ArchiveReader
from kernel import encryption
from kernel.tenants import TenantShares, wait_out
from metastore.view import ClusterView
from sms import limits, seqno, wire
from kernel import metrics
from sms.errors import (ArchiveUnavailable, EncryptionUnavailable, InvalidArgument, InvalidIteratorType,
                        InvalidSequenceNumber, PartitionNotFound, RecordNotFound, RecordsTrimmed)
from sms.metadata import chain_id, tenant_of
from kernel.ports import ReplicaReads
from kernel.ratelimit import TokenBucket, budget
from sms.proto import sms_pb2, sms_pb2_grpc
from kernel.rpc import rpc_errors, rpc_stream_errors
from sms.types import IteratorType, PartitionState, parse_partition_id, partition_id
from sms.tokens import Position, TokenCodec


def _slice_bytes(s) -> float:
    """The bytes a slice charges to read limits: its share of its stored batch."""
    return len(s.batch) * (s.end - s.start) / wire.read_header(s.batch).count


def cut_to_budget(slices: list, budget: float) -> list:
    """The slices cut to `budget` bytes (each record counted at its batch's average size),
    at least one record: a page never runs a read limit into debt by more than that."""
    out, used = [], 0.0
    for s in slices:
        size = _slice_bytes(s)
        if used + size <= budget:
            out.append(s)
            used += size
            continue
        per_record = size / (s.end - s.start)
        room = int((budget - used) // per_record) if budget > used else 0
        if room == 0 and not out:
            room = 1
        if room:
            out.append(dataclasses.replace(s, end=s.start + room))
        break
    return out


def _charge(buckets: list[TokenBucket], slices) -> None:
    """Charge what a page served to its limits."""
    if buckets and slices:
        size, now = sum(_slice_bytes(s) for s in slices), time.monotonic()
        for bucket in buckets:
            bucket.charge(size, now)


def expected_counter(pos: Position) -> int | None:
    """The per-partition counter the next record at `pos` must carry (the head gives each
    record the next one), when the position says: an iterator after a record (its SN + 1)
    or at one (its SN). None for a position that names no record (TRIM_HORIZON, a time)."""
    sn = pos.position_sn
    if sn and seqno.ordinal_of(sn) == pos.ordinal and seqno.counter_of(sn):
        return seqno.counter_of(sn)
    if sn > 1 and seqno.ordinal_of(sn - 1) == pos.ordinal and seqno.counter_of(sn - 1):
        return seqno.counter_of(sn - 1) + 1
    return None


def _check_nothing_trimmed(pos: Position, first_sn: int) -> None:
    """RecordsTrimmed when the first record left after `pos` is not the one that came
    next: the ones between were deleted before this reader read them."""
    expected = expected_counter(pos)
    if expected is not None and seqno.counter_of(first_sn) > expected:
        missing = seqno.counter_of(first_sn) - expected
        raise RecordsTrimmed(f"{pos.stream} p{pos.ordinal:04d}: {missing} records after this reader's position were "
                             f"deleted (retention or a trim) before it read them; the oldest left is {first_sn}. "
                             "Read from TRIM_HORIZON, or pass skip_trimmed=True to go on from there",
                             missing=missing, oldest_sn=str(first_sn))


class _Page(NamedTuple):
    slices: list                      # sms_pb2.BatchSlice
    next: Position | None             # None: a closed partition read to its end
    behind_ms: int
    children: list[str]


class RetrievalService(sms_pb2_grpc.RetrievalServicer):
    def __init__(self, replicas: ReplicaReads, view: ClusterView, tokens: TokenCodec,
                 archive: ArchiveReader | None = None, keys: encryption.StreamKeys | None = None):
        self.replicas = replicas       # this process's storage role (kernel/ports.py)
        self.archive = archive if archive is not None else ArchiveReader(view.store)
        self.view = view
        self.tokens = tokens
        self._read_buckets: dict[str, TokenBucket] = {}     # chain id -> its read limit's bucket
        self.tenants = TenantShares(view)
        self.keys = keys               # the streams' data keys: sealed batches are opened before answering

    async def _entry(self, stream: str, ordinal: int):
        """The partition's map entry. A partition the cached map does not have is looked
        for again in a map read at most VIEW_MISS_REFRESH_S ago: a client that learned of
        a new partition (a split, a scale) from a fresher map than this node's must not
        hear PartitionNotFound for it (seen after a scale under a control kill)."""
        for max_age_s in (None, limits.VIEW_MISS_REFRESH_S):
            view = await self.view.stream(stream, max_age_s)
            for e in view.map.entries:
                if e.ordinal == ordinal:
                    return e
        raise PartitionNotFound(f"stream {stream!r} has no partition p{ordinal:04d}")

    async def _within_read_limits(self, pos: Position) -> list[TokenBucket]:
        """The buckets of the partition's read limit and of its tenant's share here (none,
        one or both), once each is out of debt: a read over a limit waits here, up to
        READ_THROTTLE_WAIT_S_MAX, and is refused with Throttled beyond that. A page is cut
        to what they hold then (`cut_to_budget`, at least one record), and what it served
        is charged to them after it (`_charge`), so the debt is at most one record."""
        held: list[tuple[TokenBucket, str]] = []
        rate = (await self.view.stream(pos.stream)).config.read_bytes_per_s
        key = chain_id(pos.stream, pos.ordinal)
        if rate:
            bucket = self._read_buckets.get(key)
            if bucket is None or bucket.rate != rate:
                if len(self._read_buckets) >= limits.READ_BUCKETS_MAX:
                    self._read_buckets.clear()
                bucket = self._read_buckets[key] = TokenBucket(rate, limits.PARTITION_LIMIT_BURST_S,
                                                                time.monotonic())
            held.append((bucket, key))
        tenant = tenant_of(pos.stream)
        share = await self.tenants.read_share(tenant)
        if share is not None:
            held.append((share, f"tenant {tenant} (its share on each retrieval node)"))
        deadline = time.monotonic() + limits.READ_THROTTLE_WAIT_S_MAX
        for bucket, what in held:
            await wait_out(bucket, what, deadline)
        buckets = [bucket for bucket, _what in held]
        return buckets

    async def _opened(self, stream: str, batches: list[bytes]) -> list[bytes]:
        """The batches as readers get them: those of an encrypted stream, stored sealed,
        opened with its data key (kernel/encryption.py)."""
        if self.keys is None:
            if any(encryption.is_sealed(b) for b in batches):
                raise EncryptionUnavailable(f"stream {stream!r} is stored encrypted; this node holds no key")
            return batches
        return await self.keys.open_batches(stream, batches)

    async def _replica(self, stream: str, ordinal: int):
        await self._entry(stream, ordinal)
        return self.replicas.committed_log(chain_id(stream, ordinal))

    @rpc_errors
    async def GetIterator(self, request, context):
        ordinal = parse_partition_id(request.partition_id)
        try:
            kind = IteratorType(request.iterator_type)
        except ValueError:
            raise InvalidIteratorType(f"iterator type {request.iterator_type[:64]!r}; expected one of "
                                      + ", ".join(t.value for t in IteratorType)) from None
        replica = await self._replica(request.stream, ordinal)
        if kind is IteratorType.TRIM_HORIZON:
            position = 0
        elif kind is IteratorType.LATEST:
            position = replica.committed_sn + 1
        elif kind is IteratorType.AT_TIMESTAMP:
            if request.timestamp_ms < 0:
                raise InvalidArgument(f"timestamp {request.timestamp_ms}; expected >= 0 ms since the epoch")
            position = seqno.lower_bound_for_time(request.timestamp_ms)
        else:
            sn = seqno.parse(request.sequence_number)
            if seqno.ordinal_of(sn) != ordinal:
                raise InvalidSequenceNumber(f"sequence number {sn} belongs to partition "
                                            f"p{seqno.ordinal_of(sn):04d}, not p{ordinal:04d}")
            position = sn if kind is IteratorType.AT_SEQUENCE_NUMBER else sn + 1
        return sms_pb2.GetIteratorResponse(iterator=self.tokens.encode(Position(request.stream, ordinal, position)))

    async def _page(self, pos: Position, max_records: int, wait_s: float, include_trimmed: bool = False,
                    skip_trimmed: bool = False) -> _Page:
        """The committed records at and after `pos` (waiting up to `wait_s` for one), where
        the next page starts, and, for a closed partition read to its end, its children."""
        if not 1 <= max_records <= limits.GET_RECORDS_COUNT_MAX:
            raise InvalidArgument(f"max_records {max_records}; expected 1..{limits.GET_RECORDS_COUNT_MAX}")
        entry = await self._entry(pos.stream, pos.ordinal)
        buckets = await self._within_read_limits(pos)
        replica = self.replicas.committed_log(chain_id(pos.stream, pos.ordinal))
        ending = entry.ending_sn if entry.state is PartitionState.CLOSED else None
        position = pos.position_sn if include_trimmed else max(pos.position_sn, replica.trimmed_before)
        target = position if ending is None else min(position, ending)
        # wait while nothing at or after the position is committed: SNs start at 1, so from
        # position 0 (TRIM_HORIZON) an empty partition waits for its first record too
        awaited = target if ending == 0 else max(target, 1)
        if replica.committed_sn < awaited and wait_s > 0:     # (a lagging replica of a closed one too)
            await replica.wait_committed(awaited, wait_s)
            entry = await self._entry(pos.stream, pos.ordinal)     # it may have closed meanwhile
            ending = entry.ending_sn if entry.state is PartitionState.CLOSED else None
        committed = replica.committed_sn if ending is None else min(replica.committed_sn, ending)
        budget_bytes = budget(buckets, time.monotonic())
        slices = await self._read(pos.stream, pos.ordinal, replica, position, committed, max_records,
                                  int(min(limits.GET_RECORDS_BYTES_MAX, max(1.0, budget_bytes))))
        if buckets:
            slices = cut_to_budget(slices, budget_bytes)
        if slices and not skip_trimmed and not include_trimmed:
            # (also when this replica's trim point is behind: the archive's retention may
            # already have deleted what lay between)
            _check_nothing_trimmed(pos, slices[0].sn_at(slices[0].start))
        elif position > pos.position_sn and not skip_trimmed:
            if committed and seqno.ordinal_of(committed) == pos.ordinal:
                # nothing left to read: the last record committed tells whether any was due
                _check_nothing_trimmed(pos, committed + seqno.COUNTER_UNIT)
        if slices:
            last = slices[-1]
            next_position = last.sn_at(last.end - 1) + 1
            behind_ms = seqno.timestamp_ms_of(committed) - seqno.timestamp_ms_of(next_position - 1)
        else:
            next_position = position
            behind_ms = 0
        batches = await self._opened(pos.stream, [s.batch for s in slices])
        pb_slices = [sms_pb2.BatchSlice(batch=b, start=s.start, end=s.end) for s, b in zip(slices, batches)]
        _charge(buckets, slices)
        if slices:
            pid = partition_id(pos.ordinal)
            metrics.READ_RECORDS.labels(pos.stream, pid).inc(sum(s.end - s.start for s in slices))
            metrics.READ_BYTES.labels(pos.stream, pid).inc(sum(len(s.batch) for s in slices))
        if ending is not None and (ending == 0 or next_position > ending) and replica.committed_sn >= ending:
            # a closed partition read to its end: no next position; the children go on
            return _Page(pb_slices, None, 0, [partition_id(c) for c in entry.children])
        return _Page(pb_slices, Position(pos.stream, pos.ordinal, next_position), max(0, behind_ms), [])

    async def _read(self, stream: str, ordinal: int, replica, position: int, upto: int, max_records: int,
                    max_bytes: int = limits.GET_RECORDS_BYTES_MAX):
        """Committed records from `position` to `upto`: from this node's replica, or below
        what it still stores, from the stream's archive (archive/reader.py)."""
        config = (await self.view.stream(stream)).config
        if config.archive:
            first = replica.local_first_sn
            if first and position < first:
                try:
                    slices = await self.archive.read(config, ordinal, position, min(upto, first - 1), max_records,
                                                     max_bytes)
                    if not slices:     # (an index read a moment ago may lack what was just verified)
                        slices = await self.archive.read(config, ordinal, position, min(upto, first - 1),
                                                         max_records, max_bytes, fresh=True)
                except ArchiveUnavailable:
                    if position < replica.stored_first_sn:
                        raise
                    slices = []      # (the records are still here, a trim under way: read them here)
                if slices:
                    return slices
        slices = replica.read(position, upto, max_records, max_bytes)
        if config.archive and slices:
            first_read = slices[0].sn_at(slices[0].start)
            expected = expected_counter(Position(stream, ordinal, position))
            if expected is not None and seqno.counter_of(first_read) > expected:
                # records the reader expected next are not here (gone since `first` was looked
                # at): what the archive holds of them comes first, from its index as it is now
                archived = await self.archive.read(config, ordinal, position, first_read - 1, max_records,
                                                   max_bytes, fresh=True)
                if archived:
                    return archived
        return slices

    @rpc_errors
    async def GetNextRecords(self, request, context):
        pos = self.tokens.decode(request.iterator)
        wait_s = min(request.wait_ms, limits.GET_RECORDS_WAIT_MS_MAX) / 1000
        page = await self._page(pos, request.max_records, wait_s, request.include_trimmed, request.skip_trimmed)
        return sms_pb2.GetNextRecordsResponse(
            slices=page.slices, next_iterator="" if page.next is None else self.tokens.encode(page.next),
            millis_behind_latest=page.behind_ms, child_partitions=page.children)

    @rpc_stream_errors
    async def Subscribe(self, request, context):
        """Events of committed records as they commit (an empty one every
        SUBSCRIBE_HEARTBEAT_S while none do), for SUBSCRIBE_SESSION_S. The consumer's
        reading paces it: an event waits for HTTP/2 flow control before the next is read."""
        pos = self.tokens.decode(request.iterator)
        if not 1 <= request.max_records <= limits.GET_RECORDS_COUNT_MAX:
            raise InvalidArgument(f"max_records {request.max_records}; expected 1..{limits.GET_RECORDS_COUNT_MAX}")
        ends_at = time.monotonic() + limits.SUBSCRIBE_SESSION_S
        quiet_since = time.monotonic()
        while time.monotonic() < ends_at:
            page = await self._page(pos, request.max_records, limits.SUBSCRIBE_HEARTBEAT_S,
                                    skip_trimmed=request.skip_trimmed)
            if page.slices or page.next is None or time.monotonic() - quiet_since >= limits.SUBSCRIBE_HEARTBEAT_S:
                yield sms_pb2.SubscribeEvent(
                    slices=page.slices, continuation="" if page.next is None else self.tokens.encode(page.next),
                    millis_behind_latest=page.behind_ms, child_partitions=page.children)
                quiet_since = time.monotonic()
            if page.next is None:
                return
            if not page.slices:
                # nothing to send although nothing was waited for (a replica whose watermark
                # is ahead of its log, as a learner's can be): pause, so this loop never holds
                # the event loop (a node that starved its own heartbeats lost its session)
                await asyncio.sleep(limits.SUBSCRIBE_EMPTY_PAGE_PAUSE_S)
            else:
                await asyncio.sleep(0)     # every event lets the rest of the node run
            pos = page.next

    @rpc_errors
    async def GetRecord(self, request, context):
        sn = seqno.parse(request.sequence_number)
        replica = await self._replica(request.stream, seqno.ordinal_of(sn))
        buckets = await self._within_read_limits(Position(request.stream, seqno.ordinal_of(sn), sn))
        if replica.trimmed_before <= sn <= replica.committed_sn:
            slices = await self._read(request.stream, seqno.ordinal_of(sn), replica, sn, sn, 1)
            if slices and slices[0].sn_at(slices[0].start) == sn:
                s = slices[0]
                _charge(buckets, slices[:1])
                batch, = await self._opened(request.stream, [s.batch])
                return sms_pb2.GetRecordResponse(slice=sms_pb2.BatchSlice(batch=batch, start=s.start, end=s.end))
        raise RecordNotFound(f"no committed record {sn} in {request.stream!r}")

