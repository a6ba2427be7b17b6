"""Spark over SMS: `format("sms")` for readStream, writeStream, read and write.

    from spark_sps.datasource import register
    register(spark)
    df = (spark.readStream.format("sms").option("address", "127.0.0.1:7480")
          .option("stream", "clicks").option("maxRecordsPerTrigger", 10_000).load())
    q = (df.selectExpr("partition_key", "upper(cast(data as string)) as data")
         .writeStream.format("sms").option("address", "127.0.0.1:7480").option("stream", "out")
         .option("producerId", "my-query").option("checkpointLocation", "/tmp/cp").start())
    old = spark.read.format("sms").option("address", a).option("stream", "clicks").load()
    old.write.format("sms").option("address", a).option("stream", "copy").mode("append").save()

Every option, its default and the Kafka option it mirrors: docs/sps.md, "Spark connector".
An option the mode does not take is refused by name, with the list of valid ones; Kafka's
own names (`startingOffsets`, `maxOffsetsPerTrigger`...) are refused with a pointer to
this source's (spark_sps/options.py).

**Rows.** `partition_key` (string), `data` (binary), `sequence_number` (string),
`arrival_time` (timestamp), `partition_id` (string) and `headers` (map<string, binary>,
the record's headers; empty when it has none).

**Where a read starts** (`startingPosition`; a restarted streaming query ignores it and
resumes after its checkpointed offsets, as Kafka's source does):
- `TRIM_HORIZON` (default): the oldest record still stored in each partition.
- `LATEST`: after the last record committed when the query starts.
- `AT_TIMESTAMP` with `startingTimestamp` (ms since the epoch; the timestamp alone implies
  AT_TIMESTAMP): the first record that arrived at or after that time, in the partitions
  that held that time; a partition with no such record yet starts after its latest one.
- JSON, per partition id an SN or the word TRIM_HORIZON / LATEST:
  `{"p0000": "<SN>", "p0001": "LATEST"}`. An SN means "at or after": the record with that
  SN is the first read if it exists, else the first one after it. Every partition must be
  named, or lie before or after a named one in its lineage (read from its first record).
Partitions created later (splits, merges) are read from their first record, after all of
their parents: per key, records come in SN order.

**Data loss** (`failOnDataLoss`, default true). A partition's SNs carry consecutive
counters, so a reader knows exactly when records it should read next were deleted by
retention or trim_stream: the query fails with an error naming the stream, the
partition, the position it asked for and the partition's trim point (its first record
still readable). A JSON startingPosition below a partition's trim point fails the same
way, as does a partition that retention dropped before the query read it to its end.
With `failOnDataLoss=false` the query logs a warning and goes on from the trim point.

**Streaming source.** An offset is, per partition, the SN of the last record read, "@SN"
(a resolved start: the next record to read) or END (a closed partition read to its ending
SN). A micro-batch reads each partition up to its commit watermark at planning time (a
closed one: to its ending SN), at most `maxRecordsPerTrigger` records in all, shared in
proportion to each partition's backlog (through Spark's read limits: Trigger.AvailableNow
reads everything). The query's progress shows the latest offsets (`reportLatestOffset`),
so Spark reports its lag. The query registers as a consumer of the stream
(`consumerName`, default "spark-<random>", chosen when the query starts and kept in its
checkpointed offsets) and checkpoints what each committed micro-batch read, so a stream
that protects unread records keeps what the query has not read yet. Remove the consumer
of a retired query with `deregister_consumer`.

**Batch source.** `spark.read` reads, per partition, from the start position to the
ending position resolved at planning time: `endingPosition` LATEST (default: the commit
watermark then), AT_TIMESTAMP with `endingTimestamp` (records that arrived before it), or
JSON of SNs per partition (exclusive: records before it; unnamed partitions: LATEST).

**Security** (docs/security.md). All take `caFile` (the cluster CA's certificate) and
`token` (a key's token: readers need a consumer key, writers a producer key; keys of any
tenant work, with the tenant's own stream names). Without them they read $SMS_CA_FILE
and $SMS_TOKEN, in the driver and in the workers.

**Sinks.** Rows need `partition_key` (string, never null) and `data` (string or binary,
never null); a `headers` map column, when present, becomes the records' headers; other
columns are ignored. The streaming sink writes each Spark partition of micro-batch b with
the producer id `<producerId>:<partition index>` and SSSNs `b * 2^24 + index` (rows sorted
by key and data first): a restarted query re-executes an uncommitted micro-batch under
the same id, so its records are duplicates and land once (the operation before the sink
must be deterministic). The batch writer writes with `<producerId>:<write id>:<partition
index>` (the write id is drawn once per `save()`, default producerId "spark-batch") and
SSSNs from 0, so a retried Spark task repeats its records under the same SSSNs and
ingestion drops them as duplicates. Batch writes append: mode("overwrite") is refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter,
                                    DataSourceWriter, InputPartition, WriterCommitMessage)

from sms import limits, seqno
from sms.errors import SmsError
from sms.types import PartitionInfo, PartitionState, StartPosition, StreamInfo
from spark_sps import offsets
from spark_sps.offsets import END, NONE_READ
from spark_sps.options import (AT_TIMESTAMP, LATEST, TRIM_HORIZON, WRITE_ID_HEX_CHARS, Connection, OptionError,
                               SourceOptions, sink_options, source_options)

SCHEMA = ("partition_key string, data binary, sequence_number string, arrival_time timestamp, partition_id string, "
          "headers map<string, binary>")
BATCH_SSSN_SHIFT = 24                 # rows of one Spark partition in one micro-batch: < 2^24

log = logging.getLogger(__name__)


class SparkSetupError(RuntimeError):
    """Spark's Python workers cannot run this data source (say what to set, in one line)."""


