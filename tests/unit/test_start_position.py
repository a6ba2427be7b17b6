"""sms.types.StartPosition: the one parser and printer of reading positions (the
checkpoints of consumer groups and SPS leases, clients' starts, Spark's)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from sms import seqno
from sms.errors import InvalidArgument, InvalidSequenceNumber
from sms.types import SHARD_END, IteratorType, StartPosition

SN = seqno.make(1_700_000_000_000, 5, 3)


@pytest.mark.parametrize("text,kind,iterator", [
    ("TRIM_HORIZON", "TRIM_HORIZON", ("TRIM_HORIZON", {})),
    ("LATEST", "LATEST", ("LATEST", {})),
    ("AT_TIMESTAMP:1700000000000", "AT_TIMESTAMP", ("AT_TIMESTAMP", {"timestamp_ms": 1_700_000_000_000})),
    (str(SN), "AFTER_SEQUENCE_NUMBER", ("AFTER_SEQUENCE_NUMBER", {"sequence_number": str(SN)})),
    (f"AT_SEQUENCE_NUMBER:{SN}", "AT_SEQUENCE_NUMBER", ("AT_SEQUENCE_NUMBER", {"sequence_number": str(SN)})),
])
def test_each_text_form_parses_encodes_and_starts_an_iterator(text, kind, iterator):
    position = StartPosition.parse(text)
    assert position.kind == kind and position.encode() == text and position.iterator() == iterator
    assert not position.ended


def test_shard_end_is_the_end_of_a_partition():
    position = StartPosition.parse(SHARD_END)
    assert position.ended and position.after_sn is None and position.encode() == SHARD_END
    with pytest.raises(InvalidArgument, match="read to its end"):
        position.iterator()


@pytest.mark.parametrize("text", ["", "trim_horizon", "AT_TIMESTAMP", "AT_TIMESTAMP:", "AT_TIMESTAMP:-1",
                                  "AT_TIMESTAMP:1e3", "LATEST:1", "SHARD_END:", "１２３", "1" * 40,
                                  "AT_SEQUENCE_NUMBER:x", "AFTER_SEQUENCE_NUMBER:5", " 5"])
def test_what_is_not_a_position_is_named(text):
    with pytest.raises(InvalidArgument, match="position"):
        StartPosition.parse(text)


def test_an_sn_must_be_of_its_partition():
    assert StartPosition.parse(str(SN), ordinal=3).after_sn == SN
    with pytest.raises(InvalidArgument, match="not an SN of partition 4"):
        StartPosition.parse(str(SN), ordinal=4)


def test_of_checks_that_the_parts_go_together():
    assert StartPosition.of(IteratorType.AT_TIMESTAMP, timestamp_ms=0).encode() == "AT_TIMESTAMP:0"
    assert StartPosition.of("latest") == StartPosition.parse("LATEST")
    assert StartPosition.of("AFTER_SEQUENCE_NUMBER", sequence_number=str(SN)).encode() == str(SN)
    for kind, kw in [("AT_TIMESTAMP", {}), ("LATEST", {"timestamp_ms": 5}), ("AT_SEQUENCE_NUMBER", {}),
                     ("TRIM_HORIZON", {"sequence_number": 5}), ("AT_TIMESTAMP", {"timestamp_ms": -1}),
                     ("AT_TIMESTAMP", {"timestamp_ms": True}), ("NEXT", {})]:
        with pytest.raises(InvalidArgument):
            StartPosition.of(kind, **kw)
    with pytest.raises(InvalidSequenceNumber):
        StartPosition.of("AT_SEQUENCE_NUMBER", sequence_number="-1")


@given(st.one_of(
    st.sampled_from(["TRIM_HORIZON", "LATEST", SHARD_END]),
    st.integers(0, 2**48).map(lambda ms: f"AT_TIMESTAMP:{ms}"),
    st.integers(1, seqno.SN_MAX).map(str),
    st.integers(1, seqno.SN_MAX).map(lambda sn: f"AT_SEQUENCE_NUMBER:{sn}")))
def test_parse_and_encode_round_trip(text):
    assert StartPosition.parse(text).encode() == text


@given(st.text(max_size=50))
def test_any_text_parses_or_is_refused_by_name(text):
    try:
        position = StartPosition.parse(text)
    except InvalidArgument:
        return
    assert StartPosition.parse(position.encode()) == position
