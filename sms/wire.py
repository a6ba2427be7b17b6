"""The wire module: every byte format a record takes, from producer to disk and back.

Records are never protobuf objects on the hot path. Every producing path (`put_records`,
the producer, SPS output, the Spark sink), ingestion, the chain head and every reader
pack and unpack record bytes here and nowhere else.

Entry:  <I data_len> <H key_len> <H meta_len> key(utf-8) meta data
Meta:   TLVs, <B tag> <B len> value for tags below 0x80 and <B tag> <H len, big-endian>
        value from 0x80 up. Fields only some records carry:
        - on the way in (a PutRecords entry): explicit hash key, SSSN and submit time
          (with a producer session), dedup key, session partition, headers;
        - stored: producer id, SSSN, dedup key, session partition, headers.
Header: a record's named attribute (Kafka headers, SQS message attributes): one
        TAG_HEADER TLV each, value <B name_len> name(utf-8) value; stored and read back
        as they came, in order.
Batch:  <B version> <B flags> <H reserved> <I count> <16s first_sn big-endian>
        <Q origin_id> <Q origin_seq> <Q checksum> <Q prev_checksum> entries...
The checksum is xxh3-64 over (count, first_sn, origin, prev_checksum, entries); storage
verifies it before it writes a batch and again when it reads one back. The head stamps
`prev_checksum` with the checksum of the batch before this one in its log (0 for the
first), so the checksums form a hash chain, a running digest of the whole log: two logs
whose last batches have the same checksum hold the same history, and a successor's hello
that compares its last batch compares everything before it (version 3; version 2 had no
prev_checksum and let a log that diverged earlier pass a check of its last batch). The
origin names the ingestion writer that built the batch and its sequence there: a head
that is sent the same origin again (a resend after a broken stream) recognises the batch
it holds.

PutRecords: `entries` is the request's entries back to back; `session_ordinals` is 4
bytes little-endian per record; the answer's `sequence_numbers` are 16 bytes big-endian
per record and its `ordinals` 4 bytes little-endian per record.

The functions that touch every record (`encode_puts`, `parse_put`, `stored_entries`,
`check_framing`, `check_records`, `decode_records`, `session_fields`, `signature`) have two
implementations: the pure-Python reference in this module (`reference`) and a compiled
one (`sms/_wire.c`, built by the package's own build when a compiler is there). Both
give the same bytes, decisions and named errors, which `tests/unit/test_wire_differential.py`
checks. The compiled one is used when it was built, unless `SMS_PURE_PYTHON=1`;
`IMPLEMENTATION` says which is in force.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import xxhash

from sms import hashing, limits, seqno
from sms.errors import (CorruptBatch, InvalidArgument, InvalidPartitionKey, InvalidRecordHeader, RecordTooLarge,
                        RequestTooLarge, SmsError)
from sms.types import Record

log = logging.getLogger(__name__)

ENTRY = struct.Struct("<IHH")
HEADER = struct.Struct("<BBHI16sQQQQ")
BATCH_VERSION = 3
HEADER_BYTES = HEADER.size
FLAG_SEALED = 0x01          # the body is encrypted (kernel/encryption.py): stored only, readers get it opened
HEADER_AAD = struct.Struct("<I16sQQQ")     # the header fields a sealed body is bound to

TAG_EXPLICIT_HASH_KEY = 1
TAG_PRODUCER_ID = 2
TAG_SSSN = 3
TAG_DEDUP_KEY = 4
TAG_SUBMIT_MS = 5
TAG_SESSION_ORDINAL = 6     # 4 bytes: the record belongs to the producer's session with this
                            # (closed) ancestor partition, not with the one it is stored in
LONG_TAG_MIN = 0x80         # tags from here carry a 2-byte length
TAG_HEADER = 0x80           # repeatable: <B name_len> name value

SN_BYTES = 16
ORDINAL = struct.Struct("<I")
_U64_TLV = struct.Struct(">BBQ")
_U32_TLV = struct.Struct(">BBI")
_LONG_TLV = struct.Struct(">BH")
_SESSION_META = struct.Struct(">BBQBBQ")    # TAG_SSSN, 8, sssn, TAG_SUBMIT_MS, 8, submit ms
_SIG_KEY_LEN = struct.Struct("<H")
# the largest meta a PutRecords entry may carry besides its headers
_PUT_META_BYTES_MAX = 2 * 5 + 16 + 8 + 8 + 4 + limits.DEDUP_KEY_BYTES_MAX
_HEADERS_META_BYTES_MAX = limits.RECORD_HEADERS_BYTES_MAX + limits.RECORD_HEADERS_MAX * 4


# --- meta TLVs --------------------------------------------------------------------------

def _tlv(tag: int, value: bytes) -> bytes:
    if tag >= LONG_TAG_MIN:
        return _LONG_TLV.pack(tag, len(value)) + value
    return bytes((tag, len(value))) + value


def encode_meta(fields: Mapping[int, bytes]) -> bytes:
    out = bytearray()
    for tag, value in fields.items():
        assert 0 < tag < 256 and len(value) < (65_536 if tag >= LONG_TAG_MIN else 256)
        out += _tlv(tag, value)
    return bytes(out)


def iter_meta(meta: bytes | memoryview) -> Iterator[tuple[int, bytes]]:
    """(tag, value) of every TLV in order; InvalidArgument when one is truncated."""
    i, n = 0, len(meta)
    while i < n:
        tag = meta[i]
        if tag >= LONG_TAG_MIN:
            if i + 3 > n:
                raise InvalidArgument("record meta truncated")
            length, i = (meta[i + 1] << 8) | meta[i + 2], i + 3
        else:
            if i + 2 > n:
                raise InvalidArgument("record meta truncated")
            length, i = meta[i + 1], i + 2
        if i + length > n:
            raise InvalidArgument("record meta truncated")
        yield tag, bytes(meta[i:i + length])
        i += length


def decode_meta(meta: bytes | memoryview) -> dict[int, bytes]:
    """Every TLV by tag (a repeated tag: the last); InvalidArgument when truncated."""
    return dict(iter_meta(meta))


# --- headers ----------------------------------------------------------------------------

def encode_headers(headers: Mapping[str, bytes | str] | None) -> bytes:
    """A record's headers (name -> bytes or str) as meta TLVs; InvalidRecordHeader
    names the first broken limit."""
    if not headers:
        return b""
    if not isinstance(headers, Mapping):
        raise InvalidRecordHeader(f"headers of type {type(headers).__name__}; expected a dict of str -> bytes")
    if len(headers) > limits.RECORD_HEADERS_MAX:
        raise InvalidRecordHeader(f"{len(headers)} headers; at most {limits.RECORD_HEADERS_MAX}")
    out, total = [], 0
    for name, value in headers.items():
        if not isinstance(name, str):
            raise InvalidRecordHeader(f"header name of type {type(name).__name__}; expected str")
        raw_name = name.encode("utf-8", "surrogatepass")
        if not 0 < len(raw_name) <= limits.RECORD_HEADER_NAME_BYTES_MAX:
            raise InvalidRecordHeader(f"header name of {len(raw_name)} bytes; expected "
                                      f"1..{limits.RECORD_HEADER_NAME_BYTES_MAX}")
        if isinstance(value, str):
            value = value.encode("utf-8", "surrogatepass")
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidRecordHeader(f"header {name[:64]!r}: value of type {type(value).__name__}; "
                                      "expected bytes or str")
        total += len(raw_name) + len(value)
        if total > limits.RECORD_HEADERS_BYTES_MAX:
            raise InvalidRecordHeader(f"headers of more than {limits.RECORD_HEADERS_BYTES_MAX} bytes "
                                      "(names and values)")
        out.append(_tlv(TAG_HEADER, bytes((len(raw_name),)) + raw_name + bytes(value)))
    return b"".join(out)


def validate_headers(raw: bytes) -> None:
    """Checks a record's TAG_HEADER TLVs (well framed already) as the ingestion node
    does: each names 1..RECORD_HEADER_NAME_BYTES_MAX bytes of UTF-8 that no other header
    of the record names, at most RECORD_HEADERS_MAX of them, and names and values of at
    most RECORD_HEADERS_BYTES_MAX in all. InvalidRecordHeader names the first broken one."""
    count = total = 0
    seen: set[bytes] = set()
    i, n = 0, len(raw)
    while i < n:
        length = (raw[i + 1] << 8) | raw[i + 2]
        value = raw[i + 3:i + 3 + length]
        i += 3 + length
        if count == limits.RECORD_HEADERS_MAX:
            raise InvalidRecordHeader(f"more than {limits.RECORD_HEADERS_MAX} headers")
        name_len = value[0] if value else 0
        if not 0 < name_len <= min(limits.RECORD_HEADER_NAME_BYTES_MAX, len(value) - 1):
            raise InvalidRecordHeader(f"header {count}: name of {name_len} bytes in a header of {len(value)}; "
                                      f"expected 1..{limits.RECORD_HEADER_NAME_BYTES_MAX}")
        name = value[1:1 + name_len]
        try:
            name.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRecordHeader(f"header {count}: name is not UTF-8") from None
        if name in seen:
            raise InvalidRecordHeader(f"header {count}: name repeated")
        seen.add(name)
        count += 1
        total += length - 1
        if total > limits.RECORD_HEADERS_BYTES_MAX:
            raise InvalidRecordHeader(f"headers of more than {limits.RECORD_HEADERS_BYTES_MAX} bytes "
                                      "(names and values)")


def decode_headers(meta: bytes | memoryview) -> dict[str, bytes]:
    """The headers among a record's meta TLVs, name -> value, in order."""
    out: dict[str, bytes] = {}
    if not meta:
        return out
    for tag, value in iter_meta(meta):
        if tag == TAG_HEADER and value:
            out[value[1:1 + value[0]].decode("utf-8", "replace")] = value[1 + value[0]:]
    return out


