"""Structured Streaming over SMS with real PySpark (spark_sps/datasource.py).

A query reads a stream with `readStream.format("sms")`, upper-cases each record and
writes it with `writeStream.format("sms")`, with a checkpoint location. It is stopped;
the input is split and written to again; the query restarts from its checkpoint. The
output must hold every input record exactly once (the source resumes after its offsets,
reads the closed parent to its end before the children, and the sink's SSSNs make a
re-executed micro-batch a duplicate). Marked slow: a SparkSession takes 5-10 s to start
on this machine, a first micro-batch about as much.
"""

from __future__ import annotations

import collections
import os

import pytest

pytest.importorskip("pyspark")

from spark_sps.datasource import register  # noqa: E402
from spark_sps.engine import spark_session  # noqa: E402
from tests.conftest import stream_name  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]", "sms-structured-streaming-test")
    register(session)
    yield session
    session.stop()


def _records(tag: str, rounds: int, keys: int) -> list[tuple[str, bytes]]:
    return [(f"k{j}", f"{tag}{i}-{j}".encode()) for i in range(rounds) for j in range(keys)]


def test_a_query_reads_across_a_split_and_restarts_without_duplicates(cluster, client, spark, tmp_path):
    source, sink = stream_name("ss-in"), stream_name("ss-out")
    client.create_stream(source, partitions=2, replication_factor=2)
    client.create_stream(sink, partitions=2, replication_factor=2)
    sent = _records("a", 8, 50)
    for i in range(0, len(sent), 100):
        assert client.put_records(source, sent[i:i + 100]).failed_record_count == 0
    checkpoint = os.path.join(tmp_path, "checkpoint")

    def start():
        df = spark.readStream.format("sms").option("address", cluster.address).option("stream", source).load()
        return (df.selectExpr("partition_key", "upper(cast(data as string)) as data")
                .writeStream.format("sms").option("address", cluster.address).option("stream", sink)
                .option("producerId", "upper-query").option("checkpointLocation", checkpoint).start())

    query = start()
    query.processAllAvailable()
    assert query.exception() is None
    query.stop()
    first = collections.Counter((r.partition_key, bytes(r.data)) for r in client.read_stream(sink))
    assert first == collections.Counter((k, v.upper()) for k, v in sent)

    client.split(source, 0)
    more = _records("b", 8, 50)
    for i in range(0, len(more), 100):
        assert client.put_records(source, more[i:i + 100]).failed_record_count == 0
    sent += more
    query = start()
    query.processAllAvailable()
    query.processAllAvailable()            # the children join in the batch after their parent's end
    assert query.exception() is None
    query.stop()

    out = collections.Counter((r.partition_key, bytes(r.data)) for r in client.read_stream(sink))
    expected = collections.Counter((k, v.upper()) for k, v in sent)
    assert out == expected, (f"{sum(out.values())} records out, {sum(expected.values())} expected; "
                             f"duplicates {sum(v - 1 for v in out.values() if v > 1)}")


def test_headers_travel_through_the_source_and_the_sink(cluster, client, spark, tmp_path):
    """The source's `headers` map column, selected into the sink, is written as the output
    records' headers: a query copies records with their headers intact."""
    source, sink = stream_name("hd-in"), stream_name("hd-out")
    client.create_stream(source, partitions=1, replication_factor=1)
    client.create_stream(sink, partitions=1, replication_factor=1)
    out = client.put_records(source, [{"partition_key": f"k{i}", "data": b"%d" % i,
                                       "headers": {"n": b"%d" % i, "kind": b"even" if i % 2 == 0 else b"odd"}}
                                      for i in range(20)] + [("plain", b"no headers")])
    assert out.failed_record_count == 0
    df = spark.readStream.format("sms").option("address", cluster.address).option("stream", source).load()
    query = (df.select("partition_key", "data", "headers").writeStream.format("sms")
             .option("address", cluster.address).option("stream", sink).option("producerId", "copy-headers")
             .option("checkpointLocation", os.path.join(tmp_path, "checkpoint")).start())
    query.processAllAvailable()
    assert query.exception() is None
    query.stop()
    copied = {bytes(r.data): r.headers for r in client.read_stream(sink)}
    assert copied == {**{b"%d" % i: {"n": b"%d" % i, "kind": b"even" if i % 2 == 0 else b"odd"} for i in range(20)},
                      b"no headers": {}}


def test_the_source_and_the_sink_take_their_credentials_as_options(cluster, client, spark, tmp_path):
    """`caFile` and `token` (docs/security.md): a sink given a producer key's token
    writes with it; one given a key that does not exist fails its query with
    Unauthenticated (so the option, not $SMS_TOKEN, is what it used)."""
    source, sink = stream_name("cred-in"), stream_name("cred-out")
    client.create_stream(source, partitions=1, replication_factor=1)
    client.create_stream(sink, partitions=1, replication_factor=1)
    client.put_records(source, [(f"k{i}", b"%d" % i) for i in range(10)])
    _info, producer_token = client.create_key("producer", streams=[sink], name="spark sink")

    def run(token: str, checkpoint: str):
        df = (spark.readStream.format("sms").option("address", cluster.address).option("stream", source)
              .option("caFile", cluster.ca_file).load())
        return (df.select("partition_key", "data").writeStream.format("sms").option("address", cluster.address)
                .option("stream", sink).option("producerId", "cred-query").option("caFile", cluster.ca_file)
                .option("token", token).option("checkpointLocation", os.path.join(tmp_path, checkpoint)).start())

    query = run("sms_0123456789abcdef_nosuchkey", "bad")
    with pytest.raises(Exception, match="Unauthenticated"):
        query.processAllAvailable()
    query.stop()
    assert list(client.read_stream(sink)) == []
    query = run(producer_token, "good")
    query.processAllAvailable()
    assert query.exception() is None
    query.stop()
    assert sorted(bytes(r.data) for r in client.read_stream(sink)) == sorted(b"%d" % i for i in range(10))


def test_a_tenants_query_runs_on_a_consumer_and_a_producer_key(cluster, client, spark, tmp_path):
    """A tenant's source reads with a consumer key, under the tenant's own stream names,
    and its sink writes with a producer key: no admin call is needed (the source learns
    commit watermarks from LATEST iterators)."""
    import sms
    client.create_tenant("sparky")
    _i, admin = client.create_key("admin", tenant="sparky")
    with sms.Client(cluster.address, ca_file=cluster.ca_file, token=admin) as t:
        t.create_stream("in", partitions=2, replication_factor=1)
        t.create_stream("out", partitions=1, replication_factor=1)
        t.put_records("in", [(f"k{i}", b"%d" % i) for i in range(20)])
        _c, reader = t.create_key("consumer", streams=["in"])
        _p, writer = t.create_key("producer", streams=["out"])
    df = (spark.readStream.format("sms").option("address", cluster.address).option("stream", "in")
          .option("caFile", cluster.ca_file).option("token", reader).load())
    query = (df.select("partition_key", "data").writeStream.format("sms").option("address", cluster.address)
             .option("stream", "out").option("producerId", "sparky-query").option("caFile", cluster.ca_file)
             .option("token", writer).option("checkpointLocation", os.path.join(tmp_path, "cp")).start())
    query.processAllAvailable()
    assert query.exception() is None
    query.stop()
    with sms.Client(cluster.address, ca_file=cluster.ca_file, token=admin) as t:
        assert sorted(bytes(r.data) for r in t.read_stream("out")) == sorted(b"%d" % i for i in range(20))
    assert "out" not in client.list_streams()        # the default tenant's names are its own
