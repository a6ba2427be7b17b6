"""Channels (issue 34; docs/channels.md): delivery into an Iceberg table against the catch-up
read rate of the same stream in the same run, and the freshness lag at a steady load, on a
3-node LocalCluster (TLS, RF 3), with the cluster's CPU. Prints JSON.

- throughput: `records` records of `size` bytes are put into a stream of `partitions`
  partitions. The physical limit: a reader catches up with the whole stream (every
  partition at once, pages as Arrow). Then an Iceberg channel (the cluster's SQLite catalog,
  data_freshness_s 1, commits of `file_records`) is made at TRIM_HORIZON. The table is
  polled every 50 ms: the steady rate is from the first commit seen until 90% of the
  records are in the table (the workers' start and the last partial buffers' wait for
  data_freshness_s are shown apart: first_commit_s, and the rate from the channel's
  creation until every record is in). Goal: steady >= 0.5x the catch-up rate.
- freshness: a producer writes `rate` records/s for `seconds` into a stream with an Iceberg
  channel of data_freshness_s `freshness_s`. The table's current snapshot is polled every
  50 ms; each commit's lag is when it was seen, less the arrival of the oldest record it
  newly covers (the record after the position before it). Goal: max <= freshness + 2 s.

    .venv/bin/python -m bench.channels [--preset smoke|quick|full]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

from bench import common, cpu

DEFAULTS = {"records": 400_000, "size": 100, "partitions": 4, "nodes": 3, "rf": 3, "rate": 5_000,
            "seconds": 20, "freshness_s": 2, "file_records": 100_000}
PRESETS = {"smoke": {"records": 20_000, "seconds": 6, "file_records": 5_000}, "quick": {"records": 1_200_000, "seconds": 20},
           "full": {"records": 2_000_000, "seconds": 60}}
GOAL_RATIO = 0.5
GOAL_FRESHNESS_EXTRA_S = 2.0
THROUGHPUT = "channel delivery into Iceberg / catch-up read rate"
FRESHNESS = "channel freshness lag at 5,000 records/s, s beyond data_freshness_s"
POLL_S = 0.05


async def _put(client, stream: str, records: int, size: int) -> None:
    payload = os.urandom(size)
    sem = asyncio.Semaphore(8)

    async def one(start: int) -> None:
        async with sem:
            batch = [(f"k{i}", payload) for i in range(start, min(records, start + 500))]
            result = await client.put_records(stream, batch)
            if result.failed_record_count:
                raise RuntimeError(f"put failed: {result.records[0]}")
    await asyncio.gather(*(one(s) for s in range(0, records, 500)))


async def _catch_up(client, stream: str, partitions: int) -> tuple[int, float, dict[str, int]]:
    """Every record of every partition read as Arrow, the partitions at once: how many, in
    how long, and the last SN of each partition."""
    async def one(ordinal: int) -> tuple[int, int]:
        iterator = await client.get_iterator(stream, ordinal, "TRIM_HORIZON")
        n = last = 0
        while True:
            page = await client.get_next_record_batch(iterator, 10_000)
            if not len(page.batch):
                return n, last
            n += page.batch.to_arrow().num_rows
            last = page.batch.last_sn
            iterator = page.next_iterator
    t0 = time.perf_counter()
    done = await asyncio.gather(*(one(p) for p in range(partitions)))
    return sum(n for n, _ in done), time.perf_counter() - t0, {str(p): last for p, (_n, last) in enumerate(done)}


def _table(cluster, name: str):
    from delivery.destinations import open_catalog
    catalog = open_catalog(f"sqlite:///{cluster.data_dir}/channels/catalog.db",
                           f"file://{cluster.data_dir}/channels/warehouse")
    try:
        return catalog.load_table(("bench", name))
    except Exception:                               # noqa: BLE001 (not made yet)
        return None


def _total(table) -> int:
    snap = table.current_snapshot()
    return int(snap.summary.additional_properties.get("total-records", 0)) if snap is not None else 0


def _positions(table, uid: int) -> dict[str, int]:
    table.refresh()
    snap = table.current_snapshot()
    if snap is None:
        return {}
    raw = snap.summary.additional_properties.get(f"sms.positions.{uid:016x}")
    return {k: int(v) for k, v in json.loads(raw).items()} if raw else {}


async def _throughput(client, cluster, cfg: dict, meter) -> dict:
    stream = "bench-channel"
    await client.create_stream(stream, partitions=cfg["partitions"], replication_factor=cfg["rf"])
    await _put(client, stream, cfg["records"], cfg["size"])
    read, read_s, ends = await _catch_up(client, stream, cfg["partitions"])
    meter.start()
    t0 = time.perf_counter()
    ch = await client.create_channel(stream, "bench-table", "iceberg://bench.throughput", data_freshness_s=1)
    table = None
    seen: list[tuple[float, int]] = []            # (s since the channel's creation, records in the table)
    while True:
        await asyncio.sleep(POLL_S)
        table = table or await asyncio.to_thread(_table, cluster, "throughput")
        if table is None:
            continue
        positions = await asyncio.to_thread(_positions, table, ch.uid)
        total = _total(table)
        if total and (not seen or seen[-1][1] != total):
            seen.append((time.perf_counter() - t0, total))
        if positions == ends:
            break
    elapsed = time.perf_counter() - t0
    # steady: from the first commit seen until 90% of the records are in the table (neither the
    # workers' start nor the last partial buffers' data_freshness_s wait)
    first = seen[0]
    full = next((x for x in seen if x[1] >= 0.9 * cfg["records"]), seen[-1])
    steady = (full[1] - first[1]) / (full[0] - first[0]) if full[0] > first[0] else None
    usage = meter.stop(cfg["records"])
    info = await client.describe_channel("bench-table")
    await client.delete_channel("bench-table")
    catch_up = read / read_s
    rate = cfg["records"] / elapsed
    return {"records": cfg["records"], "catch_up_records_per_s": round(catch_up), "catch_up_read": read,
            "delivered_records_per_s": round(rate), "seconds": round(elapsed, 2), "first_commit_s": round(first[0], 2),
            "steady_records_per_s": round(steady) if steady else None,
            "ratio": round(steady / catch_up, 3) if steady else None,
            "end_to_end_ratio": round(rate / catch_up, 3), "commits": sum(p.files for p in info.partitions),
            "cpu": usage}


async def _freshness(client, cluster, cfg: dict) -> dict:
    from sms import seqno
    stream = "bench-fresh"
    await client.create_stream(stream, partitions=cfg["partitions"], replication_factor=cfg["rf"])
    ch = await client.create_channel(stream, "bench-fresh", "iceberg://bench.freshness",
                                     data_freshness_s=cfg["freshness_s"])
    payload = os.urandom(cfg["size"])
    stop = asyncio.Event()

    async def produce() -> int:
        n, batch, t0 = 0, 100, time.perf_counter()
        while time.perf_counter() - t0 < cfg["seconds"]:
            await client.put_records(stream, [(f"k{n + i}", payload) for i in range(batch)])
            n += batch
            ahead = n / cfg["rate"] - (time.perf_counter() - t0)
            if ahead > 0:
                await asyncio.sleep(ahead)
        return n
    lags: list[float] = []
    seen: dict[str, int] = {}
    start_ms = time.time() * 1000

    async def watch() -> None:
        table = None
        while not stop.is_set():
            await asyncio.sleep(POLL_S)
            table = table or await asyncio.to_thread(_table, cluster, "freshness")
            if table is None:
                continue
            positions = await asyncio.to_thread(_positions, table, ch.uid)
            now_ms = time.time() * 1000
            for part, sn in positions.items():
                if seen.get(part) != sn:
                    before = seen.get(part)
                    oldest_ms = seqno.timestamp_ms_of(before) if before is not None else start_ms
                    lags.append((now_ms - oldest_ms) / 1000)
                    seen[part] = sn
    watcher = asyncio.get_running_loop().create_task(watch())
    written = await produce()
    await asyncio.sleep(cfg["freshness_s"] + 3)           # (the last buffer's commit)
    stop.set()
    await watcher
    await client.delete_channel("bench-fresh")
    return {"rate": cfg["rate"], "written": written, "freshness_s": cfg["freshness_s"], "commits": len(lags),
            "lag_s_max": round(max(lags), 3) if lags else None,
            "lag_s_median": round(statistics.median(lags), 3) if lags else None,
            "extra_s_max": round(max(lags) - cfg["freshness_s"], 3) if lags else None}


def run(cfg: dict) -> dict:
    common.tune_gc()
    # (commits of 50,000 records: the throughput is the delivery's, not the data freshness's wait)
    old = os.environ.get("SMS_CHANNELS_FILE_RECORDS_MAX")
    os.environ["SMS_CHANNELS_FILE_RECORDS_MAX"] = str(cfg["file_records"])
    try:
        return _run(cfg)
    finally:
        if old is None:
            os.environ.pop("SMS_CHANNELS_FILE_RECORDS_MAX", None)
        else:
            os.environ["SMS_CHANNELS_FILE_RECORDS_MAX"] = old


def _run(cfg: dict) -> dict:
    from node.launcher import LocalCluster
    from sms import aio
    with tempfile.TemporaryDirectory() as d:
        cluster = LocalCluster(d, nodes=cfg["nodes"], port=0).start()
        try:
            async def main() -> dict:
                async with aio.Client(cluster.address, **cluster.client_options()) as client:
                    meter = cpu.Meter(cpu.cluster_pids(cluster))
                    return {"throughput": await _throughput(client, cluster, cfg, meter),
                            "freshness": await _freshness(client, cluster, cfg)}
            out = asyncio.run(main())
        finally:
            cluster.stop()
    return {"parameters": cfg, **out}


def targets(result) -> list[dict]:
    out = result if isinstance(result, dict) else {}
    ratio = common.dig(out, "throughput", "ratio")
    extra = common.dig(out, "freshness", "extra_s_max")
    return [common.target(THROUGHPUT, ratio, GOAL_RATIO,
                          detail=(f"steady {common.dig(out, 'throughput', 'steady_records_per_s')} vs catch-up "
                                  f"{common.dig(out, 'throughput', 'catch_up_records_per_s')} records/s (from the "
                                  f"channel's creation: {common.dig(out, 'throughput', 'delivered_records_per_s')}, "
                                  f"first commit after {common.dig(out, 'throughput', 'first_commit_s')} s), "
                                  f"{common.dig(out, 'throughput', 'records')} records of 100 B, RF 3; cluster CPU "
                                  f"{common.dig(out, 'throughput', 'cpu', 'total_us_per_record')} us/record")
                          if ratio is not None else "not run"),
            common.target(FRESHNESS, extra, GOAL_FRESHNESS_EXTRA_S, higher_is_better=False,
                          detail=(f"data_freshness_s {common.dig(out, 'freshness', 'freshness_s')}, lag max "
                                  f"{common.dig(out, 'freshness', 'lag_s_max')} s, median "
                                  f"{common.dig(out, 'freshness', 'lag_s_median')} s over "
                                  f"{common.dig(out, 'freshness', 'commits')} commits")
                          if extra is not None else "not run")]


def run_preset(preset: str = "quick") -> dict:
    return run({**DEFAULTS, **PRESETS[preset], "preset": preset})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    p.add_argument("--records", type=int)
    a = p.parse_args(argv)
    cfg = {**DEFAULTS, **PRESETS[a.preset], "preset": a.preset}
    if a.records is not None:
        cfg["records"] = a.records
    result = run(cfg)
    result["targets"] = targets(result)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
