"""The owner of one partition of one queue, on the node that is the partition's chain head
(docs/queues.md, "Where the state lives"); queues/service.py makes and closes them.

An owner is a client of its own cluster (`sms.aio.Client` with `cluster_ports`: the node's
certificate, the cluster ports, stored names). It
- takes the partition over: a record of the queue's state log written by a producer whose
  id is the queue's and the partition's, which opens a new epoch of that id and so fences
  the previous owner off (no write of its lands after); then reads the log from the
  partition's latest snapshot up to that record and rebuilds the state (queues/log.py);
- fetches the partition's committed records into the state while its window has room,
  keeping their data for delivery;
- hands records to receives, takes acks, visibility changes and restores, and writes what
  changed to the log (at once when a call waits, else every QUEUE_LOG_FLUSH_MS): a settle
  is answered once its change is in the log, a receive at once while the owner holds its
  lease (`flush`);
- writes a snapshot of the state every QUEUE_SNAPSHOT_CHANGES changes (or
  QUEUE_SNAPSHOT_INTERVAL_S), and its SN in the metadata store (one write per snapshot).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Iterator
from typing import Any

from kernel.aiotools import cancel_and_wait, raise_if_cancelling
from metastore import Create, NodeExistsError, NoNodeError, Set
from control.queues import consumer_name, start_cursor
from metastore.view import ClusterView
from queues import log as qlog
from queues.state import Change, Delivery, Handle, HandleError, Op, PartitionQueue
from sms import errors, limits, metadata, seqno
from sms.types import QueueInfo, Record

log = logging.getLogger(__name__)


def _nonces() -> Iterator[int]:
    while True:
        yield secrets.randbits(64) or 1


def _size(r: Record) -> int:
    """What a record's data costs the window (QUEUE_WINDOW_BYTES_MAX)."""
    return len(r.data) + len(r.partition_key) + len(r.meta)


def snapshot_path(queue: str, ordinal: int) -> str:
    return f"{metadata.queue_path(queue)}/snapshots/{ordinal}"


def producer_id(queue: QueueInfo, ordinal: int) -> bytes:
    return b"queue:" + queue.uid.to_bytes(8, "big") + ordinal.to_bytes(4, "big")


