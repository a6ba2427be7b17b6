"""An SPS worker: one stage's member in a process (a process may run several stages, each
its own Worker sharing one engine), a peer of the stage's other workers.

The stage is a consumer group, named as the stage, of each of its inputs (sms/consumer.py,
kept by the cluster: control/groups.py). Each round (a third of the stage's failover
time, and whenever a partition ends) the worker writes its member heartbeat, makes sure
the lease table has an entry per input partition (from `get_stream_info`: at start, at
the end of a partition, and every SPS_PARTITION_REFRESH_S), and claims, takes, renews
and releases leases (`sms/leases.py`).

The leases it holds are processed together, in micro-batches (`_micro_batches`):

    read each partition's next batch (up to checkpoint_records records or
        checkpoint_interval_s seconds), ahead, while the previous micro-batch is processed
    -> write each lease: checkpoint = its previous batch's end, pending_end = this batch's end
    -> apply the stage's operation to every partition's batch in one engine call (Spark:
       one job, Arrow in and out; each output row is known to come from one partition)
    -> write each partition's outputs (sps/output.py: SSSNs from its batch's input
       position) and wait for them
    -> the next micro-batch (its lease writes checkpoint this one)

A worker that takes a lease over first replays exactly its pending batch, so its outputs
are the same records under the same SSSNs, which ingestion answers as duplicates: each
output lands once (`checkpoint` recovery), whatever the other partitions of the
micro-batch. Every lease write is conditional on the version this worker last saw: when
one fails (a peer took the lease: this worker was paused past the failover time) the
partition leaves the micro-batch at once, before its outputs are written. At a closed
partition's end the lease gets SHARD_END and the children become claimable. `best_effort`
starts at LATEST and writes no progress.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

from sms import aio, errors, limits, seqno
from kernel.aiotools import cancel_and_wait, raise_if_cancelling
from sms.types import PartitionState, Record, StartPosition
from sps.graph import StageSpec, resolve
from sms.consumer import Membership, StreamsLeases
from sms.leases import (LATEST, SHARD_END, TRIM_HORIZON, ExpiryClock, Lease, LeaseLost, LeaseTable, lease_key,
                        plan_takes)
from sps.engine import Engine, InputBatch, PythonEngine
from sps.output import OutputWriter, base_sssn
from sps.state import KeyedState, parse_changelog

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Owned:
    """A lease this worker holds, and how far its processing is."""
    lease: Lease
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_write: float = field(default_factory=time.monotonic)
    stopping: bool = False            # release at the next batch boundary
    records: int = 0
    rate_since: float = field(default_factory=time.monotonic)
    done: str = ""                    # the checkpoint: the last batch whose outputs are acknowledged
    opened: bool = False              # the iterator is open (and a pending batch is being replayed)
    iterator: str | None = None
    replay_end: int | None = None     # the first batch replays exactly the pending one
    read: asyncio.Task | None = None  # the next batch, read ahead while the current one is processed
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False               # its last batch read reached the partition's end
    writer: OutputWriter | None = None
    unrecorded: int = 0               # records done since the last lease write counted them
    unfailed: int = 0                 # ... failed, and dead-lettered
    undead: int = 0
    last_error: str = ""
    state: KeyedState | None = None   # a stateful stage: the partition's keyed state, as of `done`
    state_pos: str = ""               # ... the changelog SN of its latest snapshot (kept in the lease)
    since_snapshot: int = 0           # ... batches written to the changelog since that snapshot
    snapshot_due: bool = False        # ... the next batch writes a snapshot (state handed down)


@dataclass(eq=False)
class Step:
    """One partition's part of a micro-batch."""
    owned: Owned
    batch: InputBatch
    ended: bool
    rows: list = field(default_factory=list)
    dead: list = field(default_factory=list)
    failed: int = 0
    error: str = ""
    changelog: list = field(default_factory=list)   # a stateful stage: rejected rows' dead letters, then the
    rejected: int = 0                               # ... batch's changelog records (after `rejected` of those)
    snapshot: bool = False                          # ... a snapshot (not a delta)


