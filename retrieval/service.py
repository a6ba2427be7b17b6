"""The retrieval role: GetIterator, GetNextRecords (with long-poll) and GetRecord.

Reads are served from this node's replica of the partition, never past its commit
watermark, so nothing uncommitted is ever returned and any replica may serve. Answers
carry stored batches as they are plus the record range that belongs to the answer;
the client decodes them. A node without a replica of the partition answers WrongOwner
and the client picks another member of the chain.
"""

from __future__ import annotations

from control.metaview import ClusterView
from sms import limits, seqno
from sms.errors import InvalidArgument, InvalidIteratorType, InvalidSequenceNumber, PartitionNotFound, RecordNotFound
from sms.metadata import chain_id
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.rpc import rpc_errors
from sms.types import IteratorType, PartitionState, parse_partition_id, partition_id
from sms.tokens import Position, TokenCodec
from storage.service import StorageNode


class RetrievalService(sms_pb2_grpc.RetrievalServicer):
    def __init__(self, storage: StorageNode, view: ClusterView, tokens: TokenCodec):
        self.storage = storage
        self.view = view
        self.tokens = tokens

    async def _entry(self, stream: str, ordinal: int):
        view = await self.view.stream(stream)
        for e in view.map.entries:
            if e.ordinal == ordinal:
                return e
        raise PartitionNotFound(f"stream {stream!r} has no partition p{ordinal:04d}")

    async def _replica(self, stream: str, ordinal: int):
        await self._entry(stream, ordinal)
        return self.storage.replica(chain_id(stream, ordinal))

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

    @rpc_errors
    async def GetNextRecords(self, request, context):
        pos = self.tokens.decode(request.iterator)
        if not 1 <= request.max_records <= limits.GET_RECORDS_COUNT_MAX:
            raise InvalidArgument(f"max_records {request.max_records}; expected 1..{limits.GET_RECORDS_COUNT_MAX}")
        wait_s = min(request.wait_ms, limits.GET_RECORDS_WAIT_MS_MAX) / 1000
        entry = await self._entry(pos.stream, pos.ordinal)
        replica = self.storage.replica(chain_id(pos.stream, pos.ordinal))
        ending = entry.ending_sn if entry.state is PartitionState.CLOSED else None
        position = pos.position_sn if request.include_trimmed else max(pos.position_sn, replica.trimmed_before)
        target = position if ending is None else min(position, ending)
        if replica.committed_sn < target and wait_s > 0:     # (a lagging replica of a closed one too)
            await replica.wait_committed(target, wait_s)
            entry = await self._entry(pos.stream, pos.ordinal)     # it may have closed meanwhile
            ending = entry.ending_sn if entry.state is PartitionState.CLOSED else None
        committed = replica.committed_sn if ending is None else min(replica.committed_sn, ending)
        slices = self.storage.logs.read(replica.log, position, committed, request.max_records,
                                        limits.GET_RECORDS_BYTES_MAX)
        if slices:
            last = slices[-1]
            next_position = last.sn_at(last.end - 1) + 1
            behind_ms = seqno.timestamp_ms_of(committed) - seqno.timestamp_ms_of(next_position - 1)
        else:
            next_position = position
            behind_ms = 0
        if ending is not None and (ending == 0 or next_position > ending) and replica.committed_sn >= ending:
            # a closed partition read to its end: no next iterator; the children go on
            return sms_pb2.GetNextRecordsResponse(
                slices=[sms_pb2.BatchSlice(batch=s.batch, start=s.start, end=s.end) for s in slices],
                next_iterator="", millis_behind_latest=0,
                child_partitions=[partition_id(c) for c in entry.children])
        return sms_pb2.GetNextRecordsResponse(
            slices=[sms_pb2.BatchSlice(batch=s.batch, start=s.start, end=s.end) for s in slices],
            next_iterator=self.tokens.encode(Position(pos.stream, pos.ordinal, next_position)),
            millis_behind_latest=max(0, behind_ms))

    @rpc_errors
    async def GetRecord(self, request, context):
        sn = seqno.parse(request.sequence_number)
        replica = await self._replica(request.stream, seqno.ordinal_of(sn))
        if replica.trimmed_before <= sn <= replica.committed_sn:
            slices = self.storage.logs.read(replica.log, sn, sn, 1, limits.GET_RECORDS_BYTES_MAX)
            if slices and slices[0].sn_at(slices[0].start) == sn:
                s = slices[0]
                return sms_pb2.GetRecordResponse(slice=sms_pb2.BatchSlice(batch=s.batch, start=s.start, end=s.end))
        raise RecordNotFound(f"no committed record {sn} in {request.stream!r}")

