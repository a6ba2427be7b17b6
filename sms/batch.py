"""`RecordBatch`: the records of one read page as columns, not as one object per record.

A page of `get_next_record_batch` (or of `read_stream(..., batches=True)`) is a few stored
batches of one partition, each a slice [start, end) of the bytes the storage node keeps.
`RecordBatch` decodes them with one compiled pass over the page (`wire.columns_many`) into
one set of Arrow-shaped buffers: offsets and values of keys, data and sequence numbers,
arrival times, and headers as a map. `to_arrow()` wraps those buffers as a `pyarrow.Table`
of one chunk without another copy: what a page costs in Python is a few calls, whatever
its number of stored batches or records. `records()` gives the same records as `Record`
tuples. pyarrow is needed only for `to_arrow()` (it comes with the `spark` extra).
"""

from __future__ import annotations

import array
import functools
from typing import Any

from sms import seqno, wire
from sms.types import Record, partition_id

ARROW_COLUMNS = ("partition_key", "data", "sequence_number", "arrival_time", "partition_id", "headers")


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise ImportError("RecordBatch.to_arrow() needs pyarrow: pip install 'sms-sps[spark]' or pyarrow") from None
    return pyarrow


class RecordBatch:
    """Records of one partition, in SN order, from one or more stored-batch slices."""

    __slots__ = ("partition_ordinal", "slices", "_columns")
    _columns: wire.Columns | None

    def __init__(self, partition_ordinal: int, slices: list[tuple[bytes, int, int]]) -> None:
        self.partition_ordinal = partition_ordinal
        self.slices = [(batch, start, min(end, wire.read_header(batch).count)) for batch, start, end in slices]
        self._columns = None

    def __len__(self) -> int:
        return sum(max(0, end - start) for _b, start, end in self.slices)

    @property
    def partition_id(self) -> str:
        return partition_id(self.partition_ordinal)

    @property
    def first_sn(self) -> int | None:
        """The SN of the first record, or None when empty."""
        for batch, start, end in self.slices:
            if end > start:
                return wire.read_header(batch).first_sn + start * seqno.COUNTER_UNIT
        return None

    @property
    def last_sn(self) -> int | None:
        """The SN of the last record, or None when empty."""
        for batch, start, end in reversed(self.slices):
            if end > start:
                return wire.read_header(batch).first_sn + (end - 1) * seqno.COUNTER_UNIT
        return None

    def clip(self, upto_sn: int) -> "RecordBatch":
        """The records with SN <= upto_sn."""
        out = []
        for batch, start, end in self.slices:
            cut = min(end, wire.index_at_or_after(wire.read_header(batch), upto_sn + 1))
            if cut > start:
                out.append((batch, start, cut))
        return RecordBatch(self.partition_ordinal, out)

    def columns(self) -> wire.Columns:
        """The page as (count, then the wire.COLUMNS buffers), every slice in one, decoded once."""
        if self._columns is None:
            self._columns = wire.columns_many(self.slices)
        return self._columns

    def records(self) -> list[Record]:
        return [r for batch, start, end in self.slices
                for r in wire.decode_records(batch, start, end, self.partition_ordinal)]

    def to_arrow(self, *, timestamp_unit: str = "ms") -> Any:
        """A pyarrow.Table with ARROW_COLUMNS, one chunk for the page (none when it is empty);
        arrival times as timestamp[`timestamp_unit`, UTC]."""
        pa = _pyarrow()
        return pa.Table.from_batches(self.to_arrow_batches(timestamp_unit=timestamp_unit),
                                     schema=arrow_schema(timestamp_unit))

    def to_arrow_batches(self, *, timestamp_unit: str = "ms") -> list[Any]:
        """The same as pyarrow.RecordBatch objects: one for the page, none when it is empty."""
        pa = _pyarrow()
        cols = self.columns()
        return [self._arrow_chunk(pa, arrow_schema(timestamp_unit), cols)] if cols[0] else []

    def _arrow_chunk(self, pa: Any, schema: Any, cols: wire.Columns) -> Any:
        n = cols[0]
        ko, kv, do, dv, so, sv, ts, ho, hko, hkv, hvo, hvv = cols[1:]
        buf = pa.py_buffer
        arrival = pa.Array.from_buffers(pa.timestamp("ms", tz="UTC"), n, [None, buf(ts)])
        if schema.field("arrival_time").type.unit != "ms":
            arrival = arrival.cast(schema.field("arrival_time").type)
        headers = len(hko) // 4 - 1
        names = pa.Array.from_buffers(pa.string(), headers, [None, buf(hko), buf(hkv)])
        values = pa.Array.from_buffers(pa.binary(), headers, [None, buf(hvo), buf(hvv)])
        return pa.RecordBatch.from_arrays([
            pa.Array.from_buffers(pa.string(), n, [None, buf(ko), buf(kv)]),
            pa.Array.from_buffers(pa.binary(), n, [None, buf(do), buf(dv)]),
            pa.Array.from_buffers(pa.string(), n, [None, buf(so), buf(sv)]),
            arrival,
            _repeated(pa, self.partition_id, n),
            pa.MapArray.from_arrays(pa.Array.from_buffers(pa.int32(), n + 1, [None, buf(ho)]), names, values),
        ], schema=schema)


_REPEAT_ROWS_MIN = 1024      # the capacity a repeated column's cached buffers start with


@functools.lru_cache(maxsize=64)
def _repeat_buffers(pa: Any, text: str, rows: int) -> tuple[Any, Any]:
    """(offsets, values) buffers of a string column holding `text` in each of `rows` rows."""
    raw = text.encode()
    return pa.py_buffer(array.array("i", range(0, (rows + 1) * len(raw), len(raw)) if raw else [0] * (rows + 1))
                        .tobytes()), pa.py_buffer(raw * rows)


def _repeated(pa: Any, text: str, n: int) -> Any:
    """A string column of `text` in each of n rows, from cached buffers (a prefix of one
    for the next power of two rows): no Python per row, and none of pyarrow's scalar
    machinery, whose first use imports pandas (0.2 s)."""
    rows = max(_REPEAT_ROWS_MIN, 1 << (n - 1).bit_length())
    offsets, values = _repeat_buffers(pa, text, rows)
    return pa.Array.from_buffers(pa.string(), n, [None, offsets, values])


@functools.lru_cache(maxsize=8)
def arrow_schema(timestamp_unit: str = "ms") -> Any:
    pa = _pyarrow()
    return pa.schema([
        pa.field("partition_key", pa.string()),
        pa.field("data", pa.binary()),
        pa.field("sequence_number", pa.string()),
        pa.field("arrival_time", pa.timestamp(timestamp_unit, tz="UTC")),
        pa.field("partition_id", pa.string()),
        pa.field("headers", pa.map_(pa.string(), pa.binary())),
    ])
