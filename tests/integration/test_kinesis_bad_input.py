"""What no honest client sends, sent to the Kinesis endpoint: bodies that are not JSON or
not CBOR, members of the wrong type, oversized bodies, bad and missing signatures, unknown
targets, methods and content types, and seeded random mutations of good requests. Every
answer is a named Kinesis error (never a 5xx, never a dropped connection), the node stays
up, and nothing is stored."""

from __future__ import annotations

import json
import random
import ssl
import urllib.error
import urllib.request

import pytest

botocore = pytest.importorskip("botocore")
import cbor2  # noqa: E402
from botocore.auth import SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402

import sms  # noqa: E402
from sms import limits, security  # noqa: E402
from tests.conftest import assert_all_alive, stream_name  # noqa: E402

pytestmark = pytest.mark.integration

NAMED = {"ValidationException", "SerializationException", "UnknownOperationException", "InvalidArgumentException",
         "ResourceNotFoundException", "MissingAuthenticationTokenException", "IncompleteSignatureException",
         "InvalidSignatureException", "UnrecognizedClientException", "UnsupportedMediaTypeException",
         "AccessDeniedException", "ExpiredIteratorException"}


def _send(cluster, body: bytes, target: str | None, content_type: str = "application/x-amz-json-1.1",
          sign: bool = True, method: str = "POST", secret: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": content_type}
    if target is not None:
        headers["X-Amz-Target"] = target
    request = AWSRequest(method=method, url=cluster.kinesis_endpoint + "/", data=body, headers=headers)
    if sign:
        key_id, derived = security.aws_credentials(cluster.admin_token)
        SigV4Auth(Credentials(key_id, secret or derived), "kinesis", "us-east-1").add_auth(request)
    prepared = request.prepare()
    http = urllib.request.Request(prepared.url, data=prepared.body if method == "POST" else None, method=method,
                                  headers=dict(prepared.headers))
    context = ssl.create_default_context(cafile=cluster.ca_file)
    try:
        with urllib.request.urlopen(http, context=context, timeout=30) as answer:
            raw, status = answer.read(), answer.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    if content_type == "application/x-amz-cbor-1.1" and raw[:1] != b"{":
        return status, cbor2.loads(raw)
    return status, json.loads(raw)


def _named(status: int, answer: dict) -> str:
    assert status < 500, (status, answer)
    kind = answer.get("__type", "")
    assert kind in NAMED or status == 200, (status, answer)
    return kind


def test_malformed_requests_get_named_errors(cluster):
    target = "Kinesis_20131202.PutRecords"
    cases = [
        (b"{not json", target, "application/x-amz-json-1.1", "SerializationException"),
        (b"[1, 2]", target, "application/x-amz-json-1.1", "SerializationException"),
        (b"\xff\xfe\x00", target, "application/x-amz-cbor-1.1", "SerializationException"),
        (json.dumps({"StreamName": 5, "Records": []}).encode(), target, "application/x-amz-json-1.1",
         "SerializationException"),
        (json.dumps({"StreamName": "s", "Records": [{"Data": 5, "PartitionKey": "k"}]}).encode(), target,
         "application/x-amz-json-1.1", "SerializationException"),
        (json.dumps({"StreamName": "s", "Records": [{"Data": "!!", "PartitionKey": "k"}]}).encode(), target,
         "application/x-amz-json-1.1", "SerializationException"),
        (json.dumps({"StreamName": "s"}).encode(), target, "application/x-amz-json-1.1", "ValidationException"),
        (b"{}", None, "application/x-amz-json-1.1", "UnknownOperationException"),
        (b"{}", "Kinesis_20131202.DropEverything", "application/x-amz-json-1.1", "UnknownOperationException"),
        (b"{}", "DynamoDB_20120810.PutItem", "application/x-amz-json-1.1", "UnknownOperationException"),
        (b"{}", target, "text/plain", "UnsupportedMediaTypeException"),
        (b"[" * 50_000 + b"]" * 50_000, target, "application/x-amz-json-1.1", "SerializationException"),
    ]
    for body, tgt, content_type, want in cases:
        status, answer = _send(cluster, body, tgt, content_type)
        assert _named(status, answer) == want, (body[:60], answer)
    status, answer = _send(cluster, b"x" * (limits.KINESIS_REQUEST_BYTES_MAX + 1), target)
    assert status == 413 and _named(status, answer) == "ValidationException"
    assert_all_alive(cluster)


def test_missing_and_bad_signatures_are_refused_before_anything_is_read(cluster):
    name = stream_name("k-unsigned")
    body = json.dumps({"StreamName": name, "ShardCount": 1}).encode()
    status, answer = _send(cluster, body, "Kinesis_20131202.CreateStream", sign=False)
    assert _named(status, answer) == "MissingAuthenticationTokenException"
    status, answer = _send(cluster, body, "Kinesis_20131202.CreateStream", secret="x" * 40)
    assert _named(status, answer) == "InvalidSignatureException"
    with sms.Client(cluster.address) as client:
        assert name not in client.list_streams()          # nothing was made


def test_seeded_mutations_of_good_requests_never_crash_and_store_nothing_bad(cluster):
    name = stream_name("k-fuzz")
    with sms.Client(cluster.address) as client:
        client.create_stream(name, partitions=1)
        good = {"StreamName": name, "Records": [{"PartitionKey": "k", "Data": "aGVsbG8="}]}
        rng = random.Random(20261204)
        stored = 0
        for i in range(300):
            request = json.loads(json.dumps(good))
            mutation = rng.choice(["drop", "type", "long", "bytes", "noise", "deep"])
            record = request["Records"][0]
            if mutation == "drop":
                record.pop(rng.choice(["PartitionKey", "Data"]))
            elif mutation == "type":
                record[rng.choice(["PartitionKey", "Data"])] = rng.choice([None, 1, 1.5, True, [], {}])
            elif mutation == "long":
                record["PartitionKey"] = "k" * rng.choice([0, 257, 10_000])
            elif mutation == "bytes":
                body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
                status, answer = _send(cluster, body, "Kinesis_20131202.PutRecords",
                                       rng.choice(["application/x-amz-json-1.1", "application/x-amz-cbor-1.1"]))
                _named(status, answer)
                continue
            elif mutation == "noise":
                request[rng.choice(["Extra", "StreamName"])] = rng.choice(["", "a b", "x" * 200, 7])
            else:
                request["Records"] = [[[[[]]]]]
            status, answer = _send(cluster, json.dumps(request).encode(), "Kinesis_20131202.PutRecords")
            if _named(status, answer) == "" and status == 200:
                stored += 1 if answer["FailedRecordCount"] == 0 else 0
        assert_all_alive(cluster)
        count = sum(1 for _ in client.read_stream(name))
        assert count == stored            # only the requests that were whole stored anything
