"""Unit tests of sms.batch.RecordBatch and wire.columns: a page's records as columns give
exactly what `Record`s give (keys, data, SNs, arrival times, partition, headers), `clip`
cuts at an SN, and the compiled and reference columns agree byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sms import seqno, wire
from sms.batch import RecordBatch

pa = pytest.importorskip("pyarrow")

header_maps = st.dictionaries(st.text(min_size=1, max_size=8), st.binary(max_size=12), max_size=3)
records = st.lists(st.tuples(st.text(min_size=1, max_size=12), st.binary(max_size=64), header_maps),
                   min_size=1, max_size=30)


def sealed(recs, first_sn=seqno.make(1_700_000_000_000, 7, 3)) -> bytes:
    entries = [wire.encode_entry(k.encode(), d, wire.encode_headers(h)) for k, d, h in recs]
    return wire.sequence(wire.build_batch(entries), first_sn)


def rows(table) -> list[tuple]:
    return [(r["partition_key"], r["data"], int(r["sequence_number"]),
             int(r["arrival_time"].timestamp() * 1000), r["partition_id"], dict(r["headers"]))
            for r in table.to_pylist()]


@settings(max_examples=60, deadline=None)
@given(st.lists(records, min_size=1, max_size=3), st.data())
def test_to_arrow_gives_what_records_give(pages, data):
    slices = []
    for i, recs in enumerate(pages):
        batch = sealed(recs, seqno.make(1_700_000_000_000 + i, 1 + 100 * i, 3))
        start = data.draw(st.integers(0, len(recs)), label="start")
        end = data.draw(st.integers(start, len(recs) + 2), label="end")
        slices.append((batch, start, end))
    rb = RecordBatch(3, slices)
    expected = [(r.partition_key, r.data, r.sn, r.arrival_time_ms, r.partition_id, r.headers) for r in rb.records()]
    table = rb.to_arrow()
    assert table.schema.names == ["partition_key", "data", "sequence_number", "arrival_time", "partition_id",
                                  "headers"]
    assert len(rb) == table.num_rows == len(expected)
    assert rows(table) == expected
    assert rb.last_sn == (expected[-1][2] if expected else None)


def test_clip_cuts_at_an_sequence_number():
    recs = [(f"k{i}", b"d%d" % i, {}) for i in range(10)]
    first = seqno.make(1_700_000_000_000, 1, 0)
    rb = RecordBatch(0, [(sealed(recs, first), 2, 10)])
    cut = rb.clip(first + 5 * seqno.COUNTER_UNIT)
    assert [r.data for r in cut.records()] == [b"d2", b"d3", b"d4", b"d5"]
    assert len(rb.clip(first)) == 0
    assert len(rb.clip(first + 100 * seqno.COUNTER_UNIT)) == 8


def test_microsecond_arrival_times_for_spark():
    rb = RecordBatch(1, [(sealed([("k", b"v", {"h": b"x"})]), 0, 1)])
    (chunk,) = rb.to_arrow_batches(timestamp_unit="us")
    assert str(chunk.schema.field("arrival_time").type) == "timestamp[us, tz=UTC]"
    assert chunk.column("headers").to_pylist() == [[("h", b"x")]]


def test_columns_of_a_batch_whose_framing_lies_is_corrupt():
    body = wire.encode_entry(b"k", b"data")
    lying = wire.seal(2, seqno.make(1_700_000_000_000, 1, 0), body)     # says 2 records, holds 1
    for impl in filter(None, (wire.reference, wire.compiled)):
        with pytest.raises(wire.CorruptBatch):
            impl.columns(lying, 0, 2)


@pytest.mark.skipif(wire.compiled is None, reason="no compiled wire codec (not built, or SMS_PURE_PYTHON=1)")
@settings(max_examples=80, deadline=None)
@given(records, st.integers(-2, 35), st.integers(-2, 35))
def test_compiled_columns_match_the_reference(recs, start, end):
    batch = sealed(recs)
    assert wire.compiled.columns(batch, start, end) == wire.reference.columns(batch, start, end)


def page_of(pages, data) -> list[tuple[bytes, int, int]]:
    slices = []
    for i, recs in enumerate(pages):
        batch = sealed(recs, seqno.make(1_700_000_000_000 + i, 1 + 100 * i, 3))
        start = data.draw(st.integers(-2, len(recs) + 1), label="start")
        end = data.draw(st.integers(-2, len(recs) + 2), label="end")
        slices.append((batch, start, end))
    return slices


@settings(max_examples=60, deadline=None)
@given(st.lists(records, max_size=4), st.data())
def test_columns_of_a_page_are_its_slices_columns_run_on(pages, data):
    """columns_many of a page holds each slice's records in order: the same rows as
    columns() of each slice, offsets running on from one slice to the next."""
    slices = page_of(pages, data)
    for impl in filter(None, (wire.reference, wire.compiled)):
        one = impl.columns_many(slices)
        assert one[0] == sum(impl.columns(b, s, e)[0] for b, s, e in slices)
        whole = RecordBatch(3, [])
        whole._columns = one
        expected = [r for b, s, e in slices
                    for r in rows(RecordBatch(3, [(b, s, e)]).to_arrow())]
        assert rows(whole.to_arrow()) == expected


@pytest.mark.skipif(wire.compiled is None, reason="no compiled wire codec (not built, or SMS_PURE_PYTHON=1)")
@settings(max_examples=60, deadline=None)
@given(st.lists(records, max_size=4), st.data())
def test_compiled_columns_of_a_page_match_the_reference(pages, data):
    slices = page_of(pages, data)
    assert wire.compiled.columns_many(slices) == wire.reference.columns_many(slices)


def test_a_page_with_a_lying_or_sealed_batch_is_corrupt_and_a_bad_slice_a_type_error():
    good = sealed([("k", b"v", {})])
    lying = wire.seal(2, seqno.make(1_700_000_000_000, 1, 0), wire.encode_entry(b"k", b"data"))
    for impl in filter(None, (wire.reference, wire.compiled)):
        with pytest.raises(wire.CorruptBatch):
            impl.columns_many([(good, 0, 1), (lying, 0, 2)])
        with pytest.raises((TypeError, ValueError)):
            impl.columns_many([(good, 0)])
    encrypted = bytearray(good)
    encrypted[1] |= wire.FLAG_SEALED
    with pytest.raises(wire.CorruptBatch, match="sealed"):
        wire.columns_many([(good, 0, 1), (bytes(encrypted), 0, 1)])
    assert wire.columns_many([])[0] == 0
    assert RecordBatch(0, []).to_arrow().num_rows == 0
