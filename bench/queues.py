"""Queues (issue 34; docs/queues.md): receive + ack throughput of N workers on a stream of
P partitions, and the redelivery latency after a worker's death, on a 3-node LocalCluster
(TLS, RF 3), with the CPU of each process. Prints JSON.

- throughput: `records` records of `size` bytes are put first; `workers` asyncio workers
  (one process, one client) each receive 10 and ack them in the background (up to 4 acks
  of a worker in flight), until every record is acknowledged. Records acknowledged per
  second, and CPU us per record.
- redelivery: a record is received with a visibility timeout of `visibility_s` and never
  acknowledged (its worker died); another worker long-polls (wait 20 s) for it. The time
  from the first receive to the second, less the visibility timeout (goal <= 1 s).

    .venv/bin/python -m bench.queues [--preset smoke|quick|full]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

from bench import common, cpu

DEFAULTS = {"records": 50_000, "size": 100, "partitions": 4, "workers": 8, "nodes": 3, "rf": 3,
            "visibility_s": 2, "redeliveries": 3}
PRESETS = {"smoke": {"records": 2_000, "redeliveries": 1}, "quick": {"records": 30_000},
           "full": {"records": 200_000, "redeliveries": 5}}
GOAL_ACKED_PER_S = 10_000
ACKS_IN_FLIGHT = 4               # per worker
GOAL_REDELIVERY_EXTRA_S = 1.0
THROUGHPUT = "queue receive+ack, 8 workers, 4 partitions, records/s acknowledged"
REDELIVERY = "queue redelivery after a worker's death, s beyond the visibility timeout"


async def _put(client, stream: str, records: int, size: int) -> None:
    payload = os.urandom(size)
    for start in range(0, records, 500):
        batch = [(f"k{i}", payload) for i in range(start, min(records, start + 500))]
        result = await client.put_records(stream, batch)
        if result.failed_record_count:
            raise RuntimeError(f"put failed: {result.records[0]}")


async def _worker(q, done: set[str], want: int, stats: dict) -> None:
    """Receive 10, hand them to processing (none here), ack them in the background: up to
    ACKS_IN_FLIGHT acks of a worker at once, as a worker that acks each batch when it is
    processed does."""
    acks: set[asyncio.Task] = set()

    async def settle(batch) -> None:
        result = await q.ack(batch)
        stats["acks"] += 1
        stats["ack_failed"] += len(result.failed)
        for h in result.successful:
            done.add(h)
    while len(done) < want:
        got = await q.receive(10, wait_s=1)
        stats["receives"] += 1
        if got:
            task = asyncio.get_running_loop().create_task(settle(got))
            acks.add(task)
            task.add_done_callback(acks.discard)
        while len(acks) >= ACKS_IN_FLIGHT:
            await asyncio.wait(acks, return_when=asyncio.FIRST_COMPLETED)
    if acks:
        await asyncio.wait(acks)


async def _throughput(client, cfg: dict, meter) -> dict:
    stream = "bench-queue"
    await client.create_stream(stream, partitions=cfg["partitions"], replication_factor=cfg["rf"])
    await _put(client, stream, cfg["records"], cfg["size"])
    await client.create_queue(stream, "bench", starting_position="TRIM_HORIZON", visibility_timeout_s=60)
    q = client.queue("bench")
    done: set[str] = set()
    stats = {"receives": 0, "acks": 0, "ack_failed": 0}
    meter.start()
    t0 = time.perf_counter()
    workers = [asyncio.get_running_loop().create_task(_worker(q, done, cfg["records"], stats))
               for _ in range(cfg["workers"])]
    # (timed to the last ack: the workers still long-polling then are not waited for)
    while len(done) < cfg["records"] and not all(w.done() for w in workers):
        await asyncio.wait(workers, timeout=0.01, return_when=asyncio.FIRST_EXCEPTION)
    elapsed = time.perf_counter() - t0
    usage = meter.stop(len(done))
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    await client.delete_queue("bench")
    return {"acked": len(done), "seconds": round(elapsed, 2), "records_per_s": round(len(done) / elapsed),
            **stats, "cpu": usage}


async def _redelivery(client, cfg: dict) -> dict:
    stream = "bench-redeliver"
    await client.create_stream(stream, partitions=cfg["partitions"], replication_factor=cfg["rf"])
    await client.create_queue(stream, "redeliver", starting_position="TRIM_HORIZON",
                              visibility_timeout_s=cfg["visibility_s"], max_receive_count=0)
    q = client.queue("redeliver")
    extras = []
    for i in range(cfg["redeliveries"]):
        await client.put_records(stream, [(f"r{i}", b"job")])
        first = []
        while not first:
            first = await q.receive(1, wait_s=5)
        t0 = time.monotonic()                  # its worker dies here, holding it
        again = []
        while not again:
            again = await q.receive(1, wait_s=20)
        extras.append(time.monotonic() - t0 - cfg["visibility_s"])
        assert again[0].record_id == first[0].record_id, "another record came back"
        await q.ack(again)
    await client.delete_queue("redeliver")
    return {"visibility_s": cfg["visibility_s"], "extra_s": [round(x, 3) for x in extras],
            "extra_s_max": round(max(extras), 3)}


def run(cfg: dict) -> dict:
    from node.launcher import LocalCluster
    from sms import aio
    common.tune_gc()
    with tempfile.TemporaryDirectory() as d:
        cluster = LocalCluster(d, nodes=cfg["nodes"], port=0).start()
        try:
            async def main() -> dict:
                async with aio.Client(cluster.address, **cluster.client_options()) as client:
                    meter = cpu.Meter(cpu.cluster_pids(cluster))
                    return {"throughput": await _throughput(client, cfg, meter),
                            "redelivery": await _redelivery(client, cfg)}
            out = asyncio.run(main())
        finally:
            cluster.stop()
    return {"parameters": cfg, **out}


def targets(result) -> list[dict]:
    out = result if isinstance(result, dict) else {}
    rate = common.dig(out, "throughput", "records_per_s")
    extra = common.dig(out, "redelivery", "extra_s_max")
    cpu_us = common.dig(out, "throughput", "cpu", "total_us_per_record")
    return [common.target(THROUGHPUT, rate, GOAL_ACKED_PER_S,
                          detail=f"{common.dig(out, 'parameters', 'records')} records of 100 B, RF 3; "
                                 f"cluster CPU {cpu_us} us/record acknowledged" if rate else "not run"),
            common.target(REDELIVERY, extra, GOAL_REDELIVERY_EXTRA_S, higher_is_better=False,
                          detail=f"visibility timeout {common.dig(out, 'redelivery', 'visibility_s')} s, "
                                 f"long poll 20 s" if extra is not None else "not run")]


def run_preset(preset: str = "quick") -> dict:
    return run({**DEFAULTS, **PRESETS[preset], "preset": preset})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    p.add_argument("--records", type=int)
    p.add_argument("--workers", type=int)
    a = p.parse_args(argv)
    cfg = {**DEFAULTS, **PRESETS[a.preset], "preset": a.preset}
    for key in ("records", "workers"):
        if getattr(a, key) is not None:
            cfg[key] = getattr(a, key)
    result = run(cfg)
    result["targets"] = targets(result)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