def register(spark) -> None:
    """Make `format("sms")` known to `spark`, its Python workers running an interpreter
    that has this package (`worker_python`)."""
    worker_python(spark.sparkContext)
    spark.dataSource.register(SmsDataSource)


def worker_python(sc) -> str:
    """The interpreter Spark's Python workers run for this data source, made one that can
    import spark_sps. Spark starts them with $PYSPARK_PYTHON, else `python3` from the PATH,
    which outside the virtual environment lacks this package (and pyspark): the read then
    fails deep in a Py4J trace with ModuleNotFoundError. So, on a local master (workers on
    this machine) with $PYSPARK_PYTHON unset, the workers get the driver's interpreter
    (sys.executable; the context's `pythonExec`, which registering a data source captures);
    an interpreter someone chose that cannot import spark_sps is refused with one line
    saying what to set. On a cluster the executors' Python is theirs to provision
    (docs/sps.md, "Spark connector")."""
    import subprocess
    import sys
    exe = sc.pythonExec
    local = str(sc.master).startswith("local")
    if not local or exe == sys.executable:
        return exe
    if "PYSPARK_PYTHON" not in os.environ:
        sc.pythonExec = sys.executable
        return sys.executable
    try:
        ok = subprocess.run([exe, "-c", "import spark_sps, pyspark"], capture_output=True,
                            timeout=limits.SPARK_WORKER_PYTHON_CHECK_S).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise SparkSetupError(f"Spark's Python workers run {exe} ($PYSPARK_PYTHON), which cannot import spark_sps and "
                              f"pyspark: set PYSPARK_PYTHON={sys.executable} before the SparkSession starts")
    return exe


class DataLossError(RuntimeError):
    """Records the query should read were deleted before it read them (failOnDataLoss)."""


class SmsDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sms"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> "SmsBatchReader":
        return SmsBatchReader(self.options)

    def writer(self, schema, overwrite: bool) -> "SmsBatchWriter":
        return SmsBatchWriter(self.options, schema, overwrite)

    def streamReader(self, schema) -> "SmsStreamReader":
        return SmsStreamReader(self.options)

    def streamWriter(self, schema, overwrite: bool) -> "SmsStreamWriter":
        return SmsStreamWriter(self.options, schema)


def _client(connection: Connection):
    from sms import aio
    return aio.Client(connection.address, **connection.client_kwargs())


def _pid(ordinal: int) -> str:
    return f"p{ordinal:04d}"


def _data_loss(message: str, fail: bool) -> None:
    if fail:
        raise DataLossError(f"{message}. Set failOnDataLoss=false to skip what is gone instead.")
    log.warning("%s; skipped to the trim point (failOnDataLoss=false)", message)


# --- driver: positions ----------------------------------------------------------------------

