"""A queue's state log: the bytes of its records (docs/queues.md, "Where the state lives").

One record is what one partition's owner flushed at once: the changes it made since its
last flush (`CHANGES`), its whole state (`SNAPSHOT`, the changes `PartitionQueue.snapshot`
gives), or the mark a new owner writes when it takes the partition over (`TAKEOVER`, no
changes). Every record carries the source partition's ordinal and the writing owner's
epoch. The owners' fencing is their producer's epoch (queues/owner.py: once the takeover
mark is written, no write of an older owner lands after it), and the mark bounds what a new
owner reads; `rebuild` also ignores a record of an older epoch than a takeover mark before
it, for marks that carry one (the owners write theirs before their epoch is known, as 0,
so for them this check never fires).

    record:  <B version=1> <B kind> <I ordinal> <Q owner epoch> <I changes> change*
    change:  <B op> and the op's fields (big-endian; SNs as 16 bytes)

A record that does not parse is `QueueLogCorrupt`, never a crash or a partial state.
"""

from __future__ import annotations

import enum
import struct

from collections.abc import Iterable

from queues.state import Change, Kind, Op, PartitionQueue
from sms import errors

VERSION = 1


class RecordKind(enum.IntEnum):
    CHANGES = 0
    SNAPSHOT = 1
    TAKEOVER = 2


class QueueLogCorrupt(errors.InternalError):
    """A record of a queue's state log that this version cannot read."""


_HEAD = struct.Struct(">BBIQI")
_SN = struct.Struct(">QQ")
_U32 = struct.Struct(">I")
_RECEIVE = struct.Struct(">QqIqB")      # nonce, deadline, receives, first receive, dead
_ENTRY = struct.Struct(">BQqIq")        # kind, nonce, deadline, receives, first receive
_VISIBILITY = struct.Struct(">q")
_NONCE = struct.Struct(">Q")
_SN_OPS = (Op.ACK, Op.RESTORE, Op.DEAD)


def _sn(sn: int) -> bytes:
    return _SN.pack(sn >> 64, sn & 0xFFFF_FFFF_FFFF_FFFF)


def encode(kind: RecordKind, ordinal: int, epoch: int, changes: list[Change]) -> bytes:
    out = [_HEAD.pack(VERSION, kind, ordinal, epoch, len(changes))]
    for c in changes:
        out.append(bytes((c.op,)))
        if c.op is Op.FETCH:
            out += [_sn(c.value), _U32.pack(len(c.sns))]
            out += [_sn(sn) for sn in c.sns]
        elif c.op is Op.TRIM:
            out.append(_sn(c.value))
        elif c.op is Op.RECEIVE:
            out += [_sn(c.sn), _RECEIVE.pack(c.value, c.deadline_ms, c.receives, c.first_ms, 1 if c.dead else 0)]
        elif c.op is Op.VISIBILITY:
            out += [_sn(c.sn), _VISIBILITY.pack(c.deadline_ms)]
        elif c.op is Op.EXPIRE:
            out += [_sn(c.sn), _NONCE.pack(c.value)]
        elif c.op is Op.ENTRY:
            out += [_sn(c.sn), _ENTRY.pack(c.kind, c.value, c.deadline_ms, c.receives, c.first_ms)]
        elif c.op in _SN_OPS:
            out.append(_sn(c.sn))
        else:
            errors.invariant(False, f"a queue change no log knows: {c!r}")
    return b"".join(out)


class _Reader:
    __slots__ = ("data", "at")

    def __init__(self, data: bytes):
        self.data = data
        self.at = 0

    def take(self, fmt: struct.Struct) -> tuple[int, ...]:
        end = self.at + fmt.size
        if end > len(self.data):
            raise QueueLogCorrupt(f"a queue log record ends inside a field (at byte {self.at} of {len(self.data)})")
        values = fmt.unpack_from(self.data, self.at)
        self.at = end
        return values

    def sn(self) -> int:
        hi, lo = self.take(_SN)
        return (hi << 64) | lo


