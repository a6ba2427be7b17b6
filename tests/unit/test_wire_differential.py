"""Differential tests of sms.wire's hot functions: the pure-Python reference against the
compiled implementation (sms/_wire.c).

The contract (sms/wire.py's docstring): `wire.reference` and `wire.compiled` give the same
bytes, the same decisions and the same named errors -- the same exception class and the
same `.message` -- on valid AND malformed input. Every comparison here runs both on one
input and checks `outcome(reference) == outcome(compiled)` exactly (`assert_agree`): a
return value with the same types all the way down (a `PutEntry` is not a plain tuple), or
the same `SmsError` subclass (not merely a subclass of it) with the same message. Any
other exception escapes and fails the test: non-named exceptions are only for wrong
Python argument types, never for bad bytes.

Valid inputs come from wire's own encoders (`encode_put_entry`, `encode_session_entry`,
`encode_headers`, `encode_entry`, `seal`, `sequence`); malformed ones are valid ones
broken in one known way: truncated at every offset, a lying length field or count,
arbitrary or invalid UTF-8 keys, keys of 0 or 257 characters, bad or truncated TLVs, bad
headers (names empty, too long, not UTF-8, repeated; too many; too big), trailing bytes,
SSSNs of the wrong length, a dedup key or session partition without a session, data over
the limit, and stored batches whose framing lies under a checksum that holds
(`wire.seal`).

The comparisons need the compiled module and are skipped without it (not built, or
SMS_PURE_PYTHON=1). The round trips and the mutation guard run against whatever
implementations there are, so the file also means something in a pure-Python run: the
mutation guard shows the harness notices a different value, message, error class or
result type, so the comparisons cannot pass vacuously, and `test_generators_reach_*`
show the malformed-input generators do reach each named error.

The `test_edge_*` tests pin single inputs on which the two implementations were once
seen to disagree (out-of-range values that the random generators here keep clear of, so
that the broad tests keep guarding everything else); they run on every implementation
there is and ask for one named error.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sms import limits, records, seqno, wire
from sms.errors import (InvalidArgument, InvalidPartitionKey, InvalidRecordHeader, RecordTooLarge, RequestTooLarge,
                        SmsError)
from sms.types import Record

REF = wire.reference
COMP = wire.compiled
HAS_COLUMNS = hasattr(REF, "columns")     # (a later addition: the Arrow-shaped read of a batch)

needs_compiled = pytest.mark.skipif(COMP is None, reason="sms._wire is not built (or SMS_PURE_PYTHON=1): "
                                                         "nothing to compare the reference with")
IMPLS = [pytest.param(REF, id="reference")] + ([pytest.param(COMP, id="compiled")] if COMP is not None else [])

# Deterministic (no per-run randomness, no example database), no deadlines (a loaded CI
# machine trips them); each test sets a modest max_examples.
BASE = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


def examples(n: int) -> settings:
    return settings(BASE, max_examples=n)


# --- the comparison harness -----------------------------------------------------------------

def shape(value):
    """A value with its type at every level: a namedtuple and a plain tuple of the same
    items differ, and so do a list and a tuple, or an int and a bool."""
    if isinstance(value, (list, tuple)):
        return type(value), tuple(shape(v) for v in value)
    return type(value), value


def outcome(fn, *args, any_error: bool = False):
    """("returned", shape of the value) or ("raised", error class, message). Only named
    errors (SmsError) are caught unless `any_error`: anything else escapes."""
    try:
        return "returned", shape(fn(*args))
    except SmsError as e:
        return "raised", type(e), e.message
    except Exception as e:
        if not any_error:
            raise
        return "raised", type(e), str(e)


def _brief(x, limit: int = 1500) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def assert_agree(ref_fn, comp_fn, *args, any_error: bool = False):
    """Both give the same outcome on args; returns it."""
    expected = outcome(ref_fn, *args, any_error=any_error)
    got = outcome(comp_fn, *args, any_error=any_error)
    if got != expected:
        raise AssertionError(f"implementations disagree on args {_brief(args, 600)}\n"
                             f"  reference: {_brief(expected)}\n  compiled:  {_brief(got)}")
    return expected


def agree(name: str, *args, any_error: bool = False):
    """`wire.reference.<name>(*args)` and `wire.compiled.<name>(*args)` agree."""
    ref_fn, comp_fn = getattr(REF, name), getattr(COMP, name)
    assert ref_fn is not comp_fn
    return assert_agree(ref_fn, comp_fn, *args, any_error=any_error)


# --- building blocks ------------------------------------------------------------------------

U32 = st.integers(0, (1 << 32) - 1)
U64 = st.integers(0, (1 << 64) - 1)
HASH_KEYS = st.integers(0, limits.HASH_KEY_MAX)
DATA = st.binary(max_size=120)
NOT_SURROGATE = st.characters(exclude_categories=("Cs",))
KEY_TEXT = st.one_of(
    st.text(NOT_SURROGATE, min_size=1, max_size=24),
    st.text(NOT_SURROGATE, min_size=250, max_size=256),
    st.sampled_from(["k", "\x00", "é", "日本語キー", "😀" * 256, "a" * 256, "\U0010ffff"]),
)
KEYS = KEY_TEXT.map(lambda s: s.encode())
BAD_KEYS = st.one_of(
    st.binary(max_size=30),                                # mostly not UTF-8
    st.sampled_from([b"", b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"a\x80", b"\xf4\x90\x80\x80",
                     b"a" * 257, "é".encode() * 257, "😀".encode() * 257, b"a" * 256 + b"\xff"]),
)
HEADER_NAMES = st.text(NOT_SURROGATE, min_size=1, max_size=20).filter(
    lambda s: len(s.encode()) <= limits.RECORD_HEADER_NAME_BYTES_MAX)
HEADER_MAPS = st.one_of(
    st.dictionaries(HEADER_NAMES, st.binary(max_size=40), max_size=limits.RECORD_HEADERS_MAX),
    st.just({"n" * limits.RECORD_HEADER_NAME_BYTES_MAX: b"v" * (limits.RECORD_HEADERS_BYTES_MAX
                                                               - limits.RECORD_HEADER_NAME_BYTES_MAX)}),
    st.just({f"h{i:02}": b"" for i in range(limits.RECORD_HEADERS_MAX)}),
)
HEADERS = HEADER_MAPS.map(wire.encode_headers)        # valid header TLVs (b"" for none)
# small ones, for the tests that try every offset of an input
SMALL_KEYS = st.text(NOT_SURROGATE, min_size=1, max_size=4).map(str.encode)
SMALL_HEADERS = st.dictionaries(st.sampled_from(["a", "é", "name"]), st.binary(max_size=4),
                                max_size=2).map(wire.encode_headers)
PRODUCER_IDS = st.binary(min_size=1, max_size=limits.PRODUCER_ID_BYTES_MAX)
DEDUP_KEYS = st.binary(max_size=limits.DEDUP_KEY_BYTES_MAX)
FIRST_SNS = st.one_of(st.integers(0, seqno.SN_MAX - 100 * seqno.COUNTER_UNIT),
                      st.builds(seqno.make, st.integers(0, seqno.TS_MAX), st.integers(0, seqno.COUNTER_MAX - 100),
                                st.integers(0, seqno.ORDINAL_MAX)))


def tlv(tag: int, value: bytes) -> bytes:
    """A meta TLV, any tag and value (no checks: malformed ones too)."""
    if tag >= wire.LONG_TAG_MIN:
        return struct.pack(">BH", tag, len(value) & 0xFFFF) + value
    return bytes((tag, len(value) & 0xFF)) + value


def header_tlv(name: bytes, value: bytes = b"", name_len: int | None = None) -> bytes:
    return tlv(wire.TAG_HEADER, bytes((len(name) if name_len is None else name_len,)) + name + value)


@st.composite
def put_entries(draw, session: bool, small: bool = False) -> bytes:
    """One valid PutRecords entry; with a session: SSSN, submit time, maybe a dedup key and
    a session partition, its TLVs in either the encoder's or a drawn order."""
    key, data = draw(SMALL_KEYS if small else KEYS), draw(st.binary(max_size=6) if small else DATA)
    hash_key = draw(st.none() | HASH_KEYS)
    headers = draw(SMALL_HEADERS if small else HEADERS)
    if not session:
        return wire.encode_put_entry(key, data, hash_key=hash_key, headers=headers)
    sssn, submit_ms = draw(U64), draw(U64)
    dedup_key = draw(st.none() | (st.binary(max_size=4) if small else DEDUP_KEYS))
    ordinal = draw(st.none() | U32)
    if draw(st.booleans()):
        return wire.encode_put_entry(key, data, hash_key=hash_key, sssn=sssn, submit_ms=submit_ms,
                                     dedup_key=dedup_key, session_ordinal=ordinal, headers=headers)
    extra = []
    if hash_key is not None:
        extra.append(tlv(wire.TAG_EXPLICIT_HASH_KEY, hash_key.to_bytes(16, "big")))
    if dedup_key is not None:
        extra.append(tlv(wire.TAG_DEDUP_KEY, dedup_key))
    if ordinal is not None:
        extra.append(tlv(wire.TAG_SESSION_ORDINAL, ordinal.to_bytes(4, "big")))
    extra += [tlv(t, v) for t, v in wire.iter_meta(headers)]
    return wire.encode_session_entry(key, data, sssn, submit_ms, b"".join(draw(st.permutations(extra))))


