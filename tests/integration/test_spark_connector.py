"""The Spark connector's options, with real PySpark on a real TLS cluster (spark_sps/datasource.py).

Spark's own Kafka source is the reference for the options' names and meaning: where a
read starts (`startingPosition`, `startingTimestamp`) and ends (`endingPosition`,
`endingTimestamp`, batch reads), `maxRecordsPerTrigger` through Spark's read limits,
`failOnDataLoss` both ways (records trimmed below a start position, or while a query was
stopped), batch reads and writes (a retried Spark task writes nothing twice), the
`headers` column, refused options and null keys, and the query's consumer registration
(`consumerName`), which a stream that protects unread records honours. One SparkSession
for the module; its master allows a task two attempts, so a test can make one fail after
it wrote. Data-loss and trimming tests use replication factor 1: one replica, so what a
reader sees does not depend on which replica applied the trim first.
"""

from __future__ import annotations

import collections
import json
import os
import time

import pytest

pytest.importorskip("pyspark")

from pyspark import TaskContext  # noqa: E402

from sms import seqno  # noqa: E402
from spark_sps.datasource import SmsBatchWriter, SmsDataSource, register  # noqa: E402
from spark_sps.engine import spark_session  # noqa: E402
from tests.conftest import stream_name, wait_until  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUERY_WAIT_S = 120.0


class _WriterFailingOnce(SmsBatchWriter):
    """The batch writer, whose Spark partition 0 fails its first attempt after writing;
    each attempt leaves a file in `markers` (a directory), so the test sees the retry."""

    markers = ""

    def write(self, iterator):
        written = super().write(iterator)
        ctx = TaskContext.get()
        if ctx.partitionId() == 0:
            open(os.path.join(self.markers, f"attempt-{ctx.attemptNumber()}"), "w").close()
            if ctx.attemptNumber() == 0:
                raise RuntimeError("injected: the task fails after its records were written")
        return written


class _SourceFailingOnce(SmsDataSource):
    """format("sms_failing_once"): the sms data source with that writer, and one more
    option, `markers`."""

    @classmethod
    def name(cls) -> str:
        return "sms_failing_once"

    def writer(self, schema, overwrite: bool):
        options = dict(self.options)
        markers = options.pop("markers")
        writer = _WriterFailingOnce(options, schema, overwrite)
        writer.markers = markers
        return writer


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2,2]", "sms-spark-connector-test")      # (2 threads, 2 attempts per task)
    register(session)
    session.dataSource.register(_SourceFailingOnce)
    yield session
    session.stop()


# --- helpers ---------------------------------------------------------------------------------

def put(client, stream: str, records: list) -> list:
    """Store the records (500 per call); their results, in order."""
    out = []
    for i in range(0, len(records), 500):
        result = client.put_records(stream, records[i:i + 500])
        assert result.failed_record_count == 0, [r for r in result.records if not r.ok][:3]
        out += result.records
    return out


def keyed(tag: str, count: int) -> list[tuple[str, bytes]]:
    return [(f"k{i % 7}", f"{tag}{i}".encode()) for i in range(count)]


def after_this_millisecond(sn: int) -> None:
    """Until the clock passed the millisecond of `sn`: the next record arrives later."""
    wait_until(lambda: time.time() * 1000 > seqno.timestamp_ms_of(sn) + 1, 5, "the clock to pass a record's ms")


def source(spark, cluster, stream: str, **options):
    reader = spark.readStream.format("sms").option("address", cluster.address).option("stream", stream)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def batch_read(spark, cluster, stream: str, **options) -> list:
    reader = spark.read.format("sms").option("address", cluster.address).option("stream", stream)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load().collect()


def run_to_end(spark, df, name: str) -> list:
    """Every row the streaming DataFrame has now (Trigger.AvailableNow into a memory table)."""
    query = df.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
    assert query.awaitTermination(QUERY_WAIT_S), f"query {name} still running after {QUERY_WAIT_S} s"
    assert query.exception() is None
    return spark.sql(f"select * from {name}").collect()


