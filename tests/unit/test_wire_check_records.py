"""`wire.check_records`: what a head checks of every record before it stores a batch
(issue 30 item 2; sms/wire.py `check_batch`, `sequence_checked`).

Differential, as tests/unit/test_wire_differential.py (whose harness and generators this
file reuses): the pure-Python reference (`wire.reference.check_records`) and the compiled
twin (`wire.compiled.check_records`, sms/_wire.c) give the same verdict on every body, the
same named error class and the same message: on valid bodies, on keys that are not UTF-8
(overlong forms, surrogates, past U+10FFFF, truncated sequences, lone continuation
bytes), empty and oversized keys, oversized data, broken meta TLVs, session fields
without a producer id or an SSSN, bad headers, lying lengths and trailing bytes; and
`check_batch` over either agrees on whole batches (bad batch headers, checksums and
limits too). The compiled UTF-8 check is its own code (no Python decoder): it is
compared with Python's strict decoder on every sequence of up to two bytes and on every
lead and second byte of the longer ones.

The point of the check: a body it accepts is one every reader decodes (`decode_records`,
`session_fields`, `columns`, in both implementations), and `sequence_checked` refuses a
batch with a partition key that is not UTF-8 (the CorruptBatch-on-every-read hole).
"""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from sms import limits, wire
from sms.errors import InvalidArgument, InvalidPartitionKey, InvalidRecordHeader, RecordTooLarge, SmsError
from tests.unit.test_wire_differential import (BASE, BAD_KEYS, COMP, DATA, HEADER_CASES, HEADERS, IMPLS, KEYS,
                                               META_TLVS, REF, U32, U64, Stored, assert_agree, broken,
                                               broken_put_requests, examples, needs_compiled, outcome, put_requests,
                                               stored_records, tally, tlv)

# keys no reader decodes (each one a way UTF-8 goes wrong), and their valid neighbours
NOT_UTF8_KEYS = [
    b"\xc0\x80", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xe0\x9f\xbf", b"\xf0\x80\x80\xaf",
    b"\xf0\x8f\xbf\xbf",                                                     # overlong forms
    b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xa0\xbd\xed\xb8\x80",           # surrogates (and a CESU pair)
    b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf7\xbf\xbf\xbf", b"\xf8\x88\x80\x80\x80",
    b"\xfc\x84\x80\x80\x80\x80",                                             # past U+10FFFF, 5- and 6-byte forms
    b"\xe2\x82", b"\xf0\x9f\x98", b"a\xc3", b"\xc3", b"\xf0", b"\xe2\x28\xa1",   # truncated sequences
    b"\x80", b"a\xbfb", b"\xff", b"\xfe\xff", b"k" * 255 + b"\xff",          # stray bytes
]
UTF8_EDGE_KEYS = [b"\x00", b"\x7f", b"\xc2\x80", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xee\x80\x80",
                  b"\xef\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf"]
SIZE_KEYS = [b"", b"a" * 256, b"a" * 257, "é".encode() * 256, "é".encode() * 257, "😀".encode() * 256,
             "😀".encode() * 257, "\U0010ffff".encode() * 257, b"a" * 1000]

PID, SSSN = tlv(wire.TAG_PRODUCER_ID, b"producer"), tlv(wire.TAG_SSSN, b"\0" * 8)
# stored-meta TLVs: the session fields of every length around the right one, headers good
# and bad, the put-only and unknown tags a reader skips
STORED_TLVS = st.one_of(
    META_TLVS,
    st.builds(tlv, st.just(wire.TAG_PRODUCER_ID), st.sampled_from(
        [0, 1, limits.PRODUCER_ID_BYTES_MAX, limits.PRODUCER_ID_BYTES_MAX + limits.PRODUCER_EPOCH_SUFFIX_BYTES,
         limits.SESSION_KEY_BYTES_MAX, limits.SESSION_KEY_BYTES_MAX + 1, 255]).map(lambda n: b"p" * n)),
    st.just(PID), st.just(SSSN), st.just(PID + SSSN),
    st.builds(tlv, st.sampled_from([wire.TAG_SSSN, wire.TAG_SESSION_ORDINAL]), st.sampled_from(
        [b"", b"\1" * 3, b"\1" * 7, b"\1" * 9])),
    st.builds(tlv, st.sampled_from([0x80, 0x81, 0xFF]), st.binary(max_size=8)),
)