@st.composite
def put_requests(draw, small: bool = False) -> tuple[int, bytes, bytes]:
    """(count, blob, producer_id) of a valid PutRecords request."""
    session = draw(st.booleans())
    entries = draw(st.lists(put_entries(session, small), min_size=1, max_size=3 if small else 5))
    return len(entries), b"".join(entries), draw(PRODUCER_IDS) if session else b""


# TLVs for broken metas: the known tags with values of the right length and off by a
# little, unknown short and long tags, and header TLVs good and bad.
GOOD_HEADER_VALUES = st.builds(lambda n, v: bytes((len(n),)) + n + v, HEADER_NAMES.map(str.encode),
                               st.binary(max_size=20))
BAD_HEADER_VALUES = st.one_of(
    st.binary(max_size=12),                                                    # anything
    st.just(b""),                                                              # no name length
    st.builds(lambda v: b"\x00" + v, st.binary(max_size=5)),                   # a name of 0 bytes
    st.builds(lambda n: bytes((len(n) + 1,)) + n, st.binary(min_size=1, max_size=5)),  # name past the value
    st.just(bytes((65,)) + b"n" * 65),                                         # a name of 65 bytes
    st.builds(lambda n: bytes((len(n),)) + n, st.sampled_from([b"\xff", b"\xc3", b"a\xed\xa0\x80", b"\x80x"])),
)
META_TLVS = st.one_of(
    st.builds(tlv, st.just(wire.TAG_EXPLICIT_HASH_KEY), st.sampled_from([0, 1, 15, 16, 16, 17]).flatmap(
        lambda n: st.binary(min_size=n, max_size=n))),
    st.builds(tlv, st.sampled_from([wire.TAG_SSSN, wire.TAG_SUBMIT_MS]), st.sampled_from([0, 7, 8, 8, 9]).flatmap(
        lambda n: st.binary(min_size=n, max_size=n))),
    st.builds(tlv, st.just(wire.TAG_DEDUP_KEY), st.binary(max_size=limits.DEDUP_KEY_BYTES_MAX + 2)),
    st.builds(tlv, st.just(wire.TAG_SESSION_ORDINAL), st.sampled_from([0, 3, 4, 4, 5]).flatmap(
        lambda n: st.binary(min_size=n, max_size=n))),
    st.builds(tlv, st.just(wire.TAG_PRODUCER_ID), st.binary(max_size=10)),
    st.builds(tlv, st.just(wire.TAG_HEADER), GOOD_HEADER_VALUES | BAD_HEADER_VALUES),
    st.builds(tlv, st.integers(0, 255), st.binary(max_size=10)),
)


@st.composite
def metas(draw) -> bytes:
    """A meta of arbitrary TLVs, sometimes cut short (a truncated TLV)."""
    meta = b"".join(draw(st.lists(META_TLVS, max_size=6)))
    if meta and draw(st.integers(0, 4)) == 0:
        meta = meta[:draw(st.integers(0, len(meta) - 1))]
    return meta


@st.composite
def odd_entries(draw) -> bytes:
    """A framed entry with any key and any meta (valid or not)."""
    return wire.encode_entry(draw(KEYS | BAD_KEYS), draw(DATA), draw(metas()))


@st.composite
def header_entries(draw, session: bool) -> bytes:
    """An entry valid but for its headers, which may break any header rule: names empty,
    too long, not UTF-8, past the value, repeated; too many of them; too many bytes."""
    names = draw(st.lists(st.sampled_from([b"a", b"b", "é".encode(), b"n" * 64]) | HEADER_NAMES.map(str.encode),
                          max_size=limits.RECORD_HEADERS_MAX + 2))
    tlvs = [header_tlv(n, draw(st.binary(max_size=8) | st.sampled_from([b"v" * 2100, b"v" * 4095])))
            for n in names]
    tlvs += draw(st.lists(st.builds(tlv, st.just(wire.TAG_HEADER), GOOD_HEADER_VALUES | BAD_HEADER_VALUES),
                          max_size=2))
    headers = b"".join(draw(st.permutations(tlvs)))
    if session:
        return wire.encode_session_entry(draw(KEYS), draw(DATA), draw(U64), draw(U64), headers)
    return wire.encode_entry(draw(KEYS), draw(DATA), headers)


