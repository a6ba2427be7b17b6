"""Ingest and catch-up read rates of a local cluster, with raw LMDB measured in the same run.

Starts `LocalCluster` (control + 3 storage nodes, separate processes), creates a stream,
and has `--producers` asyncio producers put `--records` records of `--size` bytes in
PutRecords calls of `--batch` records; then one consumer reads every partition from
TRIM_HORIZON. The baseline is raw LMDB in this process: the same records appended `--batch`
per synced transaction, and a cursor scan. Prints one JSON document. Never a test.

    .venv/bin/python bench/ingest_read.py [--records 200000] [--rf 3] [--partitions 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time

import lmdb

from sms import aio
from node.launcher import LocalCluster


def raw_lmdb(records: int, size: int, batch: int, directory: str) -> dict:
    env = lmdb.open(os.path.join(directory, "raw.lmdb"), map_size=8 << 30, sync=True)
    payload = os.urandom(size)
    t0 = time.perf_counter()
    n = 0
    while n < records:
        with env.begin(write=True) as txn:
            for _ in range(min(batch, records - n)):
                txn.put(n.to_bytes(16, "big"), payload, append=True)
                n += 1
    append_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with env.begin() as txn:
        scanned = sum(1 for _ in txn.cursor())
    scan_s = time.perf_counter() - t0
    env.close()
    return {"append_records_per_s": round(records / append_s), "scan_records_per_s": round(scanned / scan_s)}


async def run_cluster(args, directory: str) -> dict:
    with LocalCluster(os.path.join(directory, "cluster"), nodes=3, port=0) as cluster:
        os.environ.update(cluster.client_env())     # its clients trust its CA
        async with aio.Client(cluster.address) as client:
            info = await client.create_stream("bench", partitions=args.partitions, replication_factor=args.rf,
                                              persistence=args.persistence)
            payload = os.urandom(args.size)
            per_producer = args.records // args.producers
            latencies: list[float] = []

            async def producer(p: int) -> None:
                for start in range(0, per_producer, args.batch):
                    recs = [(f"key-{p}-{(start + i) % 997}", payload) for i in range(min(args.batch, per_producer - start))]
                    t = time.perf_counter()
                    out = await client.put_records("bench", recs)
                    latencies.append(time.perf_counter() - t)
                    assert out.failed_record_count == 0, out.records[0]

            t0 = time.perf_counter()
            await asyncio.gather(*(producer(p) for p in range(args.producers)))
            ingest_s = time.perf_counter() - t0
            total = per_producer * args.producers

            t0 = time.perf_counter()
            read = 0
            for p in info.partitions:
                it = await client.get_iterator("bench", p.ordinal, "TRIM_HORIZON")
                while it:
                    page = await client.get_next_records(it, max_records=10_000)
                    read += len(page.records)
                    if not page.records:
                        break
                    it = page.next_iterator
            read_s = time.perf_counter() - t0
            latencies.sort()
            return {
                "records": total, "read_back": read,
                "ingest_records_per_s": round(total / ingest_s),
                "ingest_mb_per_s": round(total * args.size / ingest_s / 1e6, 1),
                "put_records_call_ms_p50": round(latencies[len(latencies) // 2] * 1000, 2),
                "put_records_call_ms_p99": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
                "catch_up_read_records_per_s": round(read / read_s),
            }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--producers", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rf", type=int, default=3)
    ap.add_argument("--persistence", default="disk")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sms-bench-") as directory:
        system = asyncio.run(run_cluster(args, directory))
        baseline = raw_lmdb(args.records, args.size, args.batch, directory)
    print(json.dumps({
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()},
        "parameters": vars(args),
        "sms": system,
        "baseline_raw_lmdb": baseline,
        "ratio_ingest_to_raw_lmdb_append": round(system["ingest_records_per_s"] / baseline["append_records_per_s"], 3),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
