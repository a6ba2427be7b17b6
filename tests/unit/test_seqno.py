"""Unit tests of sms.seqno: SN layout, client parsing, byte order, time lower bounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sms import seqno
from sms.errors import InvalidSequenceNumber

timestamps_ms = st.integers(min_value=0, max_value=seqno.TS_MAX)
counters = st.integers(min_value=0, max_value=seqno.COUNTER_MAX)
ordinals = st.integers(min_value=0, max_value=seqno.ORDINAL_MAX)
sns = st.integers(min_value=0, max_value=seqno.SN_MAX)


def test_layout_constants_fill_128_bits():
    assert seqno.TS_BITS + seqno.COUNTER_BITS + seqno.ORDINAL_BITS == 128
    assert seqno.make(seqno.TS_MAX, seqno.COUNTER_MAX, seqno.ORDINAL_MAX) == seqno.SN_MAX
    assert seqno.SN_DIGITS_MAX == len(str(seqno.SN_MAX))


@settings(max_examples=300)
@given(timestamps_ms, counters, ordinals)
def test_make_then_decompose_round_trips(ts_ms, counter, ordinal):
    sn = seqno.make(ts_ms, counter, ordinal)
    assert 0 <= sn <= seqno.SN_MAX
    assert seqno.timestamp_ms_of(sn) == ts_ms
    assert seqno.counter_of(sn) == counter
    assert seqno.ordinal_of(sn) == ordinal


@settings(max_examples=300)
@given(sns)
def test_decompose_then_make_round_trips(sn):
    assert seqno.make(seqno.timestamp_ms_of(sn), seqno.counter_of(sn), seqno.ordinal_of(sn)) == sn


@settings(max_examples=200)
@given(timestamps_ms, st.integers(min_value=0, max_value=seqno.COUNTER_MAX - 1), ordinals)
def test_next_counter_is_one_counter_unit_higher(ts_ms, counter, ordinal):
    sn = seqno.make(ts_ms, counter, ordinal)
    assert seqno.make(ts_ms, counter + 1, ordinal) == sn + seqno.COUNTER_UNIT


@settings(max_examples=300)
@given(sns)
def test_to_bytes_is_16_bytes_and_round_trips(sn):
    raw = seqno.to_bytes(sn)
    assert len(raw) == 16
    assert seqno.from_bytes(raw) == sn


@settings(max_examples=300)
@given(sns, sns)
def test_byte_order_equals_numeric_order(a, b):
    assert (seqno.to_bytes(a) < seqno.to_bytes(b)) == (a < b)
    assert (seqno.to_bytes(a) == seqno.to_bytes(b)) == (a == b)


@settings(max_examples=100)
@given(st.lists(sns, min_size=2, max_size=30))
def test_sorting_bytes_sorts_numbers(values):
    assert [seqno.from_bytes(raw) for raw in sorted(seqno.to_bytes(v) for v in values)] == sorted(values)


@pytest.mark.parametrize("text, expected", [
    ("0", 0),
    ("1", 1),
    ("007", 7),
    (str(seqno.SN_MAX), seqno.SN_MAX),
    ("9" * 38, int("9" * 38)),
    (0, 0),
    (12345, 12345),
    (seqno.SN_MAX, seqno.SN_MAX),
])
def test_parse_accepts_decimal_strings_and_ints_in_range(text, expected):
    assert seqno.parse(text) == expected


@settings(max_examples=200)
@given(sns)
def test_parse_of_str_round_trips(sn):
    assert seqno.parse(str(sn)) == sn
    assert seqno.parse(sn) == sn


@pytest.mark.parametrize("bad", [
    "abc",
    "-1",
    "",
    "1" * 40,
    "9" * 39,                  # 39 digits, above 2^128 - 1
    str(seqno.SN_MAX + 1),
    " 1",
    "1 ",
    "+1",
    "1.0",
    "1e3",
    "0x10",
    "\u0663",                  # ARABIC-INDIC DIGIT THREE: isdigit() but not ASCII
    "\u00b2",                  # SUPERSCRIPT TWO
    2 ** 128,
    -1,
    True,
    False,
    1.0,
    1.5,
    float("nan"),
    None,
    b"1",
    [1],
])
def test_parse_rejects_everything_else(bad):
    with pytest.raises(InvalidSequenceNumber):
        seqno.parse(bad)


def test_parse_error_message_is_bounded():
    with pytest.raises(InvalidSequenceNumber) as info:
        seqno.parse("x" * 10_000)
    assert len(info.value.message) < 200


@settings(max_examples=300)
@given(timestamps_ms, counters, ordinals)
def test_lower_bound_is_at_or_below_every_sn_of_that_millisecond(ts_ms, counter, ordinal):
    assert seqno.lower_bound_for_time(ts_ms) <= seqno.make(ts_ms, counter, ordinal)


@settings(max_examples=300)
@given(st.integers(min_value=1, max_value=seqno.TS_MAX), counters, ordinals, st.data())
def test_lower_bound_is_above_every_sn_of_an_earlier_millisecond(ts_ms, counter, ordinal, data):
    earlier_ms = data.draw(st.integers(min_value=0, max_value=ts_ms - 1))
    assert seqno.lower_bound_for_time(ts_ms) > seqno.make(earlier_ms, counter, ordinal)


def test_lower_bound_is_exact_at_the_edges():
    assert seqno.lower_bound_for_time(0) == 0
    assert seqno.lower_bound_for_time(5) == seqno.make(5, 0, 0)
    # the largest SN of one millisecond is one below the bound of the next
    assert seqno.lower_bound_for_time(6) - 1 == seqno.make(5, seqno.COUNTER_MAX, seqno.ORDINAL_MAX)


def test_lower_bound_clamps_times_outside_the_timestamp_range():
    assert seqno.lower_bound_for_time(-1_000) == 0
    assert seqno.lower_bound_for_time(seqno.TS_MAX + 1_000) == seqno.lower_bound_for_time(seqno.TS_MAX)
    assert seqno.lower_bound_for_time(seqno.TS_MAX + 1_000) <= seqno.SN_MAX


def test_behind_counts_the_records_and_the_time_past_a_checkpoint():
    first, committed = seqno.make(1_000, 5, 2), seqno.make(4_000, 104, 2)      # records 5..104 kept in p0002
    assert seqno.behind(str(seqno.make(3_000, 100, 2)), 2, committed, first) == (4, 1_000)
    assert seqno.behind(str(committed), 2, committed, first) == (0, 0)            # at the end
    assert seqno.behind("TRIM_HORIZON", 2, committed, first) == (100, 3_000)      # all that is kept
    assert seqno.behind(str(seqno.make(900, 7, 1)), 2, committed, first) == (100, 3_000)   # a parent's SN
    assert seqno.behind("SHARD_END", 2, committed, first) == (0, 0)
    assert seqno.behind("TRIM_HORIZON", 2, 0, 0) == (0, 0)                         # nothing committed
    assert seqno.behind("LATEST", 2, committed, first) is None                     # does not say where
    assert seqno.behind("AT_TIMESTAMP:5", 2, committed, first) is None