def decode(data: bytes) -> tuple[RecordKind, int, int, list[Change]]:
    """(kind, ordinal, owner epoch, changes) of a record."""
    r = _Reader(bytes(data))
    version, kind, ordinal, epoch, count = r.take(_HEAD)
    if version != VERSION:
        raise QueueLogCorrupt(f"a queue log record of version {version}; this node reads version {VERSION}")
    try:
        record_kind = RecordKind(kind)
    except ValueError:
        raise QueueLogCorrupt(f"a queue log record of kind {kind}") from None
    if count > len(data):                          # (each change takes at least a byte)
        raise QueueLogCorrupt(f"a queue log record says {count} changes in {len(data)} bytes")
    changes = []
    for _ in range(count):
        (code,) = r.take(_OP)
        try:
            op = Op(code)
        except ValueError:
            raise QueueLogCorrupt(f"a queue log change of op {code}") from None
        if op is Op.FETCH:
            cursor = r.sn()
            (n,) = r.take(_U32)
            if n * _SN.size > len(data) - r.at:
                raise QueueLogCorrupt(f"a fetch of {n} records in {len(data) - r.at} bytes")
            changes.append(Change(op, value=cursor, sns=tuple(r.sn() for _ in range(n))))
        elif op is Op.TRIM:
            changes.append(Change(op, value=r.sn()))
        elif op is Op.RECEIVE:
            sn = r.sn()
            nonce, deadline, receives, first, dead = r.take(_RECEIVE)
            if dead > 1:
                raise QueueLogCorrupt(f"a receive's dead flag {dead}")
            changes.append(Change(op, sn=sn, value=nonce, deadline_ms=deadline, receives=receives, first_ms=first,
                                  dead=bool(dead)))
        elif op is Op.VISIBILITY:
            sn = r.sn()
            (deadline,) = r.take(_VISIBILITY)
            changes.append(Change(op, sn=sn, deadline_ms=deadline))
        elif op is Op.EXPIRE:
            sn = r.sn()
            (nonce,) = r.take(_NONCE)
            changes.append(Change(op, sn=sn, value=nonce))
        elif op is Op.ENTRY:
            sn = r.sn()
            entry_kind, nonce, deadline, receives, first = r.take(_ENTRY)
            try:
                k = Kind(entry_kind)
            except ValueError:
                raise QueueLogCorrupt(f"an entry of kind {entry_kind}") from None
            changes.append(Change(op, sn=sn, kind=k, value=nonce, deadline_ms=deadline, receives=receives,
                                  first_ms=first))
        else:
            changes.append(Change(op, sn=r.sn()))
    if r.at != len(data):
        raise QueueLogCorrupt(f"a queue log record has {len(data) - r.at} bytes after its last change")
    if record_kind is RecordKind.TAKEOVER and changes:
        raise QueueLogCorrupt("a takeover record with changes")
    return record_kind, ordinal, epoch, changes


_OP = struct.Struct(">B")


def _size(c: Change) -> int:
    return 21 + 16 * len(c.sns) if c.op is Op.FETCH else 50


def split(changes: list[Change], max_bytes: int) -> list[list[Change]]:
    """`changes` cut into runs whose records encode to at most `max_bytes` each (a fetch of
    more SNs than fit is cut into fetches of fewer, the cursor with the last): at least one
    run, in order."""
    per_fetch = max(1, (max_bytes - _HEAD.size - 21) // 16)
    runs: list[list[Change]] = [[]]
    size = _HEAD.size
    for c in changes:
        pieces = [c]
        if c.op is Op.FETCH and len(c.sns) > per_fetch:
            cuts = range(0, len(c.sns), per_fetch)
            pieces = [Change(Op.FETCH, value=c.value if i + per_fetch >= len(c.sns) else 0,
                             sns=c.sns[i:i + per_fetch]) for i in cuts]
        for piece in pieces:
            n = _size(piece)
            if runs[-1] and size + n > max_bytes:
                runs.append([])
                size = _HEAD.size
            runs[-1].append(piece)
            size += n
    return runs


def rebuild(queue_uid: int, ordinal: int, records: Iterable[bytes], **bounds: int) -> tuple[PartitionQueue, int]:
    """A partition's state from its log's records (bytes, in log order, of every ordinal:
    others' are skipped): from the last snapshot of the current owner epochs on, each
    record of an epoch older than a takeover before it ignored. Returns (state, epoch):
    the highest takeover epoch seen (0: none)."""
    state = PartitionQueue(queue_uid, ordinal, **bounds)
    floor = 0
    for data in records:
        kind, of, epoch, changes = decode(data)
        if of != ordinal:
            continue
        if kind is RecordKind.TAKEOVER:
            floor = max(floor, epoch)
            continue
        if epoch < floor:
            continue                 # written by an owner that had lost the partition
        if kind is RecordKind.SNAPSHOT:
            state = PartitionQueue(queue_uid, ordinal, **bounds)
        state.apply(changes)
    return state, floor
