"""Unit tests of archive/fragment.py: fragment files of real sequenced batches.

Round trips with both codecs, names that parse back and sort by SN, `Decoded.index_of`,
and that every damage to a fragment file -- a flipped byte anywhere, a truncation, a
wrong magic, a header that does not match the name it is read under, a claimed raw
length past the limit, a batch count that does not match, forged bodies whose own
checksum holds -- is FragmentCorrupt. No store, no mocks: bytes in, bytes out.
"""

from __future__ import annotations

import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from archive import fragment
from archive.fragment import FRAME, HEADER, MAGIC, VERSION, FragmentRef, check_codec, decode, encode
from sms import limits, seqno, wire
from sms.errors import FragmentCorrupt, InvalidStreamConfig

U = seqno.COUNTER_UNIT
S0 = seqno.make(1_700_000_000_000, 1, 7)
CODECS = ["zstd", "none"]


def make_batch(records: list[tuple[bytes, bytes]], first_sn: int, prev_checksum: int = 0) -> bytes:
    """One batch as the head stores it: built, then sequenced at `first_sn`."""
    entries = [wire.encode_entry(key, data) for key, data in records]
    return wire.sequence(wire.build_batch(entries), first_sn, prev_checksum)


def make_log(record_lists: list[list[tuple[bytes, bytes]]], first_sn: int = S0) -> list[bytes]:
    """Batches with contiguous SNs, chained by their checksums, as in a partition's log."""
    batches: list[bytes] = []
    sn, prev = first_sn, 0
    for records in record_lists:
        batch = make_batch(records, sn, prev)
        header = wire.read_header(batch)
        batches.append(batch)
        sn, prev = header.last_sn + U, header.checksum
    return batches


def sample_log(sizes: tuple[int, ...] = (3, 1, 4)) -> list[bytes]:
    return make_log([[(f"key-{b}-{i}".encode(), b"value %d of batch %d " % (i, b) * (i + 1)) for i in range(n)]
                     for b, n in enumerate(sizes)])


def header_fields(data: bytes) -> list:
    return list(HEADER.unpack_from(data))


def with_header(data: bytes, **changes: int | bytes) -> bytes:
    """The file with some header fields replaced (the body untouched)."""
    names = ["magic", "version", "codec", "reserved", "first", "last", "batches", "records", "raw_len", "checksum"]
    fields = dict(zip(names, header_fields(data)))
    fields.update(changes)
    return HEADER.pack(*(fields[n] for n in names)) + data[HEADER.size:]


def forge(body: bytes, batches: int, first_sn: int, last_sn: int, records: int = 1) -> tuple[FragmentRef, bytes]:
    """An uncompressed fragment of any raw body, whose header, name and whole checksum
    agree (so only what is inside the body can be wrong)."""
    checksum = xxhash.xxh3_64_intdigest(body)
    header = HEADER.pack(MAGIC, VERSION, 0, 0, seqno.to_bytes(first_sn), seqno.to_bytes(last_sn), batches, records,
                         len(body), checksum)
    ref = FragmentRef.parse(fragment.file_name(first_sn, last_sn, checksum, 0))
    assert ref is not None
    return ref, header + body


def framed(batches: list[bytes]) -> bytes:
    return b"".join(FRAME.pack(len(b)) + b for b in batches)


# --- round trips and names ----------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_of_sequenced_batches(codec):
    batches = sample_log((3, 1, 4, 2))
    enc = encode(batches, codec)
    headers = [wire.verify(b) for b in batches]
    assert (enc.ref.first_sn, enc.ref.last_sn) == (S0, headers[-1].last_sn) == (S0, S0 + 9 * U)
    assert enc.ref.codec == fragment.CODECS[codec]
    assert enc.batches == 4 and enc.records == 10
    assert enc.raw_bytes == sum(FRAME.size + len(b) for b in batches)
    assert enc.ref.name.endswith(".zst" if codec == "zstd" else ".raw")
    assert FragmentRef.parse(enc.ref.name) == enc.ref

    dec = decode(enc.ref, enc.data)
    assert dec.ref == enc.ref
    assert dec.batches == batches                          # byte for byte
    assert all(type(b) is bytes for b in dec.batches)
    assert dec.first_sns == [h.first_sn for h in headers]
    assert dec.records == 10
    assert dec.size == enc.raw_bytes
    # the batches' chain of checksums is kept as it was
    for before, after in zip(dec.batches, dec.batches[1:]):
        assert wire.read_header(after).prev_checksum == wire.read_header(before).checksum


