"""A channel's rows (docs/channels.md, "Columns"): pages of a partition as Arrow, and JSON
data parsed into the channel's schema, without Python per record (pyarrow's JSON reader
over the page's data buffer); only a page that does not parse whole is looked at record by
record, to set the records that do not parse apart as dead letters.
"""

from __future__ import annotations

import io
from typing import Any

ARROW_TYPES = {"string": "string", "long": "int64", "double": "float64", "boolean": "bool_",
               "timestamp": "timestamp", "binary": "binary"}


def json_schema(schema: tuple[tuple[str, str], ...]) -> Any:
    import pyarrow as pa
    fields = []
    for name, type_ in schema:
        t = pa.timestamp("us", tz="UTC") if type_ == "timestamp" else getattr(pa, ARROW_TYPES[type_])()
        fields.append(pa.field(name, t))
    return pa.schema(fields)


def _newline_joined(data: Any) -> bytes:
    """The records of a binary column, each followed by a newline, as one buffer."""
    import pyarrow as pa
    import pyarrow.compute as pc
    joined = pc.binary_join_element_wise(data, pa.scalar(b"", pa.binary()), pa.scalar(b"\n", pa.binary()))
    offsets = memoryview(joined.buffers()[1]).cast("B")
    start = int.from_bytes(offsets[joined.offset * 4:joined.offset * 4 + 4], "little", signed=True)
    end = int.from_bytes(offsets[(joined.offset + len(joined)) * 4:(joined.offset + len(joined)) * 4 + 4],
                         "little", signed=True)
    return joined.buffers()[2].to_pybytes()[start:end]


def _read(buf: bytes, schema: Any) -> Any:
    """`buf`'s JSON lines as a table: of `schema` (fields it does not name dropped), or of the
    columns pyarrow infers (None)."""
    import pyarrow.json as pj
    options = (pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore") if schema is not None
               else pj.ParseOptions())
    table = pj.read_json(io.BytesIO(buf), read_options=pj.ReadOptions(use_threads=False,
                                                                      block_size=max(1 << 20, len(buf) + 1)),
                         parse_options=options)
    return table if schema is not None else _storable(table)


def _storable(table: Any) -> Any:
    """Inferred columns as a table format keeps them: a name of the stream's columns gets
    `json_` in front, a column of nulls only is a string one, timestamps are in us."""
    import pyarrow as pa
    fields = []
    for field in table.schema:
        t = field.type
        if pa.types.is_null(t):
            t = pa.string()
        elif pa.types.is_timestamp(t):
            t = pa.timestamp("us", tz=t.tz)
        name = f"json_{field.name}" if field.name in STREAM_COLUMNS or field.name == "data" else field.name
        fields.append(pa.field(name, t))
    return table.rename_columns([f.name for f in fields]).cast(pa.schema(fields))


STREAM_COLUMNS = ("partition_key", "sequence_number", "arrival_time", "partition_id", "headers")


def parse_json(table: Any, schema: tuple[tuple[str, str], ...] | Any) -> tuple[Any, Any]:
    """(rows, dead): `table` (the stream's columns) with `data` replaced by the columns of
    `schema` parsed from it (a tuple of (name, type), or a pyarrow schema; () infers them from
    the records), and the rows whose data does not parse as one JSON object of the schema's
    types (as they came, with a `error` column), or None."""
    import pyarrow as pa
    target = schema if isinstance(schema, pa.Schema) else json_schema(schema) if schema else None
    data = table.column("data").combine_chunks()
    rest = table.drop_columns(["data"])
    empty = pa.table({f.name: pa.array([], f.type) for f in target}, schema=target) if target is not None \
        else pa.table({})
    if len(data) == 0:
        return _assemble(rest, empty), None
    try:
        parsed = _read(_newline_joined(data), target)
        if parsed.num_rows == len(data) and not _has_empty(data):
            return _assemble(rest, parsed), None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    good, bad, errors_ = [], [], []
    parts = []
    for i, value in enumerate(data.to_pylist()):          # (only a page that did not parse whole)
        try:
            if not value or b"\n" in value.strip():
                one = _read(value.replace(b"\n", b" ") + b"\n", target) if value else None
            else:
                one = _read(value + b"\n", target)
            if one is None or one.num_rows != 1:
                raise ValueError("not one JSON object")
            parts.append(one)
            good.append(i)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
            bad.append(i)
            errors_.append(str(e)[:500])
    try:
        parsed = pa.concat_tables(parts, promote_options="permissive") if parts else empty
    except (pa.ArrowInvalid, pa.ArrowTypeError):           # (inferred: a field of two kinds of value)
        parsed = pa.concat_tables([p.cast(pa.schema([pa.field(f.name, pa.string()) for f in p.schema]))
                                   for p in parts], promote_options="permissive")
    rows = _assemble(rest.take(good), parsed)
    dead = None
    if bad:
        dead = table.take(bad).append_column("error", pa.array(errors_, pa.string()))
    return rows, dead


def _has_empty(data: Any) -> bool:
    import pyarrow.compute as pc
    return bool(pc.any(pc.equal(pc.binary_length(data), 0)).as_py())


def _assemble(rest: Any, parsed: Any) -> Any:
    """partition_key, the parsed columns, then the stream's other columns."""
    import pyarrow as pa
    columns = [rest.column("partition_key")] + [parsed.column(i) for i in range(parsed.num_columns)] + \
        [rest.column(n) for n in rest.column_names if n != "partition_key"]
    names = ["partition_key"] + parsed.column_names + [n for n in rest.column_names if n != "partition_key"]
    return pa.Table.from_arrays(columns, names=names)
