"""Payloads by reference: records larger than RECORD_DATA_BYTES_MAX, kept in the stream's
archive store and carried through the stream as a small reference record (docs/api.md,
"Payloads by reference"; RStreams and Kafka's claim-check pattern).

A producer (`put_record`, `put_records`, `Producer.send`) given data over the inline
limit, or a binary file object, uploads it to the stream's store in chunks, then claims
the upload, then puts the reference record -- which is de-duplicated, retried and
ordered like any other:

    <prefix><hour>/<upload>/<index:06d>   chunk `index`: <Q xxh3-64 of its data> data
    <prefix><hour>/<upload>/claimed       the reference (JSON), written before the record is put

`prefix` is the stream's (StreamInfo.payload_prefix: its name and creation time), `hour`
the upload's start (UTC, YYYYMMDDHH) and `upload` "<start ms>-<random>". The reference
record's data is the reference's JSON and it carries the header `sms-payload`.

Readers get the payload back in place of the reference (up to
PAYLOAD_INLINE_READ_BYTES_MAX; `Record.payload` names it either way), or stream it with
`open_payload`: a file object that holds at most the chunk being read and the next one
(fetched ahead on a thread), verifies each chunk's checksum, and the whole payload's
when read from start to end, and can start at any offset (a reader that stopped resumes
there).

The stream's archiver (storage/archiver.py) deletes uploads that were never claimed
PAYLOAD_GRACE_S after they started, and claimed ones once every record as old as they
are has left the stream (its trim point, plus the grace).
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import secrets
import struct
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO

import xxhash

from sms import limits
from sms.errors import FragmentCorrupt, InvalidArgument, LimitExceeded, RecordTooLarge, SmsError
from sms.objectstore import open_store

HEADER = "sms-payload"           # a reference record's header (its value: b"1")
CLAIMED = "claimed"
_CHUNK_CHECK = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class PayloadRef:
    """Where a payload is and how to check it."""
    store: str           # the store's url
    key: str             # the upload's key prefix in it (ends with "/")
    size: int
    chunk_bytes: int
    chunks: int
    checksum: int        # xxh3-64 of the whole payload

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d["checksum"] = f"{self.checksum:016x}"
        return json.dumps({"sms_payload": 1, **d}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "PayloadRef":
        if len(raw) > limits.RECORD_HEADERS_BYTES_MAX:
            raise InvalidArgument(f"not a payload reference ({len(raw)} bytes)")
        try:
            d = json.loads(raw)
            ref = cls(store=str(d["store"]), key=str(d["key"]), size=int(d["size"]),
                      chunk_bytes=int(d["chunk_bytes"]), chunks=int(d["chunks"]), checksum=int(d["checksum"], 16))
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as e:
            raise InvalidArgument(f"not a payload reference ({type(e).__name__})") from None
        if ref.size < 0 or ref.chunk_bytes <= 0 or ref.chunks != -(-ref.size // ref.chunk_bytes) \
                or not ref.key.endswith("/"):
            raise InvalidArgument("not a payload reference (its sizes do not agree)")
        return ref

    def chunk_name(self, index: int) -> str:
        return f"{self.key}{index:06d}"


def is_file(data: object) -> bool:
    return not isinstance(data, (bytes, bytearray, memoryview)) and callable(getattr(data, "read", None))


def _pieces(source: bytes | bytearray | memoryview | BinaryIO, chunk_bytes: int) -> Iterator[bytes]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = memoryview(source)
        for at in range(0, len(view), chunk_bytes):
            yield bytes(view[at:at + chunk_bytes])
        return
    while True:
        piece = source.read(chunk_bytes)
        if not piece:
            return
        if not isinstance(piece, (bytes, bytearray)):
            raise InvalidArgument(f"a payload file gave {type(piece).__name__}; open it in binary mode")
        while len(piece) < chunk_bytes:         # (a pipe or socket may answer short)
            more = source.read(chunk_bytes - len(piece))
            if not more:
                break
            piece += more
        yield bytes(piece)


def upload(store_url: str, prefix: str, source: bytes | bytearray | memoryview | BinaryIO) -> PayloadRef:
    """(blocking) Upload a payload in chunks and claim it; its reference. RecordTooLarge
    past PAYLOAD_BYTES_MAX, LimitExceeded when it took longer than half PAYLOAD_GRACE_S (its
    chunks would be collected as abandoned), ArchiveUnavailable when the store fails; on
    any failure what was uploaded is deleted (best effort)."""
    store = open_store(store_url)
    start_ms = int(time.time() * 1000)
    hour = time.strftime("%Y%m%d%H", time.gmtime(start_ms / 1000))
    key = f"{prefix}{hour}/{start_ms}-{secrets.token_hex(8)}/"
    chunk_bytes = limits.PAYLOAD_CHUNK_BYTES
    whole = xxhash.xxh3_64()
    size = count = 0
    try:
        for piece in _pieces(source, chunk_bytes):
            size += len(piece)
            if size > limits.PAYLOAD_BYTES_MAX:
                raise RecordTooLarge(f"a payload of more than {limits.PAYLOAD_BYTES_MAX} bytes "
                                     "(PAYLOAD_BYTES_MAX)")
            whole.update(piece)
            store.put(f"{key}{count:06d}", _CHUNK_CHECK.pack(xxhash.xxh3_64_intdigest(piece)) + piece)
            count += 1
        ref = PayloadRef(store_url, key, size, chunk_bytes, count, whole.intdigest())
        if time.time() * 1000 - start_ms > limits.PAYLOAD_GRACE_S * 500:
            raise LimitExceeded(f"uploading the payload took more than half of PAYLOAD_GRACE_S "
                                f"({limits.PAYLOAD_GRACE_S} s): it was deleted; upload it from a faster "
                                "link, or raise archive.payload_grace_s on the nodes and PAYLOAD_GRACE_S here")
        store.put(key + CLAIMED, ref.to_bytes())
        return ref
    except BaseException:
        try:
            store.delete_prefix(key)
        except SmsError:     # (the store failed too: the archiver collects it after the grace period)
            pass
        raise


def discard(ref: PayloadRef) -> None:
    """(blocking) Delete an upload whose record was never stored (best effort)."""
    try:
        open_store(ref.store).delete_prefix(ref.key)
    except SmsError:         # (the archiver collects it with its records' retention)
        pass


def _fetch(ref: PayloadRef, index: int) -> bytes:
    raw = open_store(ref.store).get(ref.chunk_name(index))
    data = raw[_CHUNK_CHECK.size:]
    want = ref.chunk_bytes if index < ref.chunks - 1 else ref.size - index * ref.chunk_bytes
    if len(raw) < _CHUNK_CHECK.size or len(data) != want \
            or _CHUNK_CHECK.unpack_from(raw)[0] != xxhash.xxh3_64_intdigest(data):
        raise FragmentCorrupt(f"payload {ref.key} chunk {index} is corrupt (checksum or size)",
                              fragment=ref.chunk_name(index))
    return data


class PayloadReader(io.RawIOBase):
    """A payload as a read-only binary file, chunk by chunk (module docstring)."""

    def __init__(self, ref: PayloadRef, offset: int = 0) -> None:
        super().__init__()
        if not 0 <= offset <= ref.size:
            raise InvalidArgument(f"offset {offset}; the payload has {ref.size} bytes")
        self.ref = ref
        self._pos = offset
        self._index = -1
        self._chunk = b""
        self._ahead: tuple[int, concurrent.futures.Future[bytes]] | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="payload")
        self._whole = xxhash.xxh3_64() if offset == 0 else None     # checked when read start to end
        self._hashed = 0
        self._bad: FragmentCorrupt | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.ref.size}[whence]
        self._pos = min(max(0, base + offset), self.ref.size)
        if self._pos == 0 and self._bad is None:     # (back to the start: checked again from there)
            self._whole, self._hashed = xxhash.xxh3_64(), 0
        elif self._pos != self._hashed:
            self._whole = None      # (a jump: the whole-payload check no longer applies)
        return self._pos

    def _load(self, index: int) -> None:
        ahead = self._ahead
        if ahead is not None and ahead[0] == index:
            self._chunk = ahead[1].result()
        else:
            if ahead is not None:
                ahead[1].cancel()
            self._chunk = _fetch(self.ref, index)
        self._index = index
        self._ahead = None
        if index + 1 < self.ref.chunks:
            self._ahead = (index + 1, self._pool.submit(_fetch, self.ref, index + 1))

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError("read of a closed payload")
        if self._pos >= self.ref.size:
            return 0
        index = self._pos // self.ref.chunk_bytes
        if index != self._index:
            self._load(index)
        at = self._pos - index * self.ref.chunk_bytes
        view = memoryview(buffer).cast("B")
        n = min(len(view), len(self._chunk) - at)
        piece = self._chunk[at:at + n]
        view[:n] = piece
        if self._whole is not None and self._pos == self._hashed:
            self._whole.update(piece)
            self._hashed += n
            if self._hashed == self.ref.size and self._whole.intdigest() != self.ref.checksum:
                self._bad = FragmentCorrupt(f"payload {self.ref.key}: its checksum does not match",
                                            fragment=self.ref.key)
        if self._bad is not None:           # (and every read after: the end is never delivered)
            raise self._bad
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            if self._ahead is not None:
                self._ahead[1].cancel()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._chunk = b""
        super().close()


def open_payload(ref: PayloadRef, offset: int = 0) -> PayloadReader:
    """The payload as a file object, from `offset` (blocking reads; module docstring)."""
    return PayloadReader(ref, offset)


def read_all(ref: PayloadRef) -> bytes:
    """(blocking) The whole payload, checked."""
    with PayloadReader(ref) as reader:
        out = bytearray()
        while len(out) < ref.size:
            piece = reader.read(ref.chunk_bytes)
            if not piece:
                break
            out += piece
    return bytes(out)
