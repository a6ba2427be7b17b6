"""The worker's micro-batches: read every held partition's next batch ahead, write the
leases (checkpoint, pending end), apply the stage's operation to all of them in one engine
call, write each partition's outputs exactly once (sps/output.py) with their dead letters,
and go on (sps/worker/__init__.py tells the whole)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time

from sms import errors, limits, seqno
from kernel.aiotools import cancel_and_wait, raise_if_cancelling
from sms.types import Record, StartPosition
from sms.leases import SHARD_END, LeaseLost
from sps.engine import InputBatch
from sps.output import OutputWriter, base_sssn
from sps.worker.parts import Owned, Step

log = logging.getLogger("sps.worker")


class MicroBatches:
    """The micro-batch pipeline of a `Worker`."""

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
        its fence, so the exactly-once protocol is the one of sps/worker/__init__.py's docstring:
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

