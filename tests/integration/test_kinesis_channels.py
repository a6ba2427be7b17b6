"""The Kinesis channel operations through the real boto3 (botocore validating every request
and parsing every answer) on a TLS cluster signing with SigV4 (kinesis/channels.py,
docs/kinesis.md "Channels"), with moto's S3 server as the nodes' S3 (their boto3 reads
AWS_ENDPOINT_URL_S3 and the rest from the environment the cluster starts with), and the
cluster's default Iceberg catalog in a directory of the test:

- an S3 channel made with boto3 delivers every record put with boto3 exactly once into
  Parquet objects in moto's bucket; describe, list (paged, filtered), update, delete;
- an S3 Tables channel delivers into the Iceberg table of the default catalog (read back
  with pyiceberg);
- a channel made with the native client (file://, s3://bucket/prefix) is described too;
- bad input (two streams, both destinations or none, JSON, a bad ARN, another account, an
  unknown channel or stream, ...) answers its error code and changes nothing.

(The AWS CLI the other Kinesis tests run carries botocore models of its own, without the
channel operations: it has no channel commands to try.)"""

from __future__ import annotations

import io
import uuid

import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
from botocore.exceptions import ClientError  # noqa: E402

from tests.conftest import env_cluster, stream_name, wait_until  # noqa: E402
from tests.integration.test_kinesis_boto3 import kinesis_client  # noqa: E402
from tests.motoserver import MotoServer  # noqa: E402

pytestmark = pytest.mark.integration

ACCOUNT = "000000000000"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/kinesis-channels"
DELIVERY_TIMEOUT_S = 90.0
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def moto_endpoint():
    """moto's S3 server as its own process, up until the module's tests are done."""
    server = MotoServer().start()
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    """The cluster's default Iceberg catalog: (uri, warehouse)."""
    where = tmp_path_factory.mktemp("iceberg")
    return f"sqlite:///{where}/catalog.db", f"file://{where}/warehouse"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, moto_endpoint, catalog):
    """The module's cluster: its nodes' boto3 talks to moto, their default catalog is `catalog`."""
    aws = tmp_path_factory.mktemp("aws")
    env = {**S3_ENV, "AWS_ENDPOINT_URL_S3": moto_endpoint, "AWS_CONFIG_FILE": str(aws / "no-config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(aws / "no-credentials"),
           "SMS_CHANNELS_CATALOG_URI": catalog[0], "SMS_CHANNELS_WAREHOUSE": catalog[1]}
    with env_cluster(tmp_path_factory, env, "kinesis-channels") as local:
        yield local


@pytest.fixture(scope="module")
def kinesis(cluster):
    return kinesis_client(cluster)


@pytest.fixture(scope="module")
def s3(moto_endpoint):
    return boto3.session.Session().client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                                          aws_access_key_id="testing", aws_secret_access_key="testing")


def _bucket(s3) -> str:
    name = f"kc-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def _stream(kinesis, hint: str, shards: int = 2) -> tuple[str, str]:
    name = stream_name(hint)
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    return name, f"arn:aws:kinesis:us-east-1:{ACCOUNT}:stream/{name}"


def _put(kinesis, stream: str, n: int, tag: str) -> list[bytes]:
    sent = []
    for lo in range(0, n, 500):
        batch = [{"PartitionKey": f"k{i}", "Data": f"{tag}-{i}".encode()} for i in range(lo, min(n, lo + 500))]
        assert kinesis.put_records(StreamName=stream, Records=batch)["FailedRecordCount"] == 0
        sent += [r["Data"] for r in batch]
    return sent


def _parquet_rows(s3, bucket: str):
    """Every Parquet object in the bucket, read into one table (None: none yet), and their keys."""
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", []) if o["Key"].endswith(".parquet")]
    tables = [pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=k)["Body"].read())) for k in keys]
    return (pa.concat_tables(tables) if tables else None), keys


def _code(call, **params) -> str:
    with pytest.raises(ClientError) as e:
        call(**params)
    return e.value.response["Error"]["Code"]