def test_zstd_compresses_and_both_codecs_name_the_same_run_alike():
    batches = make_log([[(b"k", b'{"field": "value", "n": 1}' * 40)] * 5] * 4)
    zst, raw = encode(batches, "zstd"), encode(batches, "none")
    assert len(zst.data) < len(raw.data) / 3
    assert len(raw.data) == HEADER.size + raw.raw_bytes
    # the checksum is of the uncompressed body: the same for both codecs, only the extension differs
    assert (zst.ref.first_sn, zst.ref.last_sn, zst.ref.checksum) == (raw.ref.first_sn, raw.ref.last_sn,
                                                                      raw.ref.checksum)
    assert zst.ref.name[:-4] == raw.ref.name[:-4]
    # the same run encodes to the same name (two writers of one run write one name)
    assert encode(batches, "zstd").ref == zst.ref


def test_encode_refuses_no_batches():
    with pytest.raises(ValueError):
        encode([], "none")


def test_single_batch_of_one_record():
    batches = make_log([[(b"only", b"")]])
    for codec in CODECS:
        enc = encode(batches, codec)
        assert enc.ref.first_sn == enc.ref.last_sn == S0
        dec = decode(enc.ref, enc.data)
        assert dec.batches == batches and dec.first_sns == [S0] and dec.records == 1


def test_names_parse_back_and_sort_by_sn():
    refs = []
    sn = S0
    for n in (2, 5, 1, 3):
        batches = make_log([[(b"k", b"x" * i) for i in range(n)]], sn)
        refs.append(encode(batches, "zstd" if n % 2 else "none").ref)
        sn += n * U + 1234                                  # (gaps between runs too)
    names = [r.name for r in refs]
    parsed = [FragmentRef.parse(n) for n in reversed(names)]
    assert parsed == list(reversed(refs))
    assert sorted(parsed, key=lambda r: r.first_sn) == refs
    assert sorted(names) == names                            # fixed-width hex: name order is SN order
    name = names[0]
    first, last, rest = name.split("-")
    assert (int(first, 16), int(last, 16)) == (refs[0].first_sn, refs[0].last_sn)
    assert len(first) == len(last) == 32 and len(rest) == 16 + 4


def test_parse_refuses_other_names():
    good = fragment.file_name(S0, S0 + U, 0xABC, 1)
    assert FragmentRef.parse(good) == FragmentRef(S0, S0 + U, 0xABC, 1, good)
    assert FragmentRef.parse(fragment.file_name(1, 2, 3, 0)).codec == 0
    for bad in ["", "claimed", good + ".tmp", "x" + good, good.upper(), good.replace(".zst", ".gz"),
                good.replace(".zst", ""), good[1:], f"{S0:031x}-{S0:032x}-{0:016x}.raw",
                f".{good}.tmp-0123456789abcdef", good.replace("-", "_", 1)]:
        assert FragmentRef.parse(bad) is None, bad


def test_partition_prefix_and_file_name():
    assert fragment.partition_prefix("s~t", 1_700_000_000_123, 7) == "s~t/1700000000123/00007/"
    assert fragment.file_name(1, 2, 3, 0) == f"{1:032x}-{2:032x}-{3:016x}.raw"
    assert fragment.file_name(seqno.SN_MAX, seqno.SN_MAX, 2**64 - 1, 1) == "f" * 32 + "-" + "f" * 32 + "-" + "f" * 16 + ".zst"


def test_check_codec():
    assert check_codec("zstd") == "zstd"
    assert check_codec("none") == "none"
    for bad in ["gzip", "ZSTD", "", "raw", "zst", " zstd", None, 1, 0, True, b"zstd", ("zstd",), "x" * 1000]:
        with pytest.raises(InvalidStreamConfig):
            check_codec(bad)


@pytest.mark.parametrize("bad", [["zstd"], {"codec": "zstd"}])
def test_check_codec_refuses_unhashable_values(bad):
    with pytest.raises(InvalidStreamConfig):
        check_codec(bad)


# --- index_of -----------------------------------------------------------------------------