class Worker:
    def __init__(self, address: str, stage: StageSpec, worker_id: str | None = None,
                 engine: Engine | None = None, client_options: dict | None = None, *, own_engine: bool = True):
        self.address = address
        self.client_options = client_options or {}
        self.stage = stage
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.engine = engine or PythonEngine()
        self.own_engine = own_engine                 # close it when the worker stops (not when shared)
        self.operation = resolve(stage.operation, f"stage {stage.name!r} operation")
        self.sink = resolve(stage.sink, f"stage {stage.name!r} sink") if stage.sink else None
        self.table: LeaseTable | None = None       # the stage's group on each input (set by run)
        self.membership: Membership | None = None
        self.clock = ExpiryClock(stage.failover_s)
        self.owned: dict[str, Owned] = {}
        self.client: aio.Client | None = None
        self._wake = asyncio.Event()                 # the round: a partition ended or failed
        self._work = asyncio.Event()                 # the micro-batch loop: a lease was claimed
        self._refresh_at = 0.0
        self._protect_at = 0.0
        self._writing: asyncio.Task | None = None    # the last micro-batch's outputs being written
        self.processed = 0
        self.timings: Counter = Counter()            # seconds in each phase of the micro-batches, and counts
        self._report_at = time.monotonic() + limits.SPS_REPORT_S
        self.lost = 0
        self.trimmed_skips = 0                       # reads that found records trimmed before they were processed
        self.dead_letters = 0
        self._backoff: dict[str, tuple[float, float]] = {}   # lease key -> (claim again after, last backoff)

    # --- the round ----------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        self.client = aio.Client(self.address, **self.client_options)
        # the stage is a consumer group of each input stream, named as the stage
        self.table = LeaseTable(StreamsLeases(self.client, self.stage.inputs, self.stage.name), self.stage.name)
        self.membership = Membership(self.client, self.stage.inputs[0], self.stage.name, self.worker_id,
                                     self.stage.failover_s)
        loop_task = None
        try:
            await asyncio.to_thread(self.engine.start)      # (before claiming: a JVM takes seconds)
            await asyncio.to_thread(self.engine.warm_up, self.operation)
            loop_task = asyncio.get_running_loop().create_task(self._micro_batches(), name=f"sps-{self.stage.name}")
            interval = self.stage.failover_s / 3
            while not stop.is_set():
                if loop_task.done():
                    loop_task.result()          # (it never ends by itself: an error of this worker's own)
                try:
                    await self.round()
                except LeaseLost:
                    pass
                except (errors.SmsError, ConnectionError) as e:
                    raise_if_cancelling()
                    if isinstance(e, errors.SmsError) and not e.retriable:
                        raise           # (a stream deleted, a key revoked: the worker stops and says why)
                    log.info("%s: round failed, retrying: %r", self.worker_id, e)
                self._wake.clear()
                waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait()), loop_task]
                await asyncio.wait(waiters, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters[:2]:
                    w.cancel()
            if loop_task.done():
                loop_task.result()
            await self.release_all()
            self._report()
            try:
                await self.membership.leave()
            except errors.SmsError:
                pass
        finally:
            await cancel_and_wait(loop_task)
            for owned in list(self.owned.values()):
                await self._finish(owned)
            await self.client.close()
            if self.own_engine:
                self.engine.close()

    async def _workers(self) -> list[str]:
        return await self.membership.heartbeat()

    async def refresh_partitions(self) -> None:
        """An entry per input partition in the lease table (existing ones are kept)."""
        start = TRIM_HORIZON if self.stage.recovery == "checkpoint" else LATEST
        known = set(await self.table.all())
        for stream in self.stage.inputs:
            info = await self.client.get_stream_info(stream)
            for p in info.partitions:
                if lease_key(stream, p.ordinal) in known:
                    continue
                # a best-effort stage does not read closed partitions' pasts
                first = start if p.state is PartitionState.OPEN or start == TRIM_HORIZON else SHARD_END
                await self.table.ensure(stream, p.ordinal, tuple(p.parents), first)
        self._refresh_at = time.monotonic() + limits.SPS_PARTITION_REFRESH_S

    async def round(self) -> None:
        workers = await self._workers()      # (first: a slow round must not make this worker look dead)
        if time.monotonic() >= self._refresh_at:
            await self.refresh_partitions()
        leases = await self.table.all()
        for lease in leases.values():
            self.clock.observe(lease)
        claims, releases = plan_takes(leases, self.worker_id, workers, self.clock)
        # a lease still this worker's that it no longer processes (a write answered late, a
        # release that failed, a restart under the same id): taken up again from its checkpoint
        dropped = [lease for key, lease in leases.items()
                   if lease.owner == self.worker_id and key not in self.owned and not lease.done]
        now = time.monotonic()
        claims = [lease for lease in dropped + [c for c in claims if c.key not in {d.key for d in dropped}]
                  if self._backoff.get(lease.key, (0.0, 0.0))[0] <= now]
        for lease in claims:
            try:
                mine = await self.table.claim(lease, self.worker_id)
            except LeaseLost:
                continue
            log.info("%s: claimed %s at %s (from %s)", self.worker_id, lease.key, mine.checkpoint,
                     lease.owner or "nobody")
            self.owned[mine.key] = Owned(mine)
            self._work.set()
        for lease in releases:
            owned = self.owned.get(lease.key)
            if owned is not None:
                owned.stopping = True        # checkpointed and released at its next batch boundary
                self._work.set()
        for key, owned in list(self.owned.items()):
            if time.monotonic() - owned.last_write >= self.stage.failover_s / 3:
                try:
                    async with owned.lock:
                        owned.lease = await self.table.renew(owned.lease)
                        owned.last_write = time.monotonic()
                except LeaseLost:
                    if self._holds(owned):
                        await self._lose(owned)
        if self.stage.state is not None and time.monotonic() >= self._protect_at:
            self._protect_at = time.monotonic() + limits.SPS_PARTITION_REFRESH_S
            try:
                await self._protect_changelog(leases)
            except (errors.SmsError, ConnectionError) as e:
                raise_if_cancelling()
                log.warning("%s: stage %s: could not move its changelog's retention hold (retrying in %.0f s): %r",
                            self.worker_id, self.stage.name, limits.SPS_PARTITION_REFRESH_S, e)

    def _report(self) -> None:
        """A line with the micro-batches' figures so far (every SPS_REPORT_S, and at the end)."""
        self._report_at = time.monotonic() + limits.SPS_REPORT_S
        log.info("%s: stage %s: %s", self.worker_id, self.stage.name,
                 ", ".join(f"{k} {round(v, 2)}" for k, v in sorted(self.timings.items())))

    def _forget(self, key: str) -> None:
        owned = self.owned.pop(key, None)
        if owned is not None:
            owned.finished.set()
            if owned.read is not None:
                owned.read.cancel()

    async def _finish(self, owned: Owned) -> None:
        """This worker is done with the lease (released, lost, ended or failed)."""
        if self.owned.get(owned.lease.key) is owned:
            self._forget(owned.lease.key)
        owned.finished.set()
        await cancel_and_wait(owned.read)
        owned.read = None
        if owned.writer is not None:
            writer, owned.writer = owned.writer, None
            # (a replay of what it did not finish is answered by de-duplication)
            await writer.close(flush=False)
        self._wake.set()

    async def release_all(self) -> None:
        for owned in list(self.owned.values()):
            owned.stopping = True
        self._work.set()
        waits = [asyncio.ensure_future(o.finished.wait()) for o in list(self.owned.values())]
        if waits:
            await asyncio.wait(waits, timeout=self.stage.checkpoint_interval_s * 2 + 5)
            for w in waits:
                w.cancel()

    # --- the micro-batches ---------------------------------------------------------------
    async def _micro_batches(self) -> None:
        """One micro-batch after another, each over every partition this worker holds that
        has records (or ended, or is to be released): read (ahead, while the previous one
        was processed), fence (the pending write of each lease), apply (one engine call),
        write the outputs, and move each partition on. A micro-batch's outputs are written
        while the next one is read and applied (`_process`)."""
        try:
            await self._micro_batch_loop()
        finally:
            await cancel_and_wait(self._writing)

    async def _micro_batch_loop(self) -> None:
        while True:
            if self._writing is not None and (self._writing.done() or any(
                    o.read is None and (o.ended or o.stopping) for o in self.owned.values())):
                # a partition that ended or is to be released is moved on by the writing of
                # its last batch: that first (and a writing that failed says so now)
                await self._settle()
            self._work.clear()
            active = list(self.owned.values())
            for owned in active:
                if owned.read is None:
                    owned.read = asyncio.get_running_loop().create_task(self._next_batch(owned))
            if not active:
                await self._work.wait()
                continue
            reads = [o.read for o in active]
            work = asyncio.ensure_future(self._work.wait())
            done, _ = await asyncio.wait(reads + [work], return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                # the others that are about to be ready join this micro-batch
                await asyncio.wait(reads, timeout=limits.SPS_MICRO_BATCH_GATHER_S)
            work.cancel()
            steps: list[Step] = []
            for owned in active:
                task = owned.read
                if task is None or not task.done() or self.owned.get(owned.lease.key) is not owned:
                    continue
                owned.read = None
                try:
                    batch, ended = task.result()
                except asyncio.CancelledError:
                    raise_if_cancelling()
                    await self._lost_or_failed(owned, RuntimeError(f"{owned.lease.key}: its read was cancelled"))
                    continue
                except LeaseLost:
                    if self._holds(owned):
                        await self._lose(owned)
                    continue
                except Exception as e:        # noqa: BLE001 (the read of one partition: it is released)
                    raise_if_cancelling()
                    await self._fail(owned, e)
                    continue
                owned.ended = ended
                if not ended and not owned.stopping and len(batch):
                    # read ahead (not past a replay's end: replay_end is cleared by the read)
                    owned.read = asyncio.get_running_loop().create_task(self._next_batch(owned))
                steps.append(Step(owned, batch, ended))
            if steps:
                await self._process(steps)

    async def _next_batch(self, owned: Owned) -> tuple[InputBatch, bool]:
        lease = owned.lease
        if not owned.opened:
            owned.opened = True
            owned.done = lease.checkpoint
            if lease.checkpoint == SHARD_END:
                return InputBatch(lease.stream, lease.ordinal), True
            owned.iterator = await self._open(owned)
            if owned.iterator is None:
                return InputBatch(lease.stream, lease.ordinal), True
            if self.stage.recovery == "checkpoint" and lease.pending_end:
                owned.replay_end = int(lease.pending_end)
            if self.stage.state is not None:
                await self._restore(owned)      # (before its first batch: as of the checkpoint)
        batch, owned.iterator, ended = await self._read_batch(lease.stream, lease.ordinal, owned.iterator,
                                                              owned.replay_end)
        owned.replay_end = None
        return batch, ended

    async def _open(self, owned: Owned) -> str | None:
        """The partition's iterator at the lease's checkpoint; None when retention dropped
        the partition before this stage read it to its end."""
        lease = owned.lease
        stream, ordinal, done = lease.stream, lease.ordinal, lease.checkpoint
        # (an SN: after the batch processed last; AT_TIMESTAMP: `sms consumer reset
        # --timestamp-ms` on the stage)
        kind, options = StartPosition.parse(done).iterator()
        try:
            return await self.client.get_iterator(stream, ordinal, kind, **options)
        except errors.PartitionNotFound:
            if any(p.ordinal == ordinal for p in (await self.client.get_stream_info(stream)).partitions):
                raise                      # (a map that lagged: released, and claimed again)
            # retention dropped it before this stage read it to its end: say so, and let its
            # children go on (they would wait for its SHARD_END for ever)
            log.warning("%s: %s p%04d was dropped by retention before stage %s processed it to its end (from "
                        "%s); going on with its children", self.worker_id, stream, ordinal, self.stage.name, done)
            self.trimmed_skips += 1
            return None

    async def _process(self, steps: list[Step]) -> None:
        """One micro-batch: apply (and fold into the state) while the previous micro-batch's
        outputs are still being written; then, once those are acknowledged and its leases
        moved on, fence this one's leases and start writing its outputs (`_write_out`, a
        task the next micro-batch's apply overlaps). Nothing of a batch is written before
        its fence, so the exactly-once protocol is the one of sps/worker.py's docstring:
        the apply has no side effect but on the in-memory state, which a partition that
        fails or is lost takes with it."""
        checkpointing = self.stage.recovery == "checkpoint"
        work = [s for s in steps if len(s.batch) and self._holds(s.owned)]
        t0 = time.monotonic()
        if work:
            await self._apply_steps(work)
            if self.stage.state is not None:
                for s in list(work):
                    if not self._holds(s.owned):
                        continue
                    try:
                        self._fold(s)
                    except Exception as e:       # noqa: BLE001 (rows the state cannot take are dead-lettered;
                        work.remove(s)           # anything else fails the partition)
                        steps.remove(s)
                        await self._lost_or_failed(s.owned, e)
        t1 = time.monotonic()
        await self._settle()
        t2 = time.monotonic()
        # (a lease lost or failed meanwhile leaves the micro-batch before its fence)
        work = [s for s in work if self._holds(s.owned)]
        if checkpointing and work:
            # the fence: a worker that lost a lease learns it here, before it writes outputs
            fenced = await asyncio.gather(*(self._write_progress(s.owned, pending_end=str(s.batch.last_sn))
                                            for s in work), return_exceptions=True)
            for s, outcome in zip(list(work), fenced):
                if isinstance(outcome, BaseException):
                    work.remove(s)
                    steps.remove(s)
                    await self._lost_or_failed(s.owned, outcome)
        t3 = time.monotonic()
        if work and log.isEnabledFor(logging.DEBUG):
            log.debug("%s: stage %s: micro-batch of %d records from %d partitions: apply %.3f s, settle %.3f s, "
                      "fence %.3f s", self.worker_id, self.stage.name, sum(len(s.batch) for s in work), len(work),
                      t1 - t0, t2 - t1, t3 - t2)
        self.timings["apply_s"] += t1 - t0
        self.timings["settle_s"] += t2 - t1
        self.timings["fence_s"] += t3 - t2
        self._writing = asyncio.get_running_loop().create_task(self._write_out(steps, work))
        self._writing.add_done_callback(lambda _: self._work.set())    # (the loop looks at how it ended)

    async def _settle(self) -> None:
        """Wait until the previous micro-batch's outputs are written and its leases moved on."""
        task, self._writing = self._writing, None
        if task is not None:
            await task

    async def _write_out(self, steps: list[Step], work: list[Step]) -> None:
        """Write the outputs of a micro-batch's fenced partitions (`work`) and, once they are
        acknowledged, move every partition of it on: its checkpoint (written by its next
        fence, or here at its end, its release, or when it idles), SHARD_END, a release."""
        checkpointing = self.stage.recovery == "checkpoint"
        t0 = time.monotonic()
        # (a lease lost while its batch was applied or fenced leaves before its outputs)
        work = [s for s in work if self._holds(s.owned)]
        emitted = await asyncio.gather(*(self._emit(self._writer(s.owned), s.rows, s.batch.first_sn, s.dead,
                                                    s.changelog)
                                         for s in work), return_exceptions=True)
        t1 = time.monotonic()
        self.timings["emit_s"] += t1 - t0
        if work:
            self.timings["records"] += sum(len(s.batch) for s in work)
            self.timings["micro_batches"] += 1
        if t1 >= self._report_at:
            self._report()
        for s, outcome in zip(list(work), emitted):
            if isinstance(outcome, BaseException):
                steps.remove(s)
                await self._lost_or_failed(s.owned, outcome)
                continue
            o = s.owned
            if not self._holds(o):
                continue                     # (failed or lost while its outputs were written)
            o.done = str(s.batch.last_sn)
            if o.state is not None:
                self._snapshotted(s, outcome)
            o.unfailed += s.failed
            o.undead += len(s.dead) + s.rejected
            o.last_error = s.error or o.last_error
            o.records += len(s.batch)
            o.unrecorded += len(s.batch)
            self.processed += len(s.batch)
            self._backoff.pop(o.lease.key, None)
        for s in steps:
            o = s.owned
            if not self._holds(o):
                continue                     # (lost or failed meanwhile: the round or the loop stopped it)
            try:
                if s.ended:
                    await self._write_progress(o, SHARD_END)
                    self._refresh_at = 0.0               # its children appear in the table next round
                    await self._finish(o)
                elif o.stopping:
                    if checkpointing and o.done != o.lease.checkpoint:
                        await self._write_progress(o)
                    async with o.lock:
                        o.lease = await self.table.release(o.lease)
                    await self._finish(o)
                elif not len(s.batch) and checkpointing and o.done != o.lease.checkpoint:
                    await self._write_progress(o)
            except Exception as e:       # noqa: BLE001
                raise_if_cancelling()
                await self._lost_or_failed(o, e)

    async def _lost_or_failed(self, owned: Owned, e: BaseException) -> None:
        if isinstance(e, asyncio.CancelledError):
            raise e
        if not self._holds(owned):
            return                           # (lost meanwhile: the round stopped it, and its writer)
        try:
            if isinstance(e, LeaseLost):
                await self._lose(owned)
            else:
                await self._fail(owned, e)
        except Exception:                    # noqa: BLE001 (one partition's end must not stop the others)
            raise_if_cancelling()
            log.exception("%s: stopping %s", self.worker_id, owned.lease.key)
            self._forget(owned.lease.key)

    async def _lose(self, owned: Owned) -> None:
        self.lost += 1
        log.warning("%s: lost %s to a peer; stopped processing it", self.worker_id, owned.lease.key)
        await self._finish(owned)

    async def _fail(self, owned: Owned, e: BaseException) -> None:
        """Anything but the operation failed a partition (that dead-letters): an output
        stream gone, a sink raising... It is released, and claimed again after a backoff."""
        key = owned.lease.key
        now = time.monotonic()
        delay = min(limits.SPS_RECLAIM_BACKOFF_S_MAX,
                    max(limits.SPS_RECLAIM_BACKOFF_S, 2 * self._backoff.get(key, (0.0, 0.0))[1]))
        self._backoff[key] = (now + delay, delay)
        log.error("%s: processing %s failed; releasing it (this worker claims it again in %.0f s at the "
                  "earliest)", self.worker_id, key, delay, exc_info=e)
        try:
            async with owned.lock:
                owned.lease = await self.table.release(owned.lease)
        except (LeaseLost, errors.SmsError):
            pass
        await self._finish(owned)

    async def _write_progress(self, owned: Owned, checkpoint: str | None = None, pending_end: str = "") -> None:
        """Write the lease: checkpoint (default: what is done), the batch in progress, and
        the records done, failed and dead-lettered since the last write."""
        await self._write_lease(owned, owned.done if checkpoint is None else checkpoint, pending_end,
                                owned.unrecorded, (owned.unfailed, owned.undead, owned.last_error),
                                owned.state_pos if owned.state is not None else None)
        owned.unrecorded = owned.unfailed = owned.undead = 0
        owned.last_error = ""

    async def _write_lease(self, owned: Owned, checkpoint: str, pending_end: str = "", records: int = 0,
                           failures: tuple[int, int, str] = (0, 0, ""), state: str | None = None) -> None:
        async with owned.lock:
            now = time.monotonic()
            # the partition's workload: records/s since the last progress write (an EMA)
            elapsed = now - owned.rate_since
            rate = owned.lease.rate
            if records and elapsed > 0:
                rate = records / elapsed if not rate else 0.5 * rate + 0.5 * records / elapsed
            owned.lease = await self.table.checkpoint(owned.lease, checkpoint, pending_end, records, rate, *failures,
                                                      state=state)
            owned.last_write = now
            if records:
                owned.rate_since = now

    def _holds(self, owned: Owned) -> bool:
        return self.owned.get(owned.lease.key) is owned and not owned.finished.is_set()

    def _writer(self, owned: Owned) -> OutputWriter:
        if owned.finished.is_set():
            raise LeaseLost(f"{owned.lease.key}: no longer processed by this worker")
        if owned.writer is None:
            pid = output_producer_id(self.stage.name, owned.lease.key)
            owned.writer = OutputWriter(self.client, pid)
        return owned.writer

    async def _read_batch(self, stream: str, ordinal: int, iterator: str, replay_end: int | None
                          ) -> tuple[InputBatch, str | None, bool]:
        """Records up to checkpoint_records or checkpoint_interval_s (a replayed batch: exactly
        up to replay_end); (records, next iterator, the partition ended)."""
        batch = InputBatch(stream, ordinal)
        deadline = time.monotonic() + self.stage.checkpoint_interval_s
        want = self.stage.checkpoint_records if replay_end is None else limits.SPS_BATCH_RECORDS_MAX
        least = self.stage.min_batch_records     # (a batch reads on while records keep coming, up to the deadline)
        while len(batch) < want:
            left_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
            if not len(batch) or replay_end is not None:
                wait_ms = min(left_ms, 1000)
            elif len(batch) < least:        # (more while records keep coming: a pause ends the batch)
                wait_ms = min(left_ms, limits.SPS_MIN_BATCH_IDLE_MS)
            else:
                wait_ms = 0
            kw = {"max_records": min(want - len(batch), limits.GET_RECORDS_COUNT_MAX), "wait_ms": wait_ms}
            try:
                page = await self.client.get_next_record_batch(iterator, **kw)
            except errors.RecordsTrimmed as e:
                # (a stage fallen behind retention goes on from the oldest record left, and
                # says so: failing the partition would only make it be claimed again and again)
                self.trimmed_skips += 1
                log.warning("%s: %s p%04d: %s; going on from there", self.worker_id, stream, ordinal, e.message)
                page = await self.client.get_next_record_batch(iterator, **kw, skip_trimmed=True)
            records = page.batch
            if replay_end is not None and len(records) and records.last_sn >= replay_end:
                batch.add(records.clip(replay_end))
                iterator = await self.client.get_iterator(stream, ordinal, "AFTER_SEQUENCE_NUMBER",
                                                          sequence_number=replay_end)
                return batch, iterator, False
            batch.add(records)
            if page.next_iterator is None:
                return batch, None, True
            iterator = page.next_iterator
            if replay_end is not None:
                continue                 # the replayed batch ends exactly where the first one did
            if not len(records) or time.monotonic() >= deadline:
                break
        return batch, iterator, False

    async def _apply_steps(self, steps: list[Step]) -> None:
        """The operation on each partition's batch, in one engine call; when that fails,
        each batch on its own (`_apply` finds the failing records)."""
        try:
            rows = await asyncio.to_thread(self.engine.apply_batches, self.operation,
                                           {s.owned.lease.key: s.batch for s in steps})
            for s in steps:
                s.rows = rows[s.owned.lease.key]
            return
        except Exception as e:            # noqa: BLE001 (the operation's own error, whatever it is)
            raise_if_cancelling()
            self._raise_if_engine_broken(e)
        # (one budget for the micro-batch, its partitions isolated side by side: a replay
        # stays within the dedup window however many of them hold failing records)
        deadline = time.monotonic() + limits.SPS_APPLY_BUDGET_S
        results = await asyncio.gather(*(self._apply(s.batch.records(), deadline) for s in steps))
        for s, (rows, dead, failed, error) in zip(steps, results):
            s.rows, s.dead, s.failed, s.error = rows, dead, failed, error


    async def _apply(self, batch: list[Record], deadline: float | None = None
                     ) -> tuple[list[dict], list[tuple[Record, str]], int, str]:
        """The operation on the batch: (result rows, dead letters (record, error), records
        that failed at least once, the last error). When the batch fails, its halves are
        tried, and so on down to single records; a record that fails
        SPS_RECORD_ATTEMPTS_MAX times (SPS_RETRY_BACKOFF_S apart, doubling) is a dead
        letter, and the others go on. All of it within SPS_APPLY_BUDGET_S of the batch:
        past that, a part that still fails goes to the dead letters whole, untried again,
        so a replay stays well inside the dedup window. A deterministic operation gives the
        same split on a replay, so the outputs and dead letters are the same records."""
        if deadline is None:
            deadline = time.monotonic() + limits.SPS_APPLY_BUDGET_S
        try:
            return await asyncio.to_thread(self.engine.apply, self.operation, batch), [], 0, ""
        except Exception as e:            # noqa: BLE001 (the operation's own error, whatever it is)
            self._raise_if_engine_broken(e)
            error = _error_text(e)
            if time.monotonic() > deadline:
                return [], self._dead(batch, error, "its batch ran out of time"), len(batch), error
            if len(batch) > 1:
                half = len(batch) // 2
                a_rows, a_dead, a_failed, a_err = await self._apply(batch[:half], deadline)
                b_rows, b_dead, b_failed, b_err = await self._apply(batch[half:], deadline)
                return a_rows + b_rows, a_dead + b_dead, a_failed + b_failed, b_err or a_err
        for attempt in range(1, limits.SPS_RECORD_ATTEMPTS_MAX):
            pause = limits.SPS_RETRY_BACKOFF_S * 2 ** (attempt - 1)
            if time.monotonic() + pause > deadline:
                break
            await asyncio.sleep(pause)
            try:
                return await asyncio.to_thread(self.engine.apply, self.operation, batch), [], 1, error
            except Exception as e:        # noqa: BLE001
                self._raise_if_engine_broken(e)
                error = _error_text(e)
        return [], self._dead(batch, error, f"failed {limits.SPS_RECORD_ATTEMPTS_MAX} times"), 1, error

    # --- keyed state (sps/state.py) ------------------------------------------------------
    def _fold(self, s: Step) -> None:
        """A stateful stage: fold the batch's result rows into its partition's state; the
        batch then outputs the state's changed rows (or closed windows) and writes its
        changelog record(s): a snapshot when one is due (every snapshot_every batches, and
        the first batch after a hand-down), else a delta.

        A replayed batch must write the very records its first run wrote (the same SSSNs
        with other contents are refused as a SessionConflict), so everything here follows
        from the changelog and the batch alone: the snapshot schedule counts the batches
        since the last snapshot in the changelog (not, say, whether this worker is about to
        hand the lease over), and rows are folded in a fixed order when an engine's row
        order is not (a float sum depends on it)."""
        o, spec = s.owned, self.stage.state
        rows = s.rows
        if self.engine.name != "python" and any(a.function == "sum" for a in spec.aggregates):
            rows = sorted(rows, key=lambda row: repr(sorted(row.items())))
        changes = o.state.update(rows)
        s.snapshot = o.snapshot_due or o.since_snapshot + 1 >= spec.snapshot_every
        # (counted here, not once written: the next batch is folded while this one is written)
        o.since_snapshot = 0 if s.snapshot else o.since_snapshot + 1
        o.snapshot_due = False
        # result rows the state cannot take (a missing column, a value of the wrong type, the
        # entry limit) go to the dead letters, as JSON, and the others go on
        source = f"p{o.lease.ordinal:04d}/{s.batch.first_sn}-{s.batch.last_sn}"
        rejected = [self._dead_letter(o.lease.key, _row_json(row), error, source) for row, error in changes.rejected]
        if rejected:
            self.dead_letters += len(rejected)
            s.failed += len(rejected)
            s.error = changes.rejected[-1][1]
            s.rejected = len(rejected)
            log.warning("%s: stage %s: %d result row(s) of %s the state cannot take (%s): to %s", self.worker_id,
                        self.stage.name, len(rejected), o.lease.key, s.error, self.stage.dead_letter_stream)
        s.changelog = rejected + [(spec.changelog, o.lease.key, data)
                                  for data in o.state.changelog_records(s.batch.last_sn, changes, s.snapshot)]
        s.rows = o.state.output_rows(changes)
        self.timings["state_changes"] += len(changes.changed) + len(changes.closed)
        if changes.late:
            self.timings["late_rows"] += changes.late

    def _snapshotted(self, s: Step, outcomes: list) -> None:
        """After a batch's writes: where its snapshot starts in the changelog (kept in the
        lease with the checkpoint, by the next lease write)."""
        if not s.snapshot:
            return
        first = outcomes[len(outcomes) - len(s.changelog) + s.rejected] if s.changelog and outcomes else None
        if first is not None and first.sn is not None:
            # (a duplicate is the record the first run stored there: the same contents, or
            # ingestion would have refused it as a SessionConflict)
            s.owned.state_pos = str(first.sn)

    async def _restore(self, owned: Owned) -> None:
        """The partition's state as of its checkpoint, from the changelog (from the latest
        snapshot the lease names); a partition not yet started takes its parents' final
        entries in its hash range (a split or merge hands state down)."""
        spec, lease = self.stage.state, owned.lease
        state = KeyedState(spec, self.stage.name)
        t0 = time.monotonic()
        read = 0
        if lease.checkpoint.isdigit():
            docs = await self._changelog_docs(lease.key, lease.state)
            read = len(docs)
            owned.since_snapshot = state.load(docs, int(lease.checkpoint))
            owned.state_pos = lease.state
        elif lease.parents and lease.checkpoint != SHARD_END:
            leases = await self.table.all()
            info = await self.client.get_stream_info(lease.stream)
            read = await self._hand_down(state, lease.stream, lease.parents, lease.ordinal, leases, info)
            owned.snapshot_due = bool(state.entries)      # (its changelog starts with what it was handed)
        owned.state = state
        self.timings["restore_s"] += time.monotonic() - t0
        if read:
            log.info("%s: stage %s: restored %s's state (%d entries) from %d changelog records in %.2f s",
                     self.worker_id, self.stage.name, lease.key, len(state.entries), read, time.monotonic() - t0)

    async def _hand_down(self, state: KeyedState, stream: str, parents, ordinal: int, leases: dict,
                         info, depth: int = 0) -> int:
        """Into `state`: the final entries of `parents` in partition `ordinal`'s hash range.
        A parent that wrote no changelog record (it ended before it processed a record)
        passes on what it was handed itself, from its own parents. Returns the changelog
        records read."""
        me = next((p for p in info.partitions if p.ordinal == ordinal), None)
        if me is None or depth > limits.SPS_STATE_HAND_DOWN_DEPTH_MAX:
            return 0
        read = 0
        for parent in parents:
            held = leases.get(lease_key(stream, parent))
            docs = await self._changelog_docs(lease_key(stream, parent), held.state if held else "")
            read += len(docs)
            theirs = KeyedState(self.stage.state, self.stage.name)
            if docs:
                theirs.load(docs, None)
            elif held is not None and held.parents:
                read += await self._hand_down(theirs, stream, held.parents, parent, leases, info, depth + 1)
            state.adopt(theirs, me.hash_lo, me.hash_hi)
        return read

    async def _changelog_docs(self, key: str, position: str) -> list[dict]:
        """A partition's changelog documents from `position` (a snapshot's SN), or from the
        start of the changelog."""
        stream = self.stage.state.changelog
        docs = []
        try:
            async for r in self.client.read_stream(stream, **({"sequence_number": position} if position else {})):
                if r.partition_key != key:
                    continue
                try:
                    docs.append(parse_changelog(r.data))
                except errors.InvalidArgument as e:
                    log.warning("%s: stage %s: %s %s in %s is not a changelog record (%s); ignored",
                                self.worker_id, self.stage.name, key, r.sequence_number, stream, e.message)
        except errors.RecordsTrimmed as e:
            raise errors.RecordsTrimmed(f"stage {self.stage.name!r}: the changelog of {key} in {stream!r} was trimmed "
                                        f"below its snapshot ({e.message}); its state cannot be restored. Keep "
                                        f"{stream!r} protecting unread records (as `sms graph apply` makes it)") from None
        return docs

    async def _protect_changelog(self, leases: dict[str, Lease]) -> None:
        """The stage is a registered consumer of its changelog, at the oldest snapshot a
        partition may still be restored from: retention keeps that, and everything after
        it (in its changelog partition and that partition's descendants). A partition
        that started without a snapshot yet is restored from the whole changelog, so then
        nothing is let go. A closed partition's snapshot is let go once every child has a
        snapshot of its own (or ended, its own children having one)."""
        spec = self.stage.state
        children: dict[str, list[Lease]] = {}
        for c in leases.values():
            for p in c.parents:
                children.setdefault(lease_key(c.stream, p), []).append(c)

        def covered(lease: Lease, depth: int = 0) -> bool:
            if lease.state:
                return True
            kids = children.get(lease.key, [])
            return lease.done and bool(kids) and depth < limits.SPS_STATE_HAND_DOWN_DEPTH_MAX \
                and all(covered(k, depth + 1) for k in kids)

        info = await self.client.get_stream_info(spec.changelog)
        oldest: dict[int, int] = {}
        for lease in leases.values():
            kids = children.get(lease.key, [])
            if lease.done and kids and all(covered(k) for k in kids):
                continue
            if lease.state:
                sn = int(lease.state)
            elif lease.checkpoint.isdigit():
                sn = 1                          # (started, with no snapshot: the whole changelog)
            else:
                continue
            for ordinal in _with_descendants(info, seqno.ordinal_of(sn) if sn > 1 else None):
                oldest[ordinal] = min(oldest.get(ordinal, sn), sn)
        await self.client.checkpoint_consumer(spec.changelog, self.stage.name,
                                              {ordinal: sn - 1 for ordinal, sn in oldest.items()})

    def _raise_if_engine_broken(self, e: BaseException) -> None:
        """An engine that broke (its JVM gone, closed) is not the operation failing on
        records: the partitions fail (released, claimed again) instead of dead-lettering."""
        broken = getattr(self.engine, "broken", None)
        if broken is not None and broken(e):
            raise e

    def _dead(self, records: list[Record], error: str, why: str) -> list[tuple[Record, str]]:
        self.dead_letters += len(records)
        first = records[0]
        log.warning("%s: stage %s: %d record(s) from %s p%04d (first %s) %s (%s): to %s", self.worker_id,
                    self.stage.name, len(records), self.stage.inputs[0] if len(self.stage.inputs) == 1
                    else "its input", first.partition_ordinal, first.sequence_number, why, error,
                    self.stage.dead_letter_stream)
        return [(r, error) for r in records]

    def _dead_letter(self, key: str, data: bytes, error: str, source: str) -> tuple:
        """A record for the dead-letter stream: the error, the stage and where it came from
        (`pNNNN/SN` of an input record, or `pNNNN/FIRST-LAST` of a batch) as headers."""
        return (self.stage.dead_letter_stream, key, data,
                {"sms-error": error.encode(), "sms-stage": self.stage.name.encode(), "sms-source": source.encode()})

    async def _emit(self, writer: OutputWriter, rows: list[dict], first_sn: int,
                    dead: list[tuple[Record, str]] = (), changelog: list[tuple] = ()) -> list:
        """Write a batch's outputs, then its dead letters, then its changelog records (each
        with SSSNs from the batch's first input SN); their outcomes, in that order."""
        dead_out = [self._dead_letter(r.partition_key, r.data, error, f"p{r.partition_ordinal:04d}/{r.sequence_number}")
                    for r, error in dead] + list(changelog)
        if self.sink is not None:
            if rows:
                await asyncio.to_thread(self.sink, rows)
            if dead_out:
                return await writer.write(dead_out, base_sssn(first_sn), seqno.timestamp_ms_of(first_sn))
            return []
        out: list = []
        for row in rows:
            data = row.get("data")
            headers = _headers(row.get("headers"), self.stage.name)
            sn = row.get("sequence_number")
            for o in self.stage.outputs:
                if o.filter and not o.filter.matches(headers):
                    continue                 # (fan-out: this stream takes only what its filter matches)
                key = row.get(o.key)
                if key is None or data is None:
                    raise errors.InvalidArgument(f"stage {self.stage.name!r}: a result row needs {o.key!r} and "
                                                 f"'data'; got {sorted(row)}")
                data = data.encode() if isinstance(data, str) else bytes(data)
                out.append((o.stream, str(key), data, int(sn) if sn is not None else -1, headers))
        # the same order on a replay (it gets the same SSSNs), and per key the input's order:
        # a Python operation's output order is deterministic, so a stable sort by stream and key
        # keeps it; a Spark result's row order is not, so its rows are ordered by their input
        # SN when the result keeps the sequence_number column, else by data (and headers)
        if self.engine.name == "python":
            out.sort(key=lambda t: (t[0], t[1]))
        else:
            out.sort(key=lambda t: (t[0], t[1], t[3], t[2], tuple(sorted(t[4].items())) if t[4] else ()))
        out = [(t[0], t[1], t[2], t[4]) if t[4] else t[:3] for t in out] + dead_out
        if out:
            return await writer.write(out, base_sssn(first_sn), seqno.timestamp_ms_of(first_sn))
        return []


def _with_descendants(info, ordinal: int | None) -> list[int]:
    """A changelog partition and every partition after it in the lineage (None: all)."""
    if ordinal is None:
        return [p.ordinal for p in info.partitions]
    out, todo = [], [ordinal]
    while todo:
        o = todo.pop()
        if o not in out:
            out.append(o)
            todo += [p.ordinal for p in info.partitions if o in p.parents]
    return out


def output_producer_id(stage: str, lease_key: str) -> bytes:
    """The producer id of a stage's outputs from one input partition: `sps:<stage>:<stream>:
    <ordinal>`, or, when that is longer than PRODUCER_ID_BYTES_MAX, its start and a digest
    of the whole (never a cut that two partitions could share)."""
    pid = f"sps:{stage}:{lease_key}".encode()
    if len(pid) <= limits.PRODUCER_ID_BYTES_MAX:
        return pid
    digest = hashlib.sha256(pid).hexdigest()[:32].encode()
    return pid[:limits.PRODUCER_ID_BYTES_MAX - len(digest) - 1] + b"~" + digest


def _headers(value, stage: str) -> dict[str, bytes] | None:
    """A result row's `headers` (a dict, or Spark's map as a dict or (name, value) pairs;
    values bytes or text, numbers as their decimal text; a null value leaves the header
    out) as an output record's headers."""
    if not value:
        return None
    items = value.items() if isinstance(value, dict) else value
    out: dict[str, bytes] = {}
    try:
        for k, v in items:
            if v is None:
                continue
            if isinstance(v, str):
                out[str(k)] = v.encode()
            elif isinstance(v, (bytes, bytearray, memoryview)):
                out[str(k)] = bytes(v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out[str(k)] = str(v).encode()
            else:
                raise TypeError(type(v).__name__)
    except (TypeError, ValueError) as e:
        raise errors.InvalidArgument(f"stage {stage!r}: a result row's headers must map names to bytes, text or "
                                     f"numbers; got {e}") from None
    return out or None


def _row_json(row: dict) -> bytes:
    """A result row as a dead letter's data: JSON, anything else as its text."""
    def text(v):
        return bytes(v).decode("utf-8", "backslashreplace") if isinstance(v, (bytes, bytearray, memoryview)) else str(v)
    return json.dumps(row, default=text, sort_keys=True).encode()


def _error_text(e: BaseException) -> str:
    """An operation's error as kept in a lease and a dead letter: ASCII (non-ASCII escaped)
    and at most SPS_ERROR_CHARS_MAX bytes, so a lease entry stays within its size limit."""
    return f"{type(e).__name__}: {e}".encode("ascii", "backslashreplace").decode()[:limits.SPS_ERROR_CHARS_MAX]


async def run_worker(address: str, stage: StageSpec, worker_id: str | None = None,
                     engine: Engine | None = None, stop: asyncio.Event | None = None) -> Worker:
    worker = Worker(address, stage, worker_id, engine)
    await worker.run(stop or asyncio.Event())
    return worker

