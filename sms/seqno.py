"""Sequence numbers: 128-bit unsigned integers, shown as decimal strings.

Layout, high to low bits: milliseconds since the epoch (48) | per-partition counter (48)
| partition ordinal within the stream (32). So within a partition SNs increase with the
counter; the arrival time is inside every SN, so a timestamp maps to an SN lower bound
(`lower_bound_for_time`) and an SN names its partition (`ordinal_of`). A stored batch
holds consecutive counters under one timestamp, so the i-th record of a batch has SN
`first + i * COUNTER_UNIT`.
"""

from __future__ import annotations

from sms.errors import InvalidSequenceNumber

TS_BITS = 48
COUNTER_BITS = 48
ORDINAL_BITS = 32
COUNTER_SHIFT = ORDINAL_BITS
TS_SHIFT = COUNTER_BITS + ORDINAL_BITS
COUNTER_UNIT = 1 << COUNTER_SHIFT
TS_MAX = (1 << TS_BITS) - 1
COUNTER_MAX = (1 << COUNTER_BITS) - 1
ORDINAL_MAX = (1 << ORDINAL_BITS) - 1
SN_MAX = (1 << 128) - 1
SN_DIGITS_MAX = 39  # len(str(2**128 - 1))


def make(ts_ms: int, counter: int, ordinal: int) -> int:
    assert 0 <= ts_ms <= TS_MAX and 0 <= counter <= COUNTER_MAX and 0 <= ordinal <= ORDINAL_MAX
    return (ts_ms << TS_SHIFT) | (counter << COUNTER_SHIFT) | ordinal


def timestamp_ms_of(sn: int) -> int:
    return sn >> TS_SHIFT


def counter_of(sn: int) -> int:
    return (sn >> COUNTER_SHIFT) & COUNTER_MAX


def ordinal_of(sn: int) -> int:
    return sn & ORDINAL_MAX


def lower_bound_for_time(ts_ms: int) -> int:
    """The smallest SN whose timestamp is at or after ts_ms."""
    return max(0, min(ts_ms, TS_MAX)) << TS_SHIFT


def highest_below(bound: int, ordinal: int) -> int:
    """The highest SN of partition `ordinal` below `bound` (> 0): where a reader that starts
    at a bound (a time's, or a record's SN + 1) stands, as an SN of that partition."""
    below = bound - 1
    high = below >> ORDINAL_BITS
    if below & ORDINAL_MAX < ordinal:
        high -= 1
    return (high << ORDINAL_BITS) | ordinal


def to_bytes(sn: int) -> bytes:
    """16 bytes, big-endian: byte order equals numeric order (LMDB keys)."""
    return sn.to_bytes(16, "big")


def from_bytes(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def parse(text: str | int) -> int:
    """A client-supplied SN: a decimal string of 0..2^128-1, else InvalidSequenceNumber."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif isinstance(text, str) and 0 < len(text) <= SN_DIGITS_MAX and text.isascii() and text.isdigit():
        value = int(text)
    else:
        raise InvalidSequenceNumber(f"sequence number {str(text)[:64]!r}; expected a decimal string of 0..2^128-1")
    if not 0 <= value <= SN_MAX:
        raise InvalidSequenceNumber(f"sequence number {value}; expected 0 <= sn < 2^128")
    return value


def behind(checkpoint: str, ordinal: int, committed: int, first: int) -> tuple[int, int] | None:
    """(records, ms) from a consumer's checkpoint of partition `ordinal` to the partition's
    last committed SN `committed` (0: nothing committed), `first` being its oldest record
    kept (0: none). Counters are consecutive within a partition, so records are counted
    exactly. A checkpoint is an SN, "SHARD_END" or "TRIM_HORIZON" (also: 0, or a parent's
    SN: nothing of this partition read yet); None when it does not say where it stands
    (LATEST before a first read, a time).  (sms.leases: checkpoints are StartPosition's text.)"""
    if checkpoint == "SHARD_END":
        return 0, 0
    if not committed:
        return (0, 0) if checkpoint == "TRIM_HORIZON" or checkpoint.isdigit() else None
    top = counter_of(committed)
    if checkpoint.isdigit():
        done = int(checkpoint)
        if done and ordinal_of(done) == ordinal:
            n = max(0, top - counter_of(done))
            return n, (max(0, timestamp_ms_of(committed) - timestamp_ms_of(done)) if n else 0)
        checkpoint = "TRIM_HORIZON"
    if checkpoint == "TRIM_HORIZON":
        start = counter_of(first) if first else 1
        n = max(0, top - start + 1)
        return n, (max(0, timestamp_ms_of(committed) - timestamp_ms_of(first)) if n and first else 0)
    return None
