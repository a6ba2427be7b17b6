"""Channels (issue 34; control/channels.py, delivery/, docs/channels.md): a stream delivered
into Parquet files or an Iceberg table by the nodes, on a real TLS cluster, read back with
the real readers (pyarrow, DuckDB, pyiceberg).

- Files: every record exactly once, in the stream's columns, named by the key template;
  DuckDB reads the directory; each file says the positions it covers.
- Iceberg: the table read back through pyiceberg into Arrow holds every record once, and
  its snapshots record each partition's position.
- JSON with a schema: columns parsed; records that do not parse go to the dead-letter
  prefix, with their error.
- Repartition: parents are delivered to their end before their children begin.
- Describe shows each partition's progress; update, list, delete; bad input is a named
  error and changes nothing; a stream with channels is not deleted.
"""

from __future__ import annotations

import glob
import json
import os

import pytest

from sms import errors
from sms.types import SHARD_END, ChannelStatus
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _put(client, stream: str, n: int, start: int = 0, data=None) -> list[str]:
    keys = []
    for lo in range(start, start + n, 500):
        batch = [(data(i) if data else f"r{i}".encode(), f"k{i}") for i in range(lo, min(start + n, lo + 500))]
        result = client.put_records(stream, [{"data": d, "partition_key": k} for d, k in batch])
        assert not result.failed_record_count
        keys += [k for _, k in batch]
    return keys


def _files(directory: str) -> list[str]:
    return sorted(glob.glob(os.path.join(directory, "**", "*.parquet"), recursive=True))


def _read_files(directory: str):
    files = _files(directory)
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="default") if files else None


def _delivered(client, name: str) -> int:
    return sum(p.records for p in client.describe_channel(name).partitions)


def test_files_exactly_once_and_duckdb(client, tmp_path):
    client.create_stream("chan-files", partitions=2, replication_factor=3)
    out = tmp_path / "out"
    ch = client.create_channel("chan-files", "to-files", f"file://{out}", data_freshness_s=1)
    assert (ch.name, ch.stream, ch.status, ch.start, ch.data_freshness_s) == (
        "to-files", "chan-files", ChannelStatus.ACTIVE, "TRIM_HORIZON", 1)
    assert ch.destination.kind == "FILES" and ch.destination.compression == "ZSTD"
    assert "{partition}" in ch.destination.key_template and "{start}" in ch.destination.key_template
    keys = _put(client, "chan-files", 3000)
    wait_until(lambda: _delivered(client, "to-files") >= 3000, 60, "3,000 records delivered")
    table = _read_files(str(out))
    assert table.num_rows == 3000
    assert sorted(table.column("partition_key").to_pylist()) == sorted(keys)
    assert table.column_names == ["partition_key", "data", "sequence_number", "arrival_time", "partition_id",
                                  "headers"]
    assert len(set(table.column("sequence_number").to_pylist())) == 3000
    # each file covers a run of one partition's positions, and says which
    for f in _files(str(out)):
        meta = pq.read_metadata(f).metadata
        t = pq.read_table(f)
        sns = [int(s) for s in t.column("sequence_number").to_pylist()]
        assert (int(meta[b"sms.first_sn"]), int(meta[b"sms.last_sn"])) == (sns[0], sns[-1])
        assert sns == sorted(sns)
        assert os.path.basename(f) == f"{sns[0]}.parquet"
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    rows = con.execute(f"select count(*), count(distinct sequence_number) from read_parquet('{out}/**/*.parquet')"
                       ).fetchone()
    assert rows == (3000, 3000)
    # more records land in new files after the first ones, none twice
    _put(client, "chan-files", 1000, start=3000)
    wait_until(lambda: _delivered(client, "to-files") >= 4000, 60, "4,000 records delivered")
    table = _read_files(str(out))
    assert table.num_rows == 4000 and len(set(table.column("sequence_number").to_pylist())) == 4000
    described = client.describe_channel("to-files")
    assert {p.ordinal for p in described.partitions} == {0, 1}
    assert all(p.error == "" and p.last_commit_ms > 0 and p.files >= 1 for p in described.partitions)
    assert all(p.lag_records == 0 for p in described.partitions)            # (everything delivered)
    with pytest.raises(errors.StreamInUse):
        client.delete_stream("chan-files")
    client.delete_channel("to-files")
    with pytest.raises(errors.ChannelNotFound):
        client.describe_channel("to-files")
    client.delete_stream("chan-files")