def _s3_destination(bucket: str, **storage) -> dict:
    return {"DataFreshnessInSeconds": 1,
            "StorageConfiguration": {"BucketARN": f"arn:aws:s3:::{bucket}", "ExpectedBucketOwner": ACCOUNT,
                                     "CompressionType": "ZSTD", **storage}}


def test_an_s3_channel_through_boto3(kinesis, s3):
    stream, stream_arn = _stream(kinesis, "kc-s3")
    bucket, dead = _bucket(s3), _bucket(s3)
    destination = _s3_destination(bucket, StorageClass="STANDARD",
                                  OutputKeyTemplate="events/{stream}/{partition}/{year}/{month}/{start}.parquet")
    destination["DeadLetterQueueS3Configuration"] = {"BucketARN": f"arn:aws:s3:::{dead}",
                                                     "ExpectedBucketOwner": ACCOUNT, "ErrorOutputPrefix": "errors/"}
    made = kinesis.create_channel(
        ChannelName="kc-to-s3", ServiceExecutionRoleARN=ROLE,
        StreamConfigurationList=[{"StreamARN": stream_arn, "RecordConfiguration": {"RecordFormatType": "STRING"}}],
        S3DestinationConfiguration=destination,
        EncryptionConfiguration={"EncryptionType": "KMS", "KeyId": "alias/aws/kinesis"},
        LoggingConfiguration={"CloudWatchLogs": {"Enabled": True, "LogGroupName": "g"}})["ChannelDescription"]
    arn = made["ChannelARN"]
    assert arn == f"arn:aws:kinesis:us-east-1:{ACCOUNT}:channel/kc-to-s3"
    assert made["ChannelName"] == "kc-to-s3" and made["ChannelStatus"] == "ACTIVE"
    assert len(made["ChannelId"]) == 16 and int(made["ChannelId"], 16) > 0
    assert made["ServiceExecutionRoleARN"] == f"arn:aws:iam::{ACCOUNT}:role/sms-channels"   # (none is kept)
    assert made["LoggingConfiguration"] == {"CloudWatchLogs": {"Enabled": False}}
    [streamed] = made["StreamConfigurationList"]
    assert streamed["StreamARN"] == stream_arn
    assert streamed["RecordConfiguration"] == {"RecordFormatType": "BYTE_ARRAY"}
    assert made["S3DestinationConfiguration"] == {
        "DataFreshnessInSeconds": 1,
        "DeadLetterQueueS3Configuration": {"BucketARN": f"arn:aws:s3:::{dead}", "ExpectedBucketOwner": ACCOUNT,
                                           "ErrorOutputPrefix": "errors"},
        "StorageConfiguration": {"BucketARN": f"arn:aws:s3:::{bucket}", "ExpectedBucketOwner": ACCOUNT,
                                 "OutputKeyTemplate": "events/{stream}/{partition}/{year}/{month}/{start}.parquet",
                                 "CompressionType": "ZSTD"}}
    assert "S3TablesDestinationConfiguration" not in made and "ChannelStatusReason" not in made
    assert kinesis.describe_channel(ChannelARN=arn)["ChannelDescription"] == made

    sent = _put(kinesis, stream, 1200, "s3")

    def delivered():
        table, keys = _parquet_rows(s3, bucket)
        return (table, keys) if table is not None and table.num_rows >= len(sent) else None
    table, keys = wait_until(delivered, DELIVERY_TIMEOUT_S, f"{len(sent)} records in s3://{bucket}")
    assert table.num_rows == len(sent)
    assert sorted(table.column("data").to_pylist()) == sorted(sent)                  # each exactly once
    assert len(set(table.column("sequence_number").to_pylist())) == len(sent)
    assert all(k.startswith(f"events/{stream}/p000") for k in keys)
    for key in keys:
        meta = pq.read_metadata(io.BytesIO(s3.get_object(Bucket=bucket, Key=key)["Body"].read())).metadata
        assert key.endswith(f"/{meta[b'sms.first_sn'].decode()}.parquet")
    assert s3.list_objects_v2(Bucket=dead).get("KeyCount", 0) == 0      # (bytes as they are: no dead letters)

    # a second channel of the stream: listing filters by stream and pages by name
    other = kinesis.create_channel(
        ChannelName="kc-to-s3-other", ServiceExecutionRoleARN=ROLE,
        StreamConfigurationList=[{"StreamARN": stream_arn, "RecordConfiguration": {"RecordFormatType": "BYTE_ARRAY"}}],
        S3DestinationConfiguration=_s3_destination(_bucket(s3)))["ChannelDescription"]
    assert other["S3DestinationConfiguration"]["DataFreshnessInSeconds"] == 1
    listed = kinesis.list_channels(StreamFilter=[{"StreamARN": stream_arn}])["ChannelSummaries"]
    assert [(c["ChannelName"], c["ChannelDestinationType"], c["ChannelId"], c["Streams"][0]["StreamARN"])
            for c in listed] == [("kc-to-s3", "S3", made["ChannelId"], stream_arn),
                                 ("kc-to-s3-other", "S3", other["ChannelId"], stream_arn)]
    assert listed[0]["Streams"][0]["StreamCreationTimestamp"] == streamed["StreamCreationTimestamp"]
    first = kinesis.list_channels(StreamFilter=[{"StreamARN": stream_arn}], MaxResults=1)
    assert [c["ChannelName"] for c in first["ChannelSummaries"]] == ["kc-to-s3"] and first["NextToken"]
    second = kinesis.list_channels(StreamFilter=[{"StreamARN": stream_arn}], MaxResults=1,
                                   NextToken=first["NextToken"])
    assert [c["ChannelName"] for c in second["ChannelSummaries"]] == ["kc-to-s3-other"]
    assert "NextToken" not in second
    paged = [c["ChannelName"] for page in kinesis.get_paginator("list_channels").paginate(
        StreamFilter=[{"StreamARN": stream_arn}], PaginationConfig={"PageSize": 1}) for c in page["ChannelSummaries"]]
    assert paged == ["kc-to-s3", "kc-to-s3-other"]
    assert {"kc-to-s3", "kc-to-s3-other"} <= {c["ChannelName"] for c in kinesis.list_channels()["ChannelSummaries"]}
    kinesis.delete_channel(ChannelARN=other["ChannelARN"])

    updated = kinesis.update_channel(ChannelARN=arn, S3DestinationConfiguration={"DataFreshnessInSeconds": 5},
                                     LoggingConfiguration={"CloudWatchLogs": {"Enabled": False}})["ChannelDescription"]
    assert updated["S3DestinationConfiguration"]["DataFreshnessInSeconds"] == 5
    assert kinesis.describe_channel(ChannelARN=arn)["ChannelDescription"] == updated
    assert _code(kinesis.update_channel, ChannelARN=arn,
                 S3TablesDestinationConfiguration={"DataFreshnessInSeconds": 9}) == "InvalidArgumentException"
    assert kinesis.describe_channel(ChannelARN=arn)["ChannelDescription"] == updated

    assert _code(kinesis.delete_stream, StreamName=stream) == "ResourceInUseException"     # (it has a channel)
    kinesis.delete_channel(ChannelARN=arn)
    assert _code(kinesis.describe_channel, ChannelARN=arn) == "ResourceNotFoundException"
    assert _code(kinesis.delete_channel, ChannelARN=arn) == "ResourceNotFoundException"
    assert kinesis.list_channels(StreamFilter=[{"StreamARN": stream_arn}])["ChannelSummaries"] == []
    assert _parquet_rows(s3, bucket)[0].num_rows == len(sent)           # (what it delivered stays)
    kinesis.delete_stream(StreamName=stream)


