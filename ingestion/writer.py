"""Per-partition group commit: records queue up, leave as one batch, ack after commit.

A `PartitionWriter` owns the Append stream from this ingestion node to the partition's
chain head. Records accepted by PutRecords wait in a bounded queue as *chunks* (the
records of one request for this partition, kept together); whenever the in-flight window
has room, everything queued (up to the batch limits, whole chunks) leaves as one batch.
When the head's ack says the batch is committed, each chunk's one future resolves with
the SN of its first record; the chunk's record i has SN first + i * 2^32. No per-record
future or callback: the unit of work is the batch.

Every batch carries an origin: this writer's random id and the batch's sequence here.
When the stream breaks, the batches in flight are neither failed nor forgotten: the
next stream sends them again, in order, and the head recognises the ones it already
holds, so each batch's outcome is always learned and nothing is stored twice. A batch
fails only when the head says so (its error ack: the batch was not stored) or when the
writer is closed (outcome unknown; the partition's next owner rebuilds from storage).

A chain reconfiguration (new epoch) is not a failure either: a batch refused for its
stale epoch was not stored, and one whose commit the head could no longer confirm may
have been; both stay in flight, the writer re-resolves the chain's head and epoch, and
the next stream resends them, where the head recognises any it already holds.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import random
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import grpc

from sms import wire, errors, limits, seqno
from kernel import rpc
from kernel.aiotools import cancel_and_wait, raise_if_cancelling
from kernel.ports import HeadPort
from sms.metadata import chain_name
from sms.proto import sms_pb2, sms_pb2_grpc

log = logging.getLogger(__name__)


class PartitionWriter:
    def __init__(self, chain_id: str, epoch: int, resolve: Callable[[], Awaitable[tuple[str, int]]],
                 local_head: HeadPort | None = None, channels: rpc.NodeChannels | None = None):
        self.chain_id = chain_id
        self.channels = channels or rpc.NodeChannels()      # to a head in another process, with this node's TLS
        self.epoch = epoch
        self.resolve = resolve                # () -> the head's current (address, chain epoch)
        # () -> a new storage.head.HeadSession of the storage role in this process (the
        # head is on this node): batches go to it by a direct call, not over loopback gRPC
        self.local_head = local_head
        self.head_address = ""
        self.reconfigured = False             # the last session ended on a new epoch or a head handover
        self.origin_id = random.getrandbits(63) | 1
        self.queue: collections.deque = collections.deque()     # (entries, count, future) per chunk
        self.queued_records = 0
        self.queued_bytes = 0
        # origin seq -> (batch bytes, [(records, future)] per chunk), in send order; kept
        # across broken streams
        self.inflight: collections.OrderedDict[int, tuple[bytes, list[tuple[int, asyncio.Future]]]] = \
            collections.OrderedDict()
        self.origin_seqs = itertools.count(1)
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.closed = False
        self.resends = 0

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"writer-{self.chain_id}")

    async def close(self) -> None:
        self.closed = True
        await cancel_and_wait(self.task)
        error = errors.Unavailable(f"{self.chain_id}: writer closed; outcome unknown")
        for _batch, chunks in self.inflight.values():
            _fail([fut for _n, fut in chunks], error)
        self.inflight.clear()
        _fail([fut for _e, _b, fut in self.queue], errors.PartitionClosed(f"{self.chain_id}: writer closed"))
        self.queue.clear()
        self.queued_records = 0
        self.queued_bytes = 0

    def submit(self, entries: bytes, count: int) -> asyncio.Future:
        """Queue `count` stored entries (sms/wire.py, back to back) as one chunk, stored
        contiguously in one batch. The future resolves to the SN of the first (entry i:
        first + i * 2^32). Throttled when the queue is full."""
        if self.closed:
            raise errors.PartitionClosed(f"{self.chain_id}: writer closed")
        if self.queued_records + count > limits.INGEST_PENDING_RECORDS_MAX:
            raise errors.Throttled(f"{self.chain_id}: {self.queued_records} records already queued")
        if self.queued_bytes and self.queued_bytes + len(entries) > limits.INGEST_PENDING_BYTES_MAX:
            raise errors.Throttled(f"{self.chain_id}: {self.queued_bytes} bytes of records already queued")
        errors.invariant(0 < count <= limits.BATCH_RECORDS_MAX
                         and len(entries) <= limits.BATCH_BYTES_MAX - wire.HEADER_BYTES,
                         f"{self.chain_id}: a chunk of {count} records, {len(entries)} bytes, exceeds a batch")
        fut = asyncio.get_running_loop().create_future()
        self.queue.append((entries, count, fut))
        self.queued_records += count
        self.queued_bytes += len(entries)
        self.wake.set()
        return fut

    def _take_batch(self) -> tuple[list[bytes], int, list[tuple[int, asyncio.Future]]]:
        """Whole chunks from the queue's front, as many as the batch limits allow:
        (their entries, their record count, (count, future) per chunk)."""
        bodies: list[bytes] = []
        chunks: list[tuple[int, asyncio.Future]] = []
        size, records = wire.HEADER_BYTES, 0
        while self.queue:
            body, count, fut = self.queue[0]
            if chunks and (records + count > limits.BATCH_RECORDS_MAX or size + len(body) > limits.BATCH_BYTES_MAX):
                break
            self.queue.popleft()
            bodies.append(body)
            chunks.append((count, fut))
            size += len(body)
            records += count
        self.queued_records -= records
        self.queued_bytes -= size - wire.HEADER_BYTES
        return bodies, records, chunks

    def statistics(self) -> dict:
        return {"queued_records": self.queued_records, "inflight_batches": len(self.inflight),
                "resends": self.resends}

    async def _run(self) -> None:
        while not self.closed:
            self.reconfigured = False
            try:
                self.head_address, self.epoch = await self.resolve()
                await self._session()
            except (grpc.aio.AioRpcError, ConnectionError, errors.SmsError) as e:
                raise_if_cancelling()
                log.info("append stream %s -> %s broken (%d batches in flight, resent next): %s",
                         chain_name(self.chain_id), self.head_address, len(self.inflight), e)
            # a chain reconfigured under us (a new epoch, a head handing over) is resent to at
            # once, as soon as the new config is known here; anything else waits a little longer
            await asyncio.sleep(limits.APPEND_RESEND_DELAY_S if self.reconfigured else limits.LINK_RETRY_INTERVAL_S)

    async def _session(self) -> None:
        head = _LocalHead(self.local_head()) if self.local_head is not None else _GrpcHead(self.head_address, self.channels)
        async with head:
            for seq, (batch, _futures) in list(self.inflight.items()):
                await head.send(self.chain_id, self.epoch, seq, batch)
                self.resends += 1
            acks = asyncio.get_running_loop().create_task(self._read_acks(head.acks()))
            acks.add_done_callback(lambda _t: self.wake.set())      # (one event to wait on, no task per wait)
            try:
                while True:
                    while not self.queue or len(self.inflight) >= limits.APPEND_INFLIGHT_BATCHES_MAX:
                        if acks.done():
                            acks.result()
                            raise ConnectionError("head closed the append stream")
                        self.wake.clear()
                        await self.wake.wait()
                    bodies, count, chunks = self._take_batch()
                    if not count:
                        continue
                    seq = next(self.origin_seqs)
                    batch = wire.seal(count, 0, b"".join(bodies), self.origin_id, seq)
                    self.inflight[seq] = (batch, chunks)
                    await head.send(self.chain_id, self.epoch, seq, batch)
            finally:
                acks.cancel()

    async def _read_acks(self, acks) -> None:
        async for ack in acks:
            if ack.error_name in _RESEND_ERRORS and ack.batch_id in self.inflight:
                self.reconfigured = ack.error_name in _RECONFIGURED_ERRORS
                raise ConnectionError(f"head answered {ack.error_name}: {ack.error_message}")
            entry = self.inflight.pop(ack.batch_id, None)
            if entry is None:
                continue     # an ack of a batch resent twice: the first ack settled it
            _batch, chunks = entry
            futures = [fut for _n, fut in chunks]
            if ack.error_name == "PartitionSealed":
                # not stored, and never will be here: the producer re-routes to a child
                _fail(futures, errors.PartitionClosed(ack.error_message))
            elif ack.error_name:
                _fail(futures, errors.from_name(ack.error_name, ack.error_message))
            else:
                sn = ack.first_sn
                total = sum(n for n, _fut in chunks)
                if ack.count != total:
                    errors.invariant(False, f"{self.chain_id}: ack of {ack.count} records for a batch of {total}")
                for n, fut in chunks:
                    if not fut.done():
                        fut.set_result(sn)
                    sn += n * seqno.COUNTER_UNIT
            self.wake.set()


# error acks after which a batch is resent, not failed: a stale epoch (not stored; the
# chain was reconfigured), a replica closed before commit (maybe stored), and a head
# handing its role over (not stored; the new head takes it)
_RESEND_ERRORS = frozenset({"StaleEpoch", "PartitionClosed", "HeadMoving"})
_RECONFIGURED_ERRORS = frozenset({"StaleEpoch", "HeadMoving"})


def _fail(futures: list[asyncio.Future], error: errors.SmsError) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_exception(error)


class _GrpcHead:
    """The Append stream to a chain head in another process; acks as storage.head.AppendAck."""

    def __init__(self, address: str, channels: rpc.NodeChannels):
        self.address = address
        self.channels = channels
        self.channel = self.call = None

    async def __aenter__(self) -> "_GrpcHead":
        self.channel = self.channels.node_channel(self.address)
        self.call = sms_pb2_grpc.StorageStub(self.channel).Append()
        return self

    async def __aexit__(self, *exc) -> None:
        self.call.cancel()
        await self.channel.close()

    async def send(self, chain_id: str, epoch: int, batch_id: int, batch: bytes) -> None:
        await self.call.write(sms_pb2.AppendRequest(chain_id=chain_id, epoch=epoch, batch_id=batch_id, batch=batch))

    async def acks(self):
        while True:
            ack = await self.call.read()
            if ack is grpc.aio.EOF:
                return
            yield _Ack(ack.batch_id, seqno.from_bytes(ack.first_sn) if ack.count else 0, ack.count,
                       ack.error_name, ack.error_message)


class _LocalHead:
    """A session with the chain head in this process (storage.head.HeadSession): the same
    protocol by direct calls."""

    def __init__(self, session):
        self.session = session

    async def __aenter__(self) -> "_LocalHead":
        return self

    async def __aexit__(self, *exc) -> None:
        self.session.end()

    async def send(self, chain_id: str, epoch: int, batch_id: int, batch: bytes) -> None:
        await self.session.append(chain_id, epoch, batch_id, batch)

    def acks(self):
        return self.session.acks()


class _Ack(NamedTuple):
    batch_id: int
    first_sn: int
    count: int
    error_name: str
    error_message: str
