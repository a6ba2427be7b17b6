"""What TLS costs: the same ingest load on a TLS cluster and on a plaintext one, in one run.

Two `LocalCluster`s of `--nodes` storage nodes (one secure by default, one started as
`sms up --insecure` would), taken in turns A B A B... (`--rounds`), so that drift of a
shared machine falls on both alike. Each round creates a stream (`--partitions`,
replication factor `--rf`, persistence disk), warms it up, then puts `--records`
records of `--size` bytes in `put_records` calls of `--batch` from `--writers` writers
(bench/growth.py `put_load`), and reads the CPU time of every process (bench/cpu.py).
Reports each mode's best and median records/s, CPU per record, and the ratio TLS /
plaintext of the medians (issue 15's limit: a cost of at most 15%). Prints JSON; never
asserts a timing.

    .venv/bin/python bench/tls_cost.py [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import cpu  # noqa: E402
from bench.growth import put_load  # noqa: E402
from node.launcher import LocalCluster  # noqa: E402
from sms import aio  # noqa: E402

MODES = ("tls", "plaintext")


async def _round(cluster: LocalCluster, stream: str, params: dict) -> dict:
    async with aio.Client(cluster.address, **cluster.client_options()) as client:
        await client.create_stream(stream, partitions=params["partitions"], replication_factor=params["rf"],
                                   persistence="disk")
        await put_load(client, stream, params["warmup"], params["writers"], params["batch"], params["size"])
        meter = cpu.Meter(cpu.cluster_pids(cluster))
        meter.start()
        out = await put_load(client, stream, params["records"], params["writers"], params["batch"], params["size"],
                             key_base=params["warmup"])
        out["cpu"] = meter.stop(out["records"] - out["failed"])
        return out


def run(params: dict) -> dict:
    t0 = time.perf_counter()
    base = tempfile.mkdtemp(prefix="sms-bench-tls-")
    clusters = {}
    try:
        for mode in MODES:
            clusters[mode] = LocalCluster(os.path.join(base, mode), nodes=params["nodes"], port=0,
                                          tls=mode == "tls").start()
        rounds: dict[str, list[dict]] = {m: [] for m in MODES}
        for i in range(params["rounds"]):
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                print(f"[{time.perf_counter() - t0:6.1f}s] round {i + 1} {mode}", file=sys.stderr, flush=True)
                rounds[mode].append(asyncio.run(_round(clusters[mode], f"tls-cost-{i}", params)))
    finally:
        for cluster in clusters.values():
            cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    summary = {}
    for mode, results in rounds.items():
        rates = [r["records_per_s"] for r in results]
        cpus = [r["cpu"]["total_us_per_record"] for r in results if r.get("cpu")]
        summary[mode] = {"records_per_s_median": round(statistics.median(rates)), "records_per_s_best": max(rates),
                         "cluster_cpu_us_per_record_median": round(statistics.median(cpus), 1) if cpus else None,
                         "rounds": results}
    ratio = summary["tls"]["records_per_s_median"] / max(1, summary["plaintext"]["records_per_s_median"])
    return {"bench": "tls_cost", "parameters": params, **summary,
            "throughput_ratio_tls_to_plaintext": round(ratio, 3),
            "tls_cost_pct": round((1 - ratio) * 100, 1), "target_cost_pct_max": 15.0,
            "wall_s": round(time.perf_counter() - t0, 1)}


PRESETS = {
    "smoke": {"records": 4_000, "warmup": 1_000, "rounds": 1},
    "quick": {"records": 100_000, "warmup": 10_000, "rounds": 3},
    "full": {"records": 300_000, "warmup": 20_000, "rounds": 5},
}


DEFAULTS = {"nodes": 3, "rf": 3, "partitions": 4, "writers": 4, "batch": 500, "size": 100}


def run_preset(preset: str = "quick") -> dict:
    """bench/run.py's extra: the defaults at one of PRESETS."""
    return run({**DEFAULTS, **PRESETS[preset]})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rf", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--records", type=int)
    ap.add_argument("--rounds", type=int)
    args = ap.parse_args(argv)
    preset = PRESETS["smoke" if args.smoke else "quick" if args.quick else "full"]
    params = {"nodes": args.nodes, "rf": args.rf, "partitions": args.partitions, "writers": args.writers,
              "batch": args.batch, "size": args.size, "warmup": preset["warmup"],
              "records": args.records or preset["records"], "rounds": args.rounds or preset["rounds"]}
    print(json.dumps(run(params), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