def entry_offsets(blob: bytes) -> list[int]:
    """The offsets where the (well framed) entries of blob start."""
    out, offset = [], 0
    while offset + wire.ENTRY.size <= len(blob):
        out.append(offset)
        data_len, key_len, meta_len = wire.ENTRY.unpack_from(blob, offset)
        offset += wire.ENTRY.size + key_len + meta_len + data_len
    return out


LENGTH_FIELDS = [(0, "<I", (1 << 32) - 1), (4, "<H", 0xFFFF), (6, "<H", 0xFFFF)]   # data, key, meta length


@st.composite
def lying_length(draw, blob: bytes) -> bytes:
    """blob with one entry's data, key or meta length field overwritten."""
    offsets = entry_offsets(blob)
    if not offsets:
        return blob
    at = draw(st.sampled_from(offsets))
    field, fmt, top = draw(st.sampled_from(LENGTH_FIELDS))
    (true,) = struct.unpack_from(fmt, blob, at + field)
    value = draw(st.one_of(st.integers(0, top), st.integers(max(0, true - 3), min(top, true + 3)),
                           st.sampled_from([0, 1, top, top - 1])))
    out = bytearray(blob)
    struct.pack_into(fmt, out, at + field, value)
    return bytes(out)


@st.composite
def broken(draw, blob: bytes) -> bytes:
    """blob broken in one way: cut short, a lying length field, trailing bytes, flipped
    bytes, or a slice cut out."""
    if draw(st.integers(0, 99)) < 40:
        return blob
    how = draw(st.sampled_from(["cut", "length", "trailing", "flip", "splice"]))
    if how == "cut" and blob:
        return blob[:draw(st.integers(0, len(blob) - 1))]
    if how == "length":
        return draw(lying_length(blob))
    if how == "trailing":
        return blob + draw(st.binary(min_size=1, max_size=12))
    if how == "flip" and blob:
        out = bytearray(blob)
        for _ in range(draw(st.integers(1, 3))):
            out[draw(st.integers(0, len(out) - 1))] ^= draw(st.integers(1, 255))
        return bytes(out)
    if how == "splice" and blob:
        i = draw(st.integers(0, len(blob) - 1))
        j = draw(st.integers(i, min(len(blob), i + 20)))
        return blob[:i] + blob[j:]
    return blob


@st.composite
def broken_put_requests(draw) -> tuple[int, bytes, bytes]:
    """(count, blob, producer_id) of a PutRecords request broken in one or more ways:
    odd entries (bad keys, bad TLVs, bad headers) among valid ones, a broken blob, a
    wrong count, a producer id that is missing, present or too long."""
    session = draw(st.booleans())
    entries = draw(st.lists(st.one_of(put_entries(session), put_entries(session), odd_entries(),
                                      header_entries(session)), min_size=1, max_size=4))
    blob = draw(broken(b"".join(entries)))
    count = len(entries)
    if draw(st.integers(0, 99)) >= 85:
        count = draw(st.one_of(st.integers(count - 2, count + 2),
                               st.sampled_from([0, -1, limits.PUT_RECORDS_COUNT_MAX + 1])))
    pid = draw(PRODUCER_IDS) if session else b""
    if draw(st.integers(0, 99)) >= 85:          # a session's records without one, or the other way round
        pid = draw(st.one_of(st.just(b""), PRODUCER_IDS,
                             st.binary(min_size=limits.PRODUCER_ID_BYTES_MAX + 1,
                                       max_size=limits.PRODUCER_ID_BYTES_MAX + 3)))
    return count, blob, pid


@dataclass(frozen=True, slots=True)
class Stored:
    """What stored_entries reads of a record (the attributes of ingestion's Submission)."""

    key: bytes
    data: bytes
    producer_id: bytes = b""
    sssn: int = 0
    dedup_key: bytes | None = None
    session_ordinal: int | None = None
    headers: bytes = b""


@st.composite
def stored_records(draw, small: bool = False) -> Stored:
    keys, data, headers = (SMALL_KEYS, st.binary(max_size=6), SMALL_HEADERS) if small else (KEYS, DATA, HEADERS)
    if draw(st.booleans()):
        return Stored(draw(keys), draw(data), headers=draw(headers))
    return Stored(draw(keys), draw(data), draw(st.binary(min_size=1, max_size=3) if small else PRODUCER_IDS),
                  draw(U64), draw(st.none() | (st.binary(max_size=3) if small else DEDUP_KEYS)),
                  draw(st.none() | U32), draw(headers))


STORED_LISTS = st.lists(stored_records(), min_size=1, max_size=6)


@st.composite
def stored_batches(draw, small: bool = False) -> tuple[bytes, int]:
    """(a verified, sequenced batch of stored entries, its count)."""
    recs = draw(st.lists(stored_records(small), min_size=1, max_size=3) if small else STORED_LISTS)
    body = REF.stored_entries(recs)
    return wire.sequence(wire.seal(len(recs), 0, body), draw(FIRST_SNS)), len(recs)


@st.composite
def lying_batches(draw) -> tuple[bytes, int]:
    """(batch, entries it was built from): stored entries, some odd (keys not UTF-8,
    truncated TLVs), the body then broken and the count perhaps wrong, sealed anew so the
    checksum holds over the lie. Counts stay near the truth and first SNs clear of 2^128
    (see the test_edge_* tests for both)."""
    entries = [REF.stored_entries([r]) for r in draw(STORED_LISTS)]
    entries += draw(st.lists(odd_entries(), max_size=2))
    entries = draw(st.permutations(entries))
    body = draw(broken(b"".join(entries)))
    count = draw(st.one_of(st.just(len(entries)), st.integers(1, len(entries) + 3)))
    return wire.seal(count, draw(FIRST_SNS), body), len(entries)


BOUNDS = st.one_of(st.integers(-3, 10), st.sampled_from([-(1 << 62), 1 << 62]))
ENTRY_LISTS = st.lists(st.builds(wire.encode_entry, st.binary(max_size=20), st.binary(max_size=30), DATA),
                       max_size=6)


# --- mutation guard: the harness notices differences ----------------------------------------

