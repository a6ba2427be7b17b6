"""The write pause that keys see while their partition is split or merged.

Starts `LocalCluster` (control + 3 storage nodes, separate processes) and a stream of
`--partitions` partitions, and runs one de-duplicating producer that sends a record on
each of `--keys` keys every `--interval-ms` (open loop: a key's next record is sent on
schedule whether or not the last one was acknowledged). While it runs, the stream goes
through split, split, merge, scale(8), scale(2). For each switch it reports, for the keys
whose partition was closed by it (affected) and for every other key, the longest
acknowledgement latency of a record sent while the switch ran (from the request to
one second after it returned): p50 and max over the keys. The baseline is the same
figure for records sent outside every switch. Prints one JSON document. Never a test.

    .venv/bin/python bench/repartition_pause.py [--keys 200] [--interval-ms 20] [--rf 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

from sms import aio, hashing
from node.launcher import LocalCluster
from sms.types import PartitionState


def quantiles(values: list[float]) -> dict:
    if not values:
        return {"keys": 0}
    values = sorted(values)
    return {"keys": len(values), "p50_ms": round(statistics.median(values), 1), "max_ms": round(values[-1], 1)}


async def run(args) -> dict:
    directory = tempfile.mkdtemp(prefix="sms-bench-repart-")
    try:
        return await _run(args, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _run(args, directory: str) -> dict:
    with LocalCluster(os.path.join(directory, "cluster"), nodes=3, port=0) as cluster:
        os.environ.update(cluster.client_env())     # its clients trust its CA
        async with aio.Client(cluster.address) as client:
            await client.create_stream("bench", partitions=args.partitions, replication_factor=args.rf)
            keys = [f"key-{i}" for i in range(args.keys)]
            hashes = {k: hashing.hash_key_of(k) for k in keys}
            sent: list[tuple[str, float, asyncio.Future]] = []
            acked: list[tuple[str, float, float]] = []
            stop = asyncio.Event()
            errors: list[str] = []
            async with client.producer("bench", "bench-producer") as producer:

                async def settle(key: str, t0: float, fut: asyncio.Future) -> None:
                    try:
                        await fut
                    except Exception as e:                       # noqa: BLE001 (reported)
                        errors.append(f"{type(e).__name__}: {e}")
                        return
                    acked.append((key, t0, time.perf_counter()))

                async def load() -> None:
                    tasks = set()
                    tick = time.perf_counter()
                    while not stop.is_set():
                        for key in keys:
                            t0 = time.perf_counter()
                            fut = await producer.send(b"x" * args.size, key)
                            task = asyncio.ensure_future(settle(key, t0, fut))
                            tasks.add(task)
                            task.add_done_callback(tasks.discard)
                        tick += args.interval_ms / 1000
                        await asyncio.sleep(max(0.0, tick - time.perf_counter()))
                    await asyncio.gather(*tasks)

                loader = asyncio.ensure_future(load())
                await asyncio.sleep(args.warmup_s)
                switches = []
                plan = [("split", None), ("split", None), ("merge", None), ("scale", 8), ("scale", 2)]
                for op, arg in plan:
                    before = await client.get_stream_info("bench")
                    opened = sorted((p for p in before.partitions if p.state is PartitionState.OPEN),
                                    key=lambda p: p.hash_lo)
                    t0 = time.perf_counter()
                    if op == "split":
                        widest = max(opened, key=lambda p: p.hash_hi - p.hash_lo)
                        after = await client.split("bench", widest.ordinal)
                    elif op == "merge":
                        a, b = opened[0], opened[1]
                        after = await client.merge("bench", a.ordinal, b.ordinal)
                    else:
                        after = await client.scale("bench", arg)
                    t1 = time.perf_counter()
                    open_before = {p.ordinal for p in opened}
                    closed = [p for p in after.partitions if p.ordinal in open_before and p.state is PartitionState.CLOSED]
                    switches.append({"op": op if arg is None else f"{op}({arg})", "t0": t0, "t1": t1,
                                     "closed": [(p.hash_lo, p.hash_hi) for p in closed],
                                     "closed_partitions": [p.partition_id for p in closed]})
                    await asyncio.sleep(args.settle_s)
                stop.set()
                await loader
            windows = [(s["t0"], s["t1"] + 1.0) for s in switches]
            out = []
            for s in switches:
                affected = {k for k in keys if any(lo <= hashes[k] < hi for lo, hi in s["closed"])}
                worst: dict[str, float] = {}
                for key, t0, t1 in acked:
                    if s["t0"] <= t0 <= s["t1"] + 1.0:
                        worst[key] = max(worst.get(key, 0.0), (t1 - t0) * 1000)
                out.append({"op": s["op"], "closed": s["closed_partitions"],
                            "call_s": round(s["t1"] - s["t0"], 3),
                            "affected_keys": quantiles([v for k, v in worst.items() if k in affected]),
                            "other_keys": quantiles([v for k, v in worst.items() if k not in affected])})
            base: dict[str, float] = {}
            for key, t0, t1 in acked:
                if not any(a <= t0 <= b for a, b in windows):
                    base[key] = max(base.get(key, 0.0), (t1 - t0) * 1000)
            return {"switches": out, "baseline_outside_switches": quantiles(list(base.values())),
                    "records_acked": len(acked), "producer_errors": len(errors),
                    "first_errors": errors[:5]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keys", type=int, default=200)
    p.add_argument("--interval-ms", type=float, default=50.0, help="each key sends a record this often")
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--rf", type=int, default=2)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--settle-s", type=float, default=2.0)
    args = p.parse_args()
    result = asyncio.run(run(args))
    doc = {"bench": "repartition_pause",
           "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()},
           "parameters": vars(args),
           "offered_records_per_s": round(args.keys * 1000 / args.interval_ms),
           **result}
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
