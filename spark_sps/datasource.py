"""Structured Streaming over SMS: `spark.readStream.format("sms")` and `writeStream.format("sms")`.

    from spark_sps.datasource import register
    register(spark)
    df = (spark.readStream.format("sms").option("address", "127.0.0.1:7480")
          .option("stream", "clicks").load())
    q = (df.selectExpr("partition_key", "upper(cast(data as string)) as data")
         .writeStream.format("sms").option("address", "127.0.0.1:7480").option("stream", "out")
         .option("producerId", "my-query").option("checkpointLocation", "/tmp/cp").start())

**Source.** Rows have `partition_key`, `data` (binary), `sequence_number`, `arrival_time`
and `partition_id`. An offset is, per partition, the SN of the last record included
("0": none yet) or "END" once a closed partition has been read to its ending SN. A
micro-batch reads each partition from its start offset to the partition's commit
watermark at planning time (a closed one: to its ending SN). A child partition enters
the offsets only in the micro-batch after every parent reached END: closed partitions
are read to their end before their children, so per key the records come in SN order.
Offsets are checkpointed by Spark; a restarted query resumes exactly after them.
`startingPosition`: TRIM_HORIZON (default) only.

**Security** (docs/security.md). Both take `caFile` (the cluster CA's certificate) and
`token` (a key's token: the source needs a consumer key, the sink a producer key; keys of
any tenant work, with the tenant's own stream names).
Without them they read $SMS_CA_FILE and $SMS_TOKEN, in the driver and in the workers.

**Sink.** Each Spark partition of a micro-batch writes its rows (`partition_key`, `data`)
with the producer id `<producerId>:<partition index>` and SSSNs derived from the
micro-batch id and the row's position (rows sorted by key and data first). A restarted
query re-executes an uncommitted micro-batch with the same id, so the same records come
under the same SSSNs and ingestion answers them as duplicates: the output holds each
once. The operation before the sink must be deterministic for a given input.
"""

from __future__ import annotations

import asyncio

from pyspark.sql.datasource import (DataSource, DataSourceStreamReader, DataSourceStreamWriter, InputPartition,
                                    WriterCommitMessage)

from sms import limits
from sms.types import PartitionState

SCHEMA = ("partition_key string, data binary, sequence_number string, arrival_time timestamp, partition_id string, "
          "headers map<string, binary>")
END = "END"
BATCH_SSSN_SHIFT = 24                 # rows of one Spark partition in one micro-batch: < 2^24


def register(spark) -> None:
    spark.dataSource.register(SmsDataSource)


class SmsDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sms"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema) -> "SmsStreamReader":
        return SmsStreamReader(self.options)

    def streamWriter(self, schema, overwrite: bool) -> "SmsStreamWriter":
        return SmsStreamWriter(self.options)


def _credentials(options) -> dict:
    """`caFile` and `token` (docs/security.md); absent: $SMS_CA_FILE and $SMS_TOKEN."""
    return {"ca_file": options.get("caFile"), "token": options.get("token")}


def _required(options, key: str) -> str:
    value = options.get(key)
    if not value:
        raise ValueError(f'the sms data source needs .option("{key}", ...)')
    return value


class _Partition(InputPartition):
    def __init__(self, address: str, stream: str, ordinal: int, after_sn: int, upto_sn: int,
                 credentials: dict | None = None):
        self.address = address
        self.credentials = credentials or {}
        self.stream = stream
        self.ordinal = ordinal
        self.after_sn = after_sn
        self.upto_sn = upto_sn