class PartitionOwner:
    def __init__(self, queue: QueueInfo, ordinal: int, client: Any, view: ClusterView):
        self.queue = queue
        self.ordinal = ordinal
        self.client = client                  # sms.aio.Client, internal
        self.view = view
        self.log_stream = metadata.queue_state_stream(queue.name, queue.uid)
        self.state: PartitionQueue | None = None
        self.ready = asyncio.Event()
        self.error: errors.SmsError | None = None
        self.closed = False
        self.available = asyncio.Event()      # records may be visible: long polls look again
        self.data: dict[int, Record] = {}     # the records of live entries, for delivery
        self.data_bytes = 0
        self.pending: list[Change] = []       # not yet in the log
        self.waiting: list[asyncio.Future[None]] = []   # settles answered once `pending` is
        self.flush_wake = asyncio.Event()
        self.flush_wake_during_write = False  # (calls came while the last write was out)
        self.changes_since_snapshot = 0
        self.snapshot_at = time.monotonic()
        self.snapshot_every_s = float(limits.QUEUE_SNAPSHOT_INTERVAL_S)
        self.checkpoint_at = float("-inf")
        self.checkpointed: str | int = ""
        self.ended = False                    # a closed partition read to its end
        self.producer: Any = None
        self.task: asyncio.Task[None] | None = None
        self.nonces = _nonces()
        self.room_wake = asyncio.Event()
        self.lease_until = float("-inf")      # monotonic: no other owner serves before then
        self.log_ordinal = 0                  # the log's partition this one's changes go to
        self.log_hash = 0

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"queue-{self.queue.name}-{self.ordinal}")

    async def close(self, reason: str = "the queue's owner moved") -> None:
        self.closed = True
        await cancel_and_wait(self.task)
        if self.producer is not None:
            try:
                await self.producer.close(flush=False)
            except errors.SmsError:
                pass
        self._fail_waiting(errors.Unavailable(f"queue {self.queue.name!r} p{self.ordinal:04d}: {reason}; retry"))
        self.available.set()

    def _fail_waiting(self, error: errors.SmsError) -> None:
        waiting, self.waiting = self.waiting, []
        for fut in waiting:
            if not fut.done():
                fut.set_exception(error)

    async def _run(self) -> None:
        try:
            await self._take_over()
            self.ready.set()
            self.available.set()
            await asyncio.gather(self._fetch_loop(), self._flush_loop())
        except asyncio.CancelledError:
            raise
        except errors.ProducerFenced as e:
            self.error = errors.Unavailable(f"queue {self.queue.name!r} p{self.ordinal:04d} has another owner now: "
                                            f"{e.message}")
        except errors.SmsError as e:
            self.error = e
            log.warning("queue %s p%04d: the owner stops: %s: %s", self.queue.name, self.ordinal, e.name, e.message)
        except Exception as e:     # a bug: this owner stops; the node makes a new one at the next call
            log.exception("queue %s p%04d: the owner failed", self.queue.name, self.ordinal)
            self.error = errors.InternalError(f"queue owner failed: {type(e).__name__}: {e}")
        self.closed = True
        self.ready.set()
        self._fail_waiting(self.error or errors.Unavailable("the queue's owner stopped"))
        self.available.set()

    async def _take_over(self) -> None:
        # the partition's part of the log: the log's partition `ordinal` modulo their count
        # (the log has one per partition of the stream at the queue's making, up to
        # QUEUE_LOG_PARTITIONS_MAX: the owners' writes go down that many chains at once)
        info = await self.client.get_stream_info(self.log_stream)
        log_partitions = sorted(info.partitions, key=lambda p: p.ordinal)
        mine = log_partitions[self.ordinal % len(log_partitions)]
        self.log_ordinal, self.log_hash = mine.ordinal, mine.hash_lo
        self.producer = self.client.producer(self.log_stream, producer_id(self.queue, self.ordinal), linger_ms=0)
        mark = await self.producer.put(qlog.encode(qlog.RecordKind.TAKEOVER, self.ordinal, 0, []),
                                       str(self.ordinal), explicit_hash_key=self.log_hash)
        # (a snapshot well inside the log's retention: a new owner finds its latest one)
        retention_s = info.retention_s or info.retention_hours * 3600
        self.snapshot_every_s = min(float(limits.QUEUE_SNAPSHOT_INTERVAL_S), retention_s / 4)
        records, since = await self._read_log(mark.sn)
        state, _floor = qlog.rebuild(self.queue.uid, self.ordinal, records)
        if not records:
            state.apply([Change(Op.FETCH, value=start_cursor(self.queue))])
            self.pending.append(Change(Op.FETCH, value=state.cursor))
        # a previous owner may hand out records under its lease until a lease from its last
        # write has passed; that write began before our epoch fenced it (InitProducer waited
        # for every verdict of the old epoch to run out), so a lease from now covers it
        await asyncio.sleep(limits.QUEUE_OWNER_LEASE_S)
        self.state = state
        log.info("queue %s p%04d: taken over at epoch %d from %d log records since %s (%d entries, cursor %d)",
                 self.queue.name, self.ordinal, self.producer.epoch, len(records),
                 f"the snapshot at {since}" if since else "the log's start", len(state.entries), state.cursor)

    async def _read_log(self, upto_sn: int) -> tuple[list[bytes], int]:
        """This partition's log records from its latest snapshot up to `upto_sn` (the
        takeover mark: everything before it is committed, and final), and the snapshot's
        SN (0: none, from the log's start)."""
        entry = await self.view.store.get(snapshot_path(self.queue.name, self.ordinal))
        start = int(entry.value) if entry is not None else 0
        if start:
            iterator = await self.client.get_iterator(self.log_stream, self.log_ordinal, "AT_SEQUENCE_NUMBER",
                                                      sequence_number=start)
        else:
            iterator = await self.client.get_iterator(self.log_stream, self.log_ordinal, "TRIM_HORIZON")
        mine = str(self.ordinal)
        out: list[bytes] = []
        while iterator:
            page = await self.client.get_next_records(iterator, limits.GET_RECORDS_COUNT_MAX,
                                                      wait_ms=limits.QUEUE_FETCH_WAIT_MS)
            for r in page.records:
                if r.sn >= upto_sn:
                    return out, start
                if r.partition_key == mine:
                    out.append(r.data)
            iterator = page.next_iterator
        return out, start

    # --- fetching -------------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        state = self.state
        assert state is not None
        iterator: str | None = None
        while not self.closed:
            room = min(state.room(), limits.QUEUE_FETCH_RECORDS_MAX)
            if room <= 0 or self.data_bytes >= limits.QUEUE_WINDOW_BYTES_MAX:
                await self._wait_room()
                continue
            try:
                if iterator is None:
                    iterator = await self._iterator_at(state.cursor)
                page = await self.client.get_next_records(iterator, room, wait_ms=limits.QUEUE_FETCH_WAIT_MS,
                                                          skip_trimmed=True)
            except errors.ExpiredIterator:
                iterator = None
                continue
            except (errors.Unavailable, errors.Timeout) as e:
                raise_if_cancelling()
                log.info("queue %s p%04d: a fetch failed, again: %s", self.queue.name, self.ordinal, e)
                iterator = None
                await asyncio.sleep(limits.LINK_RETRY_INTERVAL_S)
                continue
            if page.records:
                self._record(state.fetch([r.sn for r in page.records], page.records[-1].sn + 1))
                for r in page.records:
                    self._keep(r)
                self.available.set()
            iterator = page.next_iterator
            if iterator is None:                # a closed partition, read to its end
                self.ended = True
                return

    async def _iterator_at(self, cursor: int) -> str:
        """An iterator of the partition from `cursor` on (a bound, not a record's SN)."""
        if not cursor:
            return await self.client.get_iterator(self.queue.stream, self.ordinal, "TRIM_HORIZON")
        return await self.client.get_iterator(self.queue.stream, self.ordinal, "AFTER_SEQUENCE_NUMBER",
                                              sequence_number=seqno.highest_below(cursor, self.ordinal))

    async def _wait_room(self) -> None:
        self.room_wake.clear()
        try:
            await asyncio.wait_for(self.room_wake.wait(), limits.QUEUE_FETCH_WAIT_MS / 1000)
        except TimeoutError:
            pass

    def _keep(self, r: Record) -> None:
        self.data[r.sn] = r
        self.data_bytes += _size(r)

    def _done(self, sn: int) -> None:
        """An entry left the state (acked or trimmed): its data goes, and there is room."""
        r = self.data.pop(sn, None)
        if r is not None:
            self.data_bytes -= _size(r)
        self.room_wake.set()

    # --- the log --------------------------------------------------------------------------
    def _record(self, changes: list[Change]) -> None:
        if changes:
            self.pending += changes
            for c in changes:
                if c.op is Op.ACK:
                    self._done(c.sn)
                elif c.op is Op.DEAD:
                    self._done(c.sn)            # (a dead letter's data is read again when received)
                elif c.op in (Op.EXPIRE, Op.VISIBILITY, Op.RESTORE):
                    self.available.set()
            if len(self.pending) >= limits.QUEUE_LOG_CHANGES_MAX:
                self.flush_wake.set()       # (a flush's worth: not waiting for the timer)

    async def _flush_loop(self) -> None:
        while not self.closed:
            try:
                await asyncio.wait_for(self.flush_wake.wait(), limits.QUEUE_LOG_FLUSH_MS / 1000)
            except TimeoutError:
                pass
            if self.waiting and limits.QUEUE_LOG_LINGER_MS and not self.flush_wake_during_write:
                # (a call waits: a moment for the calls right behind it, to share its write;
                # not when they came while the last write was out: they have shared it already)
                await asyncio.sleep(limits.QUEUE_LOG_LINGER_MS / 1000)
            self.flush_wake.clear()
            wrote = await self.flush()
            self.flush_wake_during_write = wrote and self.flush_wake.is_set()

    async def flush(self) -> bool:
        """What changed, into the log; then the settles waiting on it are answered. Whether
        it wrote."""
        state = self.state
        assert state is not None
        if state.next_deadline() is not None:
            self._record(state.expire(self._now_ms(), self.queue.max_receive_count))
        pending, self.pending = self.pending, []
        waiting, self.waiting = self.waiting, []
        if pending:
            began = time.monotonic()
            await self._put(qlog.RecordKind.CHANGES, pending)
            self.changes_since_snapshot += len(pending)
            # the log took a write of ours begun then: until a lease from then has passed,
            # no other owner serves this partition (a new one waits the lease out after it
            # fenced us: `_take_over`), so receives may be answered before their write
            self.lease_until = began + limits.QUEUE_OWNER_LEASE_S
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)
        if self.changes_since_snapshot >= limits.QUEUE_SNAPSHOT_CHANGES or (
                self.changes_since_snapshot and time.monotonic() - self.snapshot_at > self.snapshot_every_s):
            await self._snapshot()
        if time.monotonic() - self.checkpoint_at > limits.QUEUE_CHECKPOINT_INTERVAL_S:
            await self._checkpoint()
        return bool(pending)

    async def _checkpoint(self) -> None:
        """The queue's checkpoint in this partition, as a registered consumer of the stream:
        just below its lowest record not done (what retention keeps while the stream protects
        unread records), or SHARD_END once a closed partition is done."""
        state = self.state
        assert state is not None
        self.checkpoint_at = time.monotonic()
        lowest = state.entries.keys()[0] if state.entries else state.cursor
        if self.ended and not state.entries:
            value: str | int = "SHARD_END"
        elif lowest > 0:
            value = seqno.highest_below(lowest, self.ordinal)
        else:
            return
        if value == self.checkpointed:
            return
        try:
            await self.client.checkpoint_consumer(self.queue.stream, consumer_name(self.queue), {self.ordinal: value})
            self.checkpointed = value
        except errors.SmsError as e:         # (the next flush tries again)
            log.info("queue %s p%04d: checkpoint failed: %s: %s", self.queue.name, self.ordinal, e.name, e.message)

    async def _put(self, kind: qlog.RecordKind, changes: list[Change]) -> int:
        """`changes` as log records of at most QUEUE_LOG_RECORD_BYTES_MAX each (the first of
        kind `kind`, the rest CHANGES), sent as one batch; the SN of the first."""
        parts = qlog.split(changes, limits.QUEUE_LOG_RECORD_BYTES_MAX)
        records = [(str(self.ordinal), qlog.encode(kind if i == 0 else qlog.RecordKind.CHANGES, self.ordinal,
                                                   self.producer.epoch, part), self.log_hash)
                   for i, part in enumerate(parts)]
        results = await (await self.producer.send_batch(records))
        failed = results.failed
        if failed:
            raise failed[0][1]
        return results[0].sn

    async def _snapshot(self) -> None:
        state = self.state
        assert state is not None
        sn = await self._put(qlog.RecordKind.SNAPSHOT, state.snapshot())
        self.changes_since_snapshot = 0
        self.snapshot_at = time.monotonic()
        path = snapshot_path(self.queue.name, self.ordinal)
        value = str(sn).encode()
        try:
            await self.view.store.commit([Set(path, value)])
            return
        except NoNodeError:
            pass
        # the first snapshot of the partition (a commit's Create makes no parents: a queue
        # deleted meanwhile is not brought back)
        for made in (Create(path.rsplit("/", 1)[0]), Create(path, value)):
            try:
                await self.view.store.commit([made])
            except NodeExistsError:
                continue
            except NoNodeError:
                return

    # --- calls ----------------------------------------------------------------------------
    @staticmethod
    def _now_ms() -> int:
        return int(time.time() * 1000)

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.closed:
            raise errors.Unavailable(f"queue {self.queue.name!r} p{self.ordinal:04d}: its owner stopped; retry")

    async def receive(self, limit: int, visibility_s: int, dead: bool) -> list[tuple[Delivery, Record]]:
        self.check()
        state = self.state
        assert state is not None
        deliveries, changes = state.receive(limit, self._now_ms(), visibility_s * 1000, self.nonces,
                                            max_receive_count=self.queue.max_receive_count, dead=dead)
        self._record(changes)
        if deliveries and time.monotonic() >= self.lease_until:
            # with no lease left, answered once the receive is in the log: an owner that lost
            # the partition while it was paused hands out nothing (its write is fenced). Under
            # a lease, at once: its write follows within QUEUE_LOG_FLUSH_MS (an owner that dies
            # before it leaves those records to be delivered again at once, their counts one
            # short)
            await self._logged()
        missing = [d.sn for d in deliveries if d.sn not in self.data]
        if missing:
            await self._reload(missing)
        out = []
        for d in deliveries:
            record = self.data.get(d.sn)
            if record is None:
                # (not readable now: it stays in flight, and comes back at its deadline; one
                # that retention took leaves at the next trim)
                log.warning("queue %s p%04d: record %d could not be read for delivery", self.queue.name,
                            self.ordinal, d.sn)
                continue
            out.append((d, record))
        return out

    async def _reload(self, sns: list[int]) -> None:
        """The data of entries this owner did not fetch itself (it rebuilt them from the log,
        or they are dead letters): read again from the partition, a page from the lowest.
        Records retention took leave the state."""
        state = self.state
        assert state is not None
        wanted = set(sns)
        lowest = min(sns)
        try:
            iterator = await self.client.get_iterator(self.queue.stream, self.ordinal, "AT_SEQUENCE_NUMBER",
                                                      sequence_number=lowest)
        except errors.RecordsTrimmed:
            iterator = None
        if iterator is None:
            first = await self.client.get_iterator(self.queue.stream, self.ordinal, "TRIM_HORIZON")
            page = await self.client.get_next_records(first, 1)
            if page.records and page.records[0].sn > lowest:
                self._record(state.trim(page.records[0].sn))         # (retention took them: delivery ends)
            return
        while wanted and iterator:
            page = await self.client.get_next_records(iterator, limits.QUEUE_FETCH_RECORDS_MAX)
            for r in page.records:
                if r.sn in wanted:
                    wanted.discard(r.sn)
                    if r.sn in state.entries and r.sn not in self.data:
                        self._keep(r)
            if not page.records or page.records[-1].sn >= max(sns):
                break
            iterator = page.next_iterator

    def settle(self, handle: Handle, op: str,
               visibility_s: int) -> tuple[HandleError | None, asyncio.Future[None] | None]:
        """An ack, visibility change or restore: (its error, None), or (None, a future that
        resolves once it is in the log)."""
        self.check()
        state = self.state
        assert state is not None
        now = self._now_ms()
        if op == "ack":
            error, changes = state.ack(handle, now, self.queue.max_receive_count)
        elif op == "visibility":
            error, changes = state.change_visibility(handle, now, visibility_s * 1000, self.queue.max_receive_count)
        else:
            error, changes = state.restore(handle, now, self.queue.max_receive_count)
        self._record(changes)
        return (None, self._logged()) if error is None else (error, None)

    def _logged(self) -> asyncio.Future[None]:
        """Resolves once what changed so far is in the log (the next flush, at once)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        self.flush_wake.set()
        return fut

    def status(self) -> dict[str, Any]:
        state = self.state
        oldest = state.entries.keys()[0] if state is not None and state.entries else 0
        return {"queue": self.queue.name, "stream": self.queue.stream, "ordinal": self.ordinal,
                "ready": self.ready.is_set(), "error": self.error.name if self.error else "",
                "available": len(state.available) if state else 0, "in_flight": state.in_flight() if state else 0,
                "dead": state.dead if state else 0, "cursor": state.cursor if state else 0,
                "oldest_ms": seqno.timestamp_ms_of(oldest) if oldest else 0}