async def _committed(client, stream: str, ordinal: int) -> int:
    """The commit watermark of the partition's replica this client reads from: a LATEST
    iterator starts just after it (a consumer's call: no node status needed)."""
    from sms.tokens import peek
    return max(0, peek(await client.get_iterator(stream, ordinal, "LATEST")).position_sn - 1)


async def _info_and_marks(client, stream: str) -> tuple[StreamInfo, dict[int, int]]:
    """The stream's map and the commit watermark of each open partition."""
    info = await client.get_stream_info(stream)
    ordinals = [p.ordinal for p in info.partitions if p.state is PartitionState.OPEN and p.chain]
    return info, dict(zip(ordinals, await asyncio.gather(*(_committed(client, stream, o) for o in ordinals))))


def _iterator_args(position: str) -> tuple[str, dict]:
    kind, sn = offsets.parse(position)
    if kind == "at":
        return StartPosition.of("AT_SEQUENCE_NUMBER", sequence_number=sn).iterator()
    return (StartPosition.of("AFTER_SEQUENCE_NUMBER", sequence_number=sn) if sn
            else StartPosition.of(TRIM_HORIZON)).iterator()


async def _first_record(client, stream: str, ordinal: int, kind: str, kw: dict) -> tuple[int | None, bool]:
    """(the SN of the first readable record at the iterator's position or None, whether
    the partition is closed and read to its end there)."""
    page = await client.get_next_record_batch(await client.get_iterator(stream, ordinal, kind, **kw), max_records=1,
                                              skip_trimmed=True)     # (failOnDataLoss judges)
    return page.batch.first_sn, page.next_iterator is None


async def _nth_record(client, stream: str, ordinal: int, position: str, n: int) -> int | None:
    """The SN of the n-th record after `position` (the last one found if fewer are
    readable; None if none is): where a capped micro-batch ends. SNs are not dense, so
    the driver reads that far to know it."""
    kind, kw = _iterator_args(position)
    iterator = await client.get_iterator(stream, ordinal, kind, **kw)
    found, last = 0, None
    while iterator and found < n:
        page = await client.get_next_record_batch(iterator, max_records=min(limits.GET_RECORDS_COUNT_MAX, n - found),
                                                  skip_trimmed=True)
        batch = page.batch
        if not len(batch):
            break
        if found + len(batch) >= n:
            return _sn_of_index(batch, n - found - 1)
        found, last, iterator = found + len(batch), batch.last_sn, page.next_iterator
    return last


def _sn_of_index(batch, index: int) -> int:
    """The SN of the record at `index` (from 0) of a page."""
    from sms import wire
    for data, start, end in batch.slices:
        if index < end - start:
            return wire.read_header(data).first_sn + (start + index) * seqno.COUNTER_UNIT
        index -= max(0, end - start)
    raise IndexError(index)


async def _check_start_sn(client, stream: str, p: PartitionInfo, sn: int, first: int | None, committed: int,
                          fail: bool) -> None:
    """Whether a starting SN lies below the partition's trim point with records lost
    between: the records before `first` (the first readable at or after `sn`) were
    trimmed, and `first` is where reads from TRIM_HORIZON begin."""
    if first is not None:
        if first == sn or seqno.counter_of(first) == 1:
            return                                   # the record asked for, or nothing was ever trimmed
        horizon, _ended = await _first_record(client, stream, p.ordinal, "TRIM_HORIZON", {})
        if horizon != first:
            return                                   # readable records lie between the trim point and it
        trim = f"its trim point is SN {first} (its first record still readable; " \
               f"{seqno.counter_of(first) - 1} records before it were deleted)"
    else:
        if committed < sn:
            return                                   # nothing at or after it was committed yet
        trim = f"none of its records up to SN {committed} is readable any more (its trim point is past them)"
    _data_loss(f"data loss in stream {stream!r}, partition {_pid(p.ordinal)}: startingPosition asks for SN {sn} "
               f"and after, but {trim}", fail)


