"""kinesis/protocol.py against botocore's own serializer and parser: what botocore sends
decodes to the same input, what the endpoint answers botocore parses to the same output,
and input the model forbids gets the service's errors, by name."""

from __future__ import annotations

import base64
import datetime
import json

import pytest

botocore = pytest.importorskip("botocore")
import cbor2  # noqa: E402
from botocore.parsers import create_parser  # noqa: E402
from botocore.serialize import create_serializer  # noqa: E402

from kinesis import protocol  # noqa: E402
from kinesis.protocol import KinesisError  # noqa: E402

CASES = [
    ("CreateStream", {"StreamName": "clicks", "ShardCount": 4}),
    ("CreateStream", {"StreamName": "od", "StreamModeDetails": {"StreamMode": "ON_DEMAND"},
                      "Tags": {"team": "web"}}),
    ("PutRecord", {"StreamName": "clicks", "Data": b"\x00\xffhello", "PartitionKey": "k",
                   "ExplicitHashKey": "340282366920938463463374607431768211455", "SequenceNumberForOrdering": "1"}),
    ("PutRecords", {"StreamName": "clicks", "Records": [{"Data": b"a" * 10, "PartitionKey": f"k{i}"}
                                                        for i in range(500)]}),
    ("GetShardIterator", {"StreamName": "clicks", "ShardId": "shardId-000000000000", "ShardIteratorType":
                          "AT_TIMESTAMP", "Timestamp": datetime.datetime(2026, 12, 4, 10, 0, 0, 250000,
                                                                          tzinfo=datetime.timezone.utc)}),
    ("ListShards", {"StreamName": "clicks", "ShardFilter": {"Type": "AT_LATEST"}, "MaxResults": 100}),
    ("GetRecords", {"ShardIterator": "abc", "Limit": 10000}),
]


def _botocore_request(name: str, params: dict) -> tuple:
    operation = protocol.model().operation_model(name)
    request = create_serializer("json").serialize_to_request(params, operation)
    return operation, request["body"] if isinstance(request["body"], bytes) else request["body"].encode(), \
        request["headers"]


def _plain(value):
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@pytest.mark.parametrize("name,params", CASES, ids=[c[0] for c in CASES])
def test_what_botocore_sends_decodes_to_its_input_in_json_and_cbor(name, params):
    operation, body, headers = _botocore_request(name, params)
    assert headers["X-Amz-Target"] == f"Kinesis_20131202.{name}"
    assert protocol.operation_of(headers["X-Amz-Target"]) == operation
    assert protocol.media_type(headers["Content-Type"]) == protocol.CONTENT_JSON
    assert _plain(protocol.decode(operation, body, protocol.CONTENT_JSON)) == _plain(params)
    cbor = cbor2.dumps(params, datetime_as_timestamp=True)             # as a CBOR client encodes it
    assert _plain(protocol.decode(operation, cbor, protocol.CONTENT_CBOR)) == _plain(params)


def test_answers_parse_in_botocore_as_they_were_meant():
    operation = protocol.model().operation_model("GetRecords")
    when = datetime.datetime(2026, 12, 4, 10, 0, 0, 500000, tzinfo=datetime.timezone.utc)
    answer = {"Records": [{"SequenceNumber": "123", "ApproximateArrivalTimestamp": when, "Data": b"\x01\x02",
                           "PartitionKey": "k"}], "NextShardIterator": "it", "MillisBehindLatest": 0,
              "ChildShards": None}
    body = protocol.encode(operation, answer, protocol.CONTENT_JSON)
    parsed = create_parser("json").parse({"body": body, "headers": {}, "status_code": 200}, operation.output_shape)
    record = parsed["Records"][0]
    assert record["Data"] == b"\x01\x02" and record["ApproximateArrivalTimestamp"] == when
    assert parsed["NextShardIterator"] == "it" and "ChildShards" not in parsed
    decoded = cbor2.loads(protocol.encode(operation, answer, protocol.CONTENT_CBOR))
    assert decoded["Records"][0]["Data"] == b"\x01\x02"
    assert decoded["Records"][0]["ApproximateArrivalTimestamp"] == when


def test_errors_parse_in_botocore_with_their_type_and_message():
    error = KinesisError("ResourceNotFoundException", "Stream clicks under account 000000000000 not found.")
    body = protocol.encode_error(error, protocol.CONTENT_JSON)
    parsed = create_parser("json").parse({"body": body, "headers": {}, "status_code": 400}, None)
    assert parsed["Error"]["Code"] == "ResourceNotFoundException" and "not found" in parsed["Error"]["Message"]


