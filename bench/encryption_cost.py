"""What encryption at rest costs: the same ingest and catch-up read on a stream stored sealed
(`encryption="aes-256-gcm"`, kernel/encryption.py) and on one stored in clear, in one run.

One `LocalCluster` (TLS, `--nodes` storage nodes, its own master key file). Each round
creates two streams alike (`--partitions`, replication `--rf`, persistence disk), one
encrypted and one not, and measures them in turns (the order flips every round, so that
drift of a shared machine falls on both alike): a warm-up, then `--records` records of
`--size` bytes in `put_records` calls of `--batch` from `--writers` writers (bench/growth.py
`put_load`) with the CPU time of every process (bench/cpu.py), then a catch-up read of
every partition from TRIM_HORIZON in pages of READ_PAGE records. Reports each mode's
median and best rates and the ratios encrypted / clear (issue 30's target: at most 15%
less ingest). Prints JSON; never asserts a timing.

    .venv/bin/python bench/encryption_cost.py [--quick | --smoke]
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

MODES = ("encrypted", "clear")
READ_PAGE = 10_000


async def _read_all(client: aio.Client, stream: str, partitions: int) -> int:
    """Every record of the stream's partitions, read from TRIM_HORIZON until caught up."""
    async def one(ordinal: int) -> int:
        iterator = await client.get_iterator(stream, ordinal, "TRIM_HORIZON")
        n = 0
        while True:
            page = await client.get_next_records(iterator, max_records=READ_PAGE)
            n += len(page.records)
            iterator = page.next_iterator
            if not page.records and page.millis_behind_latest == 0:
                return n
    return sum(await asyncio.gather(*(one(p) for p in range(partitions))))


async def _measure(client: aio.Client, cluster: LocalCluster, stream: str, params: dict) -> dict:
    await put_load(client, stream, params["warmup"], params["writers"], params["batch"], params["size"])
    meter = cpu.Meter(cpu.cluster_pids(cluster))
    meter.start()
    out = await put_load(client, stream, params["records"], params["writers"], params["batch"], params["size"],
                         key_base=params["warmup"])
    out["cpu"] = meter.stop(out["records"] - out["failed"])
    t = time.perf_counter()
    read = await _read_all(client, stream, params["partitions"])
    elapsed = time.perf_counter() - t
    out["read_records"] = read
    out["read_records_per_s"] = round(read / elapsed) if elapsed > 0 else None
    out["read_expected"] = params["warmup"] + out["records"] - out["failed"]
    return out


async def _round(cluster: LocalCluster, i: int, params: dict) -> dict[str, dict]:
    async with aio.Client(cluster.address, **cluster.client_options()) as client:
        out = {}
        for mode in (MODES if i % 2 == 0 else MODES[::-1]):
            stream = f"encryption-cost-{mode}-{i}"
            await client.create_stream(stream, partitions=params["partitions"], replication_factor=params["rf"],
                                       persistence="disk", encryption="aes-256-gcm" if mode == "encrypted" else "none")
            out[mode] = await _measure(client, cluster, stream, params)
            await client.delete_stream(stream)
        return out


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def run(params: dict) -> dict:
    t0 = time.perf_counter()
    base = tempfile.mkdtemp(prefix="sms-bench-encryption-")
    rounds: dict[str, list[dict]] = {m: [] for m in MODES}
    cluster = LocalCluster(os.path.join(base, "cluster"), nodes=params["nodes"], port=0).start()
    try:
        for i in range(params["rounds"]):
            print(f"[{time.perf_counter() - t0:6.1f}s] encryption cost: round {i + 1}", file=sys.stderr, flush=True)
            for mode, result in asyncio.run(_round(cluster, i, params)).items():
                rounds[mode].append(result)
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    summary = {}
    for mode, results in rounds.items():
        rates = [r["records_per_s"] for r in results]
        reads = [r["read_records_per_s"] for r in results]
        summary[mode] = {"records_per_s_median": round(statistics.median(rates)), "records_per_s_best": max(rates),
                         "read_records_per_s_median": round(_median(reads) or 0),
                         "cluster_cpu_us_per_record_median":
                             round(_median([r["cpu"]["total_us_per_record"] for r in results if r.get("cpu")]) or 0, 1),
                         "rounds": results}
    ingest = summary["encrypted"]["records_per_s_median"] / max(1, summary["clear"]["records_per_s_median"])
    read = summary["encrypted"]["read_records_per_s_median"] / max(1, summary["clear"]["read_records_per_s_median"])
    return {"bench": "encryption_cost", "parameters": params, **summary,
            "ingest_ratio_encrypted_to_clear": round(ingest, 3), "ingest_cost_pct": round((1 - ingest) * 100, 1),
            "read_ratio_encrypted_to_clear": round(read, 3), "read_cost_pct": round((1 - read) * 100, 1),
            "target_ingest_cost_pct_max": 15.0, "wall_s": round(time.perf_counter() - t0, 1)}


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
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--quick", action="store_true")
    for name, value in DEFAULTS.items():
        ap.add_argument(f"--{name}", type=int, default=value)
    ap.add_argument("--records", type=int)
    ap.add_argument("--rounds", type=int)
    args = ap.parse_args(argv)
    preset = PRESETS["smoke" if args.smoke else "quick" if args.quick else "full"]
    params = {**{k: getattr(args, k) for k in DEFAULTS}, "warmup": preset["warmup"],
              "records": args.records or preset["records"], "rounds": args.rounds or preset["rounds"]}
    print(json.dumps(run(params), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
