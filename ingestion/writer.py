"""Per-partition group commit: records queue up, leave as one batch, ack after commit.

A `PartitionWriter` owns the Append stream from this ingestion node to the partition's
chain head. Records accepted by PutRecords wait in a bounded queue; whenever the
in-flight window has room, everything queued (up to the batch limits) leaves as one
batch. When the head's ack says the batch is committed, each record's future resolves
with its SN (first SN + index). A broken stream fails the batches in flight with
Unavailable; the producer retries (de-duplication arrives with producer sessions).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import Awaitable, Callable

import grpc

from sms import codec, errors, limits, rpc, seqno
from sms.proto import sms_pb2, sms_pb2_grpc

log = logging.getLogger(__name__)


class PartitionWriter:
    def __init__(self, chain_id: str, epoch: int, resolve_head: Callable[[], Awaitable[str]]):
        self.chain_id = chain_id
        self.epoch = epoch
        self.resolve_head = resolve_head      # the head's current address (it may restart elsewhere)
        self.head_address = ""
        self.queue: collections.deque = collections.deque()     # (entry bytes, future)
        self.queued_records = 0
        self.inflight: dict[int, list[asyncio.Future]] = {}
        self.batch_ids = itertools.count(1)
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.closed = False

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"writer-{self.chain_id}")

    async def close(self) -> None:
        self.closed = True
        if self.task:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        self._fail_all(errors.PartitionClosed(f"{self.chain_id}: writer closed"))

    def submit(self, entries: list[bytes]) -> list[asyncio.Future]:
        """Queue encoded entries; their futures resolve to SNs. Throttled when full."""
        if self.queued_records + len(entries) > limits.INGEST_PENDING_RECORDS_MAX:
            raise errors.Throttled(f"{self.chain_id}: {self.queued_records} records already queued")
        loop = asyncio.get_running_loop()
        futures = []
        for entry in entries:
            fut = loop.create_future()
            self.queue.append((entry, fut))
            futures.append(fut)
        self.queued_records += len(entries)
        self.wake.set()
        return futures

    def _take_batch(self) -> tuple[list[bytes], list[asyncio.Future]]:
        entries, futures, size = [], [], codec.HEADER_BYTES
        while self.queue and len(entries) < limits.BATCH_RECORDS_MAX:
            entry, fut = self.queue[0]
            if entries and size + len(entry) > limits.BATCH_BYTES_MAX:
                break
            self.queue.popleft()
            if fut.done():      # the caller gave up (cancelled): do not write it
                continue
            entries.append(entry)
            futures.append(fut)
            size += len(entry)
        self.queued_records = len(self.queue)
        return entries, futures

    def _fail_all(self, error: errors.SmsError) -> None:
        for futures in self.inflight.values():
            for fut in futures:
                if not fut.done():
                    fut.set_exception(error)
        self.inflight.clear()

    async def _run(self) -> None:
        while not self.closed:
            try:
                self.head_address = await self.resolve_head()
                await self._session()
            except (grpc.aio.AioRpcError, ConnectionError, errors.SmsError) as e:
                log.info("append stream %s -> %s broken: %s", self.chain_id, self.head_address, e)
            self._fail_all(errors.Unavailable(f"{self.chain_id}: append stream to the head broke"))
            await asyncio.sleep(limits.LINK_RETRY_INTERVAL_S)

    async def _session(self) -> None:
        async with rpc.aio_channel(self.head_address) as channel:
            call = sms_pb2_grpc.StorageStub(channel).Append()
            acks = asyncio.get_running_loop().create_task(self._read_acks(call))
            try:
                while True:
                    while not self.queue or len(self.inflight) >= limits.APPEND_INFLIGHT_BATCHES_MAX:
                        if acks.done():
                            acks.result()
                            raise ConnectionError("head closed the append stream")
                        self.wake.clear()
                        waiter = asyncio.ensure_future(self.wake.wait())
                        await asyncio.wait({waiter, acks}, return_when=asyncio.FIRST_COMPLETED)
                        waiter.cancel()
                    entries, futures = self._take_batch()
                    if not entries:
                        continue
                    batch_id = next(self.batch_ids)
                    self.inflight[batch_id] = futures
                    await call.write(sms_pb2.AppendRequest(chain_id=self.chain_id, epoch=self.epoch,
                                                           batch_id=batch_id, batch=codec.build_batch(entries)))
            finally:
                acks.cancel()
                call.cancel()

    async def _read_acks(self, call) -> None:
        while True:
            ack = await call.read()
            if ack is grpc.aio.EOF:
                return
            futures = self.inflight.pop(ack.batch_id, None)
            if futures is None:
                continue
            if ack.error_name:
                error = errors.from_name(ack.error_name, ack.error_message)
                for fut in futures:
                    if not fut.done():
                        fut.set_exception(error)
            else:
                first = seqno.from_bytes(ack.first_sn)
                errors.invariant(ack.count == len(futures), f"{self.chain_id}: ack of {ack.count} records "
                                                            f"for a batch of {len(futures)}")
                for i, fut in enumerate(futures):
                    if not fut.done():
                        fut.set_result(first + i * seqno.COUNTER_UNIT)
            self.wake.set()
