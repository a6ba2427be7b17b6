"""Where a channel's records go (docs/channels.md), and how each commit there says which
stream positions it covers, so that a worker that restarts, or another node's worker that
takes a partition over, resumes after the last commit and writes nothing twice.

- `FilesDestination`: one Parquet file per commit, of one partition's records from SN
  `first` to SN `last`, named by the key template from `first` (and the first record's
  arrival hour) only, and put only if no object of that name exists (`put_new`: a link on
  a file system, S3's If-None-Match). A file is a commit: whole or absent. Its Parquet
  metadata holds `sms.first_sn` and `sms.last_sn`. Two workers of one partition read the
  same records after the same position, so they name their next file alike and only one
  put succeeds; the other looks again (`probe`) and goes on after the winner's last SN.
- `IcebergDestination`: one append per commit (pyiceberg), whose snapshot properties hold
  `sms.positions.<channel uid>`: the last SN delivered of every partition. A commit checks,
  on the table as it is, that its partition's position is the one it started after, and
  the catalog's compare-and-swap of the table's metadata makes check and append one step:
  of two workers of a partition, the second's append fails or its check does.

Calls block (file and S3 I/O, pyiceberg): workers run them on threads.
"""

from __future__ import annotations

import datetime
import io
import json
import threading
from typing import Any

from sms import errors, limits, objectstore
from sms.types import ChannelDestination, ChannelInfo

PARQUET_COMPRESSION = {"NONE": "none", "GZIP": "gzip", "ZSTD": "zstd", "SNAPPY": "snappy"}
ICEBERG_COMPRESSION = {"NONE": "uncompressed", "ZSTD": "zstd", "SNAPPY": "snappy"}


class Conflict(Exception):
    """Another worker committed this partition's next records first: resume and look again."""


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise errors.InvalidArgument("channels need pyarrow: pip install 'sms-sps[channels]'") from None
    return pa, pq


def parquet_bytes(table: Any, compression: str, meta: dict[str, str]) -> bytes:
    pa, pq = _pyarrow()
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **{k.encode(): v.encode()
                                                                                  for k, v in meta.items()}})
    sink = io.BytesIO()
    pq.write_table(table, sink, compression=PARQUET_COMPRESSION[compression])
    return sink.getvalue()


class FilesDestination:
    kind = "FILES"

    def __init__(self, channel: ChannelInfo) -> None:
        self.channel = channel
        self.d: ChannelDestination = channel.destination
        self.store = objectstore.open_store(self.d.url)

    def key(self, ordinal: int, first_sn: int, first_arrival_ms: int) -> str:
        t = datetime.datetime.fromtimestamp(first_arrival_ms / 1000, tz=datetime.timezone.utc)
        return self.d.key_template.format(stream=self.channel.stream, partition=f"p{ordinal:04d}",
                                          start=str(first_sn), year=f"{t.year:04d}", month=f"{t.month:02d}",
                                          day=f"{t.day:02d}", hour=f"{t.hour:02d}")

    def probe(self, ordinal: int, first_sn: int, first_arrival_ms: int) -> int | None:
        """The last SN of the commit that starts at `first_sn`, or None when there is none."""
        try:
            raw = self.store.get(self.key(ordinal, first_sn, first_arrival_ms))
        except errors.FragmentMissing:
            return None
        _pa, pq = _pyarrow()
        meta = pq.read_metadata(io.BytesIO(raw)).metadata or {}
        try:
            if int(meta[b"sms.first_sn"]) != first_sn:
                raise KeyError("sms.first_sn")
            return int(meta[b"sms.last_sn"])
        except (KeyError, ValueError):
            raise errors.ArchiveUnavailable(f"{self.d.url}: {self.key(ordinal, first_sn, first_arrival_ms)} is not "
                                            "a file of this channel (no sms.first_sn/sms.last_sn of its start): "
                                            "another writer's file under the channel's key template?",
                                            url=self.d.url) from None

    def commit(self, ordinal: int, after: int | None, first_sn: int, last_sn: int, first_arrival_ms: int,
               table: Any) -> str:
        """Put the file of records first_sn..last_sn; its key. Raises Conflict when a file
        of that start exists (another worker's), ArchiveUnavailable when the store fails."""
        key = self.key(ordinal, first_sn, first_arrival_ms)
        data = parquet_bytes(table, self.d.compression, {
            "sms.channel": self.channel.name, "sms.stream": self.channel.stream, "sms.partition": str(ordinal),
            "sms.first_sn": str(first_sn), "sms.last_sn": str(last_sn), "sms.records": str(table.num_rows)})
        if not self.store.put_new(key, data):
            raise Conflict(key)
        return key

    def close(self) -> None:
        pass


_catalogs: dict[tuple[str, str], Any] = {}
_catalogs_lock = threading.Lock()


