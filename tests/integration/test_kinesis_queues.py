"""The Kinesis queue operations through the real boto3 (botocore validating every request and
parsing every answer) on a TLS cluster signing with SigV4 (issue 34; kinesis/queues.py):
create, describe, list, update and delete a queue; receive, acknowledge and change the
visibility of records; dead letters received, refused to the main calls, restored and
acknowledged; what a forged handle and a wrong ARN get."""

from __future__ import annotations

import time

import pytest

boto3 = pytest.importorskip("boto3")
from botocore.exceptions import ClientError  # noqa: E402

from tests.conftest import wait_until  # noqa: E402
from tests.integration.test_kinesis_boto3 import kinesis_client  # noqa: E402

pytestmark = pytest.mark.integration

ACCOUNT = "000000000000"


@pytest.fixture(scope="module")
def kinesis(cluster):
    return kinesis_client(cluster)


def _stream(kinesis, name: str, shards: int = 2) -> str:
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    return f"arn:aws:kinesis:us-east-1:{ACCOUNT}:stream/{name}"


def _receive_all(kinesis, arn: str, want: int) -> list[dict]:
    got: list[dict] = []
    deadline = time.monotonic() + 60
    while len(got) < want and time.monotonic() < deadline:
        got += kinesis.receive_queue_records(QueueARN=arn, Limit=10, WaitTimeSeconds=2)["QueueRecords"]
    return got


def test_a_queue_through_boto3(kinesis):
    stream_arn = _stream(kinesis, "kq-orders")
    made = kinesis.create_queue(
        QueueName="kq-fulfil",
        StreamConfigurationList=[{"StreamARN": stream_arn, "StartingPosition": {"Type": "TRIM_HORIZON"}}],
        QueueAttributes={"VisibilityTimeoutSeconds": 2,
                         "DeadLetterConfiguration": {"TargetType": "BUILT_IN", "MaxReceiveCount": 2}})["QueueDescription"]
    arn = made["QueueARN"]
    assert arn == f"arn:aws:kinesis:us-east-1:{ACCOUNT}:queue/kq-fulfil"
    assert made["QueueStatus"] == "ACTIVE" and made["StreamConfigurationList"][0]["StreamARN"] == stream_arn
    assert made["QueueAttributes"] == {"VisibilityTimeoutSeconds": 2, "DeadLetterConfiguration": {
        "TargetType": "BUILT_IN", "MaxReceiveCount": 2}}
    assert kinesis.describe_queue(QueueARN=arn)["QueueDescription"]["QueueName"] == "kq-fulfil"
    listed = kinesis.list_queues(StreamFilter=[{"StreamARN": stream_arn}])["QueueSummaries"]
    assert [(q["QueueName"], q["Streams"][0]["StreamARN"]) for q in listed] == [("kq-fulfil", stream_arn)]

    kinesis.put_records(StreamName="kq-orders", Records=[{"PartitionKey": f"k{i}", "Data": b"order-%d" % i}
                                                         for i in range(15)])
    got = _receive_all(kinesis, arn, 15)
    assert sorted(r["Data"] for r in got) == sorted(b"order-%d" % i for i in range(15))
    assert all(r["ReceiveCount"] == 1 and r["FirstReceiveTimestamp"] >= r["ApproximateArrivalTimestamp"]
               for r in got)
    keep = [r for r in got if r["Data"] != b"order-0"]
    for start in range(0, len(keep), 10):
        answer = kinesis.acknowledge_queue_records(QueueARN=arn, Entries=[
            {"ReceiptHandle": r["ReceiptHandle"]} for r in keep[start:start + 10]])
        assert answer["Failed"] == [] and len(answer["Successful"]) == len(keep[start:start + 10])
    # order-0 is never acked: back after 2 s, then a dead letter after its second receive
    poison = [r for r in got if r["Data"] == b"order-0"][0]
    again = _receive_all(kinesis, arn, 1)
    assert [(r["Data"], r["ReceiveCount"], r["RecordId"]) for r in again] == [(b"order-0", 2, poison["RecordId"])]
    moved = kinesis.update_queue_records_visibility(QueueARN=arn, Entries=[
        {"ReceiptHandle": again[0]["ReceiptHandle"], "VisibilityTimeoutSeconds": 0},
        {"ReceiptHandle": poison["ReceiptHandle"], "VisibilityTimeoutSeconds": 5}])
    assert [s["ReceiptHandle"] for s in moved["Successful"]] == [again[0]["ReceiptHandle"]]
    assert [f["ErrorCode"] for f in moved["Failed"]] == ["ReceiptHandleExpired"]
    dead = wait_until(lambda: kinesis.receive_dead_letter_queue_records(QueueARN=arn, WaitTimeSeconds=1)[
        "QueueRecords"], 20, "order-0 as a dead letter")
    assert [(r["Data"], r["ReceiveCount"]) for r in dead] == [(b"order-0", 2)]
    refused = kinesis.acknowledge_queue_records(QueueARN=arn, Entries=[{"ReceiptHandle": dead[0]["ReceiptHandle"]}])
    assert [f["ErrorCode"] for f in refused["Failed"]] == ["InvalidDeadLetterHandle"]
    assert kinesis.update_dead_letter_queue_records_visibility(QueueARN=arn, Entries=[
        {"ReceiptHandle": dead[0]["ReceiptHandle"], "VisibilityTimeoutSeconds": 60}])["Failed"] == []
    restored = kinesis.restore_dead_letter_queue_records(QueueARN=arn, Entries=[
        {"ReceiptHandle": dead[0]["ReceiptHandle"]}])
    assert restored["Failed"] == []
    back = _receive_all(kinesis, arn, 1)
    assert [(r["Data"], r["ReceiveCount"]) for r in back] == [(b"order-0", 1)]
    assert kinesis.acknowledge_queue_records(QueueARN=arn, Entries=[
        {"ReceiptHandle": back[0]["ReceiptHandle"]}])["Failed"] == []

    updated = kinesis.update_queue(QueueARN=arn, QueueAttributes={
        "VisibilityTimeoutSeconds": 30, "DeadLetterConfiguration": {"TargetType": "NONE"}})["QueueDescription"]
    assert updated["QueueAttributes"] == {"VisibilityTimeoutSeconds": 30,
                                          "DeadLetterConfiguration": {"TargetType": "NONE"}}
    with pytest.raises(ClientError) as e:
        kinesis.delete_stream(StreamName="kq-orders")
    assert e.value.response["Error"]["Code"] == "ResourceInUseException"
    kinesis.delete_queue(QueueARN=arn)
    with pytest.raises(kinesis.exceptions.ResourceNotFoundException):
        kinesis.describe_queue(QueueARN=arn)
    kinesis.delete_stream(StreamName="kq-orders")


