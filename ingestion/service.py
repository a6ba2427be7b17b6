"""The ingestion role: PutRecords validation, routing to partitions, acknowledgements.

A request is validated whole before anything is queued (bad input changes nothing):
framing, counts, sizes, partition keys and explicit hash keys. Each record then goes to
the open partition whose hash range holds its key. A partition whose chain head is not
on this node answers that record with WrongOwner, so the client refreshes its map and
re-routes; the other records of the request proceed. Records of a partition are handed
to its `PartitionWriter` and acknowledged once committed.
"""

from __future__ import annotations

import asyncio
import logging
import struct

from control.metaview import ClusterView
from sms import codec, hashing, limits, seqno
from sms.errors import (InvalidArgument, PartitionClosed, RecordTooLarge, RequestTooLarge, SmsError, Unavailable,
                        WrongOwner)
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.rpc import rpc_errors
from sms.types import StreamStatus
from ingestion.writer import PartitionWriter

log = logging.getLogger(__name__)
_ORDINAL = struct.Struct("<I")


def parse_put_entries(count: int, blob: bytes) -> list[tuple[str, int, bytes]]:
    """(partition key, hash key, data) per record, or a named error for the whole request."""
    if not 1 <= count <= limits.PUT_RECORDS_COUNT_MAX:
        raise RequestTooLarge(f"{count} records; expected 1..{limits.PUT_RECORDS_COUNT_MAX}")
    if len(blob) > limits.PUT_RECORDS_BYTES_MAX + count * (codec.ENTRY.size + 20):
        raise RequestTooLarge(f"request of {len(blob)} bytes; at most {limits.PUT_RECORDS_BYTES_MAX}")
    out, total = [], 0
    for i, e in enumerate(codec.iter_entries(blob, count)):
        if len(e.data) > limits.RECORD_DATA_BYTES_MAX:
            raise RecordTooLarge(f"record {i}: {len(e.data)} bytes of data; at most {limits.RECORD_DATA_BYTES_MAX}")
        try:
            key = e.key.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(f"record {i}: partition key is not UTF-8") from None
        hashing.validate_partition_key(key)
        total += len(e.data) + len(e.key)
        meta = codec.decode_meta(e.meta) if e.meta else {}
        if codec.TAG_EXPLICIT_HASH_KEY in meta:
            raw = meta[codec.TAG_EXPLICIT_HASH_KEY]
            if len(raw) != 16:
                raise InvalidArgument(f"record {i}: explicit hash key of {len(raw)} bytes; expected 16")
            hash_key = int.from_bytes(raw, "big")
        else:
            hash_key = hashing.hash_key_of(key)
        out.append((key, hash_key, e.data))
    if total > limits.PUT_RECORDS_BYTES_MAX:
        raise RequestTooLarge(f"request of {total} bytes of keys and data; at most {limits.PUT_RECORDS_BYTES_MAX}")
    return out


class IngestionService(sms_pb2_grpc.IngestionServicer):
    def __init__(self, node_id: str, view: ClusterView):
        self.node_id = node_id
        self.view = view
        self.writers: dict[str, PartitionWriter] = {}

    async def close(self) -> None:
        for writer in list(self.writers.values()):
            await writer.close()
        self.writers.clear()

    async def _writer(self, chain) -> PartitionWriter:
        writer = self.writers.get(chain.chain_id)
        if writer is not None and writer.epoch == chain.epoch:
            return writer
        if writer is not None:
            await writer.close()
        async def resolve_head() -> str:
            head = (await self.view.nodes()).get(chain.head)
            if head is None:
                self.view.invalidate()
                raise Unavailable(f"{chain.chain_id}: head {chain.head} is not registered")
            return head.address

        await resolve_head()
        writer = PartitionWriter(chain.chain_id, chain.epoch, resolve_head)
        writer.start()
        self.writers[chain.chain_id] = writer
        return writer

    @rpc_errors
    async def PutRecords(self, request, context):
        view = await self.view.stream(request.stream)
        if view.config.status is not StreamStatus.ACTIVE:
            raise Unavailable(f"stream {request.stream!r} is {view.config.status.value}")
        records = parse_put_entries(request.count, request.entries)
        by_partition: dict[int, list[int]] = {}
        ordinals = [0] * len(records)
        errors_out: list[sms_pb2.RecordError] = []
        for i, (_key, hash_key, _data) in enumerate(records):
            entry = view.map.open_for_hash(hash_key)
            ordinals[i] = entry.ordinal
            by_partition.setdefault(entry.ordinal, []).append(i)
        sns = [0] * len(records)
        waits = []
        for ordinal, indexes in by_partition.items():
            chain = view.chains.get(ordinal)
            try:
                if chain is None:
                    raise PartitionClosed(f"partition {ordinal} of {request.stream} has no chain")
                if chain.head != self.node_id:
                    raise WrongOwner(f"partition {ordinal} of {request.stream} is owned by {chain.head}")
                writer = await self._writer(chain)
                entries = [codec.encode_entry(records[i][0].encode(), records[i][2]) for i in indexes]
                waits.append((indexes, writer.submit(entries)))
            except SmsError as e:
                errors_out.extend(sms_pb2.RecordError(index=i, name=e.name, message=e.message) for i in indexes)
        for indexes, futures in waits:
            try:
                done = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True),
                                              limits.APPEND_TIMEOUT_S)
            except asyncio.TimeoutError:
                done = [Unavailable("commit timed out")] * len(indexes)
                for f in futures:
                    f.cancel()
            for i, result in zip(indexes, done):
                if isinstance(result, SmsError):
                    errors_out.append(sms_pb2.RecordError(index=i, name=result.name, message=result.message))
                elif isinstance(result, BaseException):
                    errors_out.append(sms_pb2.RecordError(index=i, name="InternalError", message=str(result)))
                else:
                    sns[i] = result
        errors_out.sort(key=lambda e: e.index)
        return sms_pb2.PutRecordsResponse(
            sequence_numbers=b"".join(seqno.to_bytes(s) for s in sns),
            ordinals=b"".join(_ORDINAL.pack(o) for o in ordinals),
            errors=errors_out)
