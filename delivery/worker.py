"""One partition of one channel, delivered (docs/channels.md): on the node that is the
partition's chain head, while it is.

    resume:  the position the destination's last commit of the partition covers (a table's
             snapshot properties; for files, the files found from the recorded progress on,
             each named by the first record after the one before)
    parents: wait until every parent partition is delivered to its end (SHARD_END)
    deliver: read pages after the position into a buffer; commit it when it is full or
             its oldest record is `data_freshness_s` old; record the progress (a hint, and
             the checkpoint of the channel as a registered consumer)
    end:     a closed partition read to its end and committed: SHARD_END

A commit that meets another worker's (Conflict) means the partition moved or a worker
restarted: this one resumes from the destination again. Errors of the destination or
the stream are retried with backoff, and shown as the partition's error meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from control.channels import consumer_name, progress_from_bytes, progress_to_bytes
from delivery.destinations import Conflict, dead_letter_key, open_destination, parquet_bytes
from delivery.rows import parse_json
from kernel.aiotools import cancel_and_wait, raise_if_cancelling
from metastore import BadVersionError, Create, MetaStore, NodeExistsError, NoNodeError, Set
from metastore.view import ClusterView
from sms import errors, limits, metadata, objectstore, seqno
from sms.types import SHARD_END, ChannelInfo, ChannelPartition

log = logging.getLogger("sms.channels")


class Ended(Exception):
    """The partition is delivered to its end."""


@dataclasses.dataclass
class Buffer:
    batches: list[Any] = dataclasses.field(default_factory=list)
    records: int = 0
    bytes: int = 0
    first_sn: int = 0
    last_sn: int = 0
    started: float = 0.0           # wall clock (s) from which the freshness clock runs

    def add(self, batch: Any, first_sn: int, last_sn: int, size: int) -> None:
        if not self.records:
            self.first_sn = first_sn
            # (a record's age counts from its arrival, or from when it was read, whichever is later:
            # a worker catching up fills whole files instead of committing each page at once)
            self.started = max(seqno.timestamp_ms_of(first_sn) / 1000, time.time())
        self.batches.append(batch)
        self.records += len(batch)
        self.bytes += size
        self.last_sn = last_sn


class PartitionWorker:
    def __init__(self, channel: ChannelInfo, ordinal: int, client: Any, view: ClusterView, node_id: str) -> None:
        self.channel = channel
        self.ordinal = ordinal
        self.client = client                  # sms.aio.Client of the cluster, as this node
        self.view = view
        self.store: MetaStore = view.store
        self.node_id = node_id
        self.destination = open_destination(channel)
        self.dead_store = objectstore.open_store(channel.dead_letter_url) if channel.dead_letter_url else None
        self.progress = ChannelPartition(ordinal=ordinal, node=node_id)
        self.recorded: ChannelPartition | None = None
        self.progress_at = 0.0
        self.position: int | None = None      # the last SN delivered (None: none)
        self.ended = False
        self.error = ""
        self.lag_ms = 0
        self.failures = 0
        self.ask_destination = False      # (a table's position, not the recorded progress: after a Conflict)
        self.committed = False            # (a commit since the last failure)
        self.commit_s = 0.0
        self.table_schema: Any = None     # an inferring JSON channel's table's columns, once it has a table
        self.buffered_since = 0.0        # wall clock of the oldest record read and not committed (0: none)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"channel-{self.channel.name}-p{self.ordinal:04d}")

    @property
    def done(self) -> bool:
        return self.task is not None and self.task.done()

    async def close(self) -> None:
        await cancel_and_wait(self.task)
        self.destination.close()

    # --- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        backoff = limits.CHANNEL_RETRY_S
        while True:
            try:
                await self._deliver()
                return
            except Ended:
                return
            except Conflict as e:
                log.info("channel %s p%04d: another worker committed first (%s): resuming", self.channel.name,
                         self.ordinal, e)
                self.ask_destination = True
                backoff = limits.CHANNEL_RETRY_S
                continue
            except asyncio.CancelledError:
                raise
            except Exception as e:            # (any failure of the destination or the stream: shown, retried)
                raise_if_cancelling()
                if self.committed:            # (it delivered since the last failure: a new failure, not a long one)
                    self.committed = False
                    backoff = limits.CHANNEL_RETRY_S
                name = e.name if isinstance(e, errors.SmsError) else type(e).__name__
                text = e.message if isinstance(e, errors.SmsError) else str(e)
                self.error = f"{name}: {text}"[:1000]
                log.warning("channel %s p%04d: %s; again in %.0f s", self.channel.name, self.ordinal, self.error,
                            backoff, exc_info=not isinstance(e, errors.SmsError))
                self.failures += 1
                try:
                    await self._record(force=True)
                except errors.SmsError:
                    pass
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, limits.CHANNEL_RETRY_S_MAX)

    async def _deliver(self) -> None:
        log.info("channel %s p%04d: delivering (%s)", self.channel.name, self.ordinal, self.destination.kind)
        await self._load_progress()
        if self.progress.position == SHARD_END:
            self.ended = True
            raise Ended
        await self._wait_for_parents()
        await self.client.get_stream_info(self.channel.stream)   # (the map as it is now: a new child is in it)
        self.position = await self._resume()
        await self._take_over(self.position)
        iterator: str | None = await self._iterator_after(self.position)
        read_upto = self.position         # (the last SN read: a new iterator goes on after it)
        buffer = Buffer()
        freshness = self.channel.data_freshness_s
        committing: asyncio.Task[None] | None = None   # (one commit at a time, while the next buffer fills)
        try:
            while True:
                wait_ms = limits.CHANNEL_READ_WAIT_MS
                if buffer.records:
                    left = buffer.started + freshness - time.time()
                    wait_ms = max(0, min(wait_ms, int(left * 1000)))
                try:
                    page = await self.client.get_next_record_batch(iterator, limits.CHANNEL_READ_RECORDS,
                                                                   wait_ms=wait_ms, skip_trimmed=True)
                except errors.ExpiredIterator:    # (a long commit or wait: again, after what was read)
                    iterator = await self._iterator_after(read_upto)
                    continue
                self.lag_ms = page.millis_behind_latest
                batch = page.batch
                if len(batch):
                    first, last = batch.first_sn, batch.last_sn
                    assert first is not None and last is not None
                    table = batch.to_arrow(timestamp_unit="us")
                    buffer.add(table, first, last, table.nbytes)
                    read_upto = last
                    self.buffered_since = buffer.started
                iterator = page.next_iterator
                full = (buffer.records >= limits.CHANNEL_FILE_RECORDS_MAX
                        or buffer.bytes >= limits.CHANNEL_FILE_BYTES_MAX)
                due = buffer.records and time.time() >= buffer.started + freshness
                if buffer.records and (full or due or iterator is None):
                    if committing is not None:
                        await committing              # (its failure ends this delivery: resume)
                    committing = asyncio.get_running_loop().create_task(self._commit(buffer))
                    buffer = Buffer()
                    freshness = self.channel.data_freshness_s
                elif not buffer.records and (committing is None or committing.done()):
                    if committing is not None:
                        await committing
                        committing = None
                    self.buffered_since = 0.0
                    await self._record()
                if iterator is None:              # a closed partition read to its end
                    if committing is not None:
                        await committing
                        committing = None
                    self.ended = True
                    self.progress = dataclasses.replace(self.progress, position=SHARD_END)
                    await self._record(force=True)
                    await self._checkpoint(SHARD_END)
                    raise Ended
        finally:
            if committing is not None and not committing.done():
                await cancel_and_wait(committing)    # (its thread may still commit: a Conflict on resume)

    # --- resume -----------------------------------------------------------------------------
    async def _resume(self) -> int | None:
        """The last SN the destination holds of this partition (None: none). For a table, the
        recorded progress is taken as it is (its first commit checks it against the table,
        a Conflict if it was behind: then the table is asked), so that reading begins at
        once instead of after a catalog's load."""
        hint = self.progress.position
        if self.destination.kind == "ICEBERG":
            if self.ask_destination:
                self.ask_destination = False
                return await self._blocking(self.destination.position, self.ordinal)
            return int(hint) if hint and hint != SHARD_END else None
        position = int(hint) if hint and hint != SHARD_END else self._start_position()
        for _ in range(limits.CHANNEL_RESUME_PROBES_MAX):
            first = await self._first_after(position)
            if first is None:
                return position
            last = await self._blocking(self.destination.probe, self.ordinal, first, seqno.timestamp_ms_of(first))
            if last is None:
                return position
            position = last
        raise errors.Unavailable(f"more than {limits.CHANNEL_RESUME_PROBES_MAX} commits beyond the recorded progress")

    async def _take_over(self, position: int | None) -> None:
        """Record a position the destination holds beyond the recorded progress: another
        worker (this partition's earlier head) committed it and stopped before recording
        it. Its records are counted by their SNs (counters are consecutive in a partition,
        dead letters included), its commits as one; the stream's checkpoint follows. Else
        the progress would show them undelivered until this worker's next commit, which
        never comes when nothing more is written."""
        recorded = self.progress.position
        if position is None or recorded == str(position):
            return
        done = int(recorded) if recorded and recorded != SHARD_END else None
        if done is not None and seqno.ordinal_of(done) == self.ordinal:
            if done >= position:
                return
            taken = seqno.counter_of(position) - seqno.counter_of(done)
        else:
            first = await self._first_after(self._start_position())
            taken = seqno.counter_of(position) - seqno.counter_of(first) + 1 if first and first <= position else 0
        log.info("channel %s p%04d: the destination holds up to SN %d, beyond the recorded progress (%s): %d "
                 "records another worker committed, taken over", self.channel.name, self.ordinal, position,
                 recorded or "none", taken)
        self.progress = dataclasses.replace(self.progress, position=str(position),
                                            records=self.progress.records + max(0, taken),
                                            files=self.progress.files + 1)
        await self._record(force=True)
        await self._checkpoint(position)

    def _start_position(self) -> int | None:
        if self.channel.start == "LATEST":
            return seqno.highest_below(seqno.lower_bound_for_time(self.channel.created_ms), self.ordinal)
        return None

    async def _iterator_after(self, position: int | None) -> str:
        if position is None:
            position = self._start_position()
        if position is None:
            return await self.client.get_iterator(self.channel.stream, self.ordinal, "TRIM_HORIZON")
        return await self.client.get_iterator(self.channel.stream, self.ordinal, "AFTER_SEQUENCE_NUMBER",
                                              sequence_number=position)

    async def _first_after(self, position: int | None) -> int | None:
        """The SN of the first record after `position`, or None when there is none yet."""
        iterator: str | None = await self._iterator_after(position)
        for _ in range(3):                    # (an empty page can be a replica that lags: ask again)
            assert iterator is not None
            page = await self.client.get_next_record_batch(iterator, 1, wait_ms=0, skip_trimmed=True)
            if len(page.batch):
                return page.batch.first_sn
            iterator = page.next_iterator
            if iterator is None:
                return None
        return None

    async def _wait_for_parents(self) -> None:
        """Until each parent partition is delivered to its end (or gone: trimmed away)."""
        while True:
            view = await self.view.stream(self.channel.stream)
            entry = next((e for e in view.map.entries if e.ordinal == self.ordinal), None)
            parents = tuple(entry.parents) if entry is not None else ()
            waiting = []
            for parent in parents:
                if parent not in view.chains:
                    continue                  # (its records are gone)
                raw = await self.store.get(metadata.channel_partition_path(self.channel.name, parent))
                if raw is None or progress_from_bytes(raw.value).position != SHARD_END:
                    waiting.append(parent)
            if not waiting:
                return
            self.error = ""
            await asyncio.sleep(limits.CHANNEL_CHECK_S)

    # --- commit -----------------------------------------------------------------------------
    async def _commit(self, buffer: Buffer) -> None:
        import pyarrow as pa
        table = pa.concat_tables(buffer.batches)
        dead = None
        if self.channel.record_format == "JSON":
            schema: Any = self.channel.schema
            if not schema and self.destination.kind == "ICEBERG":
                # (inferred: by the first commit's records, which made the table; later ones keep to it)
                if self.table_schema is None:
                    self.table_schema = await self._blocking(self.destination.data_schema)
                schema = self.table_schema or ()
            table, dead = await asyncio.to_thread(parse_json, table, schema)
        if dead is not None and self.dead_store is not None:
            # (before the commit: dead letters are at least once, the destination exactly once)
            key = dead_letter_key(self.channel, self.ordinal, buffer.first_sn, buffer.last_sn)
            data = parquet_bytes(dead, "ZSTD", {"sms.first_sn": str(buffer.first_sn),
                                                "sms.last_sn": str(buffer.last_sn)})
            await self._blocking(self.dead_store.put_new, key, data)
        started = time.monotonic()
        assert buffer.first_sn > (self.position or 0)
        await self._blocking(self.destination.commit, self.ordinal, self.position, buffer.first_sn, buffer.last_sn,
                             seqno.timestamp_ms_of(buffer.first_sn), table)
        self.position = buffer.last_sn
        self.committed = True
        self.error = ""
        dead_n = 0 if dead is None else dead.num_rows
        self.progress = dataclasses.replace(
            self.progress, position=str(buffer.last_sn), last_commit_ms=int(time.time() * 1000),
            records=self.progress.records + table.num_rows, files=self.progress.files + 1,
            dead_letters=self.progress.dead_letters + dead_n)
        self.commit_s = time.monotonic() - started
        log.debug("channel %s p%04d: committed %d records in %.3f s", self.channel.name, self.ordinal,
                  table.num_rows, self.commit_s)
        await self._record(force=True)
        await self._checkpoint(buffer.last_sn)

    async def _blocking(self, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), limits.CHANNEL_STORE_TIMEOUT_S)
        except TimeoutError:
            raise errors.Timeout(f"the destination did not answer within {limits.CHANNEL_STORE_TIMEOUT_S:g} s") \
                from None

    # --- progress ---------------------------------------------------------------------------
    async def _load_progress(self) -> None:
        raw = await self.store.get(metadata.channel_partition_path(self.channel.name, self.ordinal))
        if raw is not None:
            self.progress = dataclasses.replace(progress_from_bytes(raw.value), node=self.node_id)

    async def _record(self, force: bool = False) -> None:
        """The partition's progress in the metadata store (at most every
        CHANNEL_STATUS_INTERVAL_S unless `force`)."""
        now = time.monotonic()
        waiting_ms = int(max(0.0, time.time() - self.buffered_since) * 1000) if self.buffered_since else 0
        shown = dataclasses.replace(self.progress, node=self.node_id, error=self.error,
                                    lag_ms=max(self.lag_ms, waiting_ms))
        if not force and (now - self.progress_at < limits.CHANNEL_STATUS_INTERVAL_S or shown == self.recorded):
            return
        self.progress_at = now
        self.recorded = shown
        path = metadata.channel_partition_path(self.channel.name, self.ordinal)
        value = progress_to_bytes(shown)
        try:
            try:
                await self.store.commit([Set(path, value)])
            except NoNodeError:
                await self.store.commit([Create(path, value)])
        except NoNodeError:
            raise Ended from None                 # (the channel was deleted)
        except (NodeExistsError, BadVersionError):
            pass                                  # (another worker's write: the next one tells)

    async def _checkpoint(self, value: int | str) -> None:
        try:
            await self.client.checkpoint_consumer(self.channel.stream, consumer_name(self.channel),
                                                  {self.ordinal: value})
        except errors.SmsError as e:              # (the next commit records it again)
            log.info("channel %s p%04d: checkpoint failed: %s: %s", self.channel.name, self.ordinal, e.name, e.message)

    def status(self) -> dict[str, Any]:
        """For the metrics (node/metrics.py) and `sms status`: how far behind the stream the
        destination is (the oldest record read and not yet committed, or the stream's lag
        when nothing is waiting), and what it has delivered."""
        waiting_s = max(0.0, time.time() - self.buffered_since) if self.buffered_since else 0.0
        p = self.progress
        return {"channel": self.channel.name, "stream": self.channel.stream, "ordinal": self.ordinal,
                "position": p.position, "ended": self.ended, "error": self.error,
                "lag_s": max(waiting_s, self.lag_ms / 1000), "records": p.records, "commits": p.files,
                "dead_letters": p.dead_letters, "last_commit_ms": p.last_commit_ms, "failures": self.failures,
                "commit_s": self.commit_s}