@pytest.mark.parametrize("name,params,fragment", [
    ("CreateStream", {"StreamName": "a b", "ShardCount": 1},
     "Value 'a b' at 'streamName' failed to satisfy constraint: Member must satisfy regular expression pattern"),
    ("CreateStream", {"StreamName": "x" * 129}, "Member must have length less than or equal to 128"),
    ("CreateStream", {"StreamName": "s", "ShardCount": 0}, "Member must have value greater than or equal to 1"),
    ("PutRecords", {"StreamName": "s", "Records": []}, "Member must have length greater than or equal to 1"),
    ("PutRecords", {"StreamName": "s", "Records": [{"Data": "", "PartitionKey": ""}]},
     "at 'records.1.member.partitionKey' failed to satisfy constraint: Member must have length greater than"),
    ("PutRecord", {"StreamName": "s", "Data": "", "PartitionKey": "k", "ExplicitHashKey": "-1"},
     "at 'explicitHashKey' failed to satisfy constraint: Member must satisfy regular expression pattern"),
    ("GetShardIterator", {"StreamName": "s", "ShardId": "shardId-000000000000", "ShardIteratorType": "NOW"},
     "Member must satisfy enum value set: [AT_SEQUENCE_NUMBER"),
    ("PutRecord", {"StreamName": "s", "PartitionKey": "k"},
     "Value null at 'data' failed to satisfy constraint: Member must not be null"),
])
def test_input_the_model_forbids_is_a_validation_exception(name, params, fragment):
    operation = protocol.model().operation_model(name)
    with pytest.raises(KinesisError) as e:
        protocol.decode(operation, json.dumps(params).encode(), protocol.CONTENT_JSON)
    assert e.value.kind == "ValidationException" and e.value.status == 400
    assert e.value.message.startswith(("1 validation error detected: ", "2 validation errors detected: "))
    assert fragment in e.value.message, e.value.message


@pytest.mark.parametrize("body,content", [
    (b"{not json", protocol.CONTENT_JSON), (b"[1, 2]", protocol.CONTENT_JSON), (b"\xff\x00", protocol.CONTENT_CBOR),
    (json.dumps({"StreamName": 5}).encode(), protocol.CONTENT_JSON),
    (json.dumps({"StreamName": "s", "ShardCount": "4"}).encode(), protocol.CONTENT_JSON),
    (json.dumps({"StreamName": "s", "ShardCount": 1.5}).encode(), protocol.CONTENT_JSON),
    (b"[" * 100_000 + b"]" * 100_000, protocol.CONTENT_JSON),
    (json.dumps({"StreamName": "s", "Tags": {"a": {"b": [1] * 3}}}).encode(), protocol.CONTENT_JSON),
])
def test_bodies_of_the_wrong_form_are_a_serialization_exception(body, content):
    operation = protocol.model().operation_model("CreateStream")
    with pytest.raises(KinesisError) as e:
        protocol.decode(operation, body, content)
    assert e.value.kind == "SerializationException", e.value


def test_bad_targets_and_content_types_are_named():
    for target in (None, "", "DynamoDB_20120810.PutItem", "Kinesis_20131202.NoSuchThing"):
        with pytest.raises(KinesisError) as e:
            protocol.operation_of(target)
        assert e.value.kind == "UnknownOperationException"
    with pytest.raises(KinesisError) as e:
        protocol.media_type("text/plain")
    assert e.value.kind == "UnsupportedMediaTypeException" and e.value.status == 415
    assert protocol.media_type("application/x-amz-cbor-1.1") == protocol.CONTENT_CBOR


def test_a_blob_that_is_not_base64_is_refused():
    operation = protocol.model().operation_model("PutRecord")
    body = json.dumps({"StreamName": "s", "PartitionKey": "k", "Data": "not base64!"}).encode()
    with pytest.raises(KinesisError) as e:
        protocol.decode(operation, body, protocol.CONTENT_JSON)
    assert e.value.kind == "SerializationException"
    fine = json.dumps({"StreamName": "s", "PartitionKey": "k", "Data": base64.b64encode(b"ok").decode()}).encode()
    assert protocol.decode(operation, fine, protocol.CONTENT_JSON)["Data"] == b"ok"