def test_an_s3_tables_channel_into_the_default_catalog(kinesis, s3, catalog):
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError
    stream, stream_arn = _stream(kinesis, "kc-tables")
    dead = _bucket(s3)
    made = kinesis.create_channel(
        ChannelName="kc-to-table", ServiceExecutionRoleARN=ROLE,
        StreamConfigurationList=[{"StreamARN": stream_arn, "RecordConfiguration": {"RecordFormatType": "BYTE_ARRAY"}}],
        S3TablesDestinationConfiguration={
            "DataFreshnessInSeconds": 1,
            "DeadLetterQueueS3Configuration": {"BucketARN": f"arn:aws:s3:::{dead}", "ExpectedBucketOwner": ACCOUNT},
            "S3TablesConfigurationList": [{
                "TableBucketARN": f"arn:aws:s3tables:us-east-1:{ACCOUNT}:bucket/my-tables",
                "Namespace": "kinesis_events", "TableName": "clicks", "CompressionType": "SNAPPY",
                "PartitionSpec": {"PartitionFields": [{"Transform": "TIME_HOUR", "SourceName": "arrival_time"}]}}]},
    )["ChannelDescription"]
    tables = made["S3TablesDestinationConfiguration"]
    [table_conf] = tables["S3TablesConfigurationList"]
    # the table bucket shown names the catalog (the one given selects none: docs/kinesis.md)
    assert table_conf["TableBucketARN"].startswith(f"arn:aws:s3tables:us-east-1:{ACCOUNT}:bucket/sms-")
    assert {k: v for k, v in table_conf.items() if k != "TableBucketARN"} == {
        "Namespace": "kinesis_events", "TableName": "clicks", "CompressionType": "SNAPPY",
        "PartitionSpec": {"PartitionFields": [{"Transform": "TIME_HOUR", "SourceName": "arrival_time"}]}}
    assert tables["DataFreshnessInSeconds"] == 1
    assert tables["DeadLetterQueueS3Configuration"] == {"BucketARN": f"arn:aws:s3:::{dead}",
                                                        "ExpectedBucketOwner": ACCOUNT}
    assert "S3DestinationConfiguration" not in made
    assert kinesis.describe_channel(ChannelARN=made["ChannelARN"])["ChannelDescription"] == made
    [summary] = kinesis.list_channels(StreamFilter=[{"StreamARN": stream_arn}])["ChannelSummaries"]
    assert (summary["ChannelName"], summary["ChannelDestinationType"]) == ("kc-to-table", "S3_TABLES")

    sent = _put(kinesis, stream, 700, "table")
    iceberg = SqlCatalog("sms", uri=catalog[0], warehouse=catalog[1])

    def landed():
        try:
            rows = iceberg.load_table("kinesis_events.clicks").scan().to_arrow()
        except NoSuchTableError:
            return None
        return rows if rows.num_rows >= len(sent) else None
    rows = wait_until(landed, DELIVERY_TIMEOUT_S, f"{len(sent)} records in kinesis_events.clicks")
    assert rows.num_rows == len(sent)
    assert sorted(rows.column("data").to_pylist()) == sorted(sent)
    assert len(set(rows.column("sequence_number").to_pylist())) == len(sent)
    assert [f.name for f in iceberg.load_table("kinesis_events.clicks").spec().fields] == ["arrival_hour"]

    updated = kinesis.update_channel(ChannelARN=made["ChannelARN"],
                                     S3TablesDestinationConfiguration={"DataFreshnessInSeconds": 30})
    assert updated["ChannelDescription"]["S3TablesDestinationConfiguration"]["DataFreshnessInSeconds"] == 30
    assert _code(kinesis.update_channel, ChannelARN=made["ChannelARN"],
                 S3DestinationConfiguration={"DataFreshnessInSeconds": 9}) == "InvalidArgumentException"
    kinesis.delete_channel(ChannelARN=made["ChannelARN"])
    kinesis.delete_stream(StreamName=stream)


