"""What a consumer group costs, and how fast it hands over: on one TLS cluster of
`--nodes` storage nodes, a stream of `--partitions` partitions holding `--records`
records of `--size` bytes is read

- by `read_stream` (the lineage walk, no group: the reference),
- by one member of a consumer group (sms/consumer.py: leases, checkpoints),
- by two members at once, each with a client of its own (one process, one event loop:
  the members' protocol, not parallel CPU),

and a member that stops cleanly hands its partitions to the other: the seconds until the
other holds them all. Each read is timed from the first call to the last record. Prints
JSON; never asserts a timing.

    .venv/bin/python bench/consumer_group.py [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.growth import put_load  # noqa: E402
from node.launcher import LocalCluster  # noqa: E402
from sms import aio  # noqa: E402

PRESETS = {"smoke": {"records": 5_000}, "quick": {"records": 100_000}, "full": {"records": 500_000}}
DEFAULTS = {"nodes": 3, "rf": 2, "partitions": 8, "size": 100, "writers": 4, "batch": 500, "failover_s": 3.0}
HANDOVER_WAIT_S = 30.0


async def _read_all(client: aio.Client, stream: str) -> tuple[int, float]:
    t0, n = time.perf_counter(), 0
    async for _r in client.read_stream(stream, max_records=1000):
        n += 1
    return n, time.perf_counter() - t0


async def _members(cluster: LocalCluster, stream: str, group: str, count: int, want: int,
                   failover_s: float) -> tuple[int, float, float, list[int]]:
    """(records read, seconds from the first open to the last record, of which opening
    (joining, the first round's claims), records per member)."""
    clients = [aio.Client(cluster.address, **cluster.client_options()) for _ in range(count)]
    consumers = [c.consumer(stream, group, member_id=f"m{i}", failover_s=failover_s, wait_ms=200)
                 for i, c in enumerate(clients)]
    counts = [0] * count
    t0 = time.perf_counter()
    try:
        for consumer in consumers:
            await consumer.open()
        opened = time.perf_counter()

        async def drain(i: int) -> None:
            while sum(counts) < want:
                batch = await consumers[i].poll(0.5)
                if batch is not None:
                    counts[i] += len(batch.records)

        await asyncio.wait_for(asyncio.gather(*(drain(i) for i in range(count))), 600)
        return sum(counts), time.perf_counter() - t0, opened - t0, counts
    finally:
        for consumer in consumers:
            await consumer.close()
        for client in clients:
            await client.close()


async def _handover(cluster: LocalCluster, stream: str, group: str, partitions: int, failover_s: float) -> float:
    """Seconds from a member's clean close until the other holds every partition."""
    a_client = aio.Client(cluster.address, **cluster.client_options())
    b_client = aio.Client(cluster.address, **cluster.client_options())
    a = a_client.consumer(stream, group, member_id="a", failover_s=failover_s, wait_ms=200)
    b = b_client.consumer(stream, group, member_id="b", failover_s=failover_s, wait_ms=200)
    try:
        await a.open()
        await b.open()
        deadline = time.monotonic() + HANDOVER_WAIT_S
        while not (a.assigned and b.assigned and len(a.assigned) + len(b.assigned) == partitions):
            await a.poll(0.1)
            await b.poll(0.1)
            if time.monotonic() > deadline:
                raise TimeoutError("the two members never shared the partitions")
        await a.close()
        t0 = time.perf_counter()
        while len(b.assigned) < partitions:
            await b.poll(0.05)
            if time.monotonic() > deadline + HANDOVER_WAIT_S:
                raise TimeoutError("b never took a's partitions")
        return time.perf_counter() - t0
    finally:
        await a.close()
        await b.close()
        await a_client.close()
        await b_client.close()


def run(params: dict) -> dict:
    t0 = time.perf_counter()
    base = tempfile.mkdtemp(prefix="sms-bench-groups-")
    cluster = LocalCluster(os.path.join(base, "c"), nodes=params["nodes"], port=0).start()
    try:
        async def main() -> dict:
            async with aio.Client(cluster.address, **cluster.client_options()) as client:
                await client.create_stream("groups", partitions=params["partitions"],
                                           replication_factor=params["rf"])
                put = await put_load(client, "groups", params["records"], params["writers"], params["batch"],
                                     params["size"])
                want = put["records"] - put["failed"]
                n, s = await _read_all(client, "groups")
            reference = {"records": n, "seconds": round(s, 3), "records_per_s": round(n / s)}
            out = {"read_stream": reference}
            for count in (1, 2):
                got, secs, open_s, counts = await _members(cluster, "groups", f"bench-{count}", count, want,
                                                           params["failover_s"])
                out[f"group_{count}_member{'s' if count > 1 else ''}"] = {
                    "records": got, "seconds": round(secs, 3), "open_s": round(open_s, 3),
                    "records_per_s": round(got / secs), "records_per_s_after_open": round(got / (secs - open_s)),
                    "per_member": counts, "ratio_to_read_stream": round(got / secs / reference["records_per_s"], 3)}
            out["handover_after_clean_stop_s"] = round(
                await _handover(cluster, "groups", "bench-handover", params["partitions"], params["failover_s"]), 3)
            out["records_put"] = want
            return out
        result = asyncio.run(main())
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    return {"bench": "consumer_group", "parameters": params, **result, "wall_s": round(time.perf_counter() - t0, 1)}


def run_preset(preset: str = "quick") -> dict:
    """bench/run.py's extra: the defaults at one of PRESETS."""
    return run({**DEFAULTS, **PRESETS[preset]})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--records", type=int)
    ap.add_argument("--partitions", type=int, default=DEFAULTS["partitions"])
    args = ap.parse_args(argv)
    params = {**DEFAULTS, **PRESETS["smoke" if args.smoke else "quick" if args.quick else "full"],
              "partitions": args.partitions}
    if args.records:
        params["records"] = args.records
    print(json.dumps(run(params), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