@st.composite
def stored_metas(draw) -> bytes:
    """Any stored meta: TLVs in any order, sometimes cut short or with trailing junk."""
    meta = b"".join(draw(st.lists(STORED_TLVS, max_size=6)))
    how = draw(st.integers(0, 9))
    if how == 0 and meta:
        meta = meta[:draw(st.integers(0, len(meta) - 1))]
    elif how == 1:
        meta += draw(st.binary(min_size=1, max_size=3))
    return meta


@st.composite
def odd_records(draw) -> bytes:
    """One entry with any key (valid, not UTF-8, of a wrong size) and any meta (as often a
    single TLV, or a producer id and one TLV, as a list of them: each session field's and header's own errors come up
    often enough that the tally below reaches each of them whatever the seed)."""
    key = draw(st.one_of(KEYS, BAD_KEYS, st.sampled_from(NOT_UTF8_KEYS + UTF8_EDGE_KEYS + SIZE_KEYS)))
    return wire.encode_entry(key, draw(DATA), draw(st.one_of(stored_metas(), STORED_TLVS, STORED_TLVS.map(lambda t: PID + t))))


@st.composite
def bodies(draw) -> tuple[bytes, int]:
    """(body, count): stored entries as ingestion writes them, some odd ones among them,
    the whole perhaps broken (cut, a lying length, trailing bytes, flipped bytes), the
    count perhaps wrong."""
    entries = [REF.stored_entries([r]) for r in draw(st.lists(stored_records(), max_size=4))]
    entries += draw(st.lists(odd_records(), max_size=2))
    entries = draw(st.permutations(entries))
    body = draw(broken(b"".join(entries)))
    count = draw(st.one_of(st.just(len(entries)), st.integers(0, len(entries) + 2)))
    return body, count


def agree(*args) -> tuple:
    """reference and compiled check_records agree on args; the outcome."""
    return assert_agree(REF.check_records, COMP.check_records, *args)


# --- the generators reach every outcome (so the comparisons below mean something) -----------

def test_generators_reach_every_outcome_of_check_records():
    def run(example):
        body, count = example
        result = outcome(REF.check_records, body, count)
        if result[0] == "returned":
            return "returned"
        message = result[2].split(": ", 1)[-1]
        for words in ("not UTF-8", "chars", "truncated", "trailing", "session fields", "producer id", "SSSN",
                      "session partition", "header"):
            if words in message:
                return result[1], words
        return result[1], message

    seen = tally(bodies(), run, 900)
    assert seen >= {"returned", (InvalidPartitionKey, "not UTF-8"), (InvalidPartitionKey, "chars"),
                    (InvalidArgument, "truncated"), (InvalidArgument, "trailing"), (InvalidArgument, "producer id"),
                    (InvalidArgument, "SSSN"), (InvalidArgument, "session partition"),
                    (InvalidArgument, "session fields"), (InvalidRecordHeader, "header")}, seen


def _mutant_overlong_accepted(buf, count, offset=0):
    """check_records with a UTF-8 check that lets an overlong form or a surrogate pass."""
    try:
        return REF.check_records(buf, count, offset)
    except InvalidPartitionKey as e:
        if "not UTF-8" in e.message:
            return None
        raise


def test_mutation_guard_a_lax_utf8_check_is_caught():
    @settings(BASE, max_examples=300, phases=[Phase.generate])
    @given(bodies())
    def compare(example):
        assert_agree(REF.check_records, _mutant_overlong_accepted, *example)

    with pytest.raises(AssertionError, match="implementations disagree"):
        compare()


# --- differential ------------------------------------------------------------------------------

@needs_compiled
@examples(500)
@given(example=bodies())
def test_check_records_agrees_on_random_and_broken_bodies(example):
    body, count = example
    agree(body, count)
    agree(memoryview(body), count)
    agree(bytearray(body), count)