def test_a_natively_made_channel_is_described(kinesis, client, s3, tmp_path):
    stream, stream_arn = _stream(kinesis, "kc-native", shards=1)
    bucket = _bucket(s3)
    client.create_channel(stream, "kc-native-s3", {"url": f"s3://{bucket}/some/prefix", "compression": "GZIP"})
    client.create_channel(stream, "kc-native-files", f"file://{tmp_path}/out")
    try:
        native = client.describe_channel("kc-native-s3")
        described = kinesis.describe_channel(
            ChannelARN=f"arn:aws:kinesis:us-east-1:{ACCOUNT}:channel/kc-native-s3")["ChannelDescription"]
        assert described["ChannelId"] == f"{native.uid:016x}"
        assert described["S3DestinationConfiguration"] == {
            "DataFreshnessInSeconds": native.data_freshness_s,
            "DeadLetterQueueS3Configuration": {"BucketARN": f"arn:aws:s3:::{bucket}", "ExpectedBucketOwner": ACCOUNT},
            "StorageConfiguration": {
                "BucketARN": f"arn:aws:s3:::{bucket}", "ExpectedBucketOwner": ACCOUNT, "CompressionType": "GZIP",
                # (the url's prefix in front of the template: the same keys)
                "OutputKeyTemplate": f"some/prefix/{native.destination.key_template}"}}
        files = kinesis.describe_channel(
            ChannelARN=f"arn:aws:kinesis:us-east-1:{ACCOUNT}:channel/kc-native-files")["ChannelDescription"]
        assert "S3DestinationConfiguration" not in files and "S3TablesDestinationConfiguration" not in files
        assert f"file://{tmp_path}/out" in files["ChannelStatusReason"]
        listed = kinesis.list_channels(StreamFilter=[{"StreamARN": stream_arn}])["ChannelSummaries"]
        assert [(c["ChannelName"], c["ChannelDestinationType"]) for c in listed] == [
            ("kc-native-files", "S3"), ("kc-native-s3", "S3")]
    finally:
        client.delete_channel("kc-native-s3")
        client.delete_channel("kc-native-files")
        kinesis.delete_stream(StreamName=stream)


