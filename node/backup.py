"""A stream's records to a directory of Parquet files, and back into a new stream.

`sms stream export NAME DIR` writes:
- `DIR/stream.json`: the export's format, the stream's settings and its partition map
  with the lineage (each partition's hash range, parents, children, state, validity, and
  how many records were exported from it);
- `DIR/pNNNN.parquet` for each partition, open or closed, holding its records in SN
  order: `partition_key`, `data`, `sequence_number` (the original SN, text),
  `arrival_time` (ms, UTC), `partition_id`, `headers` (map<string, binary>), the columns
  of `sms.batch.ARROW_COLUMNS`. Pages are read as columns (`get_next_record_batch`) and
  written as they come: memory stays within a page.

An open partition is exported up to where it was caught up during the export: records
written meanwhile may or may not be in it; stop the writers for a point-in-time copy.

`sms stream import DIR NAME` creates stream NAME with the exported stream's settings and
as many partitions as were open, then writes every partition's records, parents before
children and each in SN order, through a de-duplicating producer, one batch at a time:
each key's records keep their order. The new stream gives them new SNs and arrival times
(the original SNs stay in the export). It refuses an existing stream, and checks at the
end that as many records were written as the export holds. An interrupted import is not
resumed: delete the new stream and import again.

Needs pyarrow (the `spark` or `backup` extra); without it both say so by name.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from sms import errors, limits
from sms.tokens import peek

EXPORT_FORMAT = 1
STREAM_FILE = "stream.json"
IMPORT_BATCH_RECORDS = limits.PUT_RECORDS_COUNT_MAX


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise errors.InvalidArgument("export and import need pyarrow: pip install 'sms-sps[backup]'") from None
    return pa, pq


def _partition_doc(p, exported: int) -> dict[str, Any]:
    return {"partition_id": p.partition_id, "ordinal": p.ordinal, "hash_lo": str(p.hash_lo),
            "hash_hi": str(p.hash_hi), "state": p.state.value, "parents": list(p.parents),
            "children": list(p.children), "valid_from_ms": p.valid_from_ms, "valid_to_ms": p.valid_to_ms,
            "ending_sn": None if p.ending_sn is None else str(p.ending_sn), "records": exported}


def lineage_order(partitions) -> list:
    """Partitions with every parent before its children: by ordinal, as a repartition
    gives its children ordinals after every existing one (the map's next_ordinal)."""
    return sorted(partitions, key=lambda p: p.ordinal)


async def export_stream(client, stream: str, directory: str, progress=None) -> dict[str, Any]:
    """Write `stream` to `directory` (created; it must be empty); the stream.json document.
    `progress(records_so_far)` is called after each page."""
    pa, pq = _pyarrow()
    from sms.batch import arrow_schema
    if os.path.exists(directory) and os.listdir(directory):
        raise errors.InvalidArgument(f"{directory} is not empty: export into a new directory")
    os.makedirs(directory, exist_ok=True)
    info = await client.get_stream_info(stream)
    schema = arrow_schema("ms")
    counts: dict[int, int] = {}
    done = [0]                               # records written, over every partition
    slots = asyncio.Semaphore(limits.EXPORT_PARTITIONS_CONCURRENT)

    async def one(p) -> None:
        """One partition into its file: a closed one to its end, an open one up to what
        was committed when its export began (the LATEST position then)."""
        path = os.path.join(directory, f"{p.partition_id}.parquet")
        n = 0
        async with slots:
            closed = p.state.value == "CLOSED"
            end_sn = 0 if closed else peek(await client.get_iterator(stream, p.ordinal, "LATEST")).position_sn - 1
            with pq.ParquetWriter(path, schema, compression="zstd") as writer:
                iterator = await client.get_iterator(stream, p.ordinal, "TRIM_HORIZON")
                deadline = time.monotonic() + limits.EXPORT_CLOSED_WAIT_S
                empty = 0
                while iterator is not None and (closed or end_sn > 0):
                    # (an empty page waits a little: a lagging replica may have answered it)
                    page = await client.get_next_record_batch(iterator, max_records=limits.EXPORT_PAGE_RECORDS,
                                                              wait_ms=limits.EXPORT_EMPTY_WAIT_MS if empty else 0)
                    batches = page.batch.to_arrow_batches(timestamp_unit="ms") if len(page.batch) else []
                    if batches:
                        writer.write_table(pa.Table.from_batches(batches, schema=schema))
                        n += len(page.batch)
                        done[0] += len(page.batch)
                        if progress is not None:
                            progress(done[0])
                        empty = 0
                    else:
                        empty += 1
                    iterator = page.next_iterator
                    if not closed and iterator is not None and peek(iterator).position_sn > end_sn:
                        break                 # (an open partition, read to where it stood)
                    if iterator is not None and empty and time.monotonic() > deadline:
                        raise errors.Unavailable(f"{stream} {p.partition_id} was not read to "
                                                 f"{'its end' if closed else 'SN ' + str(end_sn)} within "
                                                 f"{limits.EXPORT_CLOSED_WAIT_S:g} s; export again")
        counts[p.ordinal] = n

    await asyncio.gather(*(one(p) for p in lineage_order(info.partitions)))
    total = done[0]
    doc = {"format": EXPORT_FORMAT, "exported_at_ms": int(time.time() * 1000), "stream": info.name,
           "settings": {"replication_factor": info.replication_factor, "persistence": info.persistence.value,
                        "ingestion_policy": info.ingestion_policy.value, "retention_hours": info.retention_hours,
                        "dedup_window_s": info.dedup_window_s, "min_in_sync": info.min_in_sync},
           "map_version": info.map_version, "records": total,
           "partitions": [_partition_doc(p, counts[p.ordinal]) for p in lineage_order(info.partitions)]}
    tmp = os.path.join(directory, STREAM_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, os.path.join(directory, STREAM_FILE))    # (last: a directory without it is incomplete)
    return doc


def read_export(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, STREAM_FILE)
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise errors.InvalidArgument(f"{directory} holds no {STREAM_FILE}: not an export, or an unfinished "
                                     "one") from None
    except (OSError, ValueError) as e:
        raise errors.InvalidArgument(f"{path}: cannot be read: {e}") from None
    if doc.get("format") != EXPORT_FORMAT:
        raise errors.InvalidArgument(f"{path}: export format {doc.get('format')!r}; this release reads "
                                     f"{EXPORT_FORMAT}")
    return doc


async def import_stream(client, directory: str, stream: str, progress=None) -> dict[str, Any]:
    """Create `stream` from the export in `directory` and write its records; returns
    {"stream", "partitions", "records"}."""
    pa, pq = _pyarrow()
    doc = read_export(directory)
    settings = doc["settings"]
    open_now = sum(1 for p in doc["partitions"] if p["state"] == "OPEN") or 1
    await client.create_stream(stream, open_now, settings["replication_factor"],
                               persistence=settings["persistence"], ingestion_policy=settings["ingestion_policy"],
                               retention_hours=settings["retention_hours"],
                               dedup_window_s=settings["dedup_window_s"], min_in_sync=settings["min_in_sync"])
    written = 0
    # (a fresh, random producer id per import: a stream deleted and imported again must not
    # meet the de-dup sessions of the first import, which would answer its records as duplicates)
    async with client.producer(stream) as producer:
        for p in doc["partitions"]:          # (parents before children: written in that order)
            path = os.path.join(directory, f"{p['partition_id']}.parquet")
            if not os.path.exists(path):
                raise errors.InvalidArgument(f"{path} is missing from the export")
            for table in pq.ParquetFile(path).iter_batches(batch_size=IMPORT_BATCH_RECORDS,
                                                           columns=["partition_key", "data", "headers"]):
                keys = table.column(0).to_pylist()
                data = table.column(1).to_pylist()
                headers = table.column(2).to_pylist()
                chunk = [(k, d, None, dict(h)) if h else (k, d) for k, d, h in zip(keys, data, headers)]
                # one batch at a time, settled before the next: each key's order is kept
                outcomes = await (await producer.send_batch(chunk))
                if outcomes.failed:
                    raise outcomes.failed[0][1]
                written += len(chunk)
                if progress is not None:
                    progress(written)
    if written != doc["records"]:
        raise errors.InternalError(f"imported {written} records; the export holds {doc['records']}")
    return {"stream": stream, "partitions": open_now, "records": written}
