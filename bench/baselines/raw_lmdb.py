"""The storage limit: raw LMDB appends and scans in one process, no SMS code on the path.

Four figures, all over the same `records` records of `size` bytes (common.records()):

* append_records_per_s: each record its own key (16-byte big-endian counter), put with
  append=True, `batch` records per write transaction, env opened sync=True. The value is
  the record's packed entry (wire.encode_entry: entry header + key + data), so the bytes
  written equal the body of the batch SMS stores. This is the figure ingest is compared with.
* append_batch_value_records_per_s: the same records, each batch stored as ONE value: the
  sequenced batch bytes wire.build_batch makes (header + entries), which is what an SMS
  storage node stores. Extra information: it shows how much batching as one value buys.
* scan_records_per_s: one read transaction, a cursor over every per-record key.
* scan_buffers_records_per_s: the same with env.begin(buffers=True) (no copies).

Prints one JSON document on stdout, progress on stderr. Never a test.

    .venv/bin/python -m bench.baselines.raw_lmdb [--records 500000] [--size 100] [--batch 500]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import lmdb

from bench import common
from sms import wire, seqno


def packed_batches(records: int, size: int, batch: int) -> tuple[list[list[bytes]], list[bytes]]:
    """The packed entries of each batch and each batch sealed as SMS seals it (sequenced,
    first SN stamped, checksum over the entries), from common.records()."""
    recs = common.records(records, size)
    entries = [wire.encode_entry(key.encode("utf-8"), data) for key, data in recs]
    grouped = common.batches(entries, batch)
    now_ms = int(time.time() * 1000)
    sealed = []
    counter = 0
    for b in grouped:
        sealed.append(wire.build_batch(b, first_sn=seqno.make(now_ms, counter, 0)))
        counter += len(b)
    return grouped, sealed


def _open(path: str, map_size: int) -> lmdb.Environment:
    return lmdb.open(path, map_size=map_size, sync=True, subdir=True, max_dbs=0)


def _append_per_record(env: lmdb.Environment, grouped: list[list[bytes]]) -> float:
    n = 0
    t0 = time.perf_counter()
    for b in grouped:
        with env.begin(write=True) as txn:
            put = txn.put
            for value in b:
                put(n.to_bytes(16, "big"), value, append=True)
                n += 1
    return time.perf_counter() - t0


def _append_batch_values(env: lmdb.Environment, grouped: list[list[bytes]], sealed: list[bytes]) -> float:
    n = 0
    t0 = time.perf_counter()
    for b, value in zip(grouped, sealed):
        with env.begin(write=True) as txn:
            txn.put(n.to_bytes(16, "big"), value, append=True)
        n += len(b)
    return time.perf_counter() - t0


def _scan(env: lmdb.Environment, buffers: bool) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    nbytes = 0
    with env.begin(buffers=buffers) as txn:
        for _key, value in txn.cursor():
            n += 1
            nbytes += len(value)   # touch the value so the scan reads it
    return n, time.perf_counter() - t0


def run(workdir: str, records: int = 500_000, size: int = 100, batch: int = 500) -> dict:
    common.progress(f"raw_lmdb: packing {records} records of {size} B in batches of {batch}")
    grouped, sealed = packed_batches(records, size, batch)
    entry_bytes = sum(len(e) for b in grouped for e in b)
    batch_bytes = sum(len(s) for s in sealed)
    # page overhead: per-record keys + node headers, and a batch value spills onto overflow pages
    map_size = max(1 << 30, 4 * (entry_bytes + records * 64) + 4 * batch_bytes)

    per_record_path = os.path.join(workdir, "per_record.lmdb")
    batch_value_path = os.path.join(workdir, "batch_value.lmdb")
    result: dict = {"records": records, "size": size, "batch": batch,
                    "record_value_bytes_avg": round(entry_bytes / records, 1),
                    "batch_value_bytes_avg": round(batch_bytes / len(sealed), 1),
                    "map_size": map_size, "sync": True}

    env = _open(per_record_path, map_size)
    try:
        common.progress(f"raw_lmdb: appending {records} records one key each, {batch} per synced txn")
        append_s = _append_per_record(env, grouped)
        result["append_records_per_s"] = round(records / append_s)
        result["append_txns_per_s"] = round(len(grouped) / append_s, 1)
        result["append_mb_per_s"] = round(entry_bytes / append_s / 1e6, 1)

        common.progress("raw_lmdb: cursor scan (copies)")
        n, scan_s = _scan(env, buffers=False)
        assert n == records, (n, records)
        result["scan_records_per_s"] = round(n / scan_s)

        common.progress("raw_lmdb: cursor scan (buffers=True)")
        n, scan_s = _scan(env, buffers=True)
        assert n == records, (n, records)
        result["scan_buffers_records_per_s"] = round(n / scan_s)
    finally:
        env.close()

    env = _open(batch_value_path, map_size)
    try:
        common.progress(f"raw_lmdb: appending {len(sealed)} packed batches, one value per synced txn")
        append_s = _append_batch_values(env, grouped, sealed)
        result["append_batch_value_records_per_s"] = round(records / append_s)
        result["append_batch_value_txns_per_s"] = round(len(sealed) / append_s, 1)
        result["append_batch_value_mb_per_s"] = round(batch_bytes / append_s / 1e6, 1)
    finally:
        env.close()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=500_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--batch", type=int, default=500)
    args = p.parse_args()
    workdir = tempfile.mkdtemp(prefix="sms-bench-raw-lmdb-")
    try:
        out = {"machine": common.machine(), "raw_lmdb": run(workdir, args.records, args.size, args.batch)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
