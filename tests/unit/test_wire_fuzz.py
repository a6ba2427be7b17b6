"""Fuzzing of every parser of sms.wire, in both implementations of its hot functions.

Whatever bytes arrive -- arbitrary ones, or valid requests and batches mutated (bits
flipped, bytes set to edge values, length fields overwritten, slices inserted, cut out or
repeated, the whole cut short, junk appended, bodies resealed so the checksum holds over
the damage) -- a parser either returns a value of its documented shape or raises a named
error (an `sms.errors.SmsError` subclass: InvalidArgument, InvalidRecordHeader,
CorruptBatch...). Never another exception type (IndexError, struct.error,
UnicodeDecodeError, MemoryError, SystemError...), never a crash. A non-named exception
escapes the test and fails it, with the input hypothesis shrank it to.

The hot functions (`parse_put`, `check_framing`, `decode_records`, `session_fields`,
`columns` where wire has it) run
in the pure-Python reference and, when it is built, the compiled implementation
(`wire.compiled`); the rest of the parsers (`decode_meta`, `iter_meta`, `decode_headers`,
`headers_of`, `validate_headers`, `read_header`, `verify`, `iter_entries`,
`batch_entries`, `sequence`, `decode_put_results`, `Record.headers`) exist once, in Python.
Whether the two implementations agree is `test_wire_differential.py`'s business; this
file only holds each to "a value or a named error". Deterministic: hypothesis derandomized,
no example database.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sms import limits, seqno, wire
from sms.errors import SmsError
from sms.types import Record
from tests.unit.test_wire_differential import (COMP, HAS_COLUMNS, IMPLS, META_TLVS, REF, STORED_LISTS, examples,
                                               header_entries, odd_entries, put_requests, stored_batches, tlv)

# --- mutations ------------------------------------------------------------------------------

EDGE_BYTES = st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0x81, 0xC0, 0xED, 0xF4, 0xFE, 0xFF])
EDGE_U16 = st.sampled_from([0, 1, 2, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0xFFFE, 0xFFFF])
EDGE_U32 = st.sampled_from([0, 1, 8, 0xFFFF, 0x10000, limits.RECORD_DATA_BYTES_MAX, limits.RECORD_DATA_BYTES_MAX + 1,
                            0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF])


@st.composite
def mutated(draw, blob: bytes, max_ops: int = 4) -> bytes:
    """blob with 1..max_ops random edits."""
    out = bytearray(blob)
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(["flip", "set", "u16", "u32", "insert", "delete", "cut", "repeat", "append"]))
        n = len(out)
        at = draw(st.integers(0, max(0, n - 1)))
        if op == "flip" and n:
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and n:
            out[at] = draw(EDGE_BYTES | st.integers(0, 255))
        elif op == "u16" and n >= 2:
            struct.pack_into("<H", out, min(at, n - 2), draw(EDGE_U16))
        elif op == "u32" and n >= 4:
            struct.pack_into("<I", out, min(at, n - 4), draw(EDGE_U32))
        elif op == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=10))
        elif op == "delete" and n:
            del out[at:at + draw(st.integers(1, 10))]
        elif op == "cut":
            del out[at:]
        elif op == "repeat" and n:
            end = min(n, at + draw(st.integers(1, 30)))
            out[at:at] = out[at:end]
        elif op == "append":
            out += draw(st.binary(min_size=1, max_size=10))
    return bytes(out)


def named_or_value(fn, *args):
    """fn(*args), or None when it raised a named error; anything else escapes."""
    try:
        return fn(*args)
    except SmsError as e:
        assert isinstance(e.message, str) and e.message
        return None


COUNTS = st.one_of(st.integers(-2, 8), st.sampled_from([limits.PUT_RECORDS_COUNT_MAX,
                                                          limits.PUT_RECORDS_COUNT_MAX + 1, 1 << 31]))
PIDS = st.one_of(st.just(b""), st.binary(max_size=limits.PRODUCER_ID_BYTES_MAX + 4))
# read windows: near the batch, and far off (but clear of 2^32 entries: see
# test_reads_of_a_lying_huge_count_are_named_errors)
WINDOW = st.one_of(st.integers(-3, 12), st.sampled_from([-(1 << 62), 1 << 20]))


# --- parse_put ---------------------------------------------------------------------------------

def check_parse_put(impl, count, blob, pid):
    out = named_or_value(impl.parse_put, count, blob, pid)
    if out is not None:
        assert type(out) is list and len(out) == count
        assert all(type(e) is wire.PutEntry and type(e.key) is bytes and len(e.signature) == 16 for e in out)


@pytest.mark.parametrize("impl", IMPLS)
@examples(200)
@given(count=COUNTS, blob=st.binary(max_size=300), pid=PIDS)
def test_parse_put_arbitrary_bytes(impl, count, blob, pid):
    check_parse_put(impl, count, blob, pid)


@pytest.mark.parametrize("impl", IMPLS)
@examples(200)
@given(data=st.data())
def test_parse_put_mutated_requests(impl, data):
    count, blob, pid = data.draw(put_requests())
    extra = data.draw(st.lists(header_entries(bool(pid)) | odd_entries(), max_size=1))
    blob = data.draw(mutated(blob + b"".join(extra)))
    count += len(extra) + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    check_parse_put(impl, count, blob, data.draw(st.just(pid) | PIDS))


@pytest.mark.parametrize("impl", IMPLS)
@examples(150)
@given(session=st.booleans(), key=st.binary(max_size=12), body=st.binary(max_size=12),
       tlvs=st.lists(META_TLVS | st.binary(max_size=6), max_size=8))
def test_parse_put_any_meta(impl, session, key, body, tlvs):
    """Entries well framed outside, anything inside their meta (stray bytes between TLVs)."""
    entry = wire.encode_entry(key, body, b"".join(tlvs))
    check_parse_put(impl, 1, entry, b"producer" if session else b"")


# --- check_framing ------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
@examples(200)
@given(buf=st.binary(max_size=200), count=st.integers(-2, 12) | st.just(1 << 40), data=st.data())
def test_check_framing_arbitrary_bytes(impl, buf, count, data):
    offset = data.draw(st.integers(-10, len(buf) + 9))
    assert named_or_value(impl.check_framing, buf, count, offset) is None
    assert named_or_value(impl.check_framing, memoryview(buf), count) is None


@pytest.mark.parametrize("impl", IMPLS)
@examples(150)
@given(recs=STORED_LISTS, data=st.data())
def test_check_framing_mutated_bodies(impl, recs, data):
    body = data.draw(mutated(REF.stored_entries(recs)))
    prefix = data.draw(st.binary(max_size=48))
    count = len(recs) + data.draw(st.sampled_from([0, 0, -1, 1]))
    assert named_or_value(impl.check_framing, prefix + body, count, len(prefix)) is None


# --- decode_records and session_fields ---------------------------------------------------------

def check_reads(impl, batch, start, end):
    records = named_or_value(impl.decode_records, batch, start, end, 3)
    if records is not None:
        assert type(records) is list and all(type(r) is Record and type(r.partition_key) is str for r in records)
        for r in records:
            named_or_value(lambda: r.headers)
    fields = named_or_value(impl.session_fields, batch, start, end)
    if fields is not None:
        assert type(fields) is list and all(type(f) is wire.SessionFields for f in fields)
    if HAS_COLUMNS:
        cols = named_or_value(impl.columns, batch, start, end)
        if cols is not None:
            assert type(cols) is tuple and len(cols) == 13 and all(type(c) is bytes for c in cols[1:])
            assert records is None or cols[0] == len(records)


@pytest.mark.parametrize("impl", IMPLS)
@examples(150)
@given(batch=st.binary(max_size=120), start=WINDOW, end=WINDOW)
def test_reads_arbitrary_bytes(impl, batch, start, end):
    check_reads(impl, batch, start, end)


@pytest.mark.parametrize("impl", IMPLS)
@examples(200)
@given(count=st.integers(1, 12) | st.sampled_from([1 << 16, 1 << 20]), first_sn=st.integers(0, seqno.SN_MAX >> 1),
       body=st.binary(max_size=200), start=WINDOW, end=WINDOW)
def test_reads_arbitrary_bodies_under_a_good_checksum(impl, count, first_sn, body, start, end):
    check_reads(impl, wire.seal(count, first_sn, body), start, end)


@pytest.mark.parametrize("impl", IMPLS)
@examples(200)
@given(batch=stored_batches(), reseal=st.booleans(), start=WINDOW, end=WINDOW, data=st.data())
def test_reads_mutated_batches(impl, batch, reseal, start, end, data):
    """Mutated batches; resealed, the framing checks have to catch what the checksum no
    longer can."""
    batch, count = batch
    if reseal:
        header = wire.read_header(batch)
        body = data.draw(mutated(batch[wire.HEADER_BYTES:] + b"".join(data.draw(st.lists(odd_entries(),
                                                                                         max_size=1)))))
        count = max(1, count + data.draw(st.sampled_from([0, 0, 0, -1, 1, 2])))
        batch = wire.seal(count, header.first_sn, body)
    else:
        batch = data.draw(mutated(batch))
    check_reads(impl, batch, 0, count)
    check_reads(impl, batch, start, end)


@pytest.mark.parametrize("impl", IMPLS)
def test_reads_of_a_lying_huge_count_are_named_errors(impl):
    """One entry under a header (and a good checksum) that claims 2^32 - 1 entries, read
    [0, count): CorruptBatch, not MemoryError from sizing the answer by the header's
    claim (as the compiled decode_records once did). Not tried with smaller lies such as
    2^31: an implementation that sizes its answer by the claim may then get the memory
    and spend seconds on it."""
    count = (1 << 32) - 1
    batch = wire.seal(count, 5, wire.encode_entry(b"k", b"d"))
    for start in (0, 1):
        with pytest.raises(wire.CorruptBatch):
            impl.decode_records(batch, start, count, 0)
        if HAS_COLUMNS:
            with pytest.raises(wire.CorruptBatch):
                impl.columns(batch, start, count)
    with pytest.raises(wire.CorruptBatch):
        impl.session_fields(batch, 0, count)


# --- the Python-only parsers ---------------------------------------------------------------------

def first_meta(blob: bytes) -> bytes:
    """The meta of the first entry of blob."""
    _, key_len, meta_len = wire.ENTRY.unpack_from(blob)
    return blob[wire.ENTRY.size + key_len:][:meta_len]


VALID_METAS = st.one_of(put_requests().map(lambda r: first_meta(r[1])), st.lists(META_TLVS, max_size=6).map(b"".join))


@examples(300)
@given(meta=st.binary(max_size=80) | VALID_METAS.flatmap(lambda m: st.just(m) | mutated(m)))
def test_meta_parsers(meta):
    decoded = named_or_value(wire.decode_meta, meta)
    assert decoded is None or (type(decoded) is dict and all(0 <= t < 256 for t in decoded))
    pairs = named_or_value(lambda: list(wire.iter_meta(memoryview(meta))))
    assert (pairs is None) == (decoded is None)
    headers = named_or_value(wire.decode_headers, meta)
    assert headers is None or all(type(k) is str and type(v) is bytes for k, v in headers.items())
    raw = named_or_value(wire.headers_of, meta)
    if raw is not None:
        assert wire.decode_headers(raw) == headers
        named_or_value(wire.validate_headers, raw)      # framed header TLVs: its precondition
    named_or_value(lambda: Record("k", b"", 0, 0, meta).headers)


@examples(200)
@given(values=st.lists(st.binary(max_size=70) | st.sampled_from([b"", b"\x00", b"\x01a", b"\x41" + b"n" * 65]),
                       max_size=limits.RECORD_HEADERS_MAX + 2))
def test_validate_headers_on_any_framed_header_tlvs(values):
    raw = b"".join(tlv(wire.TAG_HEADER, v) for v in values)
    named_or_value(wire.validate_headers, raw)


@examples(200)
@given(batch=st.binary(max_size=120) | stored_batches().flatmap(lambda b: mutated(b[0])),
       first_sn=st.integers(0, seqno.SN_MAX))
def test_batch_parsers(batch, first_sn):
    header = named_or_value(wire.read_header, batch)
    verified = named_or_value(wire.verify, batch)
    assert header is not None or verified is None
    if header is not None:
        assert type(header) is wire.BatchHeader and header.count > 0
    entries = named_or_value(lambda: list(wire.batch_entries(batch)))
    if entries is not None:
        assert len(entries) == header.count
    named_or_value(lambda: list(wire.iter_entries(batch, 3)))
    sequenced = named_or_value(wire.sequence, batch, first_sn)
    if sequenced is not None:       # (verify refuses it when its SNs would pass 2^128 - 1)
        header = named_or_value(wire.verify, sequenced)
        assert header is None or header.first_sn == first_sn


@examples(100)
@given(sns=st.binary(max_size=70), ordinals=st.binary(max_size=20), count=st.integers(-1, 5))
def test_decode_put_results(sns, ordinals, count):
    out = named_or_value(wire.decode_put_results, sns, ordinals, count)
    if out is not None:
        assert len(out[0]) == len(out[1]) == max(count, 0)


def test_both_implementations_are_fuzzed_when_built():
    """The parametrization covers the compiled module whenever it is in force."""
    assert [p.values[0] for p in IMPLS] == [REF] + ([COMP] if COMP is not None else [])
    if wire.IMPLEMENTATION == "compiled":
        assert COMP is not None and wire.parse_put is COMP.parse_put