async def _resolve(client, stream: str, p: PartitionInfo, how, fail: bool) -> str:
    """The offset position of a starting position in one partition. `how`: TRIM_HORIZON,
    LATEST, (AT_TIMESTAMP, ms) or an SN ("at or after")."""
    closed = p.state is PartitionState.CLOSED
    committed = (p.ending_sn or 0) if closed else await _committed(client, stream, p.ordinal)
    if how == LATEST:
        return END if closed else offsets.after(committed)
    if closed and not committed:
        return END                                   # a closed partition that never held a record
    if how == TRIM_HORIZON:
        start = StartPosition.of(TRIM_HORIZON)
    elif isinstance(how, tuple):
        start = StartPosition.of(AT_TIMESTAMP, timestamp_ms=how[1])
    else:
        start = StartPosition.of("AT_SEQUENCE_NUMBER", sequence_number=how)
    kind, kw = start.iterator()
    first, ended = await _first_record(client, stream, p.ordinal, kind, kw)
    if isinstance(how, int):
        await _check_start_sn(client, stream, p, how, first, committed, fail)
    if first is not None:
        return offsets.at(first)
    if not closed:
        return offsets.after(committed)             # nothing there yet: after what is committed now
    if not ended:
        raise RuntimeError(f"stream {stream!r}: the replica of closed partition {_pid(p.ordinal)} read from has not "
                           f"committed up to its ending SN {committed} yet; try again")
    return END


async def _resolve_start(client, opts: SourceOptions, info: StreamInfo) -> dict[str, str]:
    """The starting cut: the position of each partition a new query reads first."""
    stream, pos, fail = opts.connection.stream, opts.starting, opts.fail_on_data_loss
    by = {p.ordinal: p for p in info.partitions}
    if pos.kind == TRIM_HORIZON:
        # from the roots; a closed partition with nothing left to read hands over to its
        # children, which then start at their own trim horizon
        parts: dict[str, str] = {}
        todo = list(info.roots())
        while todo:
            p = todo.pop(0)
            if str(p.ordinal) in parts:
                continue
            parts[str(p.ordinal)] = await _resolve(client, stream, p, TRIM_HORIZON, fail)
            if parts[str(p.ordinal)] == END:
                todo += [by[c] for c in p.children
                         if c in by and all(parts.get(str(q)) == END or q not in by for q in by[c].parents)]
        return parts
    if pos.kind == LATEST:
        return {str(p.ordinal): await _resolve(client, stream, p, LATEST, fail)
                for p in info.partitions if p.state is PartitionState.OPEN}
    if pos.kind == AT_TIMESTAMP:
        ts = pos.timestamp_ms
        cut = info.partitions_at(ts) + [r for r in info.roots() if r.valid_from_ms > ts]
        return {str(p.ordinal): await _resolve(client, stream, p, (AT_TIMESTAMP, ts), fail) for p in cut}
    named = dict(pos.sns)
    offsets.check_cut(info, set(named))
    return {str(o): await _resolve(client, stream, by[o], how, fail) for o, how in named.items()}


# --- Python workers: reading one partition's range ------------------------------------------

class _Partition(InputPartition):
    """A partition's records after `start` (an offset position) up to `upto_sn`."""

    def __init__(self, connection: Connection, ordinal: int, start: str, upto_sn: int, fail_on_data_loss: bool):
        self.connection = connection
        self.ordinal = ordinal
        self.start = start
        self.upto_sn = upto_sn
        self.fail_on_data_loss = fail_on_data_loss

    def describe_start(self) -> str:
        kind, sn = offsets.parse(self.start)
        if kind == "at":
            return f"SN {sn}"
        return f"the record after SN {sn}" if sn else "its first record"

    def loss(self, expected: int, why: str) -> None:
        _data_loss(f"data loss in stream {self.connection.stream!r}, partition {_pid(self.ordinal)}: the query asked "
                   f"for {self.describe_start()} (the partition's record #{expected}), but {why}",
                   self.fail_on_data_loss)