def test_iceberg_table_read_back(client, tmp_path):
    client.create_stream("chan-ice", partitions=2, replication_factor=3)
    catalog_uri = f"sqlite:///{tmp_path}/catalog.db"
    warehouse = f"file://{tmp_path}/warehouse"
    client.create_channel("chan-ice", "to-ice", {"namespace": "events", "table": "clicks", "catalog_uri": catalog_uri,
                                                 "warehouse": warehouse, "partition_by_hour": True},
                          data_freshness_s=1)
    keys = _put(client, "chan-ice", 2000)
    wait_until(lambda: _delivered(client, "to-ice") >= 2000, 60, "2,000 records in the table")
    from pyiceberg.catalog.sql import SqlCatalog
    table = SqlCatalog("sms", uri=catalog_uri, warehouse=warehouse).load_table("events.clicks")
    rows = table.scan().to_arrow()
    assert rows.num_rows == 2000
    assert sorted(rows.column("partition_key").to_pylist()) == sorted(keys)
    assert len(set(rows.column("sequence_number").to_pylist())) == 2000
    assert [f.name for f in table.spec().fields] == ["arrival_hour"]
    ch = client.describe_channel("to-ice")
    positions = json.loads(table.current_snapshot().summary.additional_properties[f"sms.positions.{ch.uid:016x}"])
    assert {int(k): v for k, v in positions.items()} == {p.ordinal: p.position for p in ch.partitions}
    client.delete_channel("to-ice")
    client.delete_stream("chan-ice")


def test_json_schema_and_dead_letters(client, tmp_path):
    client.create_stream("chan-json", partitions=1, replication_factor=3)
    out, dead = tmp_path / "out", tmp_path / "dead"
    client.create_channel("chan-json", "parsed", f"file://{out}", data_freshness_s=1, record_format="JSON",
                          schema={"user": "string", "n": "long", "price": "double"},
                          dead_letter_url=f"file://{dead}")

    def data(i: int) -> bytes:
        if i % 10 == 3:
            return b"{not json"
        return json.dumps({"user": f"u{i}", "n": i, "price": i / 2, "extra": True}).encode()
    _put(client, "chan-json", 200, data=data)
    wait_until(lambda: _delivered(client, "parsed") >= 180, 60, "180 parsed records delivered")
    table = _read_files(str(out))
    assert table.num_rows == 180
    assert table.column_names[:4] == ["partition_key", "user", "n", "price"]
    assert sorted(table.column("n").to_pylist()) == [i for i in range(200) if i % 10 != 3]
    assert table.schema.field("n").type == pa.int64()
    wait_until(lambda: _files(str(dead)), 30, "a dead-letter file")
    bad = _read_files(str(dead))
    assert sorted(bad.column("data").to_pylist()) == [b"{not json"] * 20
    assert all(e for e in bad.column("error").to_pylist())
    assert client.describe_channel("parsed").partitions[0].dead_letters == 20
    client.delete_channel("parsed")
    client.delete_stream("chan-json")


