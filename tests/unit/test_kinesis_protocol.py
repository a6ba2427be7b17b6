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


@pytest.mark.parametrize("operation,params,content", [
    ("PutRecords", {"StreamName": "s", "Records": [None]}, protocol.CONTENT_JSON),
    ("CreateStream", {"StreamName": "s", "ShardCount": 1, "Tags": {"k": None}}, protocol.CONTENT_JSON),
    ("CreateStream", {"StreamName": "s", "ShardCount": 1, "Tags": {None: "v"}}, protocol.CONTENT_CBOR),
    ("RemoveTagsFromStream", {"StreamName": "s", "TagKeys": [None]}, protocol.CONTENT_CBOR),
    ("EnableEnhancedMonitoring", {"StreamName": "s", "ShardLevelMetrics": [None]}, protocol.CONTENT_JSON),
    ("CreateStream", {"StreamName": "s", "ShardCount": 10 ** 5000}, protocol.CONTENT_CBOR),
    ("CreateStream", {"StreamName": "s", "ShardCount": -(2 ** 63) - 1}, protocol.CONTENT_CBOR),
    ("GetRecords", {"ShardIterator": "i", "Limit": 2 ** 64}, protocol.CONTENT_JSON),
])
def test_nulls_inside_lists_and_maps_and_integers_past_64_bits_are_refused(operation, params, content):
    """(Both were taken, and a handler then failed on them: an InternalFailure, not a named error.)"""
    body = cbor2.dumps(params) if content == protocol.CONTENT_CBOR else json.dumps(params).encode()
    with pytest.raises(KinesisError) as e:
        protocol.decode(protocol.model().operation_model(operation), body, content)
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


def _sample(shape, rng, depth=0):
    """A value of `shape` as a JSON body holds it: mostly valid, sometimes not (a wrong
    length, type, pattern or enum value, a missing member)."""
    kind, meta = shape.type_name, shape.metadata
    broken = rng.random() < 0.03
    if kind == "structure":
        names = [n for n in shape.members if n in shape.required_members or rng.random() < 0.5]
        if broken and names:
            names.pop()
        return {n: _sample(shape.members[n], rng, depth + 1) for n in names} if depth < 6 else {}
    if kind in ("list", "map"):
        n = rng.choice([meta.get("min", 0), 1, 2, 3, meta.get("min", 0) + 1]) if not broken else meta.get("max", 3) + 1
        n = min(n, 600)
        if kind == "list":
            return [_sample(shape.member, rng, depth + 1) for _ in range(n)]
        return {f"k{i}": _sample(shape.value, rng, depth + 1) for i in range(n)}
    if kind == "string":
        if shape.enum:
            return rng.choice(list(shape.enum)) if not broken else "NOT_IN_ENUM"
        lo, hi = meta.get("min", 0), min(meta.get("max", 20), 20)
        text = "a" * rng.randint(lo, max(lo, hi))
        if meta.get("pattern") and rng.random() < 0.3:
            text = rng.choice(["shardId-000000000001", "0", "arn:aws:kinesis:us-east-1:000000000000:stream/s",
                               "x y", "1" * 20 + "-abc"])
        return 7 if broken and rng.random() < 0.5 else text
    if kind in ("integer", "long"):
        lo, hi = meta.get("min", 0), meta.get("max", 10_000)
        value = rng.randint(lo, hi) if not broken else rng.choice([lo - 1, hi + 1, 2.5, 3.0, True, "1"])
        return value
    if kind == "boolean":
        return rng.choice([True, False]) if not broken else 1
    if kind == "blob":
        return base64.b64encode(bytes(rng.randint(0, 40))).decode() if not broken else "not base64!"
    if kind == "timestamp":
        return rng.choice([1_700_000_000, 1_700_000_000.5, "2026-12-04T10:00:00Z"])
    return None


def test_the_fast_checker_answers_as_the_full_walk_does():
    """Differential: for every operation of the model, over mostly valid and sometimes
    broken inputs, the closures made from the model give the full walk's value exactly when
    the walk finds no fault; on anything else they hand over to the walk."""
    import random
    rng = random.Random(32)
    fast_taken = 0
    for name in protocol.model().operation_names:
        operation = protocol.model().operation_model(name)
        shape = operation.input_shape
        if shape is None:
            continue
        for content in protocol.CONTENT_TYPES:
            for _ in range(40):
                raw = _sample(shape, rng)
                problems: list[str] = []
                try:
                    slow = protocol._check(shape, raw, "x", problems, content, 0)
                except KinesisError:
                    slow, problems = None, ["raised"]
                try:
                    fast = protocol._fast_checker(name, content)(raw)
                except protocol._Slow:
                    continue
                fast_taken += 1
                assert not problems, (name, raw, problems)
                assert fast == slow, (name, raw)
    assert fast_taken > 500           # (the fast path is taken; the rest are faults, timestamps, patterns)


def test_the_compiled_encoder_writes_what_the_walk_writes():
    when = datetime.datetime(2026, 12, 5, tzinfo=datetime.timezone.utc)
    outputs = {
        "GetRecords": {"Records": [{"SequenceNumber": "1", "ApproximateArrivalTimestamp": 1.5, "Data": b"\x00x",
                                    "PartitionKey": "k", "Junk": 1, "EncryptionType": None}],
                       "MillisBehindLatest": 0, "ChildShards": [{"ShardId": "s", "ParentShards": ["a"],
                                                                 "HashKeyRange": {"StartingHashKey": "0",
                                                                                  "EndingHashKey": "1"}}]},
        "PutRecords": {"FailedRecordCount": 1, "Records": [{"SequenceNumber": "1", "ShardId": "s"},
                                                           {"ErrorCode": "E", "ErrorMessage": "m"}]},
        "DescribeStreamSummary": {"StreamDescriptionSummary": {"StreamName": "s", "StreamCreationTimestamp": when,
                                                               "OpenShardCount": 1, "KeyId": None}},
        "ListTagsForStream": {"Tags": [{"Key": "a", "Value": "b"}], "HasMoreTags": False},
    }
    for name, value in outputs.items():
        operation = protocol.model().operation_model(name)
        for content in protocol.CONTENT_TYPES:
            walked = protocol._dump(protocol._out(operation.output_shape, value, content), content)
            assert protocol.encode(operation, value, content) == walked, (name, content)
