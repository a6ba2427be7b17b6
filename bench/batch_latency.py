"""How long one batch takes on an idle cluster: a de-duplicating producer's
`send_batch()` of 500 records of 100 B (with `linger_ms` 5, the default, and 0) and
`put_records` of the same batch, one after another, on a 3-node LocalCluster (4
partitions, RF 3, disk). The median and the spread after a warm-up, as JSON.

    .venv/bin/python -m bench.batch_latency [--calls 60] [--batch 500]

Under load the bench's ack latency (bench.run) adds queueing to this floor; nothing here
asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time

from bench import common
from bench import sms_workloads as workloads
from node.launcher import LocalCluster
from sms import aio

WARMUP_CALLS = 10


def summary(latencies_ms: list[float]) -> dict:
    kept = latencies_ms[WARMUP_CALLS:]
    return {"calls": len(kept), "p50_ms": round(statistics.median(kept), 2), "min_ms": round(min(kept), 2),
            "max_ms": round(max(kept), 2)}


async def measure(address: str, calls: int, batch: int) -> dict:
    out: dict = {}
    async with aio.Client(address) as client:
        await workloads.create(client, "latency", 4, 3, "disk", True)
        records = common.records(batch, 100)
        for linger_ms in (5, 0):
            producer = client.producer("latency", f"latency-{linger_ms}-{time.time_ns()}", linger_ms=linger_ms)
            latencies = []
            try:
                for _ in range(calls):
                    t0 = time.perf_counter()
                    await (await producer.send_batch(records))
                    latencies.append((time.perf_counter() - t0) * 1000)
            finally:
                await producer.close()
            out[f"send_batch_linger_{linger_ms}_ms"] = summary(latencies)
        latencies = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await client.put_records("latency", records)
            latencies.append((time.perf_counter() - t0) * 1000)
        out["put_records"] = summary(latencies)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        cluster = LocalCluster(data_dir, nodes=3, port=0).start()
        os.environ.update(cluster.client_env())
        try:
            result = asyncio.run(measure(cluster.address, max(args.calls, WARMUP_CALLS + 1), args.batch))
        finally:
            cluster.stop()
    print(json.dumps({"bench": "batch_latency", "batch": args.batch, **result}, indent=2))


if __name__ == "__main__":
    main()
