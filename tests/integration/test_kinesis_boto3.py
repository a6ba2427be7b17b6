"""The Kinesis endpoint with the real boto3 (botocore validating requests and parsing
answers), against a TLS cluster whose keys sign with AWS Signature V4: streams, shards,
records both ways between boto3 and sms.Client, paginators, the waiter, and what a
wrong key, a wrong signature or a key limited to another stream gets."""

from __future__ import annotations

import pytest

boto3 = pytest.importorskip("boto3")
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError, EventStreamError  # noqa: E402

import sms  # noqa: E402
from sms import security  # noqa: E402
from tests.conftest import stream_name, wait_until  # noqa: E402

pytestmark = pytest.mark.integration


def kinesis_client(cluster, token: str | None = None, secret: str | None = None):
    key_id, derived = security.aws_credentials(token or cluster.admin_token)
    return boto3.client("kinesis", endpoint_url=cluster.kinesis_endpoint, region_name="us-east-1",
                        aws_access_key_id=key_id, aws_secret_access_key=secret or derived,
                        verify=cluster.ca_file, config=Config(retries={"max_attempts": 2, "mode": "standard"}))


@pytest.fixture(scope="module")
def kinesis(cluster):
    return kinesis_client(cluster)


def test_streams_are_created_described_listed_and_deleted(cluster, kinesis):
    name = stream_name("k-life")
    kinesis.create_stream(StreamName=name, ShardCount=3)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    summary = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
    assert summary["StreamStatus"] == "ACTIVE" and summary["OpenShardCount"] == 3
    assert summary["StreamARN"] == f"arn:aws:kinesis:us-east-1:000000000000:stream/{name}"
    described = kinesis.describe_stream(StreamName=name)["StreamDescription"]
    shards = described["Shards"]
    assert [s["ShardId"] for s in shards] == [f"shardId-{i:012d}" for i in range(3)]
    assert shards[0]["HashKeyRange"]["StartingHashKey"] == "0"
    assert shards[-1]["HashKeyRange"]["EndingHashKey"] == str(2 ** 128 - 1)
    assert int(shards[1]["HashKeyRange"]["StartingHashKey"]) == int(shards[0]["HashKeyRange"]["EndingHashKey"]) + 1
    names = [n for page in kinesis.get_paginator("list_streams").paginate(PaginationConfig={"PageSize": 1})
             for n in page["StreamNames"]]
    assert name in names and len(names) == len(set(names))
    listed = [s["ShardId"] for page in kinesis.get_paginator("list_shards").paginate(
        StreamName=name, PaginationConfig={"PageSize": 2}) for s in page["Shards"]]
    assert listed == [s["ShardId"] for s in shards]
    by_arn = kinesis.describe_stream_summary(StreamARN=summary["StreamARN"])["StreamDescriptionSummary"]
    assert by_arn["StreamName"] == name
    with pytest.raises(ClientError) as e:
        kinesis.create_stream(StreamName=name, ShardCount=1)
    assert e.value.response["Error"]["Code"] == "ResourceInUseException"
    kinesis.delete_stream(StreamName=name)
    with pytest.raises(kinesis.exceptions.ResourceNotFoundException):
        kinesis.describe_stream_summary(StreamName=name)