@needs_compiled
@examples(150)
@given(example=bodies(), prefix=st.binary(max_size=20), data=st.data())
def test_check_records_agrees_at_any_offset(example, prefix, data):
    body, count = example
    buf = prefix + body
    agree(buf, count, data.draw(st.one_of(st.just(len(prefix)), st.integers(-5, len(buf) + 5))))


@needs_compiled
@pytest.mark.parametrize("key", NOT_UTF8_KEYS + UTF8_EDGE_KEYS + SIZE_KEYS, ids=repr)
def test_check_records_agrees_on_key_edges(key):
    good = wire.encode_entry(b"good", b"x")
    for count, body in ((1, wire.encode_entry(key, b"d")), (2, good + wire.encode_entry(key, b"")),
                        (3, good + good + wire.encode_entry(key, b"d", PID + SSSN))):
        result = agree(body, count)
        try:
            chars = len(key.decode("utf-8"))
        except UnicodeDecodeError:
            assert result == ("raised", InvalidPartitionKey, f"record {count - 1}: partition key is not UTF-8")
            continue
        if limits.PARTITION_KEY_CHARS_MIN <= chars <= limits.PARTITION_KEY_CHARS_MAX:
            assert result[0] == "returned"
        else:
            assert result[:2] == ("raised", InvalidPartitionKey) and f"of {chars} chars" in result[2]


@needs_compiled
def test_the_compiled_utf8_check_is_pythons_strict_decoder():
    """Every key of 1 and 2 bytes, and 3- and 4-byte keys over every lead and second byte
    (the bytes whose bounds differ: E0, ED, F0, F4) with continuation bytes at and just
    past their bounds: the compiled verdict is Python's, character count included."""
    def expected(key: bytes):
        try:
            return "returned" if 1 <= len(key.decode("utf-8")) <= limits.PARTITION_KEY_CHARS_MAX else "size"
        except UnicodeDecodeError:
            return "not UTF-8"

    def got(key: bytes):
        try:
            COMP.check_records(wire.encode_entry(key, b""), 1)
        except InvalidPartitionKey as e:
            return "not UTF-8" if "not UTF-8" in e.message else "size"
        return "returned"

    tails = (0x00, 0x7F, 0x80, 0xBF, 0xC0, 0xFF)
    keys = [bytes((a,)) for a in range(256)] + [bytes((a, b)) for a in range(256) for b in range(256)]
    keys += [bytes((a, b, c)) for a in range(0xC0, 0x100) for b in range(256) for c in tails]
    keys += [bytes((a, b, c, 0x80)) for a in range(0xF0, 0xF8) for b in range(256) for c in (0x7F, 0x80, 0xBF)]
    keys += [bytes((0xF0, 0x9F, 0x98, d)) for d in range(256)] + [b"a" * n + b"\xe2\x82\xac" for n in range(4)]
    wrong = [k for k in keys if got(k) != expected(k)]
    assert not wrong, [k.hex() for k in wrong[:20]]
    # and the count is in characters: 256 four-byte characters pass, 257 do not
    assert agree(wire.encode_entry("\U0010ffff".encode() * 256, b""), 1)[0] == "returned"


@needs_compiled
@examples(300)
@given(key=KEYS, tlvs=st.lists(STORED_TLVS, max_size=6), data=st.data())
def test_check_records_agrees_on_session_fields_present_missing_or_misplaced(key, tlvs, data):
    meta = b"".join(data.draw(st.permutations(tlvs)))
    for body, count in ((wire.encode_entry(key, b"d", meta), 1),
                        (wire.encode_entry(b"ok", b"") + wire.encode_entry(key, b"d", meta), 2)):
        agree(body, count)


@needs_compiled
@pytest.mark.parametrize("case", sorted(HEADER_CASES))
@pytest.mark.parametrize("session", [False, True])
def test_check_records_agrees_on_header_limits(case, session):
    meta = (PID + SSSN if session else b"") + HEADER_CASES[case]
    good = wire.encode_entry(b"good", b"x")
    for count, body in ((1, wire.encode_entry(b"k", b"d", meta)), (2, good + wire.encode_entry(b"k", b"d", meta))):
        agree(body, count)


