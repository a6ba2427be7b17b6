"""Fragment files: a run of whole committed batches of one partition, as one object.

The archiver (storage/archiver.py) writes a partition's old batches to its stream's
fragment store in runs, each run one fragment; readers (archive/reader.py) serve
records below the local trim point from them. As in Gazette, a fragment's name says
what it holds -- its SN range, the checksum of its contents and how they are
compressed -- so a listing of the store is an index of it, and two writers of the
same run write the same name:

    <stream>/<created_ms>/<ordinal>/<first_sn:032x>-<last_sn:032x>-<checksum:016x>.<raw|zst>

The created time keeps a stream deleted and made again under the same name apart.

File:   header, then the body (compressed with zstd for `.zst`)
Header: <8s magic> <B version> <B codec> <H reserved> <16s first_sn> <16s last_sn>
        <I batches> <I records> <Q raw body bytes> <Q checksum>
Body:   <I length> batch, for each batch, oldest first; each batch exactly as stored
        (sms/wire.py), so it is read back with its own checksum and SNs.

The checksum is xxh3-64 of the uncompressed body and is verified after decompression,
before any batch of it is used; each batch's own checksum is verified again when it is
read (wire.verify). A mismatch anywhere is FragmentCorrupt.
"""

from __future__ import annotations

import bisect
import re
import struct
from dataclasses import dataclass

import xxhash

from sms import limits, seqno, wire
from sms.errors import FragmentCorrupt, InvalidStreamConfig

MAGIC = b"SMSFRAG\x00"
VERSION = 1
HEADER = struct.Struct(">8sBBH16s16sIIQQ")
FRAME = struct.Struct(">I")

CODECS = {"none": 0, "zstd": 1}
EXTENSIONS = {0: "raw", 1: "zst"}
_NAME = re.compile(r"([0-9a-f]{32})-([0-9a-f]{32})-([0-9a-f]{16})\.(raw|zst)")


def check_codec(codec: object) -> str:
    if not isinstance(codec, str) or codec not in CODECS:
        raise InvalidStreamConfig(f"compression {str(codec)[:32]!r}; expected one of {', '.join(CODECS)}")
    return str(codec)


@dataclass(frozen=True, slots=True)
class FragmentRef:
    """A fragment as its name describes it."""
    first_sn: int
    last_sn: int
    checksum: int
    codec: int
    name: str                     # the file name (the last part of its key)

    @classmethod
    def parse(cls, name: str) -> "FragmentRef | None":
        m = _NAME.fullmatch(name)
        if m is None:
            return None
        return cls(int(m[1], 16), int(m[2], 16), int(m[3], 16), 0 if m[4] == "raw" else 1, name)


def partition_prefix(stream: str, created_ms: int, ordinal: int) -> str:
    """The store key prefix of one partition's fragments."""
    return f"{stream}/{created_ms}/{ordinal:05d}/"


def file_name(first_sn: int, last_sn: int, checksum: int, codec: int) -> str:
    return f"{first_sn:032x}-{last_sn:032x}-{checksum:016x}.{EXTENSIONS[codec]}"


@dataclass(frozen=True, slots=True)
class Encoded:
    ref: FragmentRef
    data: bytes
    batches: int
    records: int
    raw_bytes: int


def encode(batches: list[bytes], codec: str) -> Encoded:
    """One fragment of whole batches (oldest first, contiguous in their log)."""
    if not batches:
        raise ValueError("a fragment holds at least one batch")
    parts: list[bytes] = []
    records = 0
    for batch in batches:
        parts.append(FRAME.pack(len(batch)))
        parts.append(bytes(batch))
        records += wire.read_header(batch).count
    raw = b"".join(parts)
    checksum = xxhash.xxh3_64_intdigest(raw)
    first, last = wire.read_header(batches[0]).first_sn, wire.read_header(batches[-1]).last_sn
    code = CODECS[codec]
    body = raw
    if code == 1:
        import zstandard
        body = zstandard.ZstdCompressor(level=limits.ARCHIVE_ZSTD_LEVEL).compress(raw)
    header = HEADER.pack(MAGIC, VERSION, code, 0, seqno.to_bytes(first), seqno.to_bytes(last), len(batches),
                         records, len(raw), checksum)
    ref = FragmentRef(first, last, checksum, code, file_name(first, last, checksum, code))
    return Encoded(ref, header + body, len(batches), records, len(raw))


@dataclass(slots=True)
class Decoded:
    """A fragment's batches, verified, with their first SNs for lookups."""
    ref: FragmentRef
    batches: list[bytes]
    first_sns: list[int]
    records: int
    size: int                     # bytes held in memory (for the readers' cache)

    def index_of(self, sn: int) -> int:
        """The index of the batch that holds `sn`, or the first after it."""
        i = bisect.bisect_right(self.first_sns, sn) - 1
        if i < 0:
            return 0
        if wire.read_header(self.batches[i]).last_sn < sn:
            return i + 1
        return i


def decode(ref: FragmentRef, data: bytes) -> Decoded:
    """The verified batches of the fragment `ref` names; FragmentCorrupt on any mismatch."""
    def corrupt(why: str) -> FragmentCorrupt:
        return FragmentCorrupt(f"archive fragment {ref.name} is corrupt: {why}", fragment=ref.name)

    if len(data) < HEADER.size:
        raise corrupt(f"{len(data)} bytes, shorter than its header")
    magic, version, code, _r, first_raw, last_raw, count, records, raw_len, checksum = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise corrupt("not a fragment file (magic or version)")
    if (code, seqno.from_bytes(first_raw), seqno.from_bytes(last_raw), checksum) != (
            ref.codec, ref.first_sn, ref.last_sn, ref.checksum):
        raise corrupt("its header does not match its name")
    if raw_len > limits.ARCHIVE_FRAGMENT_RAW_BYTES_MAX * 2:
        raise corrupt(f"its body claims {raw_len} bytes")
    body = memoryview(data)[HEADER.size:]
    if code == 1:
        import zstandard
        try:
            # (a frame that states its size is allocated at that size, whatever max_output_size says)
            if zstandard.frame_content_size(body) not in (raw_len, -1):
                raise corrupt("its zstd frame's size does not match its header")
            raw = zstandard.ZstdDecompressor().decompress(body, max_output_size=raw_len)
        except zstandard.ZstdError as e:
            raise corrupt(f"zstd: {e}") from None
    else:
        raw = bytes(body)
    if len(raw) != raw_len or xxhash.xxh3_64_intdigest(raw) != checksum:
        raise corrupt("checksum mismatch after decompression")
    batches: list[bytes] = []
    firsts: list[int] = []
    pos = 0
    view = memoryview(raw)
    try:
        while pos < len(raw):
            (n,) = FRAME.unpack_from(raw, pos)
            batch = bytes(view[pos + FRAME.size:pos + FRAME.size + n])
            pos += FRAME.size + n
            header = wire.verify(batch)
            if firsts and header.first_sn <= firsts[-1]:
                raise corrupt("batches out of order")
            batches.append(batch)
            firsts.append(header.first_sn)
    except (struct.error, wire.CorruptBatch) as e:
        raise corrupt(str(e)) from None
    if len(batches) != count or pos != len(raw):
        raise corrupt("its batch count does not match its header")
    if sum(wire.read_header(b).count for b in batches) != records:
        raise corrupt("its record count does not match its header")
    if not batches or firsts[0] != ref.first_sn or wire.read_header(batches[-1]).last_sn != ref.last_sn:
        raise corrupt("its batches do not span the SNs its name says")
    return Decoded(ref, batches, firsts, records, len(raw))
