"""An SPS worker: one process running one stage, a peer of the stage's other workers.

The stage is a consumer group, named as the stage, of each of its inputs (sms/consumer.py,
kept by the cluster: control/groups.py). Each round (a third of the stage's failover
time, and whenever a partition ends) the worker writes its member heartbeat, makes sure
the lease table has an entry per input partition (from `get_stream_info`: at start, at
the end of a partition, and every SPS_PARTITION_REFRESH_S), and claims, takes, renews
and releases leases (`sms/leases.py`). A claimed partition gets a processing task:

    read a batch (up to checkpoint_records records or checkpoint_interval_s seconds)
    -> write the lease: checkpoint = the previous batch's end, pending_end = this batch's end
    -> apply the stage's operation (on Spark, or plain Python)
    -> write the outputs (sps/output.py: SSSNs from the batch's input position) and wait for them
    -> next batch (the next lease write checkpoints this one)

A worker that takes the lease over first replays exactly the pending batch, so its
outputs are the same records under the same SSSNs, which ingestion answers as duplicates:
each output lands once (`checkpoint` recovery). Every lease write is conditional on the
version this worker last saw: when one fails (a peer took the lease: this worker was
paused past the failover time) the partition's task stops at
once, before it writes the batch's outputs. At a closed partition's end the lease gets
SHARD_END and the children become claimable. `best_effort` starts at LATEST and writes no
progress.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass, field

from sms import aio, errors, limits, seqno
from sms.aiotools import cancel_and_wait, raise_if_cancelling
from sms.types import PartitionState, Record
from sps.graph import StageSpec, resolve
from sms.consumer import AT_TIMESTAMP, Membership, StreamsLeases
from sms.leases import (LATEST, SHARD_END, TRIM_HORIZON, ExpiryClock, Lease, LeaseLost, LeaseTable, lease_key,
                        plan_takes)
from sps.engine import Engine, PythonEngine
from sps.output import OutputWriter, base_sssn

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Owned:
    lease: Lease
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task | None = None
    last_write: float = field(default_factory=time.monotonic)
    stopping: bool = False            # release at the next batch boundary
    records: int = 0
    rate_since: float = field(default_factory=time.monotonic)


class Worker:
    def __init__(self, address: str, stage: StageSpec, worker_id: str | None = None,
                 engine: Engine | None = None, client_options: dict | None = None):
        self.address = address
        self.client_options = client_options or {}
        self.stage = stage
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.engine = engine or PythonEngine()
        self.operation = resolve(stage.operation, f"stage {stage.name!r} operation")
        self.sink = resolve(stage.sink, f"stage {stage.name!r} sink") if stage.sink else None
        self.table: LeaseTable | None = None       # the stage's group on each input (set by run)
        self.membership: Membership | None = None
        self.clock = ExpiryClock(stage.failover_s)
        self.owned: dict[str, Owned] = {}
        self.client: aio.Client | None = None
        self._wake = asyncio.Event()
        self._refresh_at = 0.0
        self.outputs: dict[str, OutputWriter] = {}
        self.processed = 0
        self.lost = 0
        self.trimmed_skips = 0
        self.dead_letters = 0
        self._backoff: dict[str, tuple[float, float]] = {}   # lease key -> (claim again after, last backoff)          # reads that found records trimmed before they were processed

    # --- the round ----------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        self.client = aio.Client(self.address, **self.client_options)
        # the stage is a consumer group of each input stream, named as the stage
        self.table = LeaseTable(StreamsLeases(self.client, self.stage.inputs, self.stage.name), self.stage.name)
        self.membership = Membership(self.client, self.stage.inputs[0], self.stage.name, self.worker_id,
                                     self.stage.failover_s)
        try:
            interval = self.stage.failover_s / 3
            while not stop.is_set():
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
                waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
                await asyncio.wait(waiters, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
            await self.release_all()
            try:
                await self.membership.leave()
            except errors.SmsError:
                pass
        finally:
            for owned in list(self.owned.values()):
                await cancel_and_wait(owned.task)
            await self.client.close()
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
        for key, owned in list(self.owned.items()):
            if owned.task is not None and owned.task.done():
                self._forget(key)
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
            owned = self.owned[mine.key] = Owned(mine)
            owned.task = asyncio.get_running_loop().create_task(self._process(owned), name=f"sps-{mine.key}")
        for lease in releases:
            owned = self.owned.get(lease.key)
            if owned is not None:
                owned.stopping = True        # the task checkpoints and releases at its next batch boundary
        for key, owned in list(self.owned.items()):
            if time.monotonic() - owned.last_write >= self.stage.failover_s / 3:
                try:
                    async with owned.lock:
                        owned.lease = await self.table.renew(owned.lease)
                        owned.last_write = time.monotonic()
                except LeaseLost:
                    self.lost += 1
                    log.warning("%s: lost %s to a peer; stopped processing it", self.worker_id, key)
                    await cancel_and_wait(owned.task)
                    self._forget(key)

    def _forget(self, key: str) -> None:
        self.owned.pop(key, None)

    async def release_all(self) -> None:
        for owned in list(self.owned.values()):
            owned.stopping = True
        for owned in list(self.owned.values()):
            if owned.task is not None:
                try:
                    await asyncio.wait_for(asyncio.shield(owned.task), self.stage.checkpoint_interval_s * 2 + 5)
                except (asyncio.TimeoutError, Exception):   # noqa: BLE001 (stopping: its lease expires)
                    pass

    # --- one partition -------------------------------------------------------------------
    async def _write_lease(self, owned: Owned, checkpoint: str, pending_end: str = "", records: int = 0,
                           failures: tuple[int, int, str] = (0, 0, "")) -> None:
        async with owned.lock:
            now = time.monotonic()
            # the partition's workload: records/s since the last progress write (an EMA)
            elapsed = now - owned.rate_since
            rate = owned.lease.rate
            if records and elapsed > 0:
                rate = records / elapsed if not rate else 0.5 * rate + 0.5 * records / elapsed
            owned.lease = await self.table.checkpoint(owned.lease, checkpoint, pending_end, records, rate, *failures)
            owned.last_write = now
            if records:
                owned.rate_since = now

    def _writer(self, lease: Lease) -> OutputWriter:
        if lease.key not in self.outputs:
            pid = f"sps:{self.stage.name}:{lease.key}".encode()[:limits.PRODUCER_ID_BYTES_MAX]
            self.outputs[lease.key] = OutputWriter(self.client, pid)
        return self.outputs[lease.key]

    async def _process(self, owned: Owned) -> None:
        lease = owned.lease
        try:
            await self._process_lease(owned)
        except LeaseLost:
            self.lost += 1
            log.warning("%s: lost %s to a peer; stopped processing it", self.worker_id, lease.key)
        except asyncio.CancelledError:
            raise
        except Exception:
            # (not the operation: that dead-letters; an output stream gone, a sink raising...)
            now = time.monotonic()
            delay = min(limits.SPS_RECLAIM_BACKOFF_S_MAX,
                        max(limits.SPS_RECLAIM_BACKOFF_S, 2 * self._backoff.get(lease.key, (0.0, 0.0))[1]))
            self._backoff[lease.key] = (now + delay, delay)
            log.exception("%s: processing %s failed; releasing it (this worker claims it again in %.0f s at the "
                          "earliest)", self.worker_id, lease.key, delay)
            try:
                async with owned.lock:
                    owned.lease = await self.table.release(owned.lease)
            except (LeaseLost, errors.SmsError):
                pass
        finally:
            self._forget(lease.key)
            self._wake.set()
            writer = self.outputs.pop(lease.key, None)
            if writer is not None:
                # (a replay of what it did not finish is answered by de-duplication)
                await writer.close(flush=False)

    async def _process_lease(self, owned: Owned) -> None:
        lease = owned.lease
        stream, ordinal = lease.stream, lease.ordinal
        checkpointing = self.stage.recovery == "checkpoint"
        done = lease.checkpoint
        if done == SHARD_END:
            return
        try:
            if done in (TRIM_HORIZON, LATEST):
                iterator = await self.client.get_iterator(stream, ordinal, done)
            elif done.startswith(AT_TIMESTAMP):          # (`sms consumer reset --timestamp-ms` on the stage)
                iterator = await self.client.get_iterator(stream, ordinal, "AT_TIMESTAMP",
                                                          timestamp_ms=int(done[len(AT_TIMESTAMP):]))
            else:
                iterator = await self.client.get_iterator(stream, ordinal, "AFTER_SEQUENCE_NUMBER",
                                                          sequence_number=done)
        except errors.PartitionNotFound:
            if any(p.ordinal == ordinal for p in (await self.client.get_stream_info(stream)).partitions):
                raise                      # (a map that lagged: released, and claimed again)
            # retention dropped it before this stage read it to its end: say so, and let its
            # children go on (they would wait for its SHARD_END for ever)
            log.warning("%s: %s p%04d was dropped by retention before stage %s processed it to its end (from "
                        "%s); going on with its children", self.worker_id, stream, ordinal, self.stage.name, done)
            self.trimmed_skips += 1
            await self._write_lease(owned, SHARD_END)
            self._refresh_at = 0.0
            self._wake.set()
            return
        replay_end = int(lease.pending_end) if checkpointing and lease.pending_end else None
        writer = self._writer(lease)
        unrecorded = 0           # records done since the last lease write counted them
        unfailed = undead = 0    # ... failed and dead-lettered
        last_error = ""
        while True:
            if owned.stopping:
                if checkpointing and done != owned.lease.checkpoint:
                    await self._write_lease(owned, done, records=unrecorded, failures=(unfailed, undead, last_error))
                async with owned.lock:
                    owned.lease = await self.table.release(owned.lease)
                return
            batch, iterator, ended = await self._read_batch(stream, ordinal, iterator, replay_end)
            replay_end = None
            if batch:
                end = str(batch[-1].sn)
                if checkpointing:
                    await self._write_lease(owned, done, pending_end=end, records=unrecorded,   # fenced here
                                            failures=(unfailed, undead, last_error))
                    unfailed = undead = 0
                    last_error = ""
                    unrecorded = 0
                rows, dead, failed, error = await self._apply(batch)
                await self._emit(writer, rows, batch[0].sn, dead)
                unfailed, undead, last_error = unfailed + failed, undead + len(dead), error or last_error
                done = end
                self._backoff.pop(lease.key, None)
                owned.records += len(batch)
                unrecorded += len(batch)
                self.processed += len(batch)
            if ended:
                await self._write_lease(owned, SHARD_END, records=unrecorded, failures=(unfailed, undead, last_error))
                self._refresh_at = 0.0               # its children appear in the table next round
                self._wake.set()
                return
            if not batch and checkpointing and done != owned.lease.checkpoint:
                await self._write_lease(owned, done, records=unrecorded, failures=(unfailed, undead, last_error))
                unrecorded = unfailed = undead = 0
                last_error = ""

    async def _read_batch(self, stream: str, ordinal: int, iterator: str, replay_end: int | None
                          ) -> tuple[list[Record], str | None, bool]:
        """Records up to checkpoint_records or checkpoint_interval_s (a replayed batch: exactly
        up to replay_end); (records, next iterator, the partition ended)."""
        batch: list[Record] = []
        deadline = time.monotonic() + self.stage.checkpoint_interval_s
        want = self.stage.checkpoint_records if replay_end is None else limits.SPS_BATCH_RECORDS_MAX
        while len(batch) < want:
            left_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
            kw = {"max_records": min(want - len(batch), limits.GET_RECORDS_COUNT_MAX),
                  "wait_ms": min(left_ms, 1000) if not batch or replay_end is not None else 0}
            try:
                page = await self.client.get_next_records(iterator, **kw)
            except errors.RecordsTrimmed as e:
                # (a stage fallen behind retention goes on from the oldest record left, and
                # says so: failing the partition would only make it be claimed again and again)
                self.trimmed_skips += 1
                log.warning("%s: %s p%04d: %s; going on from there", self.worker_id, stream, ordinal, e.message)
                page = await self.client.get_next_records(iterator, **kw, skip_trimmed=True)
            records = page.records
            if replay_end is not None and records and records[-1].sn >= replay_end:
                batch.extend(r for r in records if r.sn <= replay_end)
                iterator = await self.client.get_iterator(stream, ordinal, "AFTER_SEQUENCE_NUMBER",
                                                          sequence_number=replay_end)
                return batch, iterator, False
            batch.extend(records)
            if page.next_iterator is None:
                return batch, None, True
            iterator = page.next_iterator
            if replay_end is not None:
                continue                 # the replayed batch ends exactly where the first one did
            if not records or time.monotonic() >= deadline:
                break
        return batch, iterator, False

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
                error = _error_text(e)
        return [], self._dead(batch, error, f"failed {limits.SPS_RECORD_ATTEMPTS_MAX} times"), 1, error

    def _dead(self, records: list[Record], error: str, why: str) -> list[tuple[Record, str]]:
        self.dead_letters += len(records)
        first = records[0]
        log.warning("%s: stage %s: %d record(s) from %s p%04d (first %s) %s (%s): to %s", self.worker_id,
                    self.stage.name, len(records), self.stage.inputs[0] if len(self.stage.inputs) == 1
                    else "its input", first.partition_ordinal, first.sequence_number, why, error,
                    self.stage.dead_letter_stream)
        return [(r, error) for r in records]

    async def _emit(self, writer: OutputWriter, rows: list[dict], first_sn: int,
                    dead: list[tuple[Record, str]] = ()) -> None:
        dead_out = [(self.stage.dead_letter_stream, r.partition_key, r.data,
                     {"sms-error": error.encode(), "sms-stage": self.stage.name.encode(),
                      "sms-source": f"p{r.partition_ordinal:04d}/{r.sequence_number}".encode()})
                    for r, error in dead]
        if self.sink is not None:
            if rows:
                await asyncio.to_thread(self.sink, rows)
            if dead_out:
                await writer.write(dead_out, base_sssn(first_sn), seqno.timestamp_ms_of(first_sn))
            return
        out: list = []
        for o in self.stage.outputs:
            for row in rows:
                key, data = row.get(o.key), row.get("data")
                if key is None or data is None:
                    raise errors.InvalidArgument(f"stage {self.stage.name!r}: a result row needs {o.key!r} and "
                                                 f"'data'; got {sorted(row)}")
                data = data.encode() if isinstance(data, str) else bytes(data)
                sn = row.get("sequence_number")
                out.append((o.stream, str(key), data, int(sn) if sn is not None else -1))
        # the same order on a replay (it gets the same SSSNs), and per key the input's order:
        # a Python operation's output order is deterministic, so a stable sort by stream and key
        # keeps it; a Spark result's row order is not, so its rows are ordered by their input
        # SN when the result keeps the sequence_number column, else by data
        if self.engine.name == "python":
            out.sort(key=lambda t: (t[0], t[1]))
        else:
            out.sort(key=lambda t: (t[0], t[1], t[3], t[2]))
        out = [t[:3] for t in out] + dead_out
        if out:
            await writer.write(out, base_sssn(first_sn), seqno.timestamp_ms_of(first_sn))


def _error_text(e: BaseException) -> str:
    """An operation's error as kept in a lease and a dead letter: ASCII (non-ASCII escaped)
    and at most SPS_ERROR_CHARS_MAX bytes, so a lease entry stays within its size limit."""
    return f"{type(e).__name__}: {e}".encode("ascii", "backslashreplace").decode()[:limits.SPS_ERROR_CHARS_MAX]


async def run_worker(address: str, stage: StageSpec, worker_id: str | None = None,
                     engine: Engine | None = None, stop: asyncio.Event | None = None) -> Worker:
    worker = Worker(address, stage, worker_id, engine)
    await worker.run(stop or asyncio.Event())
    return worker