def headers_of(meta: bytes | memoryview) -> bytes:
    """The raw TAG_HEADER TLVs of a meta, in order (as stored)."""
    if not meta:
        return b""
    return b"".join(_tlv(tag, value) for tag, value in iter_meta(meta) if tag == TAG_HEADER)


# --- entries ----------------------------------------------------------------------------

def encode_entry(key: bytes, data: bytes, meta: bytes = b"") -> bytes:
    return ENTRY.pack(len(data), len(key), len(meta)) + key + meta + data


def encode_put_entry(key: bytes, data: bytes, *, hash_key: int | None = None, sssn: int | None = None,
                     submit_ms: int = 0, dedup_key: bytes | None = None, session_ordinal: int | None = None,
                     headers: bytes = b"") -> bytes:
    """One PutRecords entry: an explicit hash key, a producer session's SSSN and submit
    time, its dedup key and session partition, and encoded headers, each when given."""
    meta = b""
    if sssn is not None:
        meta = _SESSION_META.pack(TAG_SSSN, 8, sssn, TAG_SUBMIT_MS, 8, submit_ms)
    if hash_key is not None:
        meta += bytes((TAG_EXPLICIT_HASH_KEY, 16)) + hash_key.to_bytes(16, "big")
    if dedup_key is not None:
        meta += bytes((TAG_DEDUP_KEY, len(dedup_key))) + dedup_key
    if session_ordinal is not None:
        meta += _U32_TLV.pack(TAG_SESSION_ORDINAL, 4, session_ordinal)
    return ENTRY.pack(len(data), len(key), len(meta) + len(headers)) + key + meta + headers + data


def encode_session_entry(key: bytes, data: bytes, sssn: int, submit_ms: int, extra: bytes = b"") -> bytes:
    """A PutRecords entry of a producer session: its SSSN and submit time, then `extra`
    (already encoded TLVs: explicit hash key, dedup key, headers)."""
    meta = _SESSION_META.pack(TAG_SSSN, 8, sssn, TAG_SUBMIT_MS, 8, submit_ms) + extra
    return ENTRY.pack(len(data), len(key), len(meta)) + key + meta + data


def _encode_session_entries(records: Iterable[Any], submit_ms: int) -> list[bytes]:
    """encode_session_entry() for each record (anything with key, data, sssn and extra),
    all with the same submit time: one call per request, not per record. (Any: the
    producer's PendingRecord, whose `data` is bytes until it is encoded and None after.)"""
    session_meta, entry, tag_sssn, tag_submit = _SESSION_META.pack, ENTRY.pack, TAG_SSSN, TAG_SUBMIT_MS
    out = []
    for r in records:
        meta = session_meta(tag_sssn, 8, r.sssn, tag_submit, 8, submit_ms) + r.extra
        data, key = r.data, r.key
        out.append(entry(len(data), len(key), len(meta)) + key + meta + data)
    return out


def encode_session_ordinals(ordinals: Iterable[int]) -> bytes:
    ordinal_list = list(ordinals)
    return struct.pack(f"<{len(ordinal_list)}I", *ordinal_list)


