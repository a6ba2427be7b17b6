"""Packed record batches: the bytes that travel from producer to disk and back.

Records are never protobuf objects on the hot path. A *batch* is one header plus packed
record entries; ingestion builds it once, the chain head stamps the first sequence
number into the header, every replica stores it as one LMDB value, and readers get the
same bytes back. Only the two ends (ingestion validating puts, clients decoding reads)
touch individual records.

Entry:  <I data_len> <H key_len> <H meta_len> key(utf-8) meta data
Batch:  <B version> <B flags> <H reserved> <I count> <16s first_sn big-endian>
        <Q origin_id> <Q origin_seq> <Q checksum> entries...
The checksum is xxh3-64 over (count, first_sn, origin, entries); storage verifies it
before it writes a batch and again when it reads one back. The origin names the
ingestion writer that built the batch and its sequence there: a head that is sent the
same origin again (a resend after a broken stream) recognises the batch it holds.

`meta` is a small TLV list (<B tag> <B len> value) for fields that only some records
carry: an explicit hash key on the way in; producer-session fields in storage.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import xxhash

from sms import seqno
from sms.errors import InternalError, InvalidArgument

ENTRY = struct.Struct("<IHH")
HEADER = struct.Struct("<BBHI16sQQQ")
BATCH_VERSION = 2
HEADER_BYTES = HEADER.size

TAG_EXPLICIT_HASH_KEY = 1
TAG_PRODUCER_ID = 2
TAG_SSSN = 3
TAG_DEDUP_KEY = 4
TAG_SUBMIT_MS = 5
TAG_SESSION_ORDINAL = 6     # 4 bytes: the record belongs to the producer's session with this
                            # (closed) ancestor partition, not with the one it is stored in


class CorruptBatch(InternalError):
    """A stored or received batch whose checksum or framing does not hold."""


def encode_meta(fields: dict[int, bytes]) -> bytes:
    out = bytearray()
    for tag, value in fields.items():
        assert 0 < tag < 256 and len(value) < 256
        out += bytes((tag, len(value))) + value
    return bytes(out)


def decode_meta(meta: bytes | memoryview) -> dict[int, bytes]:
    fields: dict[int, bytes] = {}
    i, n = 0, len(meta)
    while i < n:
        if i + 2 > n:
            raise InvalidArgument("record meta truncated")
        tag, length = meta[i], meta[i + 1]
        if i + 2 + length > n:
            raise InvalidArgument("record meta truncated")
        fields[tag] = bytes(meta[i + 2:i + 2 + length])
        i += 2 + length
    return fields


def encode_entry(key: bytes, data: bytes, meta: bytes = b"") -> bytes:
    return ENTRY.pack(len(data), len(key), len(meta)) + key + meta + data


@dataclass(frozen=True, slots=True)
class RawEntry:
    """One decoded entry; views into the enclosing buffer."""

    key: bytes
    meta: bytes
    data: bytes
    start: int   # offset of the entry in the buffer
    end: int


def iter_entries(buf: bytes | memoryview, count: int, offset: int = 0) -> Iterator[RawEntry]:
    """Walk `count` entries of `buf` from `offset`; InvalidArgument on bad framing."""
    view = memoryview(buf)
    n = len(view)
    unpack = ENTRY.unpack_from
    for _ in range(count):
        if offset + ENTRY.size > n:
            raise InvalidArgument("record entries truncated")
        data_len, key_len, meta_len = unpack(view, offset)
        k = offset + ENTRY.size
        m = k + key_len
        d = m + meta_len
        end = d + data_len
        if end > n:
            raise InvalidArgument("record entries truncated")
        yield RawEntry(bytes(view[k:m]), bytes(view[m:d]), bytes(view[d:end]), offset, end)
        offset = end
    if offset != n:
        raise InvalidArgument(f"{n - offset} trailing bytes after {count} record entries")


def check_framing(buf: bytes | memoryview, count: int, offset: int = 0) -> None:
    """`count` entries fill `buf` from `offset` exactly; InvalidArgument otherwise. The
    lengths only: no per-record object."""
    n = len(buf)
    unpack, size = ENTRY.unpack_from, ENTRY.size
    for _ in range(count):
        if offset + size > n:
            raise InvalidArgument("record entries truncated")
        data_len, key_len, meta_len = unpack(buf, offset)
        offset += size + key_len + meta_len + data_len
    if offset != n:
        raise InvalidArgument("record entries truncated" if offset > n else
                              f"{n - offset} trailing bytes after {count} record entries")


def _checksum(count: int, first_sn_raw: bytes, origin_id: int, origin_seq: int, body: bytes | memoryview) -> int:
    h = xxhash.xxh3_64()
    h.update(_CHECKED.pack(count, first_sn_raw, origin_id, origin_seq))
    h.update(body)
    return h.intdigest()


_CHECKED = struct.Struct("<I16sQQ")


def build_batch(entries: list[bytes], first_sn: int = 0, origin_id: int = 0, origin_seq: int = 0) -> bytes:
    """A batch of already-encoded entries (first_sn 0 means: not yet sequenced)."""
    body = b"".join(entries)
    return seal(len(entries), first_sn, body, origin_id, origin_seq)


def seal(count: int, first_sn: int, body: bytes | memoryview, origin_id: int = 0, origin_seq: int = 0) -> bytes:
    raw_sn = seqno.to_bytes(first_sn)
    header = HEADER.pack(BATCH_VERSION, 0, 0, count, raw_sn, origin_id, origin_seq,
                         _checksum(count, raw_sn, origin_id, origin_seq, body))
    return header + bytes(body)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    count: int
    first_sn: int
    checksum: int
    origin_id: int = 0
    origin_seq: int = 0

    @property
    def last_sn(self) -> int:
        return self.first_sn + (self.count - 1) * seqno.COUNTER_UNIT


def read_header(batch: bytes | memoryview) -> BatchHeader:
    if len(batch) < HEADER_BYTES:
        raise CorruptBatch(f"batch of {len(batch)} bytes; shorter than its header")
    version, flags, reserved, count, raw_sn, origin_id, origin_seq, checksum = HEADER.unpack_from(batch, 0)
    if version != BATCH_VERSION or count == 0 or flags or reserved:
        raise CorruptBatch(f"batch version {version} flags {flags} reserved {reserved} count {count}; "
                           f"expected version {BATCH_VERSION}, flags 0, reserved 0, count > 0")
    return BatchHeader(count, seqno.from_bytes(raw_sn), checksum, origin_id, origin_seq)


def verify(batch: bytes | memoryview) -> BatchHeader:
    """Header of a batch whose checksum holds; CorruptBatch otherwise."""
    header = read_header(batch)
    view = memoryview(batch)
    raw_sn = bytes(view[8:24])
    if _checksum(header.count, raw_sn, header.origin_id, header.origin_seq, view[HEADER_BYTES:]) != header.checksum:
        raise CorruptBatch(f"batch first_sn {header.first_sn}: checksum mismatch")
    return header


def sequence(batch: bytes, first_sn: int) -> bytes:
    """The same batch, verified and its framing walked, stamped with its first sequence
    number (head only: downstream replicas trust the checksum the head sealed)."""
    header = verify(batch)
    try:
        check_framing(batch, header.count, HEADER_BYTES)
    except InvalidArgument as e:
        raise CorruptBatch(f"unsequenced batch: {e.message}") from None
    return seal(header.count, first_sn, memoryview(batch)[HEADER_BYTES:], header.origin_id, header.origin_seq)


def index_at_or_after(header: BatchHeader, position_sn: int) -> int:
    """Index of the first record of the batch whose SN >= position_sn (may be count)."""
    if position_sn <= header.first_sn:
        return 0
    delta = position_sn - header.first_sn
    return min(header.count, -(-delta // seqno.COUNTER_UNIT))


def batch_entries(batch: bytes | memoryview) -> Iterator[RawEntry]:
    header = read_header(batch)
    return iter_entries(memoryview(batch), header.count, HEADER_BYTES)