def test_mutation_guard_harness_notices_every_kind_of_difference():
    """The comparison is not vacuous: a different value, message, error class (even a
    subclass of the right one) or result type each fail `assert_agree`, and a non-named
    error escapes it."""
    good = 1, wire.encode_put_entry(b"key", b"data"), b""
    assert_agree(REF.parse_put, REF.parse_put, *good)        # the same function agrees with itself

    def other_value(count, blob, pid):
        return [e._replace(data=e.data + b"!") for e in REF.parse_put(count, blob, pid)]

    def plain_tuples(count, blob, pid):
        return [tuple(e) for e in REF.parse_put(count, blob, pid)]

    def list_not_tuple(count, blob, pid):
        return [list(e) for e in REF.parse_put(count, blob, pid)]

    def other_message(count, blob, pid):
        try:
            return REF.parse_put(count, blob, pid)
        except InvalidArgument as e:
            raise type(e)(e.message + " ") from None

    def other_class(count, blob, pid):
        try:
            return REF.parse_put(count, blob, pid)
        except InvalidPartitionKey as e:
            raise InvalidArgument(e.message) from None     # the base class, same message

    def raises_when_valid(count, blob, pid):
        REF.parse_put(count, blob, pid)
        raise InvalidArgument("record entries truncated")

    def crashes(count, blob, pid):
        raise TypeError("not a named error")

    for wrong in (other_value, plain_tuples, list_not_tuple, raises_when_valid):
        with pytest.raises(AssertionError, match="implementations disagree"):
            assert_agree(REF.parse_put, wrong, *good)
    truncated = (1, good[1][:-1], b"")
    assert outcome(REF.parse_put, *truncated)[:2] == ("raised", InvalidArgument)
    with pytest.raises(AssertionError, match="implementations disagree"):
        assert_agree(REF.parse_put, other_message, *truncated)
    empty_key = (1, wire.encode_entry(b"", b"d"), b"")
    assert outcome(REF.parse_put, *empty_key)[:2] == ("raised", InvalidPartitionKey)
    with pytest.raises(AssertionError, match="implementations disagree"):
        assert_agree(REF.parse_put, other_class, *empty_key)
    with pytest.raises(TypeError):
        assert_agree(REF.parse_put, crashes, *good)
    # and the same for a bytes result and a list of Records
    with pytest.raises(AssertionError, match="implementations disagree"):
        assert_agree(REF.stored_entries, lambda recs: REF.stored_entries(recs) + b"\0", [Stored(b"k", b"d")])
    batch = wire.sequence(wire.build_batch([wire.encode_entry(b"k", b"d")]), 7)
    with pytest.raises(AssertionError, match="implementations disagree"):
        assert_agree(REF.decode_records, lambda *a: [r._replace(sn=r.sn + 1) for r in REF.decode_records(*a)],
                     batch, 0, 1, 3)


def _mutant_repeated_header_message(count, blob, pid):
    try:
        return REF.parse_put(count, blob, pid)
    except InvalidRecordHeader as e:
        raise InvalidRecordHeader(e.message.replace("name repeated", "name repeated twice")) from None


def _mutant_session_ordinal(count, blob, pid):
    return [e._replace(session_ordinal=e.session_ordinal + 1) if e.session_ordinal else e
            for e in REF.parse_put(count, blob, pid)]


def _mutant_dedup_key_dropped(batch, start, end):
    return [f._replace(dedup_key=None) for f in REF.session_fields(batch, start, end)]


def _mutant_bad_key_error(batch, start, end, ordinal):
    try:
        return REF.decode_records(batch, start, end, ordinal)
    except wire.CorruptBatch as e:
        if "codec" in e.message:
            raise InvalidArgument(e.message) from None
        raise


def _mutant_trailing_count(buf, count, offset=0):
    try:
        return REF.check_framing(buf, count, offset)
    except InvalidArgument as e:
        raise InvalidArgument(e.message.replace(" trailing", "0 trailing")) from None