@needs_compiled
def test_check_records_agrees_on_sizes_counts_and_trailing_bytes():
    full = b"y" * limits.RECORD_DATA_BYTES_MAX
    assert agree(wire.encode_entry(b"k", full), 1)[0] == "returned"
    over = wire.encode_entry(b"k", full + b"y")
    assert agree(over, 1) == ("raised", RecordTooLarge,
                              f"record 0: {len(full) + 1} bytes of data; at most {limits.RECORD_DATA_BYTES_MAX}")
    agree(wire.encode_entry(b"ok", b"") + over, 2)
    agree(over[:1000], 1)                                  # a data length of over 1 MiB, cut short: truncated
    entry = wire.encode_entry(b"k", b"d", PID + SSSN)
    for count in (-(1 << 62), -1, 0, 1, 2, 3, 1 << 40):
        agree(entry * 2, count)
    for junk in (b"\0", b"\0" * 7, b"\0" * 8, wire.ENTRY.pack(0, 1, 0)):
        assert agree(entry + junk, 1)[1] is InvalidArgument
    assert agree(b"", 0) == ("returned", (type(None), None))
    for lie in range(0, 9):                                # every length field a little off
        for at, fmt in ((0, "<I"), (4, "<H"), (6, "<H")):
            out = bytearray(entry)
            (true,) = struct.unpack_from(fmt, out, at)
            struct.pack_into(fmt, out, at, max(0, true + lie - 4))
            agree(bytes(out), 1)


# --- check_batch (the head's and a successor's whole check) over either implementation -------

@st.composite
def batches(draw) -> bytes:
    """An unsequenced batch of any body, its header perhaps broken: version, flags,
    reserved, count, a checksum that does not hold, cut short."""
    body, count = draw(bodies())
    batch = bytearray(wire.seal(max(count, 0), 0, body, draw(U64), draw(U32)))
    how = draw(st.integers(0, 11))
    if how == 0:
        batch[0] = draw(st.sampled_from([0, 2, 4, 255]))
    elif how == 1:
        batch[1] = draw(st.sampled_from([1, 2, 0x80]))
    elif how == 2:
        struct.pack_into("<H", batch, 2, draw(st.integers(1, 0xFFFF)))
    elif how == 3:
        batch[-1 if len(batch) > wire.HEADER_BYTES else 40] ^= 1      # the checksum no longer holds
    elif how == 4:
        batch = batch[:draw(st.integers(0, len(batch) - 1))]
    return bytes(batch)


def check_batch_with(impl, monkeypatch):
    def check(batch):
        monkeypatch.setattr(wire, "check_records", impl.check_records)
        return wire.check_batch(batch)
    return check


@needs_compiled
@examples(300)
@given(batch=batches())
def test_check_batch_agrees_over_either_implementation(batch):
    with pytest.MonkeyPatch.context() as mp:
        assert_agree(check_batch_with(REF, mp), check_batch_with(COMP, mp), batch)


@pytest.mark.parametrize("impl", IMPLS)
def test_check_batch_refuses_batches_over_the_batch_limits(impl, monkeypatch):
    monkeypatch.setattr(wire, "check_records", impl.check_records)
    entry = wire.encode_entry(b"k", b"")
    many = wire.seal(limits.BATCH_RECORDS_MAX + 1, 0, entry * (limits.BATCH_RECORDS_MAX + 1))
    with pytest.raises(wire.CorruptBatch, match=f"{limits.BATCH_RECORDS_MAX + 1} records"):
        wire.check_batch(many)
    assert wire.check_batch(wire.seal(limits.BATCH_RECORDS_MAX, 0, entry * limits.BATCH_RECORDS_MAX)).count \
        == limits.BATCH_RECORDS_MAX
    big = wire.encode_entry(b"k", b"y" * limits.RECORD_DATA_BYTES_MAX)
    n = limits.BATCH_BYTES_MAX // len(big) + 1
    with pytest.raises(wire.CorruptBatch, match="bytes; at most"):
        wire.check_batch(wire.seal(n, 0, big * n))


# --- what the check is for: a body it accepts, every reader decodes ---------------------------