def test_index_of_at_inside_between_and_past_batches():
    # batches of 3, 1 and 4 records: [S0 .. S0+2U], [S0+3U], [S0+4U .. S0+7U]
    dec = decode(*_encoded(sample_log((3, 1, 4)), "none"))
    assert dec.first_sns == [S0, S0 + 3 * U, S0 + 4 * U]
    cases = {
        0: 0, S0 - 1: 0,                                     # before the first batch: the first
        S0: 0, S0 + U: 0, S0 + 2 * U: 0,                     # at and inside the first
        S0 + 2 * U + 1: 1, S0 + 3 * U - 1: 1,                # between the first and the second
        S0 + 3 * U: 1,                                       # the one-record batch
        S0 + 3 * U + 1: 2,                                   # between the second and the third
        S0 + 4 * U: 2, S0 + 6 * U: 2, S0 + 7 * U: 2,         # at, inside, at the last of the third
        S0 + 7 * U + 1: 3, S0 + 100 * U: 3, seqno.SN_MAX: 3,  # past the last: len(batches)
    }
    for sn, want in cases.items():
        assert dec.index_of(sn) == want, (sn - S0) / U


def test_index_of_with_gaps_between_batches():
    later = seqno.make(1_700_000_000_500, 0, 7)              # a new millisecond: SNs jump
    first = make_log([[(b"a", b"1"), (b"b", b"2")]], S0)
    second = make_log([[(b"c", b"3")]], later)
    dec = decode(*_encoded(first + second, "zstd"))
    assert dec.index_of(S0 + U) == 0
    assert dec.index_of(S0 + 2 * U) == 1                     # in the gap: the batch after it
    assert dec.index_of(later - 1) == 1
    assert dec.index_of(later) == 1
    assert dec.index_of(later + 1) == 2


def _encoded(batches: list[bytes], codec: str) -> tuple[FragmentRef, bytes]:
    enc = encode(batches, codec)
    return enc.ref, enc.data


# --- corruption ---------------------------------------------------------------------------

def _corrupt(ref: FragmentRef, data: bytes) -> FragmentCorrupt:
    with pytest.raises(FragmentCorrupt) as info:
        decode(ref, data)
    assert type(info.value) is FragmentCorrupt
    assert info.value.details == {"fragment": ref.name}
    assert ref.name in str(info.value)
    return info.value


# Header bytes no check covers: the reserved field (10..11).
_UNCHECKED_HEADER = set(range(10, 12))