def _read(partition: _Partition):
    """The partition's records in the range, as Arrow record batches (one per stored
    batch, decoded without a Python object per record). Each page's first record must
    carry the counter after the last one read: else records were trimmed meanwhile."""
    from sms.client import Client
    from sms.tokens import peek
    p = partition
    stream = p.connection.stream
    with Client(p.connection.address, **p.connection.client_kwargs()) as client:
        kind, kw = _iterator_args(p.start)
        iterator = client.get_iterator(stream, p.ordinal, kind, **kw)
        expected = offsets.expected_counter(p.start)
        stalled_since = time.monotonic()
        while True:
            page = client.get_next_record_batch(iterator, max_records=limits.GET_RECORDS_COUNT_MAX, skip_trimmed=True,
                                                wait_ms=limits.SPARK_READ_WAIT_MS)
            batch = page.batch
            if len(batch):
                first = batch.first_sn
                if seqno.counter_of(first) > expected:
                    p.loss(expected, f"its trim point is now SN {first} (record #{seqno.counter_of(first)}): "
                                     f"{seqno.counter_of(first) - expected} records are gone")
                clipped = batch.clip(p.upto_sn)
                yield from clipped.to_arrow_batches(timestamp_unit="us")
                if len(clipped) < len(batch) or clipped.last_sn == p.upto_sn:
                    return
                expected = seqno.counter_of(batch.last_sn) + 1
                stalled_since = time.monotonic()
            if page.next_iterator is None:
                p.loss(expected, f"the closed partition ends with no readable record from there to SN {p.upto_sn}")
                return
            if not len(batch):
                committed = max(0, peek(client.get_iterator(stream, p.ordinal, "LATEST")).position_sn - 1)
                if committed >= p.upto_sn:
                    p.loss(expected, f"no record up to SN {p.upto_sn} is readable any more (its trim point is past "
                                     f"them)")
                    return
                if time.monotonic() - stalled_since > limits.SPARK_READ_STALL_S_MAX:
                    raise TimeoutError(f"stream {stream!r}, partition {_pid(p.ordinal)}: the replica read from has "
                                       f"committed up to SN {committed} only, for {limits.SPARK_READ_STALL_S_MAX} s; "
                                       f"this batch ends at SN {p.upto_sn}")
            iterator = page.next_iterator


# --- streaming source --------------------------------------------------------------------------

class SmsStreamReader(DataSourceStreamReader):
    """Runs on the driver (offsets) and in Python workers (`read`, on a pickled copy)."""

    def __init__(self, options):
        # (checked at the first use, not here: pyspark's streaming source runner stops the
        # reader in a `finally` that names it, so an error raised while it is made comes out
        # as "UnboundLocalError: ... 'reader'", the option's own error lost)
        self._options = options
        self._opts: SourceOptions | None = None
        self._consumer: str | None = None          # the generated default name, once chosen
        self._checkpointed: dict[int, str] | None = None     # what the consumer's checkpoint says (None: not
                                                             # registered by this reader yet)
        self._endings: dict[int, int] = {}         # ending SNs of closed partitions seen
        self._latest: dict | None = None           # the uncapped latest offset (reportLatestOffset)

    @property
    def opts(self) -> SourceOptions:
        if self._opts is None:
            self._opts = source_options(self._options, streaming=True)
        return self._opts

    @property
    def stream(self) -> str:
        return self.opts.connection.stream

    def _sync(self, coro):
        return asyncio.run(coro)

    def _consumer_name(self, checkpointed: str | None) -> str:
        """consumerName, else the name the query's offsets carry, else a new one."""
        if self.opts.consumer_name:
            return self.opts.consumer_name
        if checkpointed:
            return checkpointed
        if self._consumer is None:
            self._consumer = f"spark-{secrets.token_hex(6)}"
        return self._consumer

    # --- driver ------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        async def resolve():
            async with _client(self.opts.connection) as client:
                return await _resolve_start(client, self.opts, await client.get_stream_info(self.stream))
        return offsets.pack(self._consumer_name(None), self._sync(resolve()))

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
        n = self.opts.max_records_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict, limit=None) -> dict:
        from pyspark.sql.streaming.datasource import ReadMaxRows
        checkpointed, parts = offsets.unpack(start)
        consumer = self._consumer_name(checkpointed)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None

        async def latest() -> dict[str, str]:
            async with _client(self.opts.connection) as client:
                info, marks = await _info_and_marks(client, self.stream)
                # `start` is what the last micro-batch read, and Spark has committed it; commit()
                # would say so only when the next batch is planned
                await self._checkpoint(client, consumer, parts)
                end, lost = offsets.advance(parts, info, marks, self._endings)
                for what in lost:
                    _data_loss(f"data loss in stream {self.stream!r}: {what}", self.opts.fail_on_data_loss)
                self._latest = offsets.pack(consumer, end)
                if max_rows is not None:
                    end = await self._capped(client, parts, end, max_rows)
                return end
        return offsets.pack(consumer, self._sync(latest()))

    async def _capped(self, client, start: dict[str, str], end: dict[str, str], max_rows: int) -> dict[str, str]:
        """`end` cut down to at most `max_rows` records, shared by backlog."""
        backlogs = {}
        for key, upto in end.items():
            if upto != END and start.get(key, END) != END:
                n = offsets.backlog(start[key], offsets.last_read(upto))
                if n:
                    backlogs[key] = n
        capped = dict(end)
        for key, share in offsets.allocate(max_rows, backlogs).items():
            if share >= backlogs[key]:
                continue
            sn = await _nth_record(client, self.stream, int(key), start[key], share) if share else None
            capped[key] = start[key] if sn is None else offsets.after(sn)
        return capped

    def reportLatestOffset(self) -> dict | None:
        return self._latest

    def partitions(self, start: dict, end: dict):
        _c, first = offsets.unpack(start)
        _c, last = offsets.unpack(end)
        out = []
        for key, upto in last.items():
            begin = first.get(key, NONE_READ)
            if upto != END and begin != END and offsets.reaches(begin, offsets.last_read(upto)):
                out.append(_Partition(self.opts.connection, int(key), begin, offsets.last_read(upto),
                                      self.opts.fail_on_data_loss))
        return out

    async def _checkpoint(self, client, consumer: str, parts: dict[str, str]) -> None:
        """Checkpoint what the query has read as its consumer's position: with
        protect_unread the stream keeps what comes after it. The first call registers the
        consumer (again after a restart: it is idempotent) and fails the query if it
        cannot; a later failure is logged, and the next call tries again."""
        checkpoints = offsets.consumer_checkpoints(parts)
        if checkpoints == self._checkpointed:
            return
        try:
            await client.checkpoint_consumer(self.stream, consumer, checkpoints)
        except SmsError as e:
            if self._checkpointed is None:
                raise
            log.warning("stream %r: could not checkpoint consumer %r: %s", self.stream, consumer, e)
            return
        self._checkpointed = checkpoints

    def commit(self, end: dict) -> None:
        checkpointed, parts = offsets.unpack(end)

        async def checkpoint():
            async with _client(self.opts.connection) as client:
                await self._checkpoint(client, self._consumer_name(checkpointed), parts)
        self._sync(checkpoint())

    # --- Python workers -------------------------------------------------------------------
    def read(self, partition: InputPartition):
        return _read(partition) if isinstance(partition, _Partition) else iter(())