def test_what_no_honest_client_sends(kinesis):
    stream_arn = _stream(kinesis, "kq-bad", shards=1)
    arn = kinesis.create_queue(QueueName="kq-bad", StreamConfigurationList=[{"StreamARN": stream_arn}])[
        "QueueDescription"]["QueueARN"]
    try:
        forged = kinesis.acknowledge_queue_records(QueueARN=arn, Entries=[{"ReceiptHandle": "forged"}])
        assert [f["ErrorCode"] for f in forged["Failed"]] == ["InvalidArgument"]
        for wrong in (f"arn:aws:kinesis:us-east-1:{ACCOUNT}:queue/no-such-queue",):
            with pytest.raises(kinesis.exceptions.ResourceNotFoundException):
                kinesis.receive_queue_records(QueueARN=wrong)
        with pytest.raises(ClientError) as e:
            kinesis.describe_queue(QueueARN="arn:aws:kinesis:us-east-1:111111111111:queue/kq-bad")
        assert e.value.response["Error"]["Code"] == "AccessDeniedException"
        with pytest.raises(ClientError) as e:
            kinesis.create_queue(QueueName="kq-two", StreamConfigurationList=[
                {"StreamARN": stream_arn}, {"StreamARN": stream_arn}])
        assert e.value.response["Error"]["Code"] == "InvalidArgumentException"
        with pytest.raises(ClientError) as e:
            kinesis.create_queue(QueueName="kq-bad", StreamConfigurationList=[{"StreamARN": stream_arn}])
        assert e.value.response["Error"]["Code"] == "ResourceInUseException"
        with pytest.raises(ClientError) as e:
            kinesis.create_queue(QueueName="kq-nostream", StreamConfigurationList=[
                {"StreamARN": f"arn:aws:kinesis:us-east-1:{ACCOUNT}:stream/no-such-stream"}])
        assert e.value.response["Error"]["Code"] == "ResourceNotFoundException"
    finally:
        kinesis.delete_queue(QueueARN=arn)
        kinesis.delete_stream(StreamName="kq-bad")