@pytest.mark.parametrize("impl", IMPLS)
@examples(300)
@given(example=bodies(), first_sn=st.integers(0, 1 << 100))
def test_every_reader_decodes_what_check_records_accepts(impl, example, first_sn):
    body, count = example
    if outcome(impl.check_records, body, count)[0] != "returned" or count == 0:
        return
    batch = wire.sequence(wire.seal(count, 0, body), first_sn)
    for reader in (REF, COMP) if COMP is not None else (REF,):
        assert len(reader.decode_records(batch, 0, count, 0)) == count
        reader.session_fields(batch, 0, count)
        if hasattr(reader, "columns"):
            assert reader.columns(batch, 0, count)[0] == count


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("key", [b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80", b"a\xc3"], ids=repr)
def test_sequence_checked_refuses_a_key_that_is_not_utf8(impl, key, monkeypatch):
    """The poison batch of issue 30: checksum and framing hold, one key is not UTF-8. The
    head's `sequence_checked` refuses it by name (what `sequence` alone let through, and
    every read of the partition then failed on)."""
    monkeypatch.setattr(wire, "check_records", impl.check_records)
    body = wire.encode_entry(b"fine", b"a") + wire.encode_entry(key, b"poison", PID + SSSN)
    unsequenced = wire.seal(2, 0, body, 7, 1)
    poisoned = wire.sequence(unsequenced, 1 << 64)             # (the old path: stored, then unreadable)
    with pytest.raises(wire.CorruptBatch):
        REF.decode_records(poisoned, 0, 2, 0)
    with pytest.raises(wire.CorruptBatch, match="unsequenced batch: record 1: partition key is not UTF-8"):
        wire.sequence_checked(unsequenced, 1 << 64)
    with pytest.raises(wire.CorruptBatch, match="record 1: partition key is not UTF-8"):
        wire.check_batch(poisoned)                              # a successor's check of the same
    good = wire.seal(1, 0, wire.encode_entry(b"fine", b"a"), 7, 1)
    assert wire.read_header(wire.sequence_checked(good, 1 << 64)) == wire.read_header(wire.sequence(good, 1 << 64))


@pytest.mark.parametrize("impl", IMPLS)
def test_an_epoch_producers_session_name_passes(impl):
    """A producer with an epoch stores its session name, the id and 9 bytes more
    (ingestion/fencing.py): a 64-byte id is 73 bytes stored, and is not refused."""
    from ingestion.fencing import session_producer_id
    pid = session_producer_id(b"p" * limits.PRODUCER_ID_BYTES_MAX, 3)
    body = REF.stored_entries([Stored(b"k", b"d", pid, 5, b"x" * limits.DEDUP_KEY_BYTES_MAX, 2,
                                      wire.encode_headers({"h": b"v"}))])
    assert impl.check_records(body, 1) is None


@needs_compiled
@examples(100)
@given(recs=st.lists(stored_records(), min_size=1, max_size=6), headers=HEADERS)
def test_what_ingestion_stores_passes_both(recs, headers):
    body = REF.stored_entries(recs + [Stored(b"h", b"", headers=headers)])
    assert agree(body, len(recs) + 1)[0] == "returned"


@pytest.mark.parametrize("impl", IMPLS)
@examples(300)
@given(request=st.one_of(put_requests(), broken_put_requests()), epoch=st.sampled_from([0, 1, (1 << 64) - 1]),
       dedup_key=st.none() | st.binary(max_size=8) | st.sampled_from([b"", b"d" * 129, b"d" * 255]),
       long_pid=st.booleans())
def test_whatever_ingestion_takes_the_head_takes(impl, request, epoch, dedup_key, long_pid):
    """A request that PutRecords' parse takes, stored as ingestion stores it (an epoch's
    session name for the producer id; on a stream that does not de-duplicate, a dedup key
    of any length a TLV holds): the head's check takes it too, so no producer's write is
    refused at the head, nor the writes batched with it."""
    from ingestion.service import parse_put_entries
    count, blob, pid = request
    if pid and long_pid:
        pid = b"p" * limits.PRODUCER_ID_BYTES_MAX
    try:
        subs = [s for _hash, s in parse_put_entries(count, blob, pid, epoch)]
    except SmsError:
        return
    if pid and dedup_key is not None:
        subs = [dataclasses.replace(s, dedup_key=dedup_key) for s in subs]
    body = REF.stored_entries(subs)
    assert impl.check_records(body, len(subs)) is None