def decode_ordinals(raw: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(raw) // ORDINAL.size}I", raw))


def encode_put_results(sns: list[int], ordinals: list[int]) -> tuple[bytes, bytes]:
    """A PutRecords answer's `sequence_numbers` and `ordinals` fields."""
    to_bytes = seqno.to_bytes
    return b"".join(to_bytes(sn) for sn in sns), encode_session_ordinals(ordinals)


def _decode_put_results(sequence_numbers: bytes, ordinals: bytes, count: int) -> tuple[list[int], list[int]]:
    """(SNs, partition ordinals) of a PutRecords answer; InvalidArgument when a field's
    length does not match the request's record count."""
    if len(sequence_numbers) != SN_BYTES * count or len(ordinals) != ORDINAL.size * count:
        raise InvalidArgument(f"PutRecords answer of {len(sequence_numbers)} SN bytes and {len(ordinals)} "
                              f"ordinal bytes for {count} records")
    from_bytes = int.from_bytes
    return ([from_bytes(sequence_numbers[i:i + SN_BYTES], "big") for i in range(0, SN_BYTES * count, SN_BYTES)],
            decode_ordinals(ordinals))


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


# --- batches ----------------------------------------------------------------------------

def _checksum(count: int, first_sn_raw: bytes, origin_id: int, origin_seq: int, prev_checksum: int,
              body: bytes | memoryview, flags: int = 0) -> int:
    """xxh3-64 of the header fields and the body; the flags byte too when it is set (a
    clear batch's checksum is as it always was; a flag flipped either way is detected)."""
    h = xxhash.xxh3_64()
    h.update(_CHECKED.pack(count, first_sn_raw, origin_id, origin_seq, prev_checksum))
    h.update(body)
    if flags:
        h.update(bytes((flags,)))
    return h.intdigest()


_CHECKED = struct.Struct("<I16sQQQ")


def build_batch(entries: list[bytes], first_sn: int = 0, origin_id: int = 0, origin_seq: int = 0,
                prev_checksum: int = 0) -> bytes:
    """A batch of already-encoded entries (first_sn 0 means: not yet sequenced)."""
    body = b"".join(entries)
    return seal(len(entries), first_sn, body, origin_id, origin_seq, prev_checksum)


def seal(count: int, first_sn: int, body: bytes | memoryview, origin_id: int = 0, origin_seq: int = 0,
         prev_checksum: int = 0, flags: int = 0) -> bytes:
    raw_sn = seqno.to_bytes(first_sn)
    header = HEADER.pack(BATCH_VERSION, flags, 0, count, raw_sn, origin_id, origin_seq,
                         _checksum(count, raw_sn, origin_id, origin_seq, prev_checksum, body, flags), prev_checksum)
    return header + bytes(body)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    count: int
    first_sn: int
    checksum: int                  # of this batch, chained to the one before (a running digest of the log)
    origin_id: int = 0
    origin_seq: int = 0
    prev_checksum: int = 0         # the checksum of the batch before it in the log (0: none)

    @property
    def last_sn(self) -> int:
        return self.first_sn + (self.count - 1) * seqno.COUNTER_UNIT


def read_header(batch: bytes | memoryview) -> BatchHeader:
    if len(batch) < HEADER_BYTES:
        raise CorruptBatch(f"batch of {len(batch)} bytes; shorter than its header")
    version, flags, reserved, count, raw_sn, origin_id, origin_seq, checksum, prev = HEADER.unpack_from(batch, 0)
    if version != BATCH_VERSION or count == 0 or flags & ~FLAG_SEALED or reserved:
        raise CorruptBatch(f"batch version {version} flags {flags} reserved {reserved} count {count}; "
                           f"expected version {BATCH_VERSION}, flags 0 or {FLAG_SEALED}, reserved 0, count > 0")
    return BatchHeader(count, seqno.from_bytes(raw_sn), checksum, origin_id, origin_seq, prev)


def verify(batch: bytes | memoryview) -> BatchHeader:
    """Header of a batch whose checksum holds; CorruptBatch otherwise."""
    header = read_header(batch)
    view = memoryview(batch)
    raw_sn = bytes(view[8:24])
    if _checksum(header.count, raw_sn, header.origin_id, header.origin_seq, header.prev_checksum,
                 view[HEADER_BYTES:], view[1]) != header.checksum:
        raise CorruptBatch(f"batch first_sn {header.first_sn}: checksum mismatch")
    if header.count * ENTRY.size > len(batch) - HEADER_BYTES:
        raise CorruptBatch(f"batch first_sn {header.first_sn}: {header.count} records cannot fit in "
                           f"{len(batch) - HEADER_BYTES} bytes")
    if header.last_sn > seqno.SN_MAX:       # (no head assigns these: the SNs would wrap)
        raise CorruptBatch(f"batch first_sn {header.first_sn}: {header.count} records run past SN 2^128 - 1")
    return header


def check_batch(batch: bytes, what: str = "") -> BatchHeader:
    """Header of a batch whose checksum holds, of at most BATCH_RECORDS_MAX records and
    BATCH_BYTES_MAX bytes, every record of which every reader decodes (`check_records`:
    key, sizes, meta, headers); CorruptBatch naming the first broken rule otherwise, and
    `what` the batch ("batch first_sn N" unless given). A head checks each batch so before
    it sequences it (`sequence_checked`), a replica before it stores it
    (storage/replica.py): a batch that a reader could not decode is never stored
    (docs/security.md)."""
    header = verify(batch)
    what = what or f"batch first_sn {header.first_sn}"
    if header.count > limits.BATCH_RECORDS_MAX or len(batch) - HEADER_BYTES > limits.BATCH_BYTES_MAX:
        raise CorruptBatch(f"{what}: {header.count} records in {len(batch) - HEADER_BYTES} bytes; at most "
                           f"{limits.BATCH_RECORDS_MAX} records in {limits.BATCH_BYTES_MAX} bytes")
    try:
        check_records(batch, header.count, HEADER_BYTES)
    except InvalidArgument as e:
        raise CorruptBatch(f"{what}: {e.message}") from None
    return header


def sequence_checked(batch: bytes, first_sn: int, prev_checksum: int = 0) -> bytes:
    """What a head stores of a batch from ingestion: the batch checked whole (`check_batch`:
    every record as a reader will decode it), then stamped as `sequence` stamps it."""
    return _stamp(batch, check_batch(batch, "unsequenced batch"), first_sn, prev_checksum)


def sequence(batch: bytes, first_sn: int, prev_checksum: int = 0) -> bytes:
    """The same batch, verified and its framing walked, stamped with its first sequence
    number and chained to the log's last batch by its checksum. (The records themselves
    are not looked at: a head sequences with `sequence_checked`.)"""
    header = verify(batch)
    try:
        check_framing(batch, header.count, HEADER_BYTES)
    except InvalidArgument as e:
        raise CorruptBatch(f"unsequenced batch: {e.message}") from None
    return _stamp(batch, header, first_sn, prev_checksum)


def _stamp(batch: bytes, header: BatchHeader, first_sn: int, prev_checksum: int) -> bytes:
    if first_sn + (header.count - 1) * seqno.COUNTER_UNIT > seqno.SN_MAX:
        raise CorruptBatch(f"unsequenced batch: {header.count} records from SN {first_sn} run past 2^128 - 1")
    return seal(header.count, first_sn, memoryview(batch)[HEADER_BYTES:], header.origin_id, header.origin_seq,
                prev_checksum)


def index_at_or_after(header: BatchHeader, position_sn: int) -> int:
    """Index of the first record of the batch whose SN >= position_sn (may be count)."""
    if position_sn <= header.first_sn:
        return 0
    delta = position_sn - header.first_sn
    return min(header.count, -(-delta // seqno.COUNTER_UNIT))


def batch_entries(batch: bytes | memoryview) -> Iterator[RawEntry]:
    header = read_header(batch)
    return iter_entries(memoryview(batch), header.count, HEADER_BYTES)


# --- the hot functions: the pure-Python reference ----------------------------------------

class PutEntry(NamedTuple):
    """One validated record of a PutRecords request, as ingestion needs it."""

    hash_key: int               # where it routes: MD5 of the key, or its explicit hash key
    key: bytes                  # partition key, valid UTF-8 of 1..256 characters
    data: bytes
    sssn: int                   # 0 without a producer session
    submit_ms: int
    dedup_key: bytes | None
    session_ordinal: int | None   # the record's session is with this (ancestor) partition
    headers: bytes              # its TAG_HEADER TLVs, validated, stored as they came
    signature: bytes            # what a retry of the same SSSN must match (dedup)


class SessionFields(NamedTuple):
    """The producer-session fields of one stored record, for a dedup table rebuild."""

    index: int  # type: ignore[assignment]  # in its batch (a field named as tuple.index: the C codec sets it)
    producer_id: bytes
    sssn: int
    dedup_key: bytes | None
    session_ordinal: int | None
    signature: bytes


def _hash_of(key: bytes) -> int:
    return int.from_bytes(hashlib.md5(key).digest(), "big")


def _signature(key: bytes, data: bytes, headers: bytes = b"") -> bytes:
    """What identifies a record's content for de-duplication: xxh3-128 of its key
    (length-prefixed), data and headers."""
    if len(key) > 0xFFFF:
        raise InvalidArgument(f"a key of {len(key)} bytes has no signature; at most 65535")
    h = xxhash.xxh3_128()
    h.update(_SIG_KEY_LEN.pack(len(key)))
    h.update(key)
    h.update(data)
    if headers:
        h.update(headers)
    return h.digest()


def _encode_puts(records: Iterable[Any], fallback: Callable[[Any], tuple[bytes, int]]) -> tuple[list[bytes], list[int]]:
    """(entry, hash key) per record of a put: (partition_key str, data bytes) pairs take
    the lean path; any other shape goes through `fallback(record) -> (entry, hash key)`,
    which validates it (named errors). The entries carry no session fields."""
    entries: list[bytes] = []
    hashes: list[int] = []
    key_min, key_max = limits.PARTITION_KEY_CHARS_MIN, limits.PARTITION_KEY_CHARS_MAX
    data_max, pack = limits.RECORD_DATA_BYTES_MAX, ENTRY.pack
    for r in records:
        if type(r) is tuple and len(r) == 2:
            key, data = r
            if type(key) is str and type(data) is bytes and key_min <= len(key) <= key_max \
                    and len(data) <= data_max:
                try:
                    kb = key.encode("utf-8")
                except UnicodeEncodeError:      # lone surrogates: the fallback names the error
                    kb = None
            else:
                kb = None
            if kb is not None:
                entries.append(pack(len(data), len(kb), 0) + kb + data)
                hashes.append(_hash_of(kb))
                continue
        entry, hash_key = fallback(r)
        entries.append(entry)
        hashes.append(hash_key)
    return entries, hashes


def _u64(raw: bytes, what: str, index: int) -> int:
    if len(raw) != 8:
        raise InvalidArgument(f"record {index}: {what} of {len(raw)} bytes; expected 8")
    return int.from_bytes(raw, "big")


def _walk_entries(buf: bytes | memoryview, count: int, offset: int,
                  n: int) -> Iterator[tuple[int, int, int, int, int]]:
    """The pure-Python walk over `count` record entries of `buf` from `offset` (`n`:
    len(buf)): yields (index, key start, meta start, data start, end) of each, after the
    checks every walk makes: the entry lies within `n` ("record entries truncated") and its
    data within RECORD_DATA_BYTES_MAX (RecordTooLarge). The caller checks that the last
    end is `n`."""
    unpack, head = ENTRY.unpack_from, ENTRY.size
    data_max = limits.RECORD_DATA_BYTES_MAX
    for i in range(count):
        if offset + head > n:
            raise InvalidArgument("record entries truncated")
        data_len, key_len, meta_len = unpack(buf, offset)
        k = offset + head
        m = k + key_len
        d = m + meta_len
        offset = d + data_len
        if offset > n:
            raise InvalidArgument("record entries truncated")
        if data_len > data_max:
            raise RecordTooLarge(f"record {i}: {data_len} bytes of data; at most {data_max}")
        yield i, k, m, d, offset


def _parse_put(count: int, blob: bytes, producer_id: bytes) -> list[PutEntry]:
    """The records of a PutRecords request, validated whole, or a named error for the
    whole request (bad input changes nothing)."""
    if not 1 <= count <= limits.PUT_RECORDS_COUNT_MAX:
        raise RequestTooLarge(f"{count} records; expected 1..{limits.PUT_RECORDS_COUNT_MAX}")
    if len(producer_id) > limits.PRODUCER_ID_BYTES_MAX:
        raise InvalidArgument(f"producer id of {len(producer_id)} bytes; at most {limits.PRODUCER_ID_BYTES_MAX}")
    if len(blob) > limits.PUT_RECORDS_BYTES_MAX + count * (ENTRY.size + _PUT_META_BYTES_MAX + _HEADERS_META_BYTES_MAX):
        raise RequestTooLarge(f"request of {len(blob)} bytes; at most {limits.PUT_RECORDS_BYTES_MAX}")
    out, total = [], 0
    n, offset = len(blob), 0
    key_min, key_max = limits.PARTITION_KEY_CHARS_MIN, limits.PARTITION_KEY_CHARS_MAX
    hash_of = hashing.hash_key_of_bytes     # (MD5, remembered per key)
    for i, k, m, d, offset in _walk_entries(blob, count, 0, n):
        data_len, key_len, meta_len = offset - d, m - k, d - m
        key = blob[k:m]
        try:
            chars = len(key.decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidArgument(f"record {i}: partition key is not UTF-8") from None
        if not key_min <= chars <= key_max:
            raise InvalidPartitionKey(f"partition key of {chars} chars; expected {key_min}..{key_max}")
        data = blob[d:offset]
        total += data_len + key_len
        if meta_len == _SESSION_META.size and producer_id and blob[m] == TAG_SSSN and blob[m + 1] == 8 \
                and blob[m + 10] == TAG_SUBMIT_MS and blob[m + 11] == 8:
            # the producer's usual meta, SSSN and submit time only: no TLV walk
            _t1, _l1, sssn, _t2, _l2, submit_ms = _SESSION_META.unpack_from(blob, m)
            out.append(PutEntry(hash_of(key), key, data, sssn, submit_ms, None, None, b"", _signature(key, data)))
            continue
        explicit: bytes | None = None
        dedup_key: bytes | None = None
        raw_sssn = raw_submit = b""
        raw_session: bytes | None = None
        session_ordinal: int | None = None
        headers: list[bytes] = []
        has_sssn = has_submit = False
        if meta_len:
            for tag, value in iter_meta(blob[m:d]):
                if tag == TAG_EXPLICIT_HASH_KEY:
                    explicit = value
                elif tag == TAG_SSSN:
                    raw_sssn, has_sssn = value, True
                elif tag == TAG_SUBMIT_MS:
                    raw_submit, has_submit = value, True
                elif tag == TAG_DEDUP_KEY:
                    dedup_key = value
                elif tag == TAG_SESSION_ORDINAL:
                    raw_session = value
                elif tag == TAG_HEADER:
                    headers.append(_tlv(tag, value))
        if explicit is not None:
            if len(explicit) != 16:
                raise InvalidArgument(f"record {i}: explicit hash key of {len(explicit)} bytes; expected 16")
            hash_key = int.from_bytes(explicit, "big")
        else:
            hash_key = hash_of(key)
        if producer_id:
            if not (has_sssn and has_submit):
                raise InvalidArgument(f"record {i}: a producer session needs an SSSN and a submit time per record")
            sssn = _u64(raw_sssn, "SSSN", i)
            submit_ms = _u64(raw_submit, "submit time", i)
        else:
            sssn = submit_ms = 0
            if dedup_key is not None:
                raise InvalidArgument(f"record {i}: a dedup key needs a producer session (producer_id)")
        if raw_session is not None:
            if not producer_id or len(raw_session) != 4:
                raise InvalidArgument(f"record {i}: a session partition is 4 bytes and needs a producer session")
            session_ordinal = int.from_bytes(raw_session, "big")
        raw_headers = b"".join(headers)
        if raw_headers:
            try:
                validate_headers(raw_headers)
            except InvalidRecordHeader as e:
                raise InvalidRecordHeader(f"record {i}: {e.message}") from None
            total += len(raw_headers)
        out.append(PutEntry(hash_key, key, data, sssn, submit_ms, dedup_key, session_ordinal, raw_headers,
                            _signature(key, data, raw_headers)))
    if offset != n:
        raise InvalidArgument(f"{n - offset} trailing bytes after {count} record entries")
    if total > limits.PUT_RECORDS_BYTES_MAX:
        raise RequestTooLarge(f"request of {total} bytes of keys and data; at most {limits.PUT_RECORDS_BYTES_MAX}")
    return out


class PutRun(NamedTuple):
    """Consecutive records of a PutRecords request in the producer's usual form, as
    ingestion takes them whole (`put_runs`): one session partition, consecutive SSSNs, no
    dedup key, explicit hash key or header. Columns, not a record object each."""

    ordinal: int                # the session partition (request.session_ordinals) of every record
    start: int                  # index of its first record in the request
    length: int                 # its records
    first_sssn: int             # the records' SSSNs are first_sssn, first_sssn + 1, ...
    submit_min: int             # the smallest and largest submit time (ms)
    submit_max: int
    hash_min: int               # the smallest and largest hash key (routing: both in range, all are)
    hash_max: int
    signatures: bytes           # SIGNATURE_BYTES per record (wire.signature)
    submits: bytes              # each record's submit time, <Q each
    stored: bytes               # the records' stored entries (stored_entries, session_id, no session ordinal)
    size: int                   # bytes of keys and data


SIGNATURE_BYTES = 16
_SUBMITS = struct.Struct("<Q")


class _RunRecord(NamedTuple):
    key: bytes
    data: bytes
    headers: bytes
    producer_id: bytes
    sssn: int
    dedup_key: None
    session_ordinal: None


def _put_runs(count: int, blob: bytes, producer_id: bytes, session_id: bytes,
              ordinals: bytes) -> list[PutRun] | None:
    """A PutRecords request as runs (`PutRun`), when every record is in the producer's
    usual form (its meta exactly an SSSN and a submit time) with a session partition each
    (`ordinals`, 4 bytes little-endian per record), and the request is valid as
    `parse_put` checks it; None otherwise (the caller then takes `parse_put`'s way, which
    names any error). A run ends where the session partition changes or an SSSN is not
    the one after its predecessor's."""
    if not producer_id or not 0 < len(session_id) <= 0xFF or len(ordinals) != ORDINAL.size * count:
        return None
    try:
        entries = _parse_put(count, blob, producer_id)
    except SmsError:
        return None
    for _i, _k, m, d, _end in _walk_entries(blob, count, 0, len(blob)):
        if d - m != _SESSION_META.size or blob[m] != TAG_SSSN or blob[m + 1] != 8 or blob[m + 10] != TAG_SUBMIT_MS \
                or blob[m + 11] != 8:
            return None
    ords = decode_ordinals(ordinals)
    runs: list[PutRun] = []
    i = 0
    while i < count:
        j = i + 1
        while j < count and ords[j] == ords[i] and entries[j].sssn == entries[j - 1].sssn + 1:
            j += 1
        run = entries[i:j]
        submits = [e.submit_ms for e in run]
        hashes = [e.hash_key for e in run]
        runs.append(PutRun(
            ords[i], i, j - i, run[0].sssn, min(submits), max(submits), min(hashes), max(hashes),
            b"".join(e.signature for e in run), b"".join(_SUBMITS.pack(t) for t in submits),
            _stored_entries([_RunRecord(e.key, e.data, b"", session_id, e.sssn, None, None) for e in run]),
            sum(len(e.key) + len(e.data) for e in run)))
        i = j
    return runs


class StoredRecord(Protocol):
    """What `stored_entries` reads of a record to store (ingestion's writes)."""

    @property
    def key(self) -> bytes: ...
    @property
    def data(self) -> bytes: ...
    @property
    def headers(self) -> bytes: ...
    @property
    def producer_id(self) -> bytes: ...
    @property
    def sssn(self) -> int: ...
    @property
    def dedup_key(self) -> bytes | None: ...
    @property
    def session_ordinal(self) -> int | None: ...


def _stored_entries(records: Iterable[StoredRecord]) -> bytes:
    """The stored entries of records (each with `key`, `data`, `producer_id`, `sssn`,
    `dedup_key`, `session_ordinal`, `headers`), back to back: key, data, and the session
    fields a dedup rebuild reads back (TLVs in tag order: producer id, SSSN, dedup key,
    session partition), then the headers. Without a producer id: the headers only."""
    out = []
    pack = ENTRY.pack
    for i, s in enumerate(records):
        key, data, headers, producer_id = s.key, s.data, s.headers, s.producer_id
        _check_stored(i, s)
        if producer_id:
            meta = bytes((TAG_PRODUCER_ID, len(producer_id))) + producer_id + _U64_TLV.pack(TAG_SSSN, 8, s.sssn)
            if s.dedup_key is not None:
                meta += bytes((TAG_DEDUP_KEY, len(s.dedup_key))) + s.dedup_key
            if s.session_ordinal is not None:
                meta += _U32_TLV.pack(TAG_SESSION_ORDINAL, 4, s.session_ordinal)
            meta += headers
        else:
            meta = headers
        out.append(pack(len(data), len(key), len(meta)) + key + meta + data)
    return b"".join(out)


def _check_stored(i: int, s: StoredRecord) -> None:
    """Every field of a record to store fits its stored field (ingestion's parse bounds
    them all: this names a programmer error instead of writing bytes that do not frame)."""
    meta = len(s.headers)
    if s.producer_id:
        meta += 2 + len(s.producer_id) + 10
        meta += 0 if s.dedup_key is None else 2 + len(s.dedup_key)
        meta += 0 if s.session_ordinal is None else 6
    for what, ok in (("key", len(s.key) <= 0xFFFF), ("data", len(s.data) <= 0xFFFFFFFF),
                     ("producer id", len(s.producer_id) <= 0xFF),
                     ("dedup key", not s.producer_id or s.dedup_key is None or len(s.dedup_key) <= 0xFF),
                     ("sssn", not s.producer_id or 0 <= s.sssn <= 0xFFFFFFFFFFFFFFFF),
                     ("session ordinal", not s.producer_id or s.session_ordinal is None
                      or 0 <= s.session_ordinal <= 0xFFFFFFFF),
                     ("meta", meta <= 0xFFFF)):
        if not ok:
            raise InvalidArgument(f"record {i}: its {what} does not fit its stored field")


def _check_framing(buf: bytes | memoryview, count: int, offset: int = 0) -> None:
    """`count` entries fill `buf` from `offset` exactly; InvalidArgument otherwise. The
    lengths only: no per-record object."""
    n = len(buf)
    if not 0 <= offset <= n:
        raise InvalidArgument(f"offset {offset}; expected 0..{n}")
    unpack, size = ENTRY.unpack_from, ENTRY.size
    for _ in range(count):
        if offset + size > n:
            raise InvalidArgument("record entries truncated")
        data_len, key_len, meta_len = unpack(buf, offset)
        offset += size + key_len + meta_len + data_len
    if offset != n:
        raise InvalidArgument("record entries truncated" if offset > n else
                              f"{n - offset} trailing bytes after {count} record entries")


def _check_records(buf: bytes | memoryview, count: int, offset: int = 0) -> None:
    """`count` entries fill `buf` from `offset` exactly, and each is a record every reader
    decodes: data of at most RECORD_DATA_BYTES_MAX bytes, a partition key of
    PARTITION_KEY_CHARS_MIN..MAX characters of UTF-8, and a meta as `_check_stored_meta`
    wants it. Otherwise the named error of the first broken rule, "record N: ..." (as
    `check_framing` for the framing). What a head checks of a batch before it sequences
    it, and a replica before it stores it (`check_batch`)."""
    n = len(buf)
    if not 0 <= offset <= n:
        raise InvalidArgument(f"offset {offset}; expected 0..{n}")
    key_min, key_max = limits.PARTITION_KEY_CHARS_MIN, limits.PARTITION_KEY_CHARS_MAX
    for i, k, m, d, offset in _walk_entries(buf, count, offset, n):
        meta_len = d - m
        try:
            chars = len(str(buf[k:m], "utf-8"))
        except UnicodeDecodeError:
            raise InvalidPartitionKey(f"record {i}: partition key is not UTF-8") from None
        if not key_min <= chars <= key_max:
            raise InvalidPartitionKey(f"record {i}: partition key of {chars} chars; expected {key_min}..{key_max}")
        if meta_len:
            _check_stored_meta(buf, m, d, i)
    if offset != n:
        raise InvalidArgument(f"{n - offset} trailing bytes after {count} record entries")


def _check_stored_meta(buf: bytes | memoryview, start: int, end: int, record: int) -> None:
    """The meta of a stored record, buf[start:end]: TLVs that frame; the session fields of
    their sizes (producer id 1..SESSION_KEY_BYTES_MAX bytes: an epoch's session names
    are longer than the producer's id; SSSN 8; session partition 4), and none of them
    without both a producer id and an SSSN (a dedup rebuild reads them together); headers
    as `validate_headers` wants them. A dedup key's length is not checked: a stream that
    de-duplicates refuses a bad one before it is stored (ingestion/dedup.py), and on any
    other no reader looks at it. A tag no reader knows is skipped, as every reader skips it."""
    has_pid = has_sssn = has_other = False
    headers: list[bytes] = []
    i = start
    while i < end:
        tag = buf[i]
        if tag >= LONG_TAG_MIN:
            if i + 3 > end:
                raise InvalidArgument(f"record {record}: meta truncated")
            length, v = (buf[i + 1] << 8) | buf[i + 2], i + 3
        else:
            if i + 2 > end:
                raise InvalidArgument(f"record {record}: meta truncated")
            length, v = buf[i + 1], i + 2
        if v + length > end:
            raise InvalidArgument(f"record {record}: meta truncated")
        if tag == TAG_PRODUCER_ID:
            if not 1 <= length <= limits.SESSION_KEY_BYTES_MAX:
                raise InvalidArgument(f"record {record}: producer id of {length} bytes; "
                                      f"expected 1..{limits.SESSION_KEY_BYTES_MAX}")
            has_pid = True
        elif tag == TAG_SSSN:
            if length != 8:
                raise InvalidArgument(f"record {record}: SSSN of {length} bytes; expected 8")
            has_sssn = True
        elif tag == TAG_DEDUP_KEY:
            has_other = True
        elif tag == TAG_SESSION_ORDINAL:
            if length != 4:
                raise InvalidArgument(f"record {record}: session partition of {length} bytes; expected 4")
            has_other = True
        elif tag == TAG_HEADER:
            headers.append(bytes(buf[i:v + length]))
        i = v + length
    if (has_pid or has_sssn or has_other) and not (has_pid and has_sssn):
        raise InvalidArgument(f"record {record}: session fields without a producer id and an SSSN")
    if headers:
        try:
            validate_headers(b"".join(headers))
        except InvalidRecordHeader as e:
            raise InvalidRecordHeader(f"record {record}: {e.message}") from None


def _walk(batch: bytes, header: BatchHeader, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(index, key offset, meta offset, data offset, end offset) of entries [0, end) of a
    verified batch; CorruptBatch where the framing runs past the batch."""
    n, offset = len(batch), HEADER_BYTES
    unpack, size = ENTRY.unpack_from, ENTRY.size
    for i in range(end):
        if offset + size > n:
            raise CorruptBatch(f"batch first_sn {header.first_sn}: entries run past the batch")
        data_len, key_len, meta_len = unpack(batch, offset)
        k = offset + size
        m = k + key_len
        d = m + meta_len
        offset = d + data_len
        if offset > n:       # (the checksum held: a writer bug, not a bit flip)
            raise CorruptBatch(f"batch first_sn {header.first_sn}: entries run past the batch")
        yield i, k, m, d, offset


def _decode_records(batch: bytes, start: int, end: int, ordinal: int) -> list[Record]:
    """Records [start, end) of a verified stored batch as `Record`s: one pass over the
    framing. CorruptBatch when the framing runs past the batch or a key is not UTF-8."""
    header = verify(batch)
    end = min(end, header.count)
    start = min(max(start, 0), end)
    out: list[Record] = []
    make, append, unit = tuple.__new__, out.append, seqno.COUNTER_UNIT
    for i, k, m, d, e in _walk(batch, header, end):
        if i < start:
            continue
        try:
            key = batch[k:m].decode()
        except UnicodeDecodeError as err:
            raise CorruptBatch(f"batch first_sn {header.first_sn}: {err}") from None
        append(make(Record, (key, batch[d:e], header.first_sn + i * unit, ordinal, batch[m:d])))
    return out


def _session_fields(batch: bytes, start: int, end: int) -> list[SessionFields]:
    """The session fields of records [start, end) of a verified stored batch that carry a
    producer id; CorruptBatch on bad framing or meta."""
    header = verify(batch)
    end = min(end, header.count)
    out = []
    try:
        for i, e in enumerate(iter_entries(batch, header.count, HEADER_BYTES)):
            if i < start or i >= end or not e.meta:
                continue
            meta = decode_meta(e.meta)
            if TAG_PRODUCER_ID not in meta or len(meta.get(TAG_SSSN, b"")) != 8:
                continue
            session = meta.get(TAG_SESSION_ORDINAL)
            out.append(SessionFields(i, meta[TAG_PRODUCER_ID], int.from_bytes(meta[TAG_SSSN], "big"),
                                     meta.get(TAG_DEDUP_KEY),
                                     int.from_bytes(session, "big") if session and len(session) == 4 else None,
                                     _signature(e.key, e.data, headers_of(e.meta))))
    except InvalidArgument as e:
        raise CorruptBatch(f"batch first_sn {header.first_sn}: {e.message}") from None
    return out


COLUMNS = ("key_offsets", "key_values", "data_offsets", "data_values", "sn_offsets", "sn_values",
           "arrival_ms", "header_offsets", "header_name_offsets", "header_names", "header_value_offsets",
           "header_values")


Columns = tuple[int, *tuple[bytes, ...]]     # (count, then one buffer per name in COLUMNS)


def _columns(batch: bytes, start: int, end: int) -> Columns:
    """Records [start, end) of a verified stored batch as Arrow-shaped buffers: (count,
    then the COLUMNS): keys, data and SNs (decimal text) as int32 little-endian offsets plus
    values; arrival times as int64 ms; headers as a map (per-record offsets into the header
    list, whose names and values are offsets plus values). CorruptBatch on bad framing, a
    key that is not UTF-8 or truncated meta."""
    header = verify(batch)
    end = min(end, header.count)
    start = min(max(start, 0), end)
    cols = {name: bytearray() for name in COLUMNS}
    offsets = {name: [0] for name in COLUMNS if name.endswith("offsets")}
    arrival: list[int] = []
    headers = 0
    for i, k, m, d, offset in _walk(batch, header, end):
        if i < start:
            continue
        key = batch[k:m]
        try:
            key.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptBatch(f"batch first_sn {header.first_sn}: a partition key is not UTF-8") from None
        sn = header.first_sn + i * seqno.COUNTER_UNIT
        for name, value in (("key", key), ("data", batch[d:offset]), ("sn", str(sn).encode())):
            cols[f"{name}_values"] += value
            offsets[f"{name}_offsets"].append(len(cols[f"{name}_values"]))
        arrival.append(seqno.timestamp_ms_of(sn))
        if d > m:
            try:
                tlvs = list(iter_meta(batch[m:d]))
            except InvalidArgument:
                raise CorruptBatch(f"batch first_sn {header.first_sn}: record meta truncated") from None
            for tag, value in tlvs:
                if tag != TAG_HEADER or not value or value[0] + 1 > len(value):
                    continue
                cols["header_names"] += value[1:1 + value[0]]
                offsets["header_name_offsets"].append(len(cols["header_names"]))
                cols["header_values"] += value[1 + value[0]:]
                offsets["header_value_offsets"].append(len(cols["header_values"]))
                headers += 1
        offsets["header_offsets"].append(headers)
    for name, values in offsets.items():
        cols[name] = bytearray(struct.pack(f"<{len(values)}I", *values))
    cols["arrival_ms"] = bytearray(struct.pack(f"<{len(arrival)}q", *arrival))
    return (end - start, *(bytes(cols[name]) for name in COLUMNS))


def _columns_many(slices: Sequence[tuple[bytes, int, int]]) -> Columns:
    """The columns of a page: each (batch, start, end) of `slices` as `_columns` decodes
    it, concatenated into one set of buffers (offsets running on from slice to slice), so
    a page of many stored batches is one Arrow chunk. CorruptBatch as `_columns`."""
    parts = [_columns(batch, start, end) for batch, start, end in slices]
    count = sum(p[0] for p in parts)
    out: dict[str, bytearray] = {name: bytearray() for name in COLUMNS}
    base = dict.fromkeys(COLUMNS, 0)
    for name in COLUMNS:
        if name.endswith("offsets"):
            out[name] += struct.pack("<I", 0)
    # each offsets column indexes the values column named after it (header_offsets: the header list)
    indexes = {"key_offsets": "key_values", "data_offsets": "data_values", "sn_offsets": "sn_values",
               "header_name_offsets": "header_names", "header_value_offsets": "header_values"}
    headers = 0
    for part in parts:
        cols = dict(zip(COLUMNS, part[1:]))
        for name, raw in cols.items():
            if not name.endswith("offsets"):
                out[name] += raw
                continue
            values = struct.unpack(f"<{len(raw) // 4}I", raw)[1:]
            shift = headers if name == "header_offsets" else base[indexes[name]]
            out[name] += struct.pack(f"<{len(values)}I", *(v + shift for v in values))
        for name in indexes.values():
            base[name] += len(cols[name])
        headers += len(cols["header_name_offsets"]) // 4 - 1
    return (count, *(bytes(out[name]) for name in COLUMNS))


reference = types.SimpleNamespace(
    encode_puts=_encode_puts, parse_put=_parse_put, stored_entries=_stored_entries, check_framing=_check_framing,
    check_records=_check_records, decode_records=_decode_records, session_fields=_session_fields, columns=_columns,
    columns_many=_columns_many, encode_session_entries=_encode_session_entries,
    decode_put_results=_decode_put_results, put_runs=_put_runs,
    signature=_signature, hash_key=_hash_of)


# --- which implementation is in force ------------------------------------------------------

def _load_compiled() -> Any:
    """The compiled implementation (an untyped extension module), configured, or None
    (not built, or SMS_PURE_PYTHON)."""
    try:
        import sms._wire as _wire
    except ImportError as e:
        log.info("sms.wire: the compiled codec is not built (%s); using the pure-Python reference", e)
        return None
    if getattr(_wire, "HEADER_BYTES", None) != HEADER_BYTES:
        log.warning("sms.wire: the compiled codec was built for another batch format (header of %s bytes, not %d); "
                    "using the pure-Python reference until it is rebuilt (pip install -e .)",
                    getattr(_wire, "HEADER_BYTES", "?"), HEADER_BYTES)
        return None
    missing = [name for name in vars(reference) if not hasattr(_wire, name)]
    if missing:
        log.warning("sms.wire: the compiled codec is older than this source (it lacks %s); using the pure-Python "
                    "reference until it is rebuilt (pip install -e .)", ", ".join(missing))
        return None
    _wire.configure(Record=Record, PutEntry=PutEntry, SessionFields=SessionFields, InvalidArgument=InvalidArgument,
                    InvalidPartitionKey=InvalidPartitionKey, InvalidRecordHeader=InvalidRecordHeader,
                    RecordTooLarge=RecordTooLarge, RequestTooLarge=RequestTooLarge, CorruptBatch=CorruptBatch,
                    verify=verify, limits=limits)
    return _wire


compiled = None if os.environ.get("SMS_PURE_PYTHON", "") not in ("", "0") else _load_compiled()
_impl = compiled or reference
IMPLEMENTATION = "compiled" if compiled else "python"

if TYPE_CHECKING:
    # the compiled module is untyped: its functions take and return what the reference does
    encode_puts = _encode_puts
    parse_put = _parse_put
    stored_entries = _stored_entries
    check_framing = _check_framing
    check_records = _check_records
    decode_records = _decode_records
    columns = _columns
    columns_many = _columns_many
    encode_session_entries = _encode_session_entries
    decode_put_results = _decode_put_results
    put_runs = _put_runs
    session_fields = _session_fields
    signature = _signature
    hash_key = _hash_of
else:
    encode_puts = _impl.encode_puts
    parse_put = _impl.parse_put
    stored_entries = _impl.stored_entries
    check_framing = _impl.check_framing
    check_records = _impl.check_records
    decode_records = _impl.decode_records
    columns = _impl.columns
    columns_many = _impl.columns_many
    encode_session_entries = _impl.encode_session_entries
    decode_put_results = _impl.decode_put_results
    put_runs = _impl.put_runs
    session_fields = _impl.session_fields
    signature = _impl.signature
    hash_key = _impl.hash_key


def _refuse_sealed(batch: bytes) -> None:
    """CorruptBatch for a sealed batch: the retrieval role opens every stored batch of an
    encrypted stream before it answers (kernel/encryption.py), so one reaching a reader is
    a bug, never records."""
    if len(batch) > 1 and batch[1] & FLAG_SEALED:
        raise CorruptBatch("a sealed (encrypted) batch reached a reader; it must be opened first")


def _clear_only(decode: Callable[..., Any]) -> Callable[..., Any]:
    """`decode` refusing a sealed batch by name (`_refuse_sealed`)."""
    def decode_clear(batch: bytes, *args: Any) -> Any:
        _refuse_sealed(batch)
        return decode(batch, *args)
    decode_clear.__doc__ = decode.__doc__
    return decode_clear


def _clear_only_slices(decode: Callable[..., Any]) -> Callable[..., Any]:
    """`_clear_only` for a decoder of many (batch, start, end) slices."""
    def decode_clear(slices: Sequence[tuple[bytes, int, int]]) -> Any:
        for batch, _start, _end in slices:
            _refuse_sealed(batch)
        return decode(slices)
    decode_clear.__doc__ = decode.__doc__
    return decode_clear


if not TYPE_CHECKING:
    decode_records = _clear_only(decode_records)
    columns = _clear_only(columns)
    columns_many = _clear_only_slices(columns_many)
    session_fields = _clear_only(session_fields)