def open_catalog(uri: str, warehouse: str) -> Any:
    """One pyiceberg catalog per (uri, warehouse) in a process: a SqlCatalog on SQLite, or
    a RestCatalog."""
    with _catalogs_lock:
        catalog = _catalogs.get((uri, warehouse))
        if catalog is None:
            try:
                if uri.startswith("sqlite:"):
                    import os
                    from pyiceberg.catalog.sql import SqlCatalog
                    os.makedirs(os.path.dirname(uri[len("sqlite:///"):]), exist_ok=True)
                    catalog = SqlCatalog("sms", uri=uri, warehouse=warehouse)
                else:
                    from pyiceberg.catalog.rest import RestCatalog
                    catalog = RestCatalog("sms", uri=uri, **({"warehouse": warehouse} if warehouse else {}))
            except ImportError:
                raise errors.InvalidArgument("Iceberg channels need pyiceberg: pip install 'sms-sps[channels]'") \
                    from None
            _catalogs[(uri, warehouse)] = catalog
        return catalog


class IcebergDestination:
    kind = "ICEBERG"

    def __init__(self, channel: ChannelInfo) -> None:
        self.channel = channel
        self.d = channel.destination
        self.property = f"sms.positions.{channel.uid:016x}"
        self.table: Any = None

    def _load(self, schema: Any = None) -> Any:
        """The table (made at the first commit, with `schema`), refreshed."""
        from pyiceberg.exceptions import (NamespaceAlreadyExistsError, NoSuchTableError,
                                          TableAlreadyExistsError)
        if self.table is not None:
            self.table.refresh()
            return self.table
        catalog = open_catalog(self.d.catalog_uri, self.d.warehouse)
        name = (self.d.namespace, self.d.table)
        try:
            self.table = catalog.load_table(name)
            return self.table
        except NoSuchTableError:
            if schema is None:
                return None
        try:
            catalog.create_namespace(self.d.namespace)
        except NamespaceAlreadyExistsError:
            pass
        properties = {"write.parquet.compression-codec": ICEBERG_COMPRESSION[self.d.compression]}
        try:
            table = catalog.create_table(name, schema=schema, properties=properties)
            if self.d.partition_by_hour:
                from pyiceberg.transforms import HourTransform
                with table.update_spec() as spec:
                    spec.add_field("arrival_time", HourTransform(), "arrival_hour")
            self.table = table
        except TableAlreadyExistsError:
            self.table = catalog.load_table(name)
        return self.table

    def positions(self, table: Any) -> dict[str, str]:
        """The last SN of each partition (by ordinal, as text) the table's snapshots record."""
        snapshot = table.current_snapshot() if table is not None else None
        for _ in range(limits.CHANNEL_RESUME_PROBES_MAX):
            if snapshot is None:
                return {}
            value = snapshot.summary.additional_properties.get(self.property) if snapshot.summary else None
            if value is not None:
                return dict(json.loads(value))
            # (a commit of another writer: the positions are in an earlier snapshot)
            snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
        return {}

    def data_schema(self) -> Any:
        """The table's columns besides the stream's, as a pyarrow schema (None: no table yet):
        what an inferring JSON channel parses into once its first commit made the table."""
        import pyarrow as pa
        from delivery.rows import STREAM_COLUMNS
        table = self._load()
        if table is None:
            return None
        return pa.schema([f for f in table.schema().as_arrow() if f.name not in STREAM_COLUMNS])

    def position(self, ordinal: int) -> int | None:
        table = self._load()
        value = self.positions(table).get(str(ordinal))
        return None if value is None else int(value)

    def commit(self, ordinal: int, after: int | None, first_sn: int, last_sn: int, first_arrival_ms: int,
               table: Any) -> str:
        """Append the records first_sn..last_sn, if the table's position of `ordinal` is
        still `after`; the snapshot's id. Raises Conflict if it is not."""
        from pyiceberg.exceptions import CommitFailedException
        for _ in range(limits.CHANNEL_COMMIT_ATTEMPTS_MAX):
            iceberg = self._load(table.schema)
            positions = self.positions(iceberg)
            current = positions.get(str(ordinal))
            if (None if current is None else int(current)) != after:
                raise Conflict(f"partition {ordinal} is at {current} in the table, not {after}")
            positions[str(ordinal)] = str(last_sn)
            try:
                iceberg.append(table, snapshot_properties={self.property: json.dumps(positions, sort_keys=True)})
            except CommitFailedException:
                continue                           # (another partition's commit came first: again, on it)
            return str(iceberg.current_snapshot().snapshot_id)
        raise errors.Unavailable(f"Iceberg table {self.d.namespace}.{self.d.table}: {limits.CHANNEL_COMMIT_ATTEMPTS_MAX}"
                                 " commits in a row met concurrent ones")

    def close(self) -> None:
        self.table = None


def open_destination(channel: ChannelInfo) -> FilesDestination | IcebergDestination:
    if channel.destination.kind == "FILES":
        return FilesDestination(channel)
    return IcebergDestination(channel)


def dead_letter_key(channel: ChannelInfo, ordinal: int, first_sn: int, last_sn: int) -> str:
    return f"{channel.stream}/p{ordinal:04d}/{first_sn}-{last_sn}.parquet"