def test_parents_before_children(client, tmp_path):
    client.create_stream("chan-split", partitions=1, replication_factor=3)
    out = tmp_path / "out"
    client.create_channel("chan-split", "lineage", f"file://{out}", data_freshness_s=1)
    _put(client, "chan-split", 500)
    client.split("chan-split", 0)
    _put(client, "chan-split", 500, start=500)
    try:
        wait_until(lambda: _delivered(client, "lineage") >= 1000, 60, "1,000 records delivered")
    except AssertionError:
        raise AssertionError(f"{client.describe_channel('lineage').partitions}") from None
    parts = {p.ordinal: p for p in client.describe_channel("lineage").partitions}
    assert parts[0].position == SHARD_END
    table = _read_files(str(out))
    assert table.num_rows == 1000
    # every child file was committed after the parent's last one (their positions say when)
    by_partition = {}
    for f in _files(str(out)):
        t = pq.read_table(f)
        by_partition.setdefault(t.column("partition_id")[0].as_py(), []).append(os.path.getmtime(f))
    parent_last = max(by_partition.pop("p0000"))
    assert by_partition and all(min(times) >= parent_last for times in by_partition.values())
    client.delete_channel("lineage")
    client.delete_stream("chan-split")


def test_bad_input_is_named_and_changes_nothing(client, tmp_path):
    client.create_stream("chan-bad", partitions=1, replication_factor=3)
    url = f"file://{tmp_path}/x"
    cases = [
        (dict(destination="ftp://host/x"), errors.InvalidArgument),
        (dict(destination="file://relative"), errors.InvalidArgument),
        (dict(destination={"kind": "FILES", "url": url, "key_template": "{stream}/{start}.parquet"}),
         errors.InvalidArgument),                                         # no {partition}
        (dict(destination={"kind": "FILES", "url": url, "key_template": "{partition}/{start}/{nope}"}),
         errors.InvalidArgument),
        (dict(destination={"kind": "FILES", "url": url, "compression": "LZ4"}), errors.InvalidArgument),
        (dict(destination={"kind": "ICEBERG", "namespace": "Bad-Name", "table": "t"}), errors.InvalidArgument),
        (dict(destination=url, data_freshness_s=0), errors.InvalidArgument),
        (dict(destination=url, data_freshness_s=901), errors.InvalidArgument),
        (dict(destination=url, record_format="XML"), errors.InvalidArgument),
        (dict(destination=url, record_format="JSON", schema={"a": "long"}), errors.InvalidArgument),  # no dead letters
        (dict(destination=url, record_format="JSON"), errors.InvalidArgument),               # (inferred: likewise)
        (dict(destination=url, record_format="JSON", schema={"a": "int128"}, dead_letter_url=url),
         errors.InvalidArgument),
        (dict(destination=url, record_format="JSON", schema={"headers": "long"}, dead_letter_url=url),
         errors.InvalidArgument),
        (dict(destination=url, starting_position="AT_SEQUENCE_NUMBER"), errors.InvalidArgument),
        (dict(destination=url, name="bad/name"), errors.InvalidArgument),
        (dict(destination=url, stream="no-such-stream"), errors.StreamNotFound),
    ]
    for kwargs, error in cases:
        name = kwargs.pop("name", "c")
        stream = kwargs.pop("stream", "chan-bad")
        with pytest.raises(error):
            client.create_channel(stream, name, kwargs.pop("destination"), **kwargs)
    assert client.list_channels() == [] or all(c.stream != "chan-bad" for c in client.list_channels())
    client.create_channel("chan-bad", "c", url)
    with pytest.raises(errors.ChannelAlreadyExists):
        client.create_channel("chan-bad", "c", url)
    with pytest.raises(errors.InvalidArgument):
        client.update_channel("c", data_freshness_s=0)
    assert client.update_channel("c", data_freshness_s=5).data_freshness_s == 5
    assert [c.name for c in client.list_channels("chan-bad")] == ["c"]
    with pytest.raises(errors.ChannelNotFound):
        client.update_channel("none", data_freshness_s=5)
    with pytest.raises(errors.ChannelNotFound):
        client.delete_channel("none")
    client.delete_channel("c")
    client.delete_stream("chan-bad")