def copy_query(spark, cluster, source_stream: str, sink_stream: str, checkpoint: str, producer_id: str = "copy",
               **options):
    """A query copying `source_stream` into `sink_stream` with a checkpoint."""
    df = source(spark, cluster, source_stream, **options)
    return (df.select("partition_key", "data", "headers").writeStream.format("sms")
            .option("address", cluster.address).option("stream", sink_stream).option("producerId", producer_id)
            .option("checkpointLocation", checkpoint).start())


def values(rows) -> list[bytes]:
    return sorted(bytes(r.data) for r in rows)


def readable_from(client, stream: str, ordinal: int = 0) -> int | None:
    """The SN of the partition's first readable record (where TRIM_HORIZON reads begin)."""
    page = client.get_next_records(client.get_iterator(stream, ordinal, "TRIM_HORIZON"), max_records=1)
    return page.records[0].sn if page.records else None


def trim_before(client, stream: str, sn: int) -> None:
    """trim_stream(before_sn) and wait until reads begin at `sn`."""
    client.trim_stream(stream, before_sn=sn)
    wait_until(lambda: readable_from(client, stream) == sn, 15, f"{stream} to be trimmed before {sn}")


# --- where a read starts and ends --------------------------------------------------------------

def test_streaming_starts_at_trim_horizon_latest_or_given_sns(cluster, client, spark):
    """TRIM_HORIZON (the default) reads everything; LATEST only what arrives after the
    query started; JSON SNs start each partition at or after its SN (a partition may say
    TRIM_HORIZON or LATEST instead), and a JSON that leaves a partition out is refused."""
    stream = stream_name("start")
    client.create_stream(stream, partitions=2, replication_factor=2)
    results = put(client, stream, keyed("a", 60))
    by_partition = collections.defaultdict(list)
    for (_k, data), r in zip(keyed("a", 60), results):
        by_partition[r.partition_ordinal].append((r.sn, data))
    assert sorted(by_partition) == [0, 1]

    assert values(run_to_end(spark, source(spark, cluster, stream), "th")) == sorted(d for _k, d in keyed("a", 60))

    mid_sn, _data = by_partition[0][len(by_partition[0]) // 2]
    start = json.dumps({"p0000": str(mid_sn), "p0001": "LATEST"})
    rows = run_to_end(spark, source(spark, cluster, stream, startingPosition=start), "sns")
    assert values(rows) == sorted(d for sn, d in by_partition[0] if sn >= mid_sn)
    assert {r.partition_id for r in rows} == {"p0000"}

    with pytest.raises(Exception, match="names no position for partition p0001"):
        run_to_end(spark, source(spark, cluster, stream, startingPosition=json.dumps({"0": str(mid_sn)})), "sns_bad")

    query = source(spark, cluster, stream, startingPosition="latest").writeStream.format("memory") \
        .queryName("latest").start()
    try:
        query.processAllAvailable()
        put(client, stream, keyed("b", 10))
        query.processAllAvailable()
        assert query.exception() is None
        assert values(spark.sql("select * from latest").collect()) == sorted(d for _k, d in keyed("b", 10))
    finally:
        query.stop()


def test_batch_reads_between_timestamps_and_sns_with_headers(cluster, client, spark):
    """spark.read: AT_TIMESTAMP (or startingTimestamp alone) starts at the first record
    that arrived at or after it; endingTimestamp and endingPosition SNs end before them;
    the default end is what was committed when the read was planned. The headers column
    carries each record's headers."""
    stream = stream_name("batch-read")
    client.create_stream(stream, partitions=1, replication_factor=2)
    first = put(client, stream, [{"partition_key": f"k{i}", "data": b"a%d" % i, "headers": {"n": b"%d" % i}}
                                 for i in range(20)])
    after_this_millisecond(first[-1].sn)
    second = put(client, stream, [(f"k{i}", b"b%d" % i) for i in range(20)])
    after_this_millisecond(second[-1].sn)
    put(client, stream, [(f"k{i}", b"c%d" % i) for i in range(20)])
    a = [b"a%d" % i for i in range(20)]
    b = [b"b%d" % i for i in range(20)]
    c = [b"c%d" % i for i in range(20)]
    t_b, t_c = seqno.timestamp_ms_of(second[0].sn), seqno.timestamp_ms_of(second[-1].sn) + 1

    everything = batch_read(spark, cluster, stream)
    assert values(everything) == sorted(a + b + c)
    assert {bytes(r.data): r.headers for r in everything if bytes(r.data).startswith(b"a")} == \
        {b"a%d" % i: {"n": b"%d" % i} for i in range(20)}
    assert all(r.headers == {} for r in everything if not bytes(r.data).startswith(b"a"))
    assert {(r.sequence_number, r.partition_id) for r in everything} >= {(str(first[0].sn), "p0000")}

    assert values(batch_read(spark, cluster, stream, startingPosition="AT_TIMESTAMP", startingTimestamp=t_b)) == \
        sorted(b + c)
    assert values(batch_read(spark, cluster, stream, startingTimestamp=t_b, endingPosition="AT_TIMESTAMP",
                             endingTimestamp=t_c)) == sorted(b)
    assert values(batch_read(spark, cluster, stream, startingPosition=json.dumps({"p0000": str(first[5].sn)}),
                             endingPosition=json.dumps({"p0000": str(second[5].sn)}))) == sorted(a[5:] + b[:5])
    assert batch_read(spark, cluster, stream, startingPosition="LATEST") == []


# --- read limits and lag ---------------------------------------------------------------------

def test_max_records_per_trigger_caps_each_micro_batch_and_progress_shows_the_lag(cluster, client, spark):
    """maxRecordsPerTrigger 10 over 100 records in 2 partitions: micro-batches of at most
    10 rows, every record once; each progress reports the latest offset beside the end
    offset, so the lag is visible."""
    stream = stream_name("limit")
    client.create_stream(stream, partitions=2, replication_factor=2)
    put(client, stream, keyed("r", 100))
    query = source(spark, cluster, stream, maxRecordsPerTrigger=10).writeStream.format("memory") \
        .queryName("limited").start()
    try:
        query.processAllAvailable()
        assert query.exception() is None
        progress = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert values(spark.sql("select * from limited").collect()) == sorted(d for _k, d in keyed("r", 100))
    assert max(p["numInputRows"] for p in progress) <= 10 and len(progress) >= 10, \
        [p["numInputRows"] for p in progress]
    first = progress[0]["sources"][0]
    assert first["latestOffset"] is not None and first["latestOffset"] != first["endOffset"], first


# --- failOnDataLoss --------------------------------------------------------------------------------

def test_a_start_below_the_trim_point_fails_or_skips(cluster, client, spark):
    """A JSON start at an SN that trim_stream has deleted: with failOnDataLoss (the
    default) the query fails naming the partition, the SN asked for and the trim point;
    with failOnDataLoss=false it reads from the trim point."""
    stream = stream_name("loss-start")
    client.create_stream(stream, partitions=1, replication_factor=1)
    sns = [r.sn for r in put(client, stream, [(f"k{i}", b"%d" % i) for i in range(30)])]
    trim_before(client, stream, sns[10])
    start = json.dumps({"p0000": str(sns[0])})
    with pytest.raises(Exception, match=rf"p0000.*{sns[0]}.*trim point is SN {sns[10]}"):
        run_to_end(spark, source(spark, cluster, stream, startingPosition=start), "loss_fail")
    rows = run_to_end(spark, source(spark, cluster, stream, startingPosition=start, failOnDataLoss="false"),
                      "loss_skip")
    assert values(rows) == sorted(b"%d" % i for i in range(10, 30))


def test_records_trimmed_while_a_query_was_stopped_fail_it_or_are_skipped(cluster, client, spark, tmp_path):
    """A query stops after reading 30 records; 30 more arrive and the first 10 of them are
    trimmed. Restarted from its checkpoint it fails, naming the partition, the record it
    expected and the trim point; restarted with failOnDataLoss=false it goes on from the
    trim point."""
    stream, out = stream_name("loss-resume"), stream_name("loss-out")
    client.create_stream(stream, partitions=1, replication_factor=1)
    client.create_stream(out, partitions=1, replication_factor=1)
    old = [r.sn for r in put(client, stream, [(f"k{i}", b"old%d" % i) for i in range(30)])]
    checkpoint = os.path.join(tmp_path, "cp")
    query = copy_query(spark, cluster, stream, out, checkpoint)
    query.processAllAvailable()
    assert query.exception() is None
    query.stop()
    new = [r.sn for r in put(client, stream, [(f"k{i}", b"new%d" % i) for i in range(30)])]
    trim_before(client, stream, new[10])

    query = copy_query(spark, cluster, stream, out, checkpoint)
    with pytest.raises(Exception, match=rf"p0000.*after SN {old[-1]}.*trim point is now SN {new[10]}"):
        query.processAllAvailable()
    query.stop()
    query = copy_query(spark, cluster, stream, out, checkpoint, failOnDataLoss="false")
    query.processAllAvailable()
    assert query.exception() is None
    query.stop()
    assert values(client.read_stream(out)) == sorted([b"old%d" % i for i in range(30)] +
                                                     [b"new%d" % i for i in range(10, 30)])


# --- batch writes ---------------------------------------------------------------------------------

def test_a_batch_write_lands_once_even_when_a_task_is_retried(cluster, client, spark, tmp_path):
    """df.write.format("sms"): every row lands once with its headers, in 3 Spark
    partitions; partition 0's first attempt fails after writing, and its retry writes the
    same records under the same producer id and SSSNs, which ingestion drops as
    duplicates."""
    stream = stream_name("batch-write")
    client.create_stream(stream, partitions=2, replication_factor=2)
    df = spark.range(0, 900, 1, 3).selectExpr(
        "concat('k', cast(id % 13 as string)) as partition_key", "cast(concat('v', cast(id as string)) as binary) as data",
        "map('id', cast(cast(id as string) as binary)) as headers")
    (df.write.format("sms_failing_once").option("address", cluster.address).option("stream", stream)
     .option("producerId", "loader").option("markers", str(tmp_path)).mode("append").save())
    assert sorted(os.listdir(tmp_path)) == ["attempt-0", "attempt-1"]
    stored = list(client.read_stream(stream))
    assert len(stored) == 900, f"{len(stored)} records stored for 900 rows"
    assert {bytes(r.data): r.headers for r in stored} == {b"v%d" % i: {"id": b"%d" % i} for i in range(900)}
    assert collections.Counter(r.partition_key for r in stored) == collections.Counter(f"k{i % 13}" for i in range(900))

    # a second save() is a new write (its own write id): its records are not duplicates of the first
    df.limit(10).write.format("sms").option("address", cluster.address).option("stream", stream) \
        .option("producerId", "loader").mode("append").save()
    assert len(list(client.read_stream(stream))) == 910


# --- refused options and rows ---------------------------------------------------------------------

def test_unknown_and_kafka_options_are_refused_by_name(cluster, client, spark, tmp_path):
    stream = stream_name("refused")
    client.create_stream(stream, partitions=1, replication_factor=1)
    put(client, stream, [("k", b"x")])
    with pytest.raises(Exception, match="option 'startingOffsets' is Kafka's; the sms data source takes "
                                        "startingPosition"):
        run_to_end(spark, source(spark, cluster, stream, startingOffsets="earliest"), "kafka_name")
    with pytest.raises(Exception, match="(?i)unknown option 'maxRecordsPerBatch'.*valid options: address, stream"):
        run_to_end(spark, source(spark, cluster, stream, maxRecordsPerBatch="5"), "unknown_name")
    with pytest.raises(Exception, match="'endingPosition' applies to spark.read"):
        run_to_end(spark, source(spark, cluster, stream, endingPosition="LATEST"), "batch_only")
    with pytest.raises(Exception, match="'maxRecordsPerTrigger' applies to spark.readStream"):
        batch_read(spark, cluster, stream, maxRecordsPerTrigger="5")
    df = spark.createDataFrame([("k", b"x")], "partition_key string, data binary")
    with pytest.raises(Exception, match="unknown option 'topic'|option 'topic' is Kafka's"):
        df.write.format("sms").option("address", cluster.address).option("stream", stream) \
            .option("topic", stream).mode("append").save()
    with pytest.raises(Exception, match="(?i)unknown option 'keyColumn' for df.writeStream.*valid options: "
                                        "address, stream, caFile, token, producerId, checkpointLocation"):
        (source(spark, cluster, stream).writeStream.format("sms").option("address", cluster.address)
         .option("stream", stream).option("producerId", "p").option("keyColumn", "k")
         .option("checkpointLocation", os.path.join(tmp_path, "cp")).start().processAllAvailable())


def test_a_null_partition_key_is_refused_by_name(cluster, client, spark, tmp_path):
    """Both sinks refuse a row whose partition_key is null (it used to be stored as the
    text "None"), and write nothing of that Spark partition; a DataFrame without the
    columns is refused before any task runs."""
    stream, out = stream_name("null-in"), stream_name("null-out")
    client.create_stream(stream, partitions=1, replication_factor=1)
    client.create_stream(out, partitions=1, replication_factor=1)
    keyless = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match="needs the columns partition_key and data.*lacks partition_key, data"):
        keyless.write.format("sms").option("address", cluster.address).option("stream", out).mode("append").save()
    df = spark.createDataFrame([("k", b"x"), (None, b"y")], "partition_key string, data binary").coalesce(1)
    with pytest.raises(Exception, match="partition_key is null"):
        df.write.format("sms").option("address", cluster.address).option("stream", out).mode("append").save()
    put(client, stream, [("k1", b"1"), ("k2", b"2")])
    query = (source(spark, cluster, stream).selectExpr("if(partition_key = 'k2', null, partition_key) as partition_key",
                                                       "data")
             .writeStream.format("sms").option("address", cluster.address).option("stream", out)
             .option("producerId", "nulls").option("checkpointLocation", os.path.join(tmp_path, "cp")).start())
    with pytest.raises(Exception, match="partition_key is null"):
        query.processAllAvailable()
    query.stop()
    assert list(client.read_stream(out)) == []