MUTANTS = {
    "parse_put: message of a repeated header name": (REF.parse_put, _mutant_repeated_header_message,
                                                      broken_put_requests()),
    "parse_put: session partition off by one": (REF.parse_put, _mutant_session_ordinal, broken_put_requests()),
    "session_fields: dedup key dropped": (REF.session_fields, _mutant_dedup_key_dropped,
                                          st.tuples(stored_batches().map(lambda b: b[0]), BOUNDS, BOUNDS)),
    "decode_records: class of the bad-key error": (REF.decode_records, _mutant_bad_key_error,
                                                   st.tuples(lying_batches().map(lambda b: b[0]), BOUNDS, BOUNDS,
                                                             st.just(0))),
    "check_framing: trailing byte count": (REF.check_framing, _mutant_trailing_count,
                                           st.tuples(ENTRY_LISTS.flatmap(lambda es: broken(b"".join(es))),
                                                     st.integers(0, 4))),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutation_guard_generators_and_harness_catch_a_subtle_mutant(mutant):
    """A reference changed on one rare path (a message, an optional field, an error
    class) is told apart from the real one within the example budgets used here: the
    generators reach those paths and the harness compares what they give."""
    ref_fn, mutant_fn, strategy = MUTANTS[mutant]

    @settings(BASE, max_examples=400, phases=[Phase.generate])
    @given(strategy)
    def compare(args):
        assert_agree(ref_fn, mutant_fn, *args)

    with pytest.raises(AssertionError, match="implementations disagree"):
        compare()


def tally(strategy, run, n: int) -> set:
    """The labels `run(example)` gives over n examples of strategy (no shrinking: this
    measures what the generator reaches, it does not hunt for one example)."""
    seen = set()

    @examples(n)
    @given(strategy)
    def each(example):
        seen.add(run(example))

    each()
    return seen


def label(result) -> object:
    return "returned" if result[0] == "returned" else result[1]


def test_generators_reach_every_outcome_of_parse_put():
    """The malformed-request generator reaches valid requests and every named error
    parse_put gives on small input (RecordTooLarge needs a 1 MiB record: see
    test_oversize_data_and_requests), so the comparisons over it cover each path."""
    seen = tally(broken_put_requests(), lambda r: label(outcome(REF.parse_put, *r)), 300)
    assert seen == {"returned", InvalidArgument, InvalidPartitionKey, InvalidRecordHeader, RequestTooLarge}


def test_generators_reach_every_outcome_of_the_reads():
    """The lying-batch generator reaches batches that read back and each way a read of
    a stored batch fails: entries past the end, a key not UTF-8, truncated meta,
    trailing bytes."""
    def what(result) -> str:       # the message without its "batch first_sn N: " prefix
        return result[-1].split(": ", 1)[-1] if result[0] == "raised" else ""

    def run(args):
        (batch, _), start, end = args
        result = outcome(REF.decode_records, batch, start, end, 0)
        fields = outcome(REF.session_fields, batch, start, end)
        return label(result), what(result).split(" in position")[0], label(fields), what(fields)
    seen = tally(st.tuples(lying_batches(), BOUNDS, BOUNDS), run, 300)
    decoded = {(a, b) for a, b, _, _ in seen}
    assert ("returned", "") in decoded
    assert (wire.CorruptBatch, "entries run past the batch") in decoded
    assert any(a is wire.CorruptBatch and "codec can't decode" in b for a, b in decoded)
    fields = {(c, d if "trailing" not in d else "trailing") for _, _, c, d in seen}
    assert fields >= {("returned", ""), (wire.CorruptBatch, "record entries truncated"),
                      (wire.CorruptBatch, "record meta truncated"), (wire.CorruptBatch, "trailing")}


# --- round trips (every implementation there is) ------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
@examples(60)
@given(data=st.data())
def test_parse_put_gives_back_what_encode_put_entry_put_in(impl, data):
    session = data.draw(st.booleans())
    pid = data.draw(PRODUCER_IDS) if session else b""
    fields = []
    for _ in range(data.draw(st.integers(1, 4))):
        f = dict(key=data.draw(KEYS), data=data.draw(DATA), hash_key=data.draw(st.none() | HASH_KEYS),
                 headers=data.draw(HEADERS))
        if session:
            f.update(sssn=data.draw(U64), submit_ms=data.draw(U64), dedup_key=data.draw(st.none() | DEDUP_KEYS),
                     session_ordinal=data.draw(st.none() | U32))
        fields.append(f)
    blob = b"".join(wire.encode_put_entry(**{k: v for k, v in f.items() if k not in ("key", "data")},
                                          key=f["key"], data=f["data"]) for f in fields)
    parsed = impl.parse_put(len(fields), blob, pid)
    assert [type(e) for e in parsed] == [wire.PutEntry] * len(fields)
    for e, f in zip(parsed, fields):
        assert e.key == f["key"] and e.data == f["data"] and e.headers == f["headers"]
        expected_hash = f["hash_key"] if f["hash_key"] is not None else \
            int.from_bytes(hashlib.md5(f["key"]).digest(), "big")
        assert e.hash_key == expected_hash
        assert (e.sssn, e.submit_ms) == (f.get("sssn", 0), f.get("submit_ms", 0))
        assert e.dedup_key == f.get("dedup_key") and e.session_ordinal == f.get("session_ordinal")
        assert e.signature == impl.signature(f["key"], f["data"], f["headers"])
        assert len(e.signature) == 16


@pytest.mark.parametrize("impl", IMPLS)
@examples(60)
@given(recs=STORED_LISTS, first_sn=FIRST_SNS, ordinal=st.integers(0, seqno.ORDINAL_MAX))
def test_stored_entries_read_back_by_decode_records_and_session_fields(impl, recs, first_sn, ordinal):
    body = impl.stored_entries(recs)
    impl.check_framing(body, len(recs))
    batch = wire.sequence(wire.seal(len(recs), 0, body), first_sn)
    got = impl.decode_records(batch, 0, len(recs), ordinal)
    assert [type(r) for r in got] == [Record] * len(recs)
    assert [(r.partition_key.encode(), r.data, r.headers) for r in got] == \
        [(r.key, r.data, wire.decode_headers(r.headers)) for r in recs]
    assert [(r.sn, r.partition_ordinal) for r in got] == \
        [(first_sn + i * seqno.COUNTER_UNIT, ordinal) for i in range(len(recs))]
    assert [wire.headers_of(r.meta) for r in got] == [r.headers for r in recs]
    sessions = impl.session_fields(batch, 0, len(recs))
    assert sessions == [wire.SessionFields(i, r.producer_id, r.sssn, r.dedup_key, r.session_ordinal,
                                           impl.signature(r.key, r.data, r.headers))
                        for i, r in enumerate(recs) if r.producer_id]
    # a window [start, end) reads the same records as the whole
    start, end = len(recs) // 3, len(recs) - len(recs) // 3
    assert impl.decode_records(batch, start, end, ordinal) == got[start:end]
    assert impl.session_fields(batch, start, end) == [s for s in sessions if start <= s.index < end]


def _slices(values: bytes, offsets: bytes) -> list[bytes]:
    ends = struct.unpack(f"<{len(offsets) // 4}I", offsets)
    return [values[a:b] for a, b in zip(ends, ends[1:])]


def columns_as_rows(cols) -> list[tuple]:
    """(key, data, sn, arrival ms, [(header name, value)...]) per record of a columns()
    answer."""
    count, ko, kv, do, dv, so, sv, ms, ho, hko, hkv, hvo, hvv = cols
    per_record = struct.unpack(f"<{count + 1}I", ho)
    names, values = _slices(hkv, hko), _slices(hvv, hvo)
    arrival = struct.unpack(f"<{count}q", ms)
    return [(k.decode(), d, int(sn), t, list(zip(names[a:b], values[a:b])))
            for k, d, sn, t, a, b in zip(_slices(kv, ko), _slices(dv, do), _slices(sv, so), arrival,
                                         per_record, per_record[1:])]


@pytest.mark.skipif(not HAS_COLUMNS, reason="wire has no columns()")
@pytest.mark.parametrize("impl", IMPLS)
@examples(60)
@given(recs=STORED_LISTS, first_sn=FIRST_SNS, window=st.tuples(BOUNDS, BOUNDS))
def test_columns_hold_what_decode_records_reads(impl, recs, first_sn, window):
    batch = wire.sequence(wire.seal(len(recs), 0, impl.stored_entries(recs)), first_sn)
    for start, end in ((0, len(recs)), window):
        cols = impl.columns(batch, start, end)
        assert type(cols) is tuple and len(cols) == 13 and all(type(c) is bytes for c in cols[1:])
        assert columns_as_rows(cols) == [
            (r.partition_key, r.data, r.sn, seqno.timestamp_ms_of(r.sn),
             [(n.encode(), v) for n, v in r.headers.items()])
            for r in impl.decode_records(batch, start, end, 0)]


@pytest.mark.parametrize("impl", IMPLS)
@examples(60)
@given(pairs=st.lists(st.tuples(KEY_TEXT, DATA), min_size=1, max_size=8))
def test_encode_puts_entries_parse_back(impl, pairs):
    entries, hashes = impl.encode_puts(pairs, records.encode_put)
    parsed = impl.parse_put(len(pairs), b"".join(entries), b"")
    assert [(e.key.decode(), e.data) for e in parsed] == pairs
    assert hashes == [e.hash_key for e in parsed] == [impl.hash_key(k.encode()) for k, _ in pairs]


@pytest.mark.parametrize("impl", IMPLS)
def test_hash_key_is_md5_big_endian_across_block_boundaries(impl):
    for n in list(range(0, 300)) + [1000, 4095, 4096, 65_535, 65_536, 1 << 20]:
        key = bytes((i * 7 + n) & 0xFF for i in range(n))
        assert impl.hash_key(key) == int.from_bytes(hashlib.md5(key).digest(), "big"), n


# --- differential: valid input -------------------------------------------------------------

@needs_compiled
@examples(150)
@given(request=put_requests())
def test_parse_put_agrees_on_valid_requests(request):
    kind, *rest = agree("parse_put", *request)
    assert kind == "returned"


@needs_compiled
@examples(40)
@given(request=put_requests(small=True), data=st.data())
def test_parse_put_agrees_on_every_truncation(request, data):
    count, blob, pid = request
    for cut in range(len(blob)):
        agree("parse_put", count, blob[:cut], pid)
    agree("parse_put", count, blob + data.draw(st.binary(min_size=1, max_size=9)), pid)


@needs_compiled
@examples(300)
@given(request=broken_put_requests())
def test_parse_put_agrees_on_broken_requests(request):
    agree("parse_put", *request)


@needs_compiled
@examples(100)
@given(session=st.booleans(), data=st.data())
def test_parse_put_agrees_on_session_fields_present_missing_or_misplaced(session, data):
    """Session TLVs (SSSN, submit time, dedup key, session partition) of any length, any
    of them missing, with and without a producer id."""
    key, body = data.draw(KEYS), data.draw(DATA)
    tlvs = data.draw(st.lists(META_TLVS, max_size=5))
    meta = b"".join(data.draw(st.permutations(tlvs)))
    pid = data.draw(PRODUCER_IDS) if session else b""
    agree("parse_put", 1, wire.encode_entry(key, body, meta), pid)


HEADER_CASES = {
    "17 headers": b"".join(header_tlv(f"h{i}".encode()) for i in range(limits.RECORD_HEADERS_MAX + 1)),
    "16 headers": b"".join(header_tlv(f"h{i}".encode()) for i in range(limits.RECORD_HEADERS_MAX)),
    "4096 bytes": header_tlv(b"n", b"v" * (limits.RECORD_HEADERS_BYTES_MAX - 1)),
    "4097 bytes": header_tlv(b"n", b"v" * limits.RECORD_HEADERS_BYTES_MAX),
    "4097 over two": header_tlv(b"a", b"v" * 2047) + header_tlv(b"b", b"v" * 2048),
    "repeated name": header_tlv(b"a", b"1") + header_tlv(b"b") + header_tlv(b"a", b"2"),
    "repeated non-ASCII": header_tlv("é".encode()) + header_tlv("é".encode(), b"x"),
    "name of 0 bytes": header_tlv(b"", b"value"),
    "empty TLV": tlv(wire.TAG_HEADER, b""),
    "name of 64 bytes": header_tlv(b"n" * 64, b"v"),
    "name of 65 bytes": header_tlv(b"n" * 65, b"v"),
    "name past value": header_tlv(b"abc", name_len=9),
    "name not UTF-8": header_tlv(b"\xff\xfe"),
    "name a lone surrogate": header_tlv(b"\xed\xa0\x80"),
    "name overlong NUL": header_tlv(b"\xc0\x80"),
    "second name bad": header_tlv(b"ok") + header_tlv(b"\x80"),
    "truncated TLV": header_tlv(b"ok", b"v")[:-2],
    "TLV cut in its length": header_tlv(b"ok")[:2],
    "17th repeated": b"".join(header_tlv(f"h{i}".encode()) for i in range(16)) + header_tlv(b"h0"),
}


@needs_compiled
@pytest.mark.parametrize("case", sorted(HEADER_CASES))
@pytest.mark.parametrize("session", [False, True])
def test_parse_put_agrees_on_header_limits(case, session):
    headers = HEADER_CASES[case]
    if session:
        entry = wire.encode_session_entry(b"k", b"d", 5, 6, headers)
        pid = b"producer"
    else:
        entry, pid = wire.encode_entry(b"k", b"d", headers), b""
    good = wire.encode_put_entry(b"good", b"x")
    for count, blob in ((1, entry), (2, good + entry), (3, entry + good + entry)):
        agree("parse_put", count, blob, pid if session else b"")


@needs_compiled
@pytest.mark.parametrize("key", [b"", b"a" * 257, "é".encode() * 257, "😀".encode() * 257, b"\xff", b"a\xc3",
                                 b"\xed\xa0\x80", b"\xc0\x80", b"a" * 256, "😀".encode() * 256, b"\x00"])
def test_parse_put_agrees_on_key_edges(key):
    for blob in (wire.encode_put_entry(key, b"d"), wire.encode_put_entry(b"ok", b"") + wire.encode_put_entry(key, b"")):
        agree("parse_put", len(entry_offsets(blob)), blob, b"")


@needs_compiled
def test_parse_put_agrees_on_counts_and_producer_ids():
    entry = wire.encode_session_entry(b"k", b"d", 1, 2)
    for count in (-(1 << 62), -1, 0, 1, 2, limits.PUT_RECORDS_COUNT_MAX, limits.PUT_RECORDS_COUNT_MAX + 1, 1 << 31):
        agree("parse_put", count, entry, b"p")
    for pid_len in (0, 1, limits.PRODUCER_ID_BYTES_MAX, limits.PRODUCER_ID_BYTES_MAX + 1, 300):
        agree("parse_put", 1, entry, b"p" * pid_len)
    many = wire.encode_put_entry(b"k", b"") * limits.PUT_RECORDS_COUNT_MAX
    assert agree("parse_put", limits.PUT_RECORDS_COUNT_MAX, many, b"")[0] == "returned"


@needs_compiled
def test_oversize_data_and_requests():
    big = b"x" * (limits.RECORD_DATA_BYTES_MAX + 1)
    # a record of 1 MiB + 1 byte, first or after a good one
    assert agree("parse_put", 1, wire.encode_put_entry(b"k", big), b"")[1] is RecordTooLarge
    assert agree("parse_put", 2, wire.encode_put_entry(b"k", b"") + wire.encode_put_entry(b"k", big),
                 b"")[1] is RecordTooLarge
    # a lying data length of over 1 MiB: truncated first
    agree("parse_put", 1, wire.encode_put_entry(b"k", big)[:1000], b"")
    # exactly 1 MiB is fine
    full = b"y" * limits.RECORD_DATA_BYTES_MAX
    assert agree("parse_put", 1, wire.encode_put_entry(b"k", full), b"")[0] == "returned"
    # six records of 1 MiB: keys and data over PUT_RECORDS_BYTES_MAX
    assert agree("parse_put", 6, wire.encode_put_entry(b"k", full) * 6, b"")[1] is RequestTooLarge
    # five of 1 MiB and headers pushing it over
    heavy = wire.encode_put_entry(b"k", full[:-100], headers=header_tlv(b"h", b"v" * 1000))
    agree("parse_put", 5, heavy * 5, b"")
    # a blob over the bound on its size alone
    agree("parse_put", 1, wire.encode_put_entry(b"k", b"") + b"\0" * (limits.PUT_RECORDS_BYTES_MAX + 5000), b"")


# --- differential: encode_puts, stored_entries, signature, hash_key ---------------------------

RECORD_SHAPES = st.one_of(
    st.tuples(KEY_TEXT, DATA),                                                        # the lean path
    st.tuples(KEY_TEXT, DATA),
    st.tuples(st.text(min_size=1, max_size=8).map(lambda s: s + "\ud800"), DATA),     # a lone surrogate
    st.tuples(st.sampled_from(["", "a" * 257, "😀" * 257]), DATA),                      # 0 or 257 chars
    st.tuples(KEY_TEXT, st.binary(max_size=10).map(bytearray)),                       # not exactly bytes
    st.tuples(KEY_TEXT, st.text(max_size=5)),                                         # data a str: UTF-8
    st.tuples(KEY_TEXT, st.text(max_size=5).map(lambda s: s + "\udc80")),             # ... not encodable
    st.tuples(KEY_TEXT, DATA, HASH_KEYS | HASH_KEYS.map(str) | st.just(-1)),          # explicit hash key
    st.tuples(KEY_TEXT, DATA, st.none(), HEADER_MAPS),                                # headers
    st.builds(lambda k, d, h: {"partition_key": k, "data": d, "headers": h}, KEY_TEXT, DATA, HEADER_MAPS),
    st.builds(lambda k, d: [k, d], KEY_TEXT, DATA),                                   # a list
    st.builds(lambda k, d: (k, d, None), KEY_TEXT, DATA),
    st.just(("k",)),
    st.just({"partition_key": "k", "data": b"", "what": 1}),
)


@needs_compiled
@examples(150)
@given(recs=st.lists(RECORD_SHAPES, min_size=1, max_size=6))
def test_encode_puts_agrees_on_every_record_shape(recs):
    agree("encode_puts", recs, records.encode_put)


@needs_compiled
def test_encode_puts_agrees_on_data_limits():
    for n in (0, limits.RECORD_DATA_BYTES_MAX, limits.RECORD_DATA_BYTES_MAX + 1):
        agree("encode_puts", [("k", b"x" * n)], records.encode_put)
    agree("encode_puts", [], records.encode_put)
    agree("encode_puts", (("k", b"a"), ("é", b"")), records.encode_put)


@needs_compiled
@examples(150)
@given(recs=STORED_LISTS)
def test_stored_entries_agrees(recs):
    assert agree("stored_entries", recs)[0] == "returned"


@needs_compiled
@examples(40)
@given(recs=STORED_LISTS)
def test_stored_entries_agrees_on_ingestion_submissions(recs):
    partition = pytest.importorskip("ingestion.partition")
    subs = [partition.Submission(key=r.key, data=r.data, producer_id=r.producer_id, sssn=r.sssn, submit_ms=0,
                                 dedup_key=r.dedup_key, hwm=0, session_ordinal=r.session_ordinal,
                                 headers=r.headers) for r in recs]
    assert agree("stored_entries", subs) == agree("stored_entries", recs)


@needs_compiled
@examples(150)
@given(key=st.binary(max_size=1100), data=st.binary(max_size=300), headers=st.none() | st.binary(max_size=200))
def test_signature_and_hash_key_agree(key, data, headers):
    args = (key, data) if headers is None else (key, data, headers)
    agree("signature", *args)
    assert agree("hash_key", key) == outcome(lambda k: int.from_bytes(hashlib.md5(k).digest(), "big"), key)


# --- differential: check_framing -------------------------------------------------------------

@needs_compiled
@examples(200)
@given(entries=ENTRY_LISTS, prefix=st.binary(max_size=50), data=st.data())
def test_check_framing_agrees(entries, prefix, data):
    body = data.draw(broken(b"".join(entries)))
    buf = prefix + body
    count = data.draw(st.one_of(st.just(len(entries)), st.integers(-1, len(entries) + 3), st.just(1 << 40)))
    offset = data.draw(st.one_of(st.just(len(prefix)), st.integers(-10, len(buf) + 10)))
    agree("check_framing", buf, count, offset)
    agree("check_framing", memoryview(buf), count, offset)
    agree("check_framing", bytearray(buf), count, offset)
    if offset == 0:
        agree("check_framing", buf, count)


@needs_compiled
@examples(40)
@given(entries=ENTRY_LISTS.filter(bool))
def test_check_framing_agrees_on_every_truncation(entries):
    body = b"".join(entries)
    for cut in range(len(body) + 1):
        agree("check_framing", body[:cut], len(entries))
        agree("check_framing", b"\x01" * 48 + body[:cut], len(entries), 48)


# --- differential: decode_records, session_fields and columns ---------------------------------

def agree_reads(batch, start, end, ordinal=0):
    """Every read of a stored batch agrees on [start, end); the outcomes (decode_records
    first)."""
    out = [agree("decode_records", batch, start, end, ordinal), agree("session_fields", batch, start, end)]
    if HAS_COLUMNS:
        out.append(agree("columns", batch, start, end))
    return out


@needs_compiled
@examples(120)
@given(batch=stored_batches(), start=BOUNDS, end=BOUNDS, ordinal=st.integers(0, seqno.ORDINAL_MAX))
def test_reads_agree_on_valid_batches(batch, start, end, ordinal):
    batch, count = batch
    assert {result[0] for result in agree_reads(batch, 0, count, ordinal)} == {"returned"}
    agree_reads(batch, start, end, ordinal)


@needs_compiled
@examples(300)
@given(batch=lying_batches(), start=BOUNDS, end=BOUNDS)
def test_reads_agree_on_batches_whose_framing_lies_under_a_good_checksum(batch, start, end):
    batch, count = batch
    for s, e in ((0, count + 3), (start, end)):
        agree_reads(batch, s, e, 9)


@needs_compiled
@examples(25)
@given(batch=stored_batches(small=True))
def test_reads_agree_on_every_truncation_and_every_flipped_byte(batch):
    """Cut or flipped without resealing (the checksum catches it) and cut then resealed
    (the framing has to)."""
    batch, count = batch
    header = wire.read_header(batch)
    body = batch[wire.HEADER_BYTES:]
    for cut in range(len(batch)):
        agree_reads(batch[:cut], 0, count)
    for cut in range(len(body)):
        agree_reads(wire.seal(count, header.first_sn, body[:cut]), 0, count)
    for i in range(0, len(batch), max(1, len(batch) // 64)):
        agree_reads(batch[:i] + bytes((batch[i] ^ 0x5A,)) + batch[i + 1:], 0, count)


@needs_compiled
def test_reads_agree_on_bad_keys_and_bad_metas_in_stored_batches():
    entries = [wire.encode_entry(b"\xff", b"d"), wire.encode_entry(b"ok\xc3", b"d"),
               wire.encode_entry(b"ok", b"d", tlv(wire.TAG_PRODUCER_ID, b"p")[:-1]),
               wire.encode_entry(b"ok", b"d", tlv(wire.TAG_PRODUCER_ID, b"p") + tlv(wire.TAG_SSSN, b"\0" * 7)),
               wire.encode_entry(b"ok", b"d", tlv(wire.TAG_PRODUCER_ID, b"p") + tlv(wire.TAG_SSSN, b"\0" * 8)
                                 + tlv(wire.TAG_SESSION_ORDINAL, b"\0" * 3) + tlv(wire.TAG_DEDUP_KEY, b"")),
               wire.encode_entry(b"ok", b"d", tlv(wire.TAG_PRODUCER_ID, b"") + tlv(wire.TAG_SSSN, b"\1" * 8)
                                 + header_tlv(b"h", b"v") + tlv(0x99, b"zz") + tlv(0x05, b"")),
               wire.encode_entry(b"ok", b"d", tlv(wire.TAG_HEADER, b"abc")[:2])]
    for i in range(len(entries)):
        for j in range(i, len(entries) + 1):
            batch = wire.seal(len(entries), 1 << 40, b"".join(entries[:i] + entries[j:] + entries[i:j]))
            for start, end in ((0, len(entries)), (i, j), (j, i)):
                agree_reads(batch, start, end, 1)


@needs_compiled
def test_reads_agree_on_headers_that_do_not_verify():
    good = wire.sequence(wire.build_batch([wire.encode_entry(b"k", b"d")]), 5)
    for batch in (b"", good[:47], good[:48], bytes([3]) + good[1:], good[:1] + b"\1" + good[2:],
                  good[:4] + b"\0\0\0\0" + good[8:], good + b"\0", good[:-1]):
        agree_reads(batch, 0, 1)


# --- edge inputs the two implementations once treated differently ---------------------------------
# Each was found by this file and pinned here; each is now a named error in both (and the
# random generators above stay clear of them, so that those tests guard everything else).

AVAILABLE = [REF] + ([COMP] if COMP is not None else [])


def assert_named_everywhere(name: str, error: type, *args) -> None:
    """Every implementation raises `error` (exactly) on args, and they agree on its
    message. Non-named exceptions are caught here, to be shown, not to pass."""
    for impl in AVAILABLE:
        got = outcome(getattr(impl, name), *args, any_error=True)
        if got[:2] != ("raised", error):
            raise AssertionError(f"{'compiled' if impl is COMP else 'reference'} {name}: expected {error.__name__}, "
                                 f"got {_brief(got, 600)}")
    if COMP is not None:
        agree(name, *args, any_error=True)


def test_edge_decode_records_sn_past_2_128():
    """A sealed batch whose first SN is the largest there is: its second record's SN,
    first_sn + 2^32, would be past 2^128 - 1. (Once: the reference gave that SN, one that
    cannot exist, and the compiled code wrapped it around to 2^32 - 1.)"""
    batch = wire.seal(2, seqno.SN_MAX, wire.encode_entry(b"k", b"d") * 2)
    assert_named_everywhere("decode_records", wire.CorruptBatch, batch, 0, 2, 0)
    assert_named_everywhere("session_fields", wire.CorruptBatch, batch, 0, 2)
    if HAS_COLUMNS:
        assert_named_everywhere("columns", wire.CorruptBatch, batch, 0, 2)


def test_edge_decode_records_lying_huge_count():
    """A sealed batch of one entry whose header claims 2^32 - 1 records, read [0, count).
    (Once: the reference raised CorruptBatch, the compiled code sized its answer by the
    claim and raised MemoryError -- or, for 2^28, took 2 GiB before the CorruptBatch.)"""
    count = (1 << 32) - 1
    batch = wire.seal(count, 5, wire.encode_entry(b"k", b"d"))
    assert_named_everywhere("decode_records", wire.CorruptBatch, batch, 0, count, 0)
    assert_named_everywhere("session_fields", wire.CorruptBatch, batch, 0, count)
    if HAS_COLUMNS:
        assert_named_everywhere("columns", wire.CorruptBatch, batch, 0, count)


def test_edge_signature_of_a_key_over_65535_bytes():
    """The signature prefixes the key with its length in 2 bytes. (Once: the reference
    raised struct.error for a key of 65536 bytes, the compiled code wrapped the length.)"""
    assert_named_everywhere("signature", InvalidArgument, b"k" * 65_536, b"d")
    if COMP is not None:
        agree("signature", b"k" * 65_535, b"d")


OUT_OF_RANGE = {
    "dedup key of 256 bytes": Stored(b"k", b"d", b"p", 1, dedup_key=b"x" * 256),
    "producer id of 256 bytes": Stored(b"k", b"d", b"p" * 256, 1),
    "session ordinal 2^32": Stored(b"k", b"d", b"p", 1, session_ordinal=1 << 32),
    "session ordinal 2^63": Stored(b"k", b"d", b"p", 1, session_ordinal=1 << 63),
    "session ordinal -1": Stored(b"k", b"d", b"p", 1, session_ordinal=-1),
    "sssn 2^64": Stored(b"k", b"d", b"p", sssn=1 << 64),
    "sssn -1": Stored(b"k", b"d", b"p", sssn=-1),
    "key of 65536 bytes": Stored(b"k" * 65_536, b"d"),
    "headers of 65536 bytes": Stored(b"k", b"d", headers=b"h" * 65_536),
    "meta of 65536 bytes": Stored(b"k", b"d", b"p" * 200, 1, b"x" * 200, 7, headers=b"h" * (65_536 - 420)),
}


@pytest.mark.parametrize("case", list(OUT_OF_RANGE))
def test_edge_stored_entries_fields_that_do_not_fit_their_length_fields(case):
    """Values stored_entries cannot frame (ingestion never makes them: parse_put bounds
    every one), alone and after a good record. (Once: the reference raised struct.error
    or ValueError, the compiled code wrote truncated length fields -- bytes that do not
    frame as the record --, dropped the session partition (2^63) or raised OverflowError.)"""
    record = OUT_OF_RANGE[case]
    assert_named_everywhere("stored_entries", InvalidArgument, [record])
    assert_named_everywhere("stored_entries", InvalidArgument, [Stored(b"ok", b""), record])


def test_edge_check_framing_offsets_outside_the_buffer():
    """(Once: the reference unpacked a negative offset from the end of the buffer or
    raised struct.error; the compiled code cast it to size_t and read the up to 8 bytes
    in front of the buffer -- shown by a view whose 8 bytes in front are a whole empty
    entry, which the compiled code walked.)"""
    view = memoryview(wire.ENTRY.pack(0, 0, 0) + b"\xff" * 16)[8:]
    assert_named_everywhere("check_framing", InvalidArgument, view, 1, -8)
    entries = wire.encode_entry(b"k", b"d") * 2
    for offset in (-1, -8, -10, -(1 << 62), len(entries) + 1, 1 << 62):
        assert_named_everywhere("check_framing", InvalidArgument, entries, 1, offset)