# --- batch source ------------------------------------------------------------------------------

class SmsBatchReader(DataSourceReader):
    """`spark.read.format("sms")`: each partition from its start to its end, both resolved
    when Spark plans the read."""

    def __init__(self, options):
        self.opts = source_options(options, streaming=False)

    def partitions(self):
        return asyncio.run(self._plan())

    async def _plan(self) -> list[_Partition]:
        opts, stream = self.opts, self.opts.connection.stream
        async with _client(opts.connection) as client:
            info, marks = await _info_and_marks(client, stream)
            by = {p.ordinal: p for p in info.partitions}
            if opts.starting.kind == TRIM_HORIZON:
                # (no order to keep across a batch read: each partition from its own trim horizon)
                starts = {str(p.ordinal): await _resolve(client, stream, p, TRIM_HORIZON, opts.fail_on_data_loss)
                          for p in info.partitions}
            else:
                starts = await _resolve_start(client, opts, info)
                starts.update({str(o): NONE_READ for o in offsets.descendants(info, {int(k) for k in starts})
                               if str(o) not in starts})
        ending = dict(opts.ending.sns)
        unknown = sorted(set(ending) - set(by))
        if unknown:
            raise OptionError(f"endingPosition names partition {_pid(unknown[0])}, which stream {stream!r} does not have")
        out = []
        for key, begin in sorted(starts.items(), key=lambda kv: int(kv[0])):
            p = by[int(key)]
            upto = (p.ending_sn or 0) if p.state is PartitionState.CLOSED else marks.get(p.ordinal, 0)
            if opts.ending.kind == AT_TIMESTAMP:
                upto = min(upto, seqno.lower_bound_for_time(opts.ending.timestamp_ms) - 1)
            elif isinstance(ending.get(p.ordinal), int):
                upto = min(upto, ending[p.ordinal] - 1)         # an ending SN is exclusive
            if begin != END and offsets.reaches(begin, upto):
                out.append(_Partition(opts.connection, p.ordinal, begin, upto, opts.fail_on_data_loss))
        return out

    def read(self, partition: InputPartition):
        # (a read with nothing to read still gets one task, with Spark's empty InputPartition(None))
        return _read(partition) if isinstance(partition, _Partition) else iter(())