# --- the query as a registered consumer -----------------------------------------------------------

def test_the_query_registers_as_a_consumer_and_protects_what_it_has_not_read(cluster, client, spark, tmp_path):
    """A query registers under consumerName and checkpoints what each micro-batch read:
    with protect_unread, trim_stream beyond the query's position deletes only what the
    query has read; restarted, the query reads the rest with no data loss, and its next
    checkpoint lets the trim go on. Without consumerName the query picks a name when it
    starts and keeps it across restarts."""
    stream, out = stream_name("protect"), stream_name("protect-out")
    client.create_stream(stream, partitions=1, replication_factor=1)
    client.create_stream(out, partitions=1, replication_factor=1)
    client.update_stream(stream, protect_unread=True)
    old = [r.sn for r in put(client, stream, [(f"k{i}", b"old%d" % i) for i in range(20)])]
    checkpoint = os.path.join(tmp_path, "cp")
    query = copy_query(spark, cluster, stream, out, checkpoint, consumerName="copier")
    query.processAllAvailable()
    assert query.exception() is None
    query.stop()
    assert client.get_stream_info(stream).consumers == ("copier",)

    new = [r.sn for r in put(client, stream, [(f"k{i}", b"new%d" % i) for i in range(20)])]
    client.trim_stream(stream, before_sn=new[10])
    # one trim pass computes the point from the request and the consumer's checkpoint
    wait_until(lambda: readable_from(client, stream) != old[0], 15, "the records the query read to be trimmed")
    assert readable_from(client, stream) == new[0], "the trim went past what the query had read"

    query = copy_query(spark, cluster, stream, out, checkpoint, consumerName="copier")
    query.processAllAvailable()
    assert query.exception() is None
    query.stop()
    assert values(client.read_stream(out)) == sorted([b"old%d" % i for i in range(20)] +
                                                     [b"new%d" % i for i in range(20)])
    wait_until(lambda: readable_from(client, stream) == new[10], 15, "the trim to go on once the query read on")

    unnamed = os.path.join(tmp_path, "unnamed")
    for _ in range(2):
        query = copy_query(spark, cluster, stream, out, unnamed, producer_id="unnamed")
        query.processAllAvailable()
        assert query.exception() is None
        query.stop()
    consumers = client.get_stream_info(stream).consumers
    assert len(consumers) == 2 and "copier" in consumers, consumers
    assert [c for c in consumers if c != "copier"][0].startswith("spark-")