class SmsStreamReader(DataSourceStreamReader):
    """Runs on the driver (offsets) and in Python workers (`read`, on a pickled copy)."""

    def __init__(self, options):
        self.address = _required(options, "address")
        self.stream = _required(options, "stream")
        self.credentials = _credentials(options)
        start = options.get("startingPosition", "TRIM_HORIZON").upper()
        if start != "TRIM_HORIZON":
            raise ValueError(f"startingPosition {start!r}: only TRIM_HORIZON is supported")
        self._client = None

    # --- driver ------------------------------------------------------------------------
    def _sync(self, coro):
        return asyncio.run(coro)

    async def _info_and_watermarks(self):
        from sms import aio
        from sms.tokens import peek
        async with aio.Client(self.address, **self.credentials) as client:
            info = await client.get_stream_info(self.stream)
            marks: dict[int, int] = {}
            for p in info.partitions:
                if p.state is PartitionState.OPEN and p.chain:
                    # a LATEST iterator starts just after the commit watermark of the replica
                    # that made it: a consumer's call (no node status), and never ahead of
                    # what is committed
                    latest = await client.get_iterator(self.stream, p.ordinal, "LATEST")
                    marks[p.ordinal] = max(0, peek(latest).position_sn - 1)
            return info, marks

    def initialOffset(self) -> dict:
        info, _marks = self._sync(self._info_and_watermarks())
        return {str(p.ordinal): "0" for p in info.roots()}

    def latestOffset(self, start: dict, limit=None) -> dict:
        info, marks = self._sync(self._info_and_watermarks())
        by = {p.ordinal: p for p in info.partitions}
        end = dict(start)
        for key, pos in start.items():
            p = by.get(int(key))
            if pos == END:
                continue
            if p is None:                     # dropped by retention: nothing left of it
                end[key] = END
            elif p.state is PartitionState.CLOSED:
                ending = p.ending_sn or 0
                end[key] = END if int(pos) >= ending else str(ending)
            else:
                end[key] = str(max(int(pos), marks.get(p.ordinal, int(pos))))
        # a child joins once every parent was at END when this batch started (a parent no
        # longer in the map counts as read): parents are read to their end before children
        done = {int(k) for k, v in start.items() if v == END}
        for p in info.partitions:
            if str(p.ordinal) in end or not any(str(q) in start for q in p.parents):
                continue
            if all(q in done or q not in by for q in p.parents):
                end[str(p.ordinal)] = "0"
        return end

    def partitions(self, start: dict, end: dict):
        out = []
        for key, upto in end.items():
            after = start.get(key, "0")
            if upto == END or after == END:
                continue                  # (a partition goes to END after a batch read it to its ending SN)
            if int(upto) > int(after):
                out.append(_Partition(self.address, self.stream, int(key), int(after), int(upto), self.credentials))
        return out

    def commit(self, end: dict) -> None:
        pass

    # --- Python workers ---------------------------------------------------------------------
    def read(self, partition: _Partition):
        """The partition's records after `after_sn` up to `upto_sn`, as Arrow record batches
        (one per stored batch, decoded without a Python object per record)."""
        from sms.client import Client
        with Client(partition.address, **partition.credentials) as client:
            if partition.after_sn:
                it = client.get_iterator(partition.stream, partition.ordinal, "AFTER_SEQUENCE_NUMBER",
                                         sequence_number=partition.after_sn)
            else:
                it = client.get_iterator(partition.stream, partition.ordinal, "TRIM_HORIZON")
            while it:
                page = client.get_next_record_batch(it, max_records=10_000, wait_ms=200)
                batch = page.batch.clip(partition.upto_sn)
                yield from batch.to_arrow_batches(timestamp_unit="us")
                if len(batch) < len(page.batch) or batch.last_sn == partition.upto_sn:
                    return
                it = page.next_iterator


class _Written(WriterCommitMessage):
    def __init__(self, rows: int, duplicates: int):
        self.rows = rows
        self.duplicates = duplicates


class SmsStreamWriter(DataSourceStreamWriter):
    def __init__(self, options):
        self.address = _required(options, "address")
        self.stream = _required(options, "stream")
        self.producer_id = _required(options, "producerId")
        self.credentials = _credentials(options)

    def write(self, iterator) -> _Written:
        from pyspark import TaskContext

        from sms import aio
        from sps.output import OutputWriter
        ctx = TaskContext.get()
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId") or 0)
        rows = []
        for row in iterator:
            data = row["data"]
            data = data.encode() if isinstance(data, str) else bytes(data)
            headers = row["headers"] if "headers" in row.__fields__ else None     # (a map column, optional)
            rows.append((self.stream, str(row["partition_key"]), data, dict(headers)) if headers else
                        (self.stream, str(row["partition_key"]), data))
        rows.sort(key=lambda t: (t[1], t[2]))
        if len(rows) >= 1 << BATCH_SSSN_SHIFT:
            raise ValueError(f"{len(rows)} rows in one partition of one micro-batch; at most {1 << BATCH_SSSN_SHIFT}")
        producer = f"{self.producer_id}:{ctx.partitionId()}".encode()

        async def send() -> _Written:
            async with aio.Client(self.address, **self.credentials) as client:
                # Spark starts micro-batch b once every earlier one committed: their SSSNs are settled
                writer = OutputWriter(client, producer)
                try:
                    step = limits.SPS_OUTPUTS_PER_BATCH_MAX
                    for i in range(0, len(rows), step):
                        await writer.write(rows[i:i + step], (batch_id << BATCH_SSSN_SHIFT) + i, 0)
                finally:
                    await writer.close(flush=False)
                return _Written(len(rows), writer.duplicates)
        return asyncio.run(send())

    def commit(self, messages, batchId: int) -> None:
        pass

    def abort(self, messages, batchId: int) -> None:
        pass
