"""kinesis/mapping.py and the pure helpers of kinesis/service.py: shard ids, ARNs, error
names, where a subscription stands before its first record, list tokens."""

from __future__ import annotations

import pytest

from kinesis import mapping, service
from kinesis.protocol import KinesisError
from sms import errors, seqno

ACCOUNT = "000000000000"


def test_shard_ids_round_trip_and_odd_ones_are_not_found():
    assert mapping.shard_id(7) == "shardId-000000000007"
    for text, ordinal in (("shardId-000000000007", 7), ("shardId-7", 7), ("7", 7), ("shardId-999999999999", 10**12 - 1)):
        assert mapping.ordinal_of(text) == ordinal
    for bad in ("", "shard-1", "shardId-", "shardId-1234567890123", "-1", "shardId-x"):
        with pytest.raises(KinesisError) as e:
            mapping.ordinal_of(bad)
        assert e.value.kind == "ResourceNotFoundException"


def test_stream_and_consumer_arns():
    arn = mapping.stream_arn("eu-west-1", ACCOUNT, "clicks")
    assert arn == "arn:aws:kinesis:eu-west-1:000000000000:stream/clicks"
    assert mapping.stream_of({"StreamARN": arn}, ACCOUNT) == "clicks"
    assert mapping.stream_of({"StreamName": "clicks", "StreamARN": arn}, ACCOUNT) == "clicks"
    assert mapping.stream_of({"StreamARN": arn.replace("arn:aws:", "arn:aws-cn:")}, ACCOUNT) == "clicks"
    cases = [({}, "InvalidArgumentException"), ({"StreamName": "other", "StreamARN": arn}, "InvalidArgumentException"),
             ({"StreamARN": arn.replace(ACCOUNT, "123456789012")}, "AccessDeniedException"),
             ({"StreamARN": "arn:aws:s3:::bucket"}, "InvalidArgumentException")]
    for params, kind in cases:
        with pytest.raises(KinesisError) as e:
            mapping.stream_of(params, ACCOUNT)
        assert e.value.kind == kind, params
    consumer = mapping.consumer_arn("eu-west-1", ACCOUNT, "clicks", "reader", 1700000000)
    assert mapping.consumer_of(consumer, ACCOUNT) == ("clicks", "reader", 1700000000)
    with pytest.raises(KinesisError):
        mapping.consumer_of(arn, ACCOUNT)


@pytest.mark.parametrize("error,kind,status", [
    (errors.StreamNotFound("x"), "ResourceNotFoundException", 400),
    (errors.StreamAlreadyExists("x"), "ResourceInUseException", 400),
    (errors.ExpiredIterator("x"), "ExpiredIteratorException", 400),
    (errors.InvalidIterator("x"), "InvalidArgumentException", 400),
    (errors.StorageFull("x"), "ProvisionedThroughputExceededException", 400),
    (errors.TooManyPartitions("x"), "LimitExceededException", 400),
    (errors.PermissionDenied("x"), "AccessDeniedException", 400),
    (errors.NotEnoughReplicas("x"), "ServiceUnavailableException", 503),
    (errors.InternalError("x"), "InternalFailureException", 500),
])
def test_engine_errors_answer_as_their_kinesis_errors(error, kind, status):
    mapped = mapping.error_of(error)
    assert (mapped.kind, mapped.status, mapped.message) == (kind, status, "x")


def test_a_subscription_stands_just_before_its_position_in_its_own_partition():
    for ordinal in (0, 3, 2**31):
        for position in (seqno.make(1_700_000_000_000, 5, ordinal), seqno.make(1_700_000_000_000, 0, ordinal) + 1):
            before = service._before(position, ordinal)
            assert before < position and seqno.ordinal_of(before) == ordinal
            assert before + (1 << seqno.COUNTER_SHIFT) >= position     # nothing of the partition in between


def test_list_tokens_round_trip_and_are_bound_to_their_operation():
    token = service._token("clicks\nshardId-000000000003", "ListShards")
    assert service._untoken(token, "ListShards") == "clicks\nshardId-000000000003"
    for bad, what in ((token, "ListStreams"), ("%%%", "ListShards"), ("", "ListShards")):
        with pytest.raises(KinesisError) as e:
            service._untoken(bad, what)
        assert e.value.kind == "InvalidArgumentException"