def test_a_channel_s_files_and_table_read_with_spark(cluster, client, spark, tmp_path):
    """A channel's Parquet files (docs/channels.md) are what spark.read.parquet reads, and the
    data files of its Iceberg table's current snapshot (pyiceberg lists them) too."""
    pytest.importorskip("pyiceberg")
    from pyiceberg.catalog.sql import SqlCatalog
    stream = "spark-channel"
    client.create_stream(stream, partitions=2, replication_factor=3)
    out = tmp_path / "files"
    catalog_uri, warehouse = f"sqlite:///{tmp_path}/catalog.db", f"file://{tmp_path}/warehouse"
    client.create_channel(stream, "spark-files", f"file://{out}", data_freshness_s=1)
    client.create_channel(stream, "spark-table", {"namespace": "lake", "table": "events", "catalog_uri": catalog_uri,
                                                  "warehouse": warehouse}, data_freshness_s=1)
    put(client, stream, [(k, d) for k, d in keyed("ch", 1500)])
    # what the stream holds: plain put_records retries a record whose outcome it did not learn
    # (a chain change under way, as Spark's start starves the nodes), so a record may be there
    # twice, under two SNs (docs/api.md); a channel delivers each SN once
    stored = list(client.read_stream(stream))
    n = len(stored)
    assert n >= 1500 and {bytes(r.data) for r in stored} == {d for _k, d in keyed("ch", 1500)}

    def delivered(name: str) -> int:
        return sum(p.records for p in client.describe_channel(name).partitions)
    try:
        wait_until(lambda: delivered("spark-files") == n and delivered("spark-table") == n, 60,
                   f"the stream's {n} records in both destinations")
    except AssertionError:           # (what each partition's worker recorded: docs/testing.md, flake log)
        raise AssertionError(f"{client.describe_channel('spark-files').partitions} "
                             f"{client.describe_channel('spark-table').partitions} "
                             f"{client.get_stream_info(stream).partitions}") from None
    files = spark.read.option("recursiveFileLookup", "true").parquet(f"file://{out}")
    assert files.count() == n
    assert files.select("sequence_number").distinct().count() == n
    assert sorted(r.data for r in files.select("data").collect()) == sorted(bytes(r.data) for r in stored)
    table = SqlCatalog("sms", uri=catalog_uri, warehouse=warehouse).load_table("lake.events")
    paths = table.inspect.files().column("file_path").to_pylist()
    rows = spark.read.parquet(*paths)
    assert rows.count() == n and rows.select("sequence_number").distinct().count() == n
    assert table.scan().to_arrow().num_rows == n
    client.delete_channel("spark-files")
    client.delete_channel("spark-table")