@pytest.mark.parametrize("codec", CODECS)
def test_flipped_byte_in_the_body_is_corrupt(codec):
    ref, data = _encoded(sample_log(), codec)
    body_positions = range(HEADER.size, len(data))
    # every byte of the body, each with a low bit flipped (the high bit of the zstd frame
    # header's descriptor has its own test below)
    for pos in body_positions:
        damaged = bytearray(data)
        damaged[pos] ^= 0x01
        _corrupt(ref, bytes(damaged))
    for pos in (HEADER.size + 20, len(data) // 2, len(data) - 1):
        damaged = bytearray(data)
        damaged[pos] ^= 0xFF
        _corrupt(ref, bytes(damaged))


@pytest.mark.parametrize("codec", CODECS)
def test_flipped_byte_in_the_header_is_corrupt(codec):
    ref, data = _encoded(sample_log(), codec)
    for pos in range(HEADER.size):
        if pos in _UNCHECKED_HEADER:
            continue
        for bit in (0x01, 0x80):
            damaged = bytearray(data)
            damaged[pos] ^= bit
            _corrupt(ref, bytes(damaged))


def test_damaged_zstd_frame_content_size_is_corrupt():
    ref, data = _encoded(sample_log(), "zstd")
    damaged = bytearray(data)
    damaged[HEADER.size + 4] ^= 0x80                         # zstd frame header descriptor (after its magic)
    _corrupt(ref, bytes(damaged))


@pytest.mark.parametrize("codec", CODECS)
def test_records_count_mismatch_is_corrupt(codec):
    ref, data = _encoded(sample_log((3, 1, 4)), codec)
    assert header_fields(data)[7] == 8
    _corrupt(ref, with_header(data, records=9))


@pytest.mark.parametrize("codec", CODECS)
def test_truncated_file_is_corrupt(codec):
    ref, data = _encoded(sample_log(), codec)
    for size in (0, 1, len(MAGIC), HEADER.size - 1, HEADER.size, HEADER.size + 1, HEADER.size + 4,
                 (HEADER.size + len(data)) // 2, len(data) - 1):
        err = _corrupt(ref, data[:size])
        if size < HEADER.size:
            assert "shorter than its header" in str(err)


@pytest.mark.parametrize("codec", CODECS)
def test_wrong_magic_or_version_is_corrupt(codec):
    ref, data = _encoded(sample_log(), codec)
    assert "magic" in str(_corrupt(ref, with_header(data, magic=b"SMSFRAG\x01")))
    assert "magic" in str(_corrupt(ref, with_header(data, magic=b"\x00" * 8)))
    assert "magic" in str(_corrupt(ref, with_header(data, version=VERSION + 1)))
    _corrupt(ref, b"\x28\xb5\x2f\xfd" + data[4:])            # a bare zstd magic where ours belongs
    _corrupt(ref, data[HEADER.size:])                         # the body without its header


@pytest.mark.parametrize("codec", CODECS)
def test_header_that_does_not_match_the_name_is_corrupt(codec):
    ref, data = _encoded(sample_log(), codec)
    others = [
        fragment.file_name(ref.first_sn, ref.last_sn, ref.checksum ^ 1, ref.codec),         # another checksum
        fragment.file_name(ref.first_sn + U, ref.last_sn, ref.checksum, ref.codec),         # another range
        fragment.file_name(ref.first_sn, ref.last_sn + U, ref.checksum, ref.codec),
        fragment.file_name(ref.first_sn - U, ref.last_sn - U, ref.checksum, ref.codec),
        fragment.file_name(ref.first_sn, ref.last_sn, ref.checksum, 1 - ref.codec),         # another codec
    ]
    for name in others:
        other = FragmentRef.parse(name)
        assert other is not None
        assert "does not match its name" in str(_corrupt(other, data))
    # and the other way round: the header changed, the name kept
    _corrupt(ref, with_header(data, checksum=ref.checksum ^ 1 << 63))
    _corrupt(ref, with_header(data, first=seqno.to_bytes(ref.first_sn + 1)))
    _corrupt(ref, with_header(data, last=seqno.to_bytes(ref.last_sn - 1)))
    _corrupt(ref, with_header(data, codec=1 - ref.codec))


@pytest.mark.parametrize("codec", CODECS)
def test_a_claimed_raw_length_beyond_the_limit_is_corrupt(codec, monkeypatch):
    ref, data = _encoded(sample_log(), codec)
    too_long = limits.ARCHIVE_FRAGMENT_RAW_BYTES_MAX * 2 + 1
    assert "claims" in str(_corrupt(ref, with_header(data, raw_len=too_long)))
    assert "claims" in str(_corrupt(ref, with_header(data, raw_len=2**64 - 1)))
    # the limit is read at decode time: a fragment over a lowered limit is refused as it is
    raw_len = header_fields(data)[8]
    monkeypatch.setattr(limits, "ARCHIVE_FRAGMENT_RAW_BYTES_MAX", raw_len // 2 - 1)
    assert "claims" in str(_corrupt(ref, data))
    monkeypatch.setattr(limits, "ARCHIVE_FRAGMENT_RAW_BYTES_MAX", -(-raw_len // 2))
    assert decode(ref, data).records == 8


@pytest.mark.parametrize("codec", CODECS)
def test_a_claimed_raw_length_that_is_wrong_is_corrupt(codec):
    ref, data = _encoded(sample_log(), codec)
    raw_len = header_fields(data)[8]
    for claimed in (0, 1, raw_len - 1, raw_len + 1, raw_len * 2):
        _corrupt(ref, with_header(data, raw_len=claimed))


@pytest.mark.parametrize("codec", CODECS)
def test_batch_count_mismatch_is_corrupt(codec):
    ref, data = _encoded(sample_log((3, 1, 4)), codec)
    assert header_fields(data)[6] == 3
    for count in (0, 2, 4, 2**32 - 1):
        assert "batch count" in str(_corrupt(ref, with_header(data, batches=count)))


def test_batch_whose_own_checksum_fails_is_corrupt_although_the_fragment_checksum_holds():
    batches = sample_log()
    damaged = bytearray(batches[1])
    damaged[-1] ^= 0x01                                      # its data: the batch's checksum fails
    for codec in CODECS:
        enc = encode([batches[0], bytes(damaged), batches[2]], codec)   # (encode reads headers only)
        assert "checksum mismatch" in str(_corrupt(enc.ref, enc.data))


def test_forged_bodies_are_corrupt():
    batches = sample_log((2, 2))
    h0, h1 = (wire.read_header(b) for b in batches)
    first, last = h0.first_sn, h1.last_sn
    # the batches out of order (and one batch twice)
    assert "out of order" in str(_corrupt(*forge(framed([batches[1], batches[0]]), 2, first, last)))
    assert "out of order" in str(_corrupt(*forge(framed([batches[0], batches[0]]), 2, first, last)))
    enc = encode([batches[1], batches[0]], "none")           # encode does not look; decode does
    _corrupt(enc.ref, enc.data)
    # a frame length past the end of the body
    body = framed(batches)
    overrun = body[:-len(batches[1]) - FRAME.size] + FRAME.pack(len(batches[1]) + 1) + batches[1]
    _corrupt(*forge(overrun, 2, first, last))
    # a frame length short of its batch (the rest read as another frame)
    short = body[:-len(batches[1]) - FRAME.size] + FRAME.pack(len(batches[1]) - 3) + batches[1]
    _corrupt(*forge(short, 3, first, last))
    # trailing bytes too few for a frame length, and an empty frame
    _corrupt(*forge(body + b"\x00\x00", 2, first, last))
    _corrupt(*forge(body + FRAME.pack(0), 3, first, last))
    # a frame holding something that is not a batch
    _corrupt(*forge(body + FRAME.pack(5) + b"hello", 3, first, last))
    # the forge itself makes a good fragment when nothing inside is wrong
    ref, data = forge(body, 2, first, last, records=4)
    assert decode(ref, data).batches == batches


def test_unsequenced_batch_in_a_body_is_read_but_ordering_still_holds():
    # (a batch is verified by its own checksum; a second batch at SN 0 is out of order)
    batches = sample_log((1,))
    unsequenced = wire.build_batch([wire.encode_entry(b"k", b"v")])
    ref, data = forge(framed(batches + [unsequenced]), 2, S0, S0)
    assert "out of order" in str(_corrupt(ref, data))


# --- property -----------------------------------------------------------------------------

_records = st.lists(st.tuples(st.binary(min_size=1, max_size=24), st.binary(max_size=200)), min_size=1, max_size=6)


@settings(derandomize=True, database=None, deadline=None, max_examples=40)
@given(record_lists=st.lists(_records, min_size=1, max_size=20), codec=st.sampled_from(CODECS),
       counter=st.integers(min_value=0, max_value=seqno.COUNTER_MAX - 200),
       ordinal=st.integers(min_value=0, max_value=seqno.ORDINAL_MAX))
def test_any_run_of_batches_round_trips_byte_identically(record_lists, codec, counter, ordinal):
    first_sn = seqno.make(1_700_000_000_000, counter, ordinal)
    batches = make_log(record_lists, first_sn)
    enc = encode(batches, codec)
    total = sum(len(r) for r in record_lists)
    assert enc.records == total and enc.batches == len(batches)
    assert enc.ref == FragmentRef.parse(enc.ref.name)
    assert (enc.ref.first_sn, enc.ref.last_sn) == (first_sn, first_sn + (total - 1) * U)
    dec = decode(enc.ref, enc.data)
    assert dec.batches == batches
    assert dec.records == total
    assert dec.first_sns == [wire.read_header(b).first_sn for b in batches]
    got = [(e.key, e.data) for b in dec.batches for e in wire.batch_entries(b)]
    assert got == [r for records in record_lists for r in records]
    for i, first in enumerate(dec.first_sns):
        assert dec.index_of(first) == i


def test_header_layout_is_what_the_module_says():
    # (a file written by one version is read by the next: the layout is fixed)
    assert HEADER.size == 8 + 1 + 1 + 2 + 16 + 16 + 4 + 4 + 8 + 8
    assert struct.calcsize(">I") == FRAME.size
    ref, data = _encoded(sample_log((3, 1, 4)), "zstd")
    magic, version, codec, reserved, first, last, batches, records, raw_len, checksum = header_fields(data)
    assert (magic, version, codec, reserved) == (MAGIC, VERSION, 1, 0)
    assert (seqno.from_bytes(first), seqno.from_bytes(last), batches, records, checksum) == (
        ref.first_sn, ref.last_sn, 3, 8, ref.checksum)