def test_bad_input_is_named_and_changes_nothing(kinesis, client, s3):
    stream, stream_arn = _stream(kinesis, "kc-bad", shards=1)
    bucket = _bucket(s3)
    good = kinesis.create_channel(
        ChannelName="kc-good", ServiceExecutionRoleARN=ROLE,
        StreamConfigurationList=[{"StreamARN": stream_arn, "RecordConfiguration": {"RecordFormatType": "BYTE_ARRAY"}}],
        S3DestinationConfiguration=_s3_destination(bucket))["ChannelDescription"]
    records = {"RecordFormatType": "BYTE_ARRAY"}
    streams = [{"StreamARN": stream_arn, "RecordConfiguration": records}]
    tables = {"DataFreshnessInSeconds": 1,
              "DeadLetterQueueS3Configuration": {"BucketARN": f"arn:aws:s3:::{bucket}", "ExpectedBucketOwner": ACCOUNT},
              "S3TablesConfigurationList": [{"TableBucketARN": f"arn:aws:s3tables:us-east-1:{ACCOUNT}:bucket/tbl",
                                             "Namespace": "ns", "TableName": "t", "CompressionType": "ZSTD"}]}

    def create(name="kc-bad-1", streams=streams, **destination):
        if not destination:
            destination = {"S3DestinationConfiguration": _s3_destination(bucket)}
        return kinesis.create_channel(ChannelName=name, ServiceExecutionRoleARN=ROLE,
                                      StreamConfigurationList=streams, **destination)

    try:
        two = [{"StreamARN": stream_arn, "RecordConfiguration": records}] * 2
        assert _code(create, streams=two) == "InvalidArgumentException"
        assert _code(create, S3DestinationConfiguration=_s3_destination(bucket),
                     S3TablesDestinationConfiguration=tables) == "InvalidArgumentException"
        assert _code(create, streams=streams, Tags={"team": "a"},
                     S3DestinationConfiguration=_s3_destination(bucket)) == "InvalidArgumentException"
        for kind in ("JSON", "GSR_JSON"):
            with pytest.raises(ClientError) as e:
                create(streams=[{"StreamARN": stream_arn, "RecordConfiguration": {"RecordFormatType": kind}}])
            assert e.value.response["Error"]["Code"] == "InvalidArgumentException"
            assert 'record_format="JSON"' in e.value.response["Error"]["Message"]
        # a stream ARN of the model's pattern but no stream's; another account's; no such stream
        assert _code(create, streams=[{"StreamARN": f"arn:aws:kinesis:us-east-1:{ACCOUNT}:stream/a/b",
                                       "RecordConfiguration": records}]) == "InvalidArgumentException"
        assert _code(create, streams=[{"StreamARN": stream_arn.replace(ACCOUNT, "111111111111"),
                                       "RecordConfiguration": records}]) == "AccessDeniedException"
        assert _code(create, streams=[{"StreamARN": f"arn:aws:kinesis:us-east-1:{ACCOUNT}:stream/kc-no-such",
                                       "RecordConfiguration": records}]) == "ResourceNotFoundException"
        # what the native side refuses: a template without {start}, a freshness over 900 s, a bucket name S3 refuses
        assert _code(create, S3DestinationConfiguration=_s3_destination(
            bucket, OutputKeyTemplate="{partition}.parquet")) == "InvalidArgumentException"
        assert _code(create, S3DestinationConfiguration={**_s3_destination(bucket), "DataFreshnessInSeconds": 901}
                     ) == "InvalidArgumentException"
        assert _code(create, S3DestinationConfiguration=_s3_destination("under_score")) == "InvalidArgumentException"
        partitioned = {**tables, "S3TablesConfigurationList": [{
            **tables["S3TablesConfigurationList"][0],
            "PartitionSpec": {"PartitionFields": [{"Transform": "TIME_HOUR", "SourceName": "other"}]}}]}
        assert _code(create, S3TablesDestinationConfiguration=partitioned) == "InvalidArgumentException"
        twice = {**tables, "S3TablesConfigurationList": tables["S3TablesConfigurationList"] * 2}
        assert _code(create, S3TablesDestinationConfiguration=twice) == "InvalidArgumentException"
        # the model's own constraints, checked by the endpoint (botocore checks no patterns)
        assert _code(create, name="a b") == "ValidationException"
        assert _code(create, name="kc-good") == "ResourceInUseException"
        for call in (kinesis.describe_channel, kinesis.delete_channel, kinesis.update_channel):
            assert _code(call, ChannelARN=f"arn:aws:kinesis:us-east-1:{ACCOUNT}:channel/kc-no-such"
                         ) == "ResourceNotFoundException"
            assert _code(call, ChannelARN=f"arn:aws:kinesis:us-east-1:{ACCOUNT}:channel/a/b"
                         ) == "InvalidArgumentException"
            assert _code(call, ChannelARN=good["ChannelARN"].replace(ACCOUNT, "111111111111")
                         ) == "AccessDeniedException"
        assert _code(kinesis.list_channels, StreamFilter=[{"StreamARN": stream_arn.replace(ACCOUNT, "111111111111")}]
                     ) == "AccessDeniedException"
        # nothing changed: the one good channel, as it was; no other made
        listed = kinesis.list_channels(StreamFilter=[{"StreamARN": stream_arn}])["ChannelSummaries"]
        assert [c["ChannelName"] for c in listed] == ["kc-good"]
        assert kinesis.describe_channel(ChannelARN=good["ChannelARN"])["ChannelDescription"] == good
        assert [c.name for c in client.list_channels(stream)] == ["kc-good"]
        assert _code(kinesis.describe_channel, ChannelARN=f"arn:aws:kinesis:us-east-1:{ACCOUNT}:channel/kc-bad-1"
                     ) == "ResourceNotFoundException"
    finally:
        kinesis.delete_channel(ChannelARN=good["ChannelARN"])
        kinesis.delete_stream(StreamName=stream)