def test_records_go_both_ways_between_boto3_and_the_native_client(cluster, kinesis):
    name = stream_name("k-records")
    kinesis.create_stream(StreamName=name, ShardCount=2)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    sent = [(f"key-{i}", f"value {i}".encode() + bytes(range(256))) for i in range(600)]
    acked = {}
    for start in range(0, len(sent), 500):
        answer = kinesis.put_records(StreamName=name, Records=[{"PartitionKey": k, "Data": d}
                                                               for k, d in sent[start:start + 500]])
        assert answer["FailedRecordCount"] == 0
        for (k, _d), r in zip(sent[start:start + 500], answer["Records"]):
            acked[k] = (r["ShardId"], r["SequenceNumber"])
    one = kinesis.put_record(StreamName=name, PartitionKey="single", Data=b"one", ExplicitHashKey="0")
    assert one["ShardId"] == "shardId-000000000000"
    with sms.Client(cluster.address) as native:
        native.put_record(name, b"from the native client", "native")
        got = {}
        for record in native.read_stream(name):
            got[record.partition_key] = (record.partition_ordinal, record.sequence_number, record.data)
    assert all(got[k][1] == acked[k][1] and got[k][2] == d for k, d in sent)
    assert got["single"][2] == b"one"
    read = {}
    for shard in kinesis.list_shards(StreamName=name)["Shards"]:
        iterator = kinesis.get_shard_iterator(StreamName=name, ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            page = kinesis.get_records(ShardIterator=iterator, Limit=250)
            for r in page["Records"]:
                read[r["PartitionKey"]] = (shard["ShardId"], r["SequenceNumber"], r["Data"])
                assert r["ApproximateArrivalTimestamp"].year >= 2024
            iterator = page.get("NextShardIterator") if page["Records"] else None
    assert all(read[k] == (acked[k][0], acked[k][1], d) for k, d in sent)
    assert read["native"][2] == b"from the native client"
    first = read["key-0"]
    at = kinesis.get_shard_iterator(StreamName=name, ShardId=first[0], ShardIteratorType="AT_SEQUENCE_NUMBER",
                                    StartingSequenceNumber=first[1])["ShardIterator"]
    assert kinesis.get_records(ShardIterator=at, Limit=1)["Records"][0]["SequenceNumber"] == first[1]


def test_a_wrong_signature_an_unknown_key_and_a_key_of_another_stream_are_refused(cluster, kinesis):
    with pytest.raises(ClientError) as e:
        kinesis_client(cluster, secret="not the secret of this key at all").list_streams()
    assert e.value.response["Error"]["Code"] == "InvalidSignatureException"
    unknown = "sms_" + "0" * 16 + "_" + "x" * 43
    with pytest.raises(ClientError) as e:
        kinesis_client(cluster, token=unknown).list_streams()
    assert e.value.response["Error"]["Code"] == "UnrecognizedClientException"
    mine, other = stream_name("k-mine"), stream_name("k-other")
    for name in (mine, other):
        kinesis.create_stream(StreamName=name, ShardCount=1)
    with sms.Client(cluster.address) as admin:
        _info, token = admin.create_key("producer", streams=[mine], name="kinesis test")
    producer = kinesis_client(cluster, token=token)
    assert producer.put_record(StreamName=mine, PartitionKey="k", Data=b"ok")["SequenceNumber"]
    with pytest.raises(ClientError) as e:
        producer.put_record(StreamName=other, PartitionKey="k", Data=b"no")
    assert e.value.response["Error"]["Code"] == "AccessDeniedException"
    with pytest.raises(ClientError) as e:
        producer.delete_stream(StreamName=mine)
    assert e.value.response["Error"]["Code"] == "AccessDeniedException"


def test_bad_input_gets_named_errors(cluster, kinesis):
    with pytest.raises(kinesis.exceptions.ResourceNotFoundException):
        kinesis.put_record(StreamName=stream_name("k-none"), PartitionKey="k", Data=b"x")
    name = stream_name("k-bad")
    kinesis.create_stream(StreamName=name, ShardCount=1)
    with pytest.raises(kinesis.exceptions.ResourceNotFoundException):
        kinesis.get_shard_iterator(StreamName=name, ShardId="shardId-000000000009", ShardIteratorType="LATEST")
    with pytest.raises(ClientError) as e:
        kinesis.get_records(ShardIterator="not-an-iterator")
    assert e.value.response["Error"]["Code"] == "InvalidArgumentException"
    with pytest.raises(ClientError) as e:
        kinesis.get_resource_policy(ResourceARN=kinesis.describe_stream_summary(StreamName=name)[
            "StreamDescriptionSummary"]["StreamARN"])
    assert e.value.response["Error"]["Code"] == "InvalidArgumentException"
    assert "resource policies are not kept" in e.value.response["Error"]["Message"]


def _read_shard(kinesis, name: str, shard_id: str) -> tuple[list[dict], list[dict]]:
    """Every record of a shard from its start, and the children its end names."""
    iterator = kinesis.get_shard_iterator(StreamName=name, ShardId=shard_id,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    records, children = [], []
    while iterator:
        page = kinesis.get_records(ShardIterator=iterator)
        records += page["Records"]
        children = page.get("ChildShards", children)
        iterator = page.get("NextShardIterator") if (page["Records"] or "NextShardIterator" not in page) else None
    return records, children


def test_a_reader_follows_splits_and_merges_through_child_shards(cluster, kinesis):
    name = stream_name("k-reshard")
    kinesis.create_stream(StreamName=name, ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    kinesis.put_records(StreamName=name, Records=[{"PartitionKey": f"a{i}", "Data": b"before"} for i in range(50)])
    kinesis.split_shard(StreamName=name, ShardToSplit="shardId-000000000000", NewStartingHashKey=str(2 ** 127))
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    shards = {s["ShardId"]: s for s in kinesis.list_shards(StreamName=name)["Shards"]}
    assert set(shards) == {"shardId-000000000000", "shardId-000000000001", "shardId-000000000002"}
    assert shards["shardId-000000000001"]["ParentShardId"] == "shardId-000000000000"
    assert "EndingSequenceNumber" in shards["shardId-000000000000"]["SequenceNumberRange"]
    kinesis.put_records(StreamName=name, Records=[{"PartitionKey": f"b{i}", "Data": b"after"} for i in range(50)])
    records, children = _read_shard(kinesis, name, "shardId-000000000000")
    assert len(records) == 50 and {c["ShardId"] for c in children} == {"shardId-000000000001",
                                                                        "shardId-000000000002"}
    assert all(c["ParentShards"] == ["shardId-000000000000"] for c in children)
    after = sum(len(_read_shard(kinesis, name, c["ShardId"])[0]) for c in children)
    assert after == 50
    kinesis.merge_shards(StreamName=name, ShardToMerge="shardId-000000000001",
                         AdjacentShardToMerge="shardId-000000000002")
    open_now = kinesis.list_shards(StreamName=name, ShardFilter={"Type": "AT_LATEST"})["Shards"]
    assert [s["ShardId"] for s in open_now] == ["shardId-000000000003"]
    assert {open_now[0]["ParentShardId"], open_now[0]["AdjacentParentShardId"]} == {"shardId-000000000001",
                                                                                     "shardId-000000000002"}
    scaled = kinesis.update_shard_count(StreamName=name, TargetShardCount=2, ScalingType="UNIFORM_SCALING")
    assert (scaled["CurrentShardCount"], scaled["TargetShardCount"]) == (1, 2)
    summary = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
    assert summary["OpenShardCount"] == 2


def test_consumers_and_retention_through_the_endpoint(cluster, kinesis):
    name = stream_name("k-consumers")
    kinesis.create_stream(StreamName=name, ShardCount=1)
    arn = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamARN"]
    consumer = kinesis.register_stream_consumer(StreamARN=arn, ConsumerName="reader")["Consumer"]
    assert consumer["ConsumerARN"].startswith(arn + "/consumer/reader:")
    with pytest.raises(kinesis.exceptions.ResourceInUseException):
        kinesis.register_stream_consumer(StreamARN=arn, ConsumerName="reader")
    described = kinesis.describe_stream_consumer(ConsumerARN=consumer["ConsumerARN"])["ConsumerDescription"]
    assert described["ConsumerName"] == "reader" and described["StreamARN"] == arn
    assert [c["ConsumerName"] for c in kinesis.list_stream_consumers(StreamARN=arn)["Consumers"]] == ["reader"]
    kinesis.deregister_stream_consumer(StreamARN=arn, ConsumerName="reader")
    assert kinesis.list_stream_consumers(StreamARN=arn)["Consumers"] == []
    with pytest.raises(kinesis.exceptions.ResourceNotFoundException):
        kinesis.describe_stream_consumer(StreamARN=arn, ConsumerName="reader")
    kinesis.increase_stream_retention_period(StreamName=name, RetentionPeriodHours=48)
    assert kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["RetentionPeriodHours"] == 48
    with pytest.raises(kinesis.exceptions.InvalidArgumentException):
        kinesis.increase_stream_retention_period(StreamName=name, RetentionPeriodHours=24)
    kinesis.decrease_stream_retention_period(StreamName=name, RetentionPeriodHours=24)
    assert kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["RetentionPeriodHours"] == 24


def _cbor_call(cluster, operation: str, body: dict) -> tuple[int, dict]:
    """One request as the Java SDK sends it: CBOR 1.1, signed with botocore's SigV4 signer."""
    import ssl
    import urllib.request

    import cbor2
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    key_id, secret = security.aws_credentials(cluster.admin_token)
    request = AWSRequest(method="POST", url=cluster.kinesis_endpoint + "/", data=cbor2.dumps(body),
                         headers={"Content-Type": "application/x-amz-cbor-1.1",
                                  "X-Amz-Target": f"Kinesis_20131202.{operation}"})
    SigV4Auth(Credentials(key_id, secret), "kinesis", "us-east-1").add_auth(request)
    prepared = request.prepare()
    http = urllib.request.Request(prepared.url, data=prepared.body, method="POST", headers=dict(prepared.headers))
    context = ssl.create_default_context(cafile=cluster.ca_file)
    try:
        with urllib.request.urlopen(http, context=context, timeout=30) as answer:
            assert answer.headers["Content-Type"] == "application/x-amz-cbor-1.1"
            return answer.status, cbor2.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, cbor2.loads(e.read())


def test_a_cbor_client_puts_and_gets_records(cluster, kinesis):
    name = stream_name("k-cbor")
    kinesis.create_stream(StreamName=name, ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    status, put = _cbor_call(cluster, "PutRecords", {"StreamName": name, "Records": [
        {"PartitionKey": f"k{i}", "Data": bytes([i]) * 10} for i in range(20)]})
    assert status == 200 and put["FailedRecordCount"] == 0 and len(put["Records"]) == 20
    status, it = _cbor_call(cluster, "GetShardIterator", {"StreamName": name, "ShardId": "shardId-000000000000",
                                                          "ShardIteratorType": "TRIM_HORIZON"})
    status, page = _cbor_call(cluster, "GetRecords", {"ShardIterator": it["ShardIterator"]})
    assert status == 200 and [r["Data"] for r in page["Records"]] == [bytes([i]) * 10 for i in range(20)]
    assert isinstance(page["Records"][0]["Data"], bytes)                        # a byte string, not base64
    assert page["Records"][0]["ApproximateArrivalTimestamp"].year >= 2024     # a tag-1 time
    status, error = _cbor_call(cluster, "DescribeStreamSummary", {"StreamName": stream_name("k-cbor-none")})
    assert status == 400 and error["__type"] == "ResourceNotFoundException"


def test_subscribe_to_shard_pushes_records_as_they_are_put(cluster, kinesis):
    import threading
    import time
    name = stream_name("k-push")
    kinesis.create_stream(StreamName=name, ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    arn = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamARN"]
    consumer = kinesis.register_stream_consumer(StreamARN=arn, ConsumerName="pushed")["Consumer"]["ConsumerARN"]
    answer = kinesis.subscribe_to_shard(ConsumerARN=consumer, ShardId="shardId-000000000000",
                                        StartingPosition={"Type": "LATEST"})
    got, continuations = [], []
    sent_at: dict[str, float] = {}

    def put() -> None:
        for i in range(30):
            sent_at[f"p{i}"] = time.monotonic()
            kinesis.put_record(StreamName=name, PartitionKey=f"p{i}", Data=f"pushed {i}".encode())

    writer = threading.Thread(target=put)
    writer.start()
    deadline = time.monotonic() + 60
    for event in answer["EventStream"]:
        shard_event = event["SubscribeToShardEvent"]
        got += [(r["PartitionKey"], r["Data"]) for r in shard_event["Records"]]
        continuations.append(shard_event["ContinuationSequenceNumber"])
        if len(got) >= 30 or time.monotonic() > deadline:
            break
    writer.join()
    answer["EventStream"].close()
    assert got == [(f"p{i}", f"pushed {i}".encode()) for i in range(30)]
    assert int(continuations[-1]) > 0

    def resubscribe():
        try:
            return kinesis.subscribe_to_shard(ConsumerARN=consumer, ShardId="shardId-000000000000",
                                              StartingPosition={"Type": "AT_SEQUENCE_NUMBER",
                                                                "SequenceNumber": continuations[-1]})
        except kinesis.exceptions.ResourceInUseException:
            return None          # the node has not yet seen the first subscription's connection close
    again = wait_until(resubscribe, 30, "a second subscription once the first was closed")
    first = next(iter(again["EventStream"]))["SubscribeToShardEvent"]["Records"]
    assert first and first[0]["PartitionKey"] == "p29"
    with pytest.raises(kinesis.exceptions.ResourceInUseException):     # one subscription per consumer and shard
        kinesis.subscribe_to_shard(ConsumerARN=consumer, ShardId="shardId-000000000000",
                                   StartingPosition={"Type": "LATEST"})

    def take_over():
        try:
            return kinesis.subscribe_to_shard(ConsumerARN=consumer, ShardId="shardId-000000000000",
                                              StartingPosition={"Type": "LATEST"})
        except kinesis.exceptions.ResourceInUseException:
            return None          # within 5 s of the last one's start (KINESIS_SUBSCRIPTION_TAKEOVER_S)
    third = wait_until(take_over, 30, "a subscription taking over after KINESIS_SUBSCRIPTION_TAKEOVER_S")
    with pytest.raises(EventStreamError) as ended:                     # the one taken over ends, as with Kinesis
        for _event in again["EventStream"]:
            pass
    assert ended.value.response["Error"]["Code"] == "ResourceInUseException"
    third["EventStream"].close()
    again["EventStream"].close()
    with pytest.raises(kinesis.exceptions.ResourceNotFoundException):
        kinesis.subscribe_to_shard(ConsumerARN=arn + "/consumer/nobody:1", ShardId="shardId-000000000000",
                                   StartingPosition={"Type": "LATEST"})


def test_tags_are_kept_listed_and_removed(cluster, kinesis):
    name = stream_name("k-tags")
    kinesis.create_stream(StreamName=name, ShardCount=1, Tags={"team": "clicks", "env": "test"})
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    arn = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamARN"]
    assert kinesis.list_tags_for_stream(StreamName=name)["Tags"] == [{"Key": "env", "Value": "test"},
                                                                     {"Key": "team", "Value": "clicks"}]
    kinesis.add_tags_to_stream(StreamName=name, Tags={f"k{i}": str(i) for i in range(10)})
    first = kinesis.list_tags_for_stream(StreamName=name, Limit=5)
    assert first["HasMoreTags"] and [t["Key"] for t in first["Tags"]] == ["env", "k0", "k1", "k2", "k3"]
    rest = kinesis.list_tags_for_stream(StreamName=name, ExclusiveStartTagKey="k3")
    assert not rest["HasMoreTags"] and [t["Key"] for t in rest["Tags"]][-1] == "team"
    kinesis.remove_tags_from_stream(StreamName=name, TagKeys=["env"] + [f"k{i}" for i in range(10)])
    kinesis.tag_resource(ResourceARN=arn, Tags={"owner": "data platform"})
    kinesis.untag_resource(ResourceARN=arn, TagKeys=["team"])
    assert kinesis.list_tags_for_resource(ResourceARN=arn)["Tags"] == [{"Key": "owner", "Value": "data platform"}]
    with sms.Client(cluster.address) as native:
        assert dict(native.get_stream_info(name).tags) == {"owner": "data platform"}     # the engine's own
    for bad, code in (({"aws:reserved": "x"}, "InvalidArgumentException"),
                      ({f"t{i}": "x" for i in range(11)}, "InvalidArgumentException"),
                      ({"bad\u0000key": "x"}, "InvalidArgumentException")):
        with pytest.raises(ClientError) as e:
            kinesis.add_tags_to_stream(StreamName=name, Tags=bad)
        assert e.value.response["Error"]["Code"] == code, bad
    consumer = kinesis.register_stream_consumer(StreamARN=arn, ConsumerName="tagged")["Consumer"]["ConsumerARN"]
    with pytest.raises(kinesis.exceptions.InvalidArgumentException):
        kinesis.tag_resource(ResourceARN=consumer, Tags={"a": "b"})
    assert kinesis.list_tags_for_resource(ResourceARN=arn)["Tags"] == [{"Key": "owner", "Value": "data platform"}]
    with pytest.raises(ClientError) as e:
        kinesis.create_stream(StreamName=stream_name("k-tags-bad"), ShardCount=1, Tags={"aws:x": "y"})
    assert e.value.response["Error"]["Code"] == "InvalidArgumentException"
    with pytest.raises(kinesis.exceptions.ResourceNotFoundException):      # nothing made
        kinesis.describe_stream_summary(StreamName=stream_name("k-tags-bad"))


def test_stream_mode_monitoring_record_size_stream_id_and_account_settings(cluster, kinesis):
    name = stream_name("k-settings")
    kinesis.create_stream(StreamName=name, ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    summary = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
    arn, stream_id = summary["StreamARN"], summary["StreamId"]
    assert summary["StreamModeDetails"] == {"StreamMode": "PROVISIONED"} and summary["MaxRecordSizeInKiB"] == 1024
    kinesis.update_stream_mode(StreamARN=arn, StreamModeDetails={"StreamMode": "ON_DEMAND"})
    with sms.Client(cluster.address) as native:
        assert native.get_stream_info(name).auto_split_records_per_s > 0        # the engine's auto-split
    assert kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"][
        "StreamModeDetails"] == {"StreamMode": "ON_DEMAND"}
    kinesis.update_stream_mode(StreamARN=arn, StreamModeDetails={"StreamMode": "PROVISIONED"})
    assert kinesis.describe_stream_summary(StreamARN=arn)["StreamDescriptionSummary"][
        "StreamModeDetails"] == {"StreamMode": "PROVISIONED"}
    on = kinesis.enable_enhanced_monitoring(StreamName=name, ShardLevelMetrics=["IncomingBytes", "OutgoingRecords"])
    assert on["CurrentShardLevelMetrics"] == [] and on["DesiredShardLevelMetrics"] == ["IncomingBytes",
                                                                                       "OutgoingRecords"]
    off = kinesis.disable_enhanced_monitoring(StreamName=name, ShardLevelMetrics=["IncomingBytes"])
    assert off["DesiredShardLevelMetrics"] == ["OutgoingRecords"]
    assert kinesis.describe_stream(StreamName=name)["StreamDescription"]["EnhancedMonitoring"] == [
        {"ShardLevelMetrics": ["OutgoingRecords"]}]
    all_on = kinesis.enable_enhanced_monitoring(StreamName=name, ShardLevelMetrics=["ALL"])
    assert len(all_on["DesiredShardLevelMetrics"]) == 7
    kinesis.update_max_record_size(StreamARN=arn, MaxRecordSizeInKiB=1024)
    with pytest.raises(kinesis.exceptions.InvalidArgumentException):
        kinesis.update_max_record_size(StreamARN=arn, MaxRecordSizeInKiB=2048)
    # a StreamId names the stream alone, and must agree with a name given beside it (through a
    # signed request of our own: botocore's endpoint rules send a call with a StreamId to AWS's
    # own host, whatever endpoint_url says)
    status, found = _cbor_call(cluster, "DescribeStreamSummary", {"StreamId": stream_id})
    assert status == 200 and found["StreamDescriptionSummary"]["StreamName"] == name
    status, put = _cbor_call(cluster, "PutRecord", {"StreamId": stream_id, "PartitionKey": "by-id", "Data": b"x"})
    assert status == 200 and put["ShardId"] == "shardId-000000000000"
    for wrong in ({"StreamName": name, "StreamId": "a" * 20 + "-aaa"}, {"StreamId": "b" * 20 + "-bbb"}):
        status, error = _cbor_call(cluster, "DescribeStreamSummary", wrong)
        assert status == 400 and error["__type"] == "ResourceNotFoundException", wrong
    assert kinesis.describe_account_settings()["MinimumThroughputBillingCommitment"]["Status"] == "DISABLED"
    with pytest.raises(kinesis.exceptions.InvalidArgumentException) as e:
        kinesis.update_account_settings(MinimumThroughputBillingCommitment={"Status": "ENABLED"})
    assert "billing" in str(e.value)
    kinesis.update_stream_record_distribution_strategy(StreamARN=arn, RecordDistributionStrategy="USER_PARTITION_KEY")
    with pytest.raises(kinesis.exceptions.InvalidArgumentException):
        kinesis.update_stream_record_distribution_strategy(StreamARN=arn, RecordDistributionStrategy="AUTO")


def test_an_on_demand_stream_with_tags_is_made_whole_in_one_step(cluster, kinesis):
    """CreateStream's tags and ON_DEMAND mode are part of the stream from its first moment
    (one metadata write): the native client sees them as soon as the stream exists."""
    name = stream_name("k-whole")
    kinesis.create_stream(StreamName=name, StreamModeDetails={"StreamMode": "ON_DEMAND"}, Tags={"made": "whole"})
    with sms.Client(cluster.address) as native:
        info = native.get_stream_info(name)
        assert dict(info.tags) == {"made": "whole"} and info.auto_split_records_per_s > 0
        with pytest.raises(sms.errors.InvalidStreamConfig):
            native.create_stream(stream_name("k-whole-bad"), partitions=1, tags={"aws:no": "x"})
        assert stream_name("k-whole-bad") not in native.list_streams()
