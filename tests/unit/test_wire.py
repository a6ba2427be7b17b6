"""Unit tests of sms.wire: entry and batch framing, sealing, corruption detection."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sms import wire, seqno
from sms.errors import InvalidArgument

metas = st.dictionaries(st.integers(min_value=1, max_value=255), st.binary(max_size=40), max_size=4)
records = st.tuples(st.binary(min_size=1, max_size=64), metas, st.binary(max_size=300))
record_lists = st.lists(records, min_size=1, max_size=20)
first_sns = st.integers(min_value=1, max_value=seqno.SN_MAX - 100 * seqno.COUNTER_UNIT)


def encode_all(recs) -> list[bytes]:
    return [wire.encode_entry(key, data, wire.encode_meta(meta)) for key, meta, data in recs]


def decoded(batch: bytes) -> tuple[wire.BatchHeader, list[tuple[bytes, bytes, bytes]]]:
    """Everything a reader gets out of a batch; raises on any detected damage."""
    header = wire.verify(batch)
    return header, [(e.key, e.meta, e.data) for e in wire.batch_entries(batch)]


def small_sealed_batch() -> bytes:
    recs = [(b"pk-1", {wire.TAG_EXPLICIT_HASH_KEY: b"\x01\x02"}, b"hello"),
            (b"pk-2", {}, b""),
            (b"pk-3", {wire.TAG_PRODUCER_ID: b"prod", wire.TAG_SSSN: b"\x00\x07"}, b"world" * 3)]
    return wire.sequence(wire.build_batch(encode_all(recs)), seqno.make(1_700_000_000_000, 5, 3))


# --- round trips -----------------------------------------------------------------------

@settings(max_examples=150)
@given(record_lists, first_sns)
def test_batch_round_trip_through_sequence_and_verify(recs, first_sn):
    unsequenced = wire.build_batch(encode_all(recs))
    assert wire.verify(unsequenced).first_sn == 0
    batch = wire.sequence(unsequenced, first_sn)
    header, entries = decoded(batch)
    assert header.count == len(recs)
    assert header.first_sn == first_sn
    assert header.last_sn == first_sn + (len(recs) - 1) * seqno.COUNTER_UNIT
    assert [(k, wire.decode_meta(m), d) for k, m, d in entries] == list(recs)
    # sequencing changes the header only
    assert batch[wire.HEADER_BYTES:] == unsequenced[wire.HEADER_BYTES:]


@settings(max_examples=150)
@given(record_lists)
def test_entry_offsets_tile_the_body(recs):
    encoded = encode_all(recs)
    body = b"".join(encoded)
    entries = list(wire.iter_entries(body, len(encoded)))
    assert entries[0].start == 0 and entries[-1].end == len(body)
    for prev, nxt in zip(entries, entries[1:]):
        assert prev.end == nxt.start
    for entry, raw in zip(entries, encoded):
        assert body[entry.start:entry.end] == raw


@settings(max_examples=100)
@given(record_lists, first_sns, first_sns)
def test_resequencing_keeps_body_and_moves_first_sn(recs, sn_a, sn_b):
    batch_a = wire.sequence(wire.build_batch(encode_all(recs)), sn_a)
    batch_b = wire.sequence(batch_a, sn_b)
    assert wire.verify(batch_b).first_sn == sn_b
    assert decoded(batch_b)[1] == decoded(batch_a)[1]


def test_build_batch_with_first_sn_equals_sequence():
    entries = encode_all([(b"k", {}, b"v"), (b"k2", {}, b"v2")])
    sn = seqno.make(10, 1, 0)
    assert wire.build_batch(entries, sn) == wire.sequence(wire.build_batch(entries), sn)


def test_empty_batch_is_refused():
    with pytest.raises(wire.CorruptBatch):
        wire.verify(wire.build_batch([]))


# --- corruption --------------------------------------------------------------------------

_UNCOVERED_HEADER_BYTES = range(1, 4)   # flags (1 byte) and reserved (2 bytes)


def test_every_single_flipped_byte_is_detected_or_harmless():
    batch = small_sealed_batch()
    expected = decoded(batch)
    for i in range(len(batch)):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(batch)
            damaged[i] ^= mask
            try:
                got = decoded(bytes(damaged))
            except (wire.CorruptBatch, InvalidArgument):
                continue
            # never a silent wrong answer: an undetected flip must not change what readers get
            assert got == expected, f"byte {i} ^ {mask:#x} changed the decoded batch silently"
            assert i in _UNCOVERED_HEADER_BYTES, f"byte {i} ^ {mask:#x} went undetected"


@settings(max_examples=200)
@given(record_lists, first_sns, st.data())
def test_flipped_byte_in_body_or_covered_header_raises_corrupt_batch(recs, first_sn, data):
    batch = wire.sequence(wire.build_batch(encode_all(recs)), first_sn)
    covered = [0, *range(4, len(batch))]
    i = data.draw(st.sampled_from(covered), label="offset")
    mask = data.draw(st.integers(min_value=1, max_value=255), label="mask")
    damaged = bytearray(batch)
    damaged[i] ^= mask
    with pytest.raises(wire.CorruptBatch):
        wire.verify(bytes(damaged))


@pytest.mark.parametrize("offset", list(_UNCOVERED_HEADER_BYTES))
def test_flipped_flags_or_reserved_byte_is_detected(offset):
    damaged = bytearray(small_sealed_batch())
    damaged[offset] ^= 0x01
    with pytest.raises(wire.CorruptBatch):
        wire.verify(bytes(damaged))


def test_sequence_refuses_a_corrupted_unsequenced_batch():
    unsequenced = bytearray(wire.build_batch(encode_all([(b"k", {}, b"payload")])))
    unsequenced[-1] ^= 0x01
    with pytest.raises(wire.CorruptBatch):
        wire.sequence(bytes(unsequenced), seqno.make(1, 1, 0))


def test_truncated_sealed_batch_raises_corrupt_batch():
    batch = small_sealed_batch()
    for n in range(len(batch)):
        with pytest.raises(wire.CorruptBatch):
            wire.verify(batch[:n])


def test_wrong_version_raises_corrupt_batch():
    damaged = bytearray(small_sealed_batch())
    damaged[0] = wire.BATCH_VERSION + 1
    with pytest.raises(wire.CorruptBatch):
        wire.read_header(bytes(damaged))


def test_count_not_matching_entries_is_a_framing_error():
    entries = encode_all([(b"k", {}, b"a" * 20), (b"k", {}, b"b")])   # (3 headers of 8 bytes fit: verify holds)
    too_many = wire.seal(3, seqno.make(1, 1, 0), b"".join(entries))
    too_few = wire.seal(1, seqno.make(1, 1, 0), b"".join(entries))
    for batch in (too_many, too_few):
        wire.verify(batch)   # checksum holds: it was sealed that way
        with pytest.raises(InvalidArgument):
            list(wire.batch_entries(batch))


# --- entry framing -----------------------------------------------------------------------

@settings(max_examples=100)
@given(record_lists, st.data())
def test_truncated_entry_buffer_raises_invalid_argument(recs, data):
    encoded = encode_all(recs)
    body = b"".join(encoded)
    cut = data.draw(st.integers(min_value=0, max_value=len(body) - 1), label="cut")
    with pytest.raises(InvalidArgument):
        list(wire.iter_entries(body[:cut], len(encoded)))


@settings(max_examples=100)
@given(record_lists, st.binary(min_size=1, max_size=20))
def test_trailing_bytes_raise_invalid_argument(recs, trailing):
    encoded = encode_all(recs)
    with pytest.raises(InvalidArgument):
        list(wire.iter_entries(b"".join(encoded) + trailing, len(encoded)))


def test_every_truncation_of_one_entry_raises():
    entry = wire.encode_entry(b"key", b"data-data", wire.encode_meta({1: b"xy"}))
    for n in range(len(entry)):
        with pytest.raises(InvalidArgument):
            list(wire.iter_entries(entry[:n], 1))
    assert [(e.key, e.meta, e.data) for e in wire.iter_entries(entry, 1)] == [
        (b"key", wire.encode_meta({1: b"xy"}), b"data-data")]


def test_iter_entries_from_an_offset():
    prefix = b"\xAA" * 7
    entry = wire.encode_entry(b"k", b"v")
    (got,) = wire.iter_entries(prefix + entry, 1, offset=len(prefix))
    assert (got.key, got.data, got.start, got.end) == (b"k", b"v", len(prefix), len(prefix) + len(entry))


# --- positions within a batch ----------------------------------------------------------------

def _header(first_sn: int, count: int) -> wire.BatchHeader:
    return wire.BatchHeader(count=count, first_sn=first_sn, checksum=0)


def test_index_at_or_after_named_positions():
    unit = seqno.COUNTER_UNIT
    first = seqno.make(1_000, 10, 7)
    h = _header(first, 5)
    assert wire.index_at_or_after(h, 0) == 0                      # before
    assert wire.index_at_or_after(h, first - 1) == 0              # just before
    assert wire.index_at_or_after(h, first) == 0                  # at the first record
    assert wire.index_at_or_after(h, first + 1) == 1              # between 0 and 1
    assert wire.index_at_or_after(h, first + 2 * unit) == 2       # inside, on a record
    assert wire.index_at_or_after(h, first + 2 * unit - 1) == 2   # just before record 2
    assert wire.index_at_or_after(h, h.last_sn) == 4              # at the last record
    assert wire.index_at_or_after(h, h.last_sn + 1) == 5          # just after
    assert wire.index_at_or_after(h, seqno.SN_MAX) == 5           # far after


@settings(max_examples=300)
@given(first_sns, st.integers(min_value=1, max_value=50), st.data())
def test_index_at_or_after_counts_records_below_the_position(first_sn, count, data):
    h = _header(first_sn, count)
    position = data.draw(st.one_of(
        st.integers(min_value=0, max_value=seqno.SN_MAX),
        st.integers(min_value=max(0, first_sn - 3), max_value=h.last_sn + 3)), label="position")
    below = sum(1 for i in range(count) if first_sn + i * seqno.COUNTER_UNIT < position)
    assert wire.index_at_or_after(h, position) == below


# --- record meta -----------------------------------------------------------------------------

@settings(max_examples=200)
@given(st.dictionaries(st.integers(min_value=1, max_value=255), st.binary(max_size=255), max_size=8))
def test_meta_round_trip(fields):
    assert wire.decode_meta(wire.encode_meta(fields)) == fields
    assert wire.decode_meta(memoryview(wire.encode_meta(fields))) == fields


def test_empty_meta_is_empty():
    assert wire.encode_meta({}) == b""
    assert wire.decode_meta(b"") == {}


@settings(max_examples=150)
@given(st.dictionaries(st.integers(min_value=1, max_value=255), st.binary(max_size=30), min_size=1, max_size=5),
       st.data())
def test_truncated_meta_raises_invalid_argument(fields, data):
    raw = wire.encode_meta(fields)
    boundaries, offset = {0}, 0
    for tag, value in fields.items():
        offset += (3 if tag >= wire.LONG_TAG_MIN else 2) + len(value)    # long tags carry 2 length bytes
        boundaries.add(offset)
    cut = data.draw(st.integers(min_value=0, max_value=len(raw) - 1).filter(lambda n: n not in boundaries),
                    label="cut")
    with pytest.raises(InvalidArgument):
        wire.decode_meta(raw[:cut])


def test_truncated_meta_named_cases():
    raw = wire.encode_meta({wire.TAG_PRODUCER_ID: b"abc"})
    for cut in (1, 2, 3, 4):
        with pytest.raises(InvalidArgument):
            wire.decode_meta(raw[:cut])


def test_checksums_chain_a_batch_to_the_one_before():
    """prev_checksum is covered by the checksum: the same records at the same SNs after
    another history have another checksum, and a changed prev_checksum is corruption."""
    recs = [(b"k", {}, b"payload")]
    first_sn = seqno.make(1_700_000_000_000, 5, 3)
    a = wire.sequence(wire.build_batch(encode_all(recs)), first_sn, prev_checksum=1)
    b = wire.sequence(wire.build_batch(encode_all(recs)), first_sn, prev_checksum=2)
    ha, hb = wire.verify(a), wire.verify(b)
    assert (ha.prev_checksum, hb.prev_checksum) == (1, 2) and ha.checksum != hb.checksum
    assert a[wire.HEADER_BYTES:] == b[wire.HEADER_BYTES:]
    forged = bytearray(a)
    forged[wire.HEADER_BYTES - 8:wire.HEADER_BYTES] = (2).to_bytes(8, "little")   # prev_checksum, unsealed
    with pytest.raises(wire.CorruptBatch):
        wire.verify(bytes(forged))
