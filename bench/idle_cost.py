"""What a cluster costs when nothing happens, as its metadata grows; and how long creating
streams takes. Issue 14: an idle cluster's CPU must stay flat as partitions grow.

Starts `LocalCluster` (control + `--nodes` storage nodes, separate processes, the embedded
metadata store), then for each step of `--steps` (total partitions: 40, 400, ...) creates
streams of `--per-stream` partitions (RF 3) up to that total, timing the creations, waits
until every chain is ACTIVE, lets the cluster settle, and reads each process's CPU over
`--idle-s` seconds of nothing: percent of one core per process. Then, loaded: it puts
`--load-records` records into the first stream (`--per-stream` partitions; 4 writers of
`put_records` calls of 500, as bench/growth.py) and reports its ingest rate and each
process's CPU meanwhile, so a step shows whether a busy stream pays for the idle ones
beside it. Prints one JSON document on stdout, progress on stderr; nothing here asserts a
timing.

    .venv/bin/python -m bench.idle_cost [--steps 40,400,1000] [--idle-s 5] [--per-stream 10] [--load-records 40000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

from bench import cpu
from sms import aio
from node.launcher import LocalCluster


def _progress(t0: float, text: str) -> None:
    print(f"[{time.monotonic() - t0:7.1f}s] {text}", file=sys.stderr, flush=True)


async def _grow(address: str, have: int, want: int, per_stream: int, rf: int) -> tuple[int, float]:
    """Streams of per_stream partitions until `want` partitions exist; (partitions, seconds)."""
    t = time.perf_counter()
    async with aio.Client(address) as client:
        n = have
        while n < want:
            parts = min(per_stream, want - n)
            await client.create_stream(f"idle-{n}", partitions=parts, replication_factor=rf)
            n += parts
    return n, time.perf_counter() - t


async def _load(address: str, records: int) -> dict:
    from bench.growth import put_load
    async with aio.Client(address) as client:
        return await put_load(client, "idle-0", records, writers=4, batch=500, size=100)


def run(steps: list[int], idle_s: float, per_stream: int, nodes: int, rf: int, settle_s: float,
        load_records: int = 0) -> dict:
    t0 = time.monotonic()
    out = {"bench": "idle_cost", "parameters": {"steps": steps, "idle_s": idle_s, "per_stream": per_stream,
                                                "nodes": nodes, "rf": rf, "settle_s": settle_s,
                                                "load_records": load_records}, "steps": []}
    with tempfile.TemporaryDirectory(prefix="sms-bench-idle-") as directory, \
            LocalCluster(directory, nodes=nodes) as cluster:
        os.environ.update(cluster.client_env())     # its clients trust its CA
        partitions = 0
        for want in steps:
            _progress(t0, f"creating streams up to {want} partitions")
            before = partitions
            partitions, create_s = asyncio.run(_grow(cluster.address, partitions, want, per_stream, rf))
            created = partitions - before
            _progress(t0, f"{created} partitions in {create_s:.1f} s; settling {settle_s} s, then idle {idle_s} s")
            time.sleep(settle_s)               # the cluster's own follow-up work (learners, syncs) ends
            pids = {k: v for k, v in cpu.cluster_pids(cluster).items() if k != cpu.CLIENT}
            before_cpu = {name: cpu.cpu_seconds(pid) for name, pid in pids.items()}
            time.sleep(idle_s)                 # the measurement: nothing is asked of the cluster
            after_cpu = {name: cpu.cpu_seconds(pid) for name, pid in pids.items()}
            percent = {name: round((after_cpu[name] - before_cpu[name]) / idle_s * 100, 2)
                       for name in pids if before_cpu[name] is not None and after_cpu[name] is not None}
            step = {"partitions": partitions, "created": created, "create_s": round(create_s, 2),
                    "create_s_per_100_partitions": round(create_s / created * 100, 2) if created else None,
                    "idle_percent_of_a_core": percent,
                    "idle_percent_max": max(percent.values()) if percent else None}
            _progress(t0, f"{partitions} partitions: idle {percent}")
            if load_records:
                before_cpu = {name: cpu.cpu_seconds(pid) for name, pid in pids.items()}
                load = asyncio.run(_load(cluster.address, load_records))
                after_cpu = {name: cpu.cpu_seconds(pid) for name, pid in pids.items()}
                step["loaded"] = {
                    "stream_partitions": min(per_stream, partitions), "records": load["records"],
                    "failed": load["failed"], "records_per_s": load["records_per_s"],
                    "cpu_us_per_record": {name: round((after_cpu[name] - before_cpu[name]) / load["records"] * 1e6, 1)
                                          for name in pids if before_cpu[name] is not None
                                          and after_cpu[name] is not None}}
                _progress(t0, f"{partitions} partitions, loaded: {load['records_per_s']:,} records/s into "
                              f"one stream of {min(per_stream, partitions)}")
            out["steps"].append(step)
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="40,400,1000", help="total partitions after each step")
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--settle-s", type=float, default=3.0)
    ap.add_argument("--per-stream", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rf", type=int, default=3)
    ap.add_argument("--load-records", type=int, default=40_000,
                    help="records put into the first stream after each idle measurement (0: none)")
    args = ap.parse_args(argv)
    result = run([int(s) for s in args.steps.split(",")], args.idle_s, args.per_stream, args.nodes, args.rf,
                 args.settle_s, args.load_records)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