def test_a_tenant_delivers_where_the_operator_lets_it(cluster, client, tmp_path):
    """The nodes write a channel's files themselves: a tenant's admin names no file:// path
    or catalog of its own (PermissionDenied, nothing made), and in the cluster's catalog only
    namespaces of its own; its channels are its own to see."""
    import sms
    client.create_tenant("chacme")
    acme = sms.Client(cluster.address, ca_file=cluster.ca_file, token=client.create_key("admin", tenant="chacme")[1])
    try:
        acme.create_stream("clicks", partitions=1)
        for destination in (f"file://{tmp_path}/mine", "s3://any-bucket/x",
                            {"namespace": "chacme_x", "table": "t", "catalog_uri": f"sqlite:///{tmp_path}/c.db"},
                            {"namespace": "chacme_x", "table": "t", "warehouse": f"file://{tmp_path}/wh"},
                            "iceberg://default_lake.clicks", "iceberg://chacme_.clicks"):
            with pytest.raises(errors.PermissionDenied):
                acme.create_channel("clicks", "c", destination)
        assert acme.list_channels() == [] and not os.path.exists(tmp_path / "mine")
        ch = acme.create_channel("clicks", "to-lake", "iceberg://chacme_lake.clicks", data_freshness_s=1)
        assert (ch.name, ch.stream) == ("to-lake", "clicks")
        assert [c.name for c in acme.list_channels()] == ["to-lake"]
        assert all(c.name != "to-lake" for c in client.list_channels())
        acme.put_records("clicks", [{"data": b"x", "partition_key": "k"}])
        try:
            wait_until(lambda: _delivered(acme, "to-lake") == 1, 60, "the tenant's record in its table")
        except AssertionError:
            raise AssertionError(str(acme.describe_channel("to-lake"))) from None
        with pytest.raises(errors.ChannelNotFound):
            client.describe_channel("to-lake")
        acme.delete_channel("to-lake")
        acme.delete_stream("clicks")
    finally:
        acme.close()


def test_json_schema_inferred(client, tmp_path):
    """No schema: files take the columns each commit's records have; a table, those of the
    records of its first commit (later fields it does not have are dropped)."""
    client.create_stream("chan-infer", partitions=1, replication_factor=3)
    out, dead = tmp_path / "out", tmp_path / "dead"
    catalog_uri, warehouse = f"sqlite:///{tmp_path}/catalog.db", f"file://{tmp_path}/warehouse"
    client.create_channel("chan-infer", "inferred-files", f"file://{out}", data_freshness_s=1, record_format="JSON",
                          dead_letter_url=f"file://{dead}")
    client.create_channel("chan-infer", "inferred-table", {"namespace": "lake", "table": "inferred",
                                                          "catalog_uri": catalog_uri, "warehouse": warehouse},
                          data_freshness_s=1, record_format="JSON", dead_letter_url=f"file://{dead}/t")
    _put(client, "chan-infer", 50, data=lambda i: json.dumps({"user": f"u{i}", "n": i, "partition_key": "x"}).encode())
    wait_until(lambda: _delivered(client, "inferred-files") == 50 and _delivered(client, "inferred-table") == 50,
               60, "the first 50 records in both")
    _put(client, "chan-infer", 50, start=50,
         data=lambda i: json.dumps({"user": f"u{i}", "n": i, "extra": 1.5}).encode())
    wait_until(lambda: _delivered(client, "inferred-files") == 100 and _delivered(client, "inferred-table") == 100,
               60, "100 records in both")
    files = _read_files(str(out))        # (pyarrow unifies the files' columns)
    assert files.num_rows == 100 and sorted(files.column("n").to_pylist()) == list(range(100))
    assert "json_partition_key" in files.column_names and files.schema.field("n").type == pa.int64()
    from pyiceberg.catalog.sql import SqlCatalog
    rows = SqlCatalog("sms", uri=catalog_uri, warehouse=warehouse).load_table("lake.inferred").scan().to_arrow()
    assert rows.num_rows == 100 and sorted(rows.column("n").to_pylist()) == list(range(100))
    assert "extra" not in rows.column_names and "user" in rows.column_names
    client.delete_channel("inferred-files")
    client.delete_channel("inferred-table")
    client.delete_stream("chan-infer")