# --- sinks -------------------------------------------------------------------------------------

class _Written(WriterCommitMessage):
    def __init__(self, rows: int, duplicates: int):
        self.rows = rows
        self.duplicates = duplicates


def _check_columns(schema, what: str) -> None:
    names = set(getattr(schema, "names", None) or ())
    missing = [c for c in ("partition_key", "data") if c not in names]
    if names and missing:
        raise ValueError(f"{what} needs the columns partition_key and data (and optionally headers); "
                         f"the DataFrame lacks {', '.join(missing)} (it has {', '.join(sorted(names))})")


def _rows(iterator, stream: str, partition: int) -> list[tuple]:
    """(stream, key, data[, headers]) of each row, sorted by key and data: the order, and
    so the SSSNs, do not depend on how Spark ordered the partition's rows."""
    rows = []
    for i, row in enumerate(iterator):
        key, data = row["partition_key"], row["data"]
        if key is None or data is None:
            column = "partition_key" if key is None else "data"
            raise ValueError(f"the sms sink refuses row {i} of Spark partition {partition}: its {column} is null "
                             f"(every record needs a partition_key and data)")
        data = data.encode() if isinstance(data, str) else bytes(data)
        headers = row["headers"] if "headers" in row.__fields__ else None     # (a map column, optional)
        rows.append((stream, str(key), data, dict(headers)) if headers else (stream, str(key), data))
    rows.sort(key=lambda t: (t[1], t[2]))
    return rows


def _write(connection: Connection, producer: bytes, rows: list[tuple], first_sssn: int) -> _Written:
    """Write `rows` with SSSNs first_sssn + index under `producer`, and wait for every
    acknowledgement (a duplicate counts as one)."""
    from sps.output import OutputWriter

    async def send() -> _Written:
        async with _client(connection) as client:
            writer = OutputWriter(client, producer)
            try:
                step = limits.SPS_OUTPUTS_PER_BATCH_MAX
                for i in range(0, len(rows), step):
                    await writer.write(rows[i:i + step], first_sssn + i, 0)
            finally:
                await writer.close(flush=False)
            return _Written(len(rows), writer.duplicates)
    return asyncio.run(send())


class SmsStreamWriter(DataSourceStreamWriter):
    def __init__(self, options, schema=None):
        opts = sink_options(options, streaming=True)
        _check_columns(schema, "writeStream.format('sms')")
        self.connection = opts.connection
        self.producer_id = opts.producer_id

    def write(self, iterator) -> _Written:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId") or 0)
        rows = _rows(iterator, self.connection.stream, ctx.partitionId())
        if len(rows) >= 1 << BATCH_SSSN_SHIFT:
            raise ValueError(f"{len(rows)} rows in one partition of one micro-batch; at most {1 << BATCH_SSSN_SHIFT}")
        # Spark starts micro-batch b once every earlier one committed: their SSSNs are settled
        producer = f"{self.producer_id}:{ctx.partitionId()}".encode()
        return _write(self.connection, producer, rows, batch_id << BATCH_SSSN_SHIFT)

    def commit(self, messages, batchId: int) -> None:
        pass

    def abort(self, messages, batchId: int) -> None:
        pass


class SmsBatchWriter(DataSourceWriter):
    """`df.write.format("sms").mode("append").save()`; runs on the driver, then pickled
    into each task with the write id drawn here."""

    def __init__(self, options, schema=None, overwrite: bool = False):
        opts = sink_options(options, streaming=False)
        if overwrite:
            raise OptionError("the sms sink appends to a stream; mode('overwrite') is not supported: use "
                             "mode('append')")
        _check_columns(schema, "df.write.format('sms')")
        self.connection = opts.connection
        self.producer_id = opts.producer_id
        self.write_id = secrets.token_hex(WRITE_ID_HEX_CHARS // 2)

    def write(self, iterator) -> _Written:
        from pyspark import TaskContext
        partition = TaskContext.get().partitionId()
        rows = _rows(iterator, self.connection.stream, partition)
        producer = f"{self.producer_id}:{self.write_id}:{partition}".encode()
        return _write(self.connection, producer, rows, 0)

    def commit(self, messages) -> None:
        pass

    def abort(self, messages) -> None:
        pass
