"""Unit tests of sms/payloads.py: payloads by reference in a real file store.

Uploads go to a FileStore (`file://<tmp_path>/store`) in chunks of a lowered
PAYLOAD_CHUNK_BYTES (1 KiB, so several chunks stay small); they are read back with
read_all and PayloadReader (odd read sizes, tell/seek, resuming at an offset), damaged
in the store by hand (a replaced, corrupted, truncated or missing chunk), and refused
when too large. Also PayloadRef's JSON and sms.records.needs_reference. No mocks of what
is tested; no sockets.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import time

import pytest
import xxhash

from sms import limits, payloads, records
from sms.errors import FragmentCorrupt, FragmentMissing, InvalidArgument, LimitExceeded, RecordTooLarge
from sms.objectstore import open_store
from sms.payloads import PayloadReader, PayloadRef, discard, read_all, upload

CHUNK = 1024
PREFIX = "orders/1700000000000/payloads/"


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(limits, "PAYLOAD_CHUNK_BYTES", CHUNK)


@pytest.fixture
def url(tmp_path) -> str:
    return f"file://{tmp_path}/store"


def payload(size: int, seed: int = 0) -> bytes:
    """`size` bytes that differ from chunk to chunk (a swapped chunk would show)."""
    out = bytearray()
    i = 0
    while len(out) < size:
        out += xxhash.xxh3_64_digest(b"%d-%d" % (seed, i))
        i += 1
    return bytes(out[:size])


def chunk_object(data: bytes) -> bytes:
    """A chunk as upload stores it: <Q xxh3-64 of data> data."""
    return struct.pack(">Q", xxhash.xxh3_64_intdigest(data)) + data


def stored(url: str, prefix: str = "") -> list[str]:
    return open_store(url).list(prefix)


def read_in(reader: PayloadReader, size: int) -> bytes:
    out = bytearray()
    while piece := reader.read(size):
        assert len(piece) <= size
        out += piece
    return bytes(out)


SIZES = [1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 17, 10 * CHUNK]


# --- uploads --------------------------------------------------------------------------------

@pytest.mark.parametrize("size", SIZES)
def test_upload_from_bytes_and_read_all(url, size):
    data = payload(size)
    ref = upload(url, PREFIX, data)
    assert ref.store == url
    assert (ref.size, ref.chunk_bytes, ref.chunks) == (size, CHUNK, -(-size // CHUNK))
    assert ref.checksum == xxhash.xxh3_64_intdigest(data)
    assert read_all(ref) == data
    # the layout: one object per chunk, then `claimed`
    names = stored(url, ref.key)
    assert names == [f"{ref.key}{i:06d}" for i in range(ref.chunks)] + [ref.key + "claimed"]
    store = open_store(url)
    for i in range(ref.chunks):
        raw = store.get(ref.chunk_name(i))
        assert raw == chunk_object(data[i * CHUNK:(i + 1) * CHUNK])


@pytest.mark.parametrize("size", SIZES)
def test_upload_from_a_file_object_and_read_all(url, size, tmp_path):
    data = payload(size, seed=1)
    from_bytes_io = upload(url, PREFIX, io.BytesIO(data))
    path = tmp_path / "source.bin"
    path.write_bytes(data)
    with open(path, "rb") as f:
        from_file = upload(url, PREFIX, f)
    for ref in (from_bytes_io, from_file):
        assert (ref.size, ref.chunks, ref.checksum) == (size, -(-size // CHUNK), xxhash.xxh3_64_intdigest(data))
        assert read_all(ref) == data
    assert from_bytes_io.key != from_file.key


class ShortReads(io.RawIOBase):
    """A file object that answers at most 100 bytes a read (a pipe, a socket)."""

    def __init__(self, data: bytes) -> None:
        self._data, self._pos = data, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = 100 if n < 0 else min(n, 100)
        piece = self._data[self._pos:self._pos + n]
        self._pos += len(piece)
        return piece


def test_upload_from_a_file_object_with_short_reads_makes_whole_chunks(url):
    data = payload(3 * CHUNK + 5, seed=2)
    ref = upload(url, PREFIX, ShortReads(data))
    assert ref.chunks == 4
    store = open_store(url)
    assert [len(store.get(ref.chunk_name(i))) - 8 for i in range(4)] == [CHUNK, CHUNK, CHUNK, 5]
    assert read_all(ref) == data


def test_upload_of_an_empty_payload(url):
    # an empty payload is no chunks and a claimed reference; it reads back as b""
    for source in (b"", io.BytesIO(b"")):
        ref = upload(url, PREFIX, source)
        assert (ref.size, ref.chunks, ref.checksum) == (0, 0, xxhash.xxh3_64_intdigest(b""))
        assert stored(url, ref.key) == [ref.key + "claimed"]
        assert PayloadRef.from_bytes(ref.to_bytes()) == ref
        assert read_all(ref) == b""
        with PayloadReader(ref) as reader:
            assert reader.read() == b"" and reader.tell() == 0
            assert reader.seek(5) == 0


def test_upload_of_bytearray_and_memoryview(url):
    data = payload(2 * CHUNK + 3, seed=3)
    for source in (bytearray(data), memoryview(data), memoryview(bytearray(data))[0:]):
        assert read_all(upload(url, PREFIX, source)) == data


def test_upload_key_layout_and_the_claimed_reference(url):
    data = payload(CHUNK + 1)
    ref = upload(url, PREFIX, data)
    m = re.fullmatch(re.escape(PREFIX) + r"(\d{10})/(\d+)-([0-9a-f]{16})/", ref.key)
    assert m is not None, ref.key
    hour, start_ms = m[1], int(m[2])
    assert time.strftime("%Y%m%d%H", time.gmtime(start_ms / 1000)) == hour
    assert abs(time.time() * 1000 - start_ms) < 60_000
    claimed = open_store(url).get(ref.key + payloads.CLAIMED)
    assert claimed == ref.to_bytes()
    assert PayloadRef.from_bytes(claimed) == ref
    # two uploads of the same data are two uploads
    assert upload(url, PREFIX, data).key != ref.key


def test_upload_over_the_limit_is_refused_and_leaves_nothing(url, tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "PAYLOAD_BYTES_MAX", 3 * CHUNK - 100)
    for source in (payload(3 * CHUNK - 99), io.BytesIO(payload(10 * CHUNK)), ShortReads(payload(5 * CHUNK))):
        with pytest.raises(RecordTooLarge):
            upload(url, PREFIX, source)
        assert stored(url) == []                            # the chunks written before it were deleted
    assert os.listdir(tmp_path / "store") == []             # and their directories
    # at the limit: fine
    data = payload(3 * CHUNK - 100)
    assert read_all(upload(url, PREFIX, data)) == data


def test_upload_that_took_too_long_is_refused_and_leaves_nothing(url, monkeypatch):
    monkeypatch.setattr(limits, "PAYLOAD_GRACE_S", -1.0)       # (any upload is "too long")
    with pytest.raises(LimitExceeded):
        upload(url, PREFIX, payload(2 * CHUNK + 1))
    assert stored(url) == []


def test_upload_to_a_bad_store_url(tmp_path):
    with pytest.raises(InvalidArgument):
        upload("http://example.invalid/x", PREFIX, b"data")
    with pytest.raises(InvalidArgument):
        upload(f"file://{tmp_path}/store", "../escape/", b"data")


def test_discard_deletes_the_upload(url):
    keep = upload(url, PREFIX, payload(CHUNK + 1, seed=4))
    ref = upload(url, PREFIX, payload(3 * CHUNK, seed=5))
    assert len(stored(url, ref.key)) == 4
    discard(ref)
    assert stored(url, ref.key) == []
    assert stored(url) == stored(url, keep.key)               # only that one
    discard(ref)                                              # again: nothing there, no error
    discard(PayloadRef("http://example.invalid/x", "k/", 0, CHUNK, 0, 0))   # best effort: no error
    assert read_all(keep) == payload(CHUNK + 1, seed=4)


# --- reading ----------------------------------------------------------------------------------

@pytest.mark.parametrize("read_size", [1, 7, 333, CHUNK - 1, CHUNK, CHUNK + 1, 5000])
def test_reads_in_odd_sizes(url, read_size):
    data = payload(3 * CHUNK + 17, seed=6)
    ref = upload(url, PREFIX, data)
    with payloads.open_payload(ref) as reader:
        assert reader.readable() and reader.seekable() and not reader.writable()
        assert read_in(reader, read_size) == data
        assert reader.tell() == len(data)
        assert reader.read(10) == b""


def test_readinto_and_readall(url):
    data = payload(2 * CHUNK + 9, seed=7)
    ref = upload(url, PREFIX, data)
    with PayloadReader(ref) as reader:
        buf = bytearray(CHUNK + 500)
        n = reader.readinto(buf)
        assert n == CHUNK and buf[:n] == data[:CHUNK]         # (never past a chunk's end)
        assert reader.read() == data[CHUNK:]
    with PayloadReader(ref) as reader:
        assert reader.readall() == data
    with PayloadReader(ref) as reader:
        assert io.BufferedReader(reader, 300).read() == data


def test_tell_and_seek(url):
    data = payload(4 * CHUNK + 100, seed=8)
    size = len(data)
    ref = upload(url, PREFIX, data)
    with PayloadReader(ref) as reader:
        assert reader.tell() == 0
        assert reader.read(10) == data[:10] and reader.tell() == 10
        assert reader.seek(CHUNK * 2 + 3) == CHUNK * 2 + 3 == reader.tell()
        assert reader.read(5) == data[CHUNK * 2 + 3:CHUNK * 2 + 8]
        assert reader.seek(-8, io.SEEK_CUR) == CHUNK * 2
        assert reader.read(4) == data[CHUNK * 2:CHUNK * 2 + 4]
        assert reader.seek(-100, io.SEEK_END) == size - 100
        assert reader.read() == data[-100:]
        assert reader.seek(0, io.SEEK_END) == size and reader.read(1) == b""
        assert reader.seek(10) == 10 and reader.read(CHUNK) == data[10:CHUNK]   # back to an earlier chunk
        assert reader.seek(CHUNK, io.SEEK_CUR) == 2 * CHUNK
        assert reader.read() == data[2 * CHUNK:]
        # (out of range: held to the payload's bounds)
        assert reader.seek(size + 50) == size
        assert reader.seek(-1) == 0
        assert reader.seek(-size - 1, io.SEEK_END) == 0
        assert reader.read(3) == data[:3]


def test_resume_at_an_offset_reads_the_tail(url):
    data = payload(3 * CHUNK + 17, seed=9)
    ref = upload(url, PREFIX, data)
    for offset in (0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, len(data) - 1, len(data)):
        with payloads.open_payload(ref, offset) as reader:
            assert reader.tell() == offset
            assert read_in(reader, 500) == data[offset:]
    for offset in (-1, len(data) + 1):
        with pytest.raises(InvalidArgument):
            PayloadReader(ref, offset)


def test_reads_after_close_fail(url):
    ref = upload(url, PREFIX, payload(2 * CHUNK))
    reader = PayloadReader(ref)
    assert reader.read(5) == payload(2 * CHUNK)[:5]
    reader.close()
    reader.close()                                            # (twice: fine)
    with pytest.raises(ValueError):
        reader.read(5)
    with pytest.raises(ValueError):
        reader.readinto(bytearray(5))


# --- damage in the store ------------------------------------------------------------------------

def test_a_replaced_chunk_fails_the_whole_payload_check_at_the_end(url):
    data = payload(3 * CHUNK + 17, seed=10)
    ref = upload(url, PREFIX, data)
    other = payload(CHUNK, seed=99)
    assert other != data[CHUNK:2 * CHUNK]
    # a valid-looking chunk: its own checksum holds, its size is right
    open_store(url).put(ref.chunk_name(1), chunk_object(other))
    with pytest.raises(FragmentCorrupt) as info:
        read_all(ref)
    assert type(info.value) is FragmentCorrupt and "checksum does not match" in str(info.value)
    # read in pieces: every read but the last answers (the per-chunk checks pass); the last fails
    with PayloadReader(ref) as reader:
        got = bytearray()
        with pytest.raises(FragmentCorrupt):
            while piece := reader.read(300):
                got += piece
        assert bytes(got) == data[:CHUNK] + other + data[2 * CHUNK:len(got)]
        assert len(got) >= len(data) - 300
    # (the whole check applies to reads from start to end only: a resumed or seeking
    # reader gets the replaced chunk's data, checked per chunk)
    with PayloadReader(ref, CHUNK) as reader:
        assert reader.read(CHUNK) == other
    with PayloadReader(ref) as reader:        # a seek back to the start checks again from there
        reader.seek(0)
        with pytest.raises(FragmentCorrupt):
            reader.read()
    with PayloadReader(ref) as reader:        # a jump elsewhere does not
        reader.seek(5)
        reader.seek(0, io.SEEK_CUR)
        assert reader.read() == (data[:CHUNK] + other + data[2 * CHUNK:])[5:]


def test_a_replaced_last_chunk_fails_the_whole_payload_check(url):
    data = payload(2 * CHUNK + 5, seed=11)
    ref = upload(url, PREFIX, data)
    open_store(url).put(ref.chunk_name(2), chunk_object(b"zzzzz"))
    with pytest.raises(FragmentCorrupt):
        read_all(ref)
    single = upload(url, PREFIX, b"a")
    open_store(url).put(single.chunk_name(0), chunk_object(b"b"))
    with pytest.raises(FragmentCorrupt):
        read_all(single)


@pytest.mark.parametrize("damage", ["flip data", "flip checksum", "truncate", "extend", "empty", "short header",
                                    "swap chunks"])
@pytest.mark.parametrize("index", [0, 1, 3])
def test_a_corrupt_chunk_is_fragment_corrupt(url, damage, index):
    data = payload(3 * CHUNK + 17, seed=12)
    ref = upload(url, PREFIX, data)
    store = open_store(url)
    raw = bytearray(store.get(ref.chunk_name(index)))
    if damage == "flip data":
        raw[-1] ^= 0x01
    elif damage == "flip checksum":
        raw[0] ^= 0x80
    elif damage == "truncate":
        raw = raw[:-1]
    elif damage == "extend":
        raw = chunk_object(bytes(raw[8:]) + b"x")             # (its own checksum holds; its size does not)
    elif damage == "empty":
        raw = bytearray()
    elif damage == "short header":
        raw = raw[:5]
    elif damage == "swap chunks":                             # another chunk (of another size) in its place
        raw = bytearray(store.get(ref.chunk_name(3 if index != 3 else 0)))
    store.put(ref.chunk_name(index), bytes(raw))
    with pytest.raises(FragmentCorrupt) as info:
        read_all(ref)
    assert type(info.value) is FragmentCorrupt and "checksum or size" in str(info.value)
    # a reader that starts at the damaged chunk fails on it too (the per-chunk check)
    with PayloadReader(ref, index * CHUNK) as reader:
        with pytest.raises(FragmentCorrupt):
            reader.read(1)
    # the chunks before it read fine
    if index:
        with PayloadReader(ref) as reader:
            assert reader.read(CHUNK) == data[:CHUNK]


@pytest.mark.parametrize("index", [0, 1, 3])
def test_a_missing_chunk_is_fragment_missing(url, index):
    data = payload(3 * CHUNK + 17, seed=13)
    ref = upload(url, PREFIX, data)
    open_store(url).delete(ref.chunk_name(index))
    with pytest.raises(FragmentMissing):
        read_all(ref)
    with PayloadReader(ref) as reader:
        got = bytearray()
        with pytest.raises(FragmentMissing):
            while piece := reader.read(100):
                got += piece
        assert bytes(got) == data[:index * CHUNK]


def test_a_discarded_payload_is_fragment_missing(url):
    ref = upload(url, PREFIX, payload(10))
    discard(ref)
    with pytest.raises(FragmentMissing):
        read_all(ref)


# --- PayloadRef ---------------------------------------------------------------------------------

def test_payload_ref_round_trips():
    ref = PayloadRef("file:///x/store", "s/1/payloads/2024010100/1-ab/", 3 * CHUNK + 1, CHUNK, 4, 2**64 - 1)
    raw = ref.to_bytes()
    d = json.loads(raw)
    assert d["sms_payload"] == 1 and d["checksum"] == "f" * 16
    assert PayloadRef.from_bytes(raw) == ref
    assert PayloadRef.from_bytes(raw.decode()) == ref          # (json.loads takes str too)
    assert ref.chunk_name(3) == "s/1/payloads/2024010100/1-ab/000003"


def _ref_json(**changes) -> bytes:
    d = json.loads(PayloadRef("file:///x", "k/", 2 * CHUNK + 1, CHUNK, 3, 0xABC).to_bytes())
    d.update(changes)
    for k, v in list(d.items()):
        if v is _DROP:
            del d[k]
    return json.dumps(d).encode()


_DROP = object()


@pytest.mark.parametrize("raw", [
    b"", b"not json", b"{", b"[]", b"null", b'"x"', b"1", b"\xff\xfe", b"{}",
    _ref_json(store=_DROP), _ref_json(key=_DROP), _ref_json(size=_DROP), _ref_json(chunk_bytes=_DROP),
    _ref_json(chunks=_DROP), _ref_json(checksum=_DROP),
    _ref_json(checksum="xyz"), _ref_json(checksum=123), _ref_json(checksum=None), _ref_json(size="big"),
    _ref_json(size=None), _ref_json(chunks=[3]),
    _ref_json(size=-1, chunks=0), _ref_json(chunk_bytes=0), _ref_json(chunk_bytes=-CHUNK),
    _ref_json(chunks=2), _ref_json(chunks=4), _ref_json(chunks=0), _ref_json(size=0),
    _ref_json(size=3 * CHUNK + 1), _ref_json(chunk_bytes=CHUNK // 2),
    _ref_json(key="k"), _ref_json(key=""),
])
def test_payload_ref_refuses_malformed_json_and_inconsistent_sizes(raw):
    with pytest.raises(InvalidArgument):
        PayloadRef.from_bytes(raw)


def test_payload_ref_accepts_consistent_sizes():
    assert PayloadRef.from_bytes(_ref_json()).chunks == 3
    assert PayloadRef.from_bytes(_ref_json(size=3 * CHUNK)).size == 3 * CHUNK
    assert PayloadRef.from_bytes(_ref_json(size=0, chunks=0)).chunks == 0
    assert PayloadRef.from_bytes(_ref_json(size=1, chunks=1, chunk_bytes=1)).size == 1


# --- needs_reference ----------------------------------------------------------------------------

def test_needs_reference(tmp_path):
    limit = limits.RECORD_DATA_BYTES_MAX
    over, at = b"x" * (limit + 1), b"x" * limit
    assert records.needs_reference(("k", over))
    assert records.needs_reference(("k", bytearray(over)))
    assert records.needs_reference(("k", memoryview(over)))
    assert not records.needs_reference(("k", at))
    assert not records.needs_reference(("k", b""))
    assert not records.needs_reference(("k", memoryview(at)))
    # file objects go by reference whatever their size
    assert records.needs_reference(("k", io.BytesIO(b"")))
    path = tmp_path / "f.bin"
    path.write_bytes(b"small")
    with open(path, "rb") as f:
        assert records.needs_reference(("k", f))
    assert records.needs_reference(("k", ShortReads(b"")))
    # every accepted shape: dicts, tuples and lists of 2..4
    assert records.needs_reference({"partition_key": "k", "data": over})
    assert records.needs_reference({"partition_key": "k", "data": io.BytesIO(b"x"), "headers": {"h": "v"}})
    assert not records.needs_reference({"partition_key": "k", "data": at})
    assert records.needs_reference(("k", over, None))
    assert records.needs_reference(("k", over, "123", {"h": b"v"}))
    assert records.needs_reference(["k", io.BytesIO(b"x")])
    assert not records.needs_reference(("k", at, None, None))
    # what is not data (or not a record) does not
    assert not records.needs_reference(("k", "x" * (limit + 1)))
    assert not records.needs_reference(("k", None))
    assert not records.needs_reference(("k", 12345))
    assert not records.needs_reference({"partition_key": "k"})
    assert not records.needs_reference({"partition_key": "k", "data": over, "extra": 1})   # (an invalid record)
    assert not records.needs_reference(("k",))
    assert not records.needs_reference(("k", over, None, None, None))
    assert not records.needs_reference(over)
    assert not records.needs_reference(None)


def test_needs_reference_follows_the_limit(monkeypatch):
    monkeypatch.setattr(limits, "RECORD_DATA_BYTES_MAX", 10)
    assert records.needs_reference(("k", b"x" * 11))
    assert not records.needs_reference(("k", b"x" * 10))
    assert payloads.is_file(io.BytesIO(b"")) and not payloads.is_file(b"") and not payloads.is_file(bytearray())
