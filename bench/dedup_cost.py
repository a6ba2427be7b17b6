"""The cost of de-duplication: one workload, de-duplication on and off, in one run.

Starts `LocalCluster` (control + 3 storage nodes), creates two streams that differ only
in ingestion policy (`at_least_once_no_dup` vs `at_least_once_dup_permitted`), and
drives each with the same `--producers` de-duplicating producers (sms/producer.py)
sending `--records` records of `--size` bytes over 500 keys. Rounds alternate between the
two policies so background noise hits both alike; the figure per policy is the median
round. Prints one JSON document. Never a test.

    .venv/bin/python bench/dedup_cost.py [--records 40000] [--rounds 3] [--producers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time

from sms import aio
from node.launcher import LocalCluster

POLICIES = ("at_least_once_no_dup", "at_least_once_dup_permitted")


async def one_round(client: aio.Client, stream: str, args, round_no: int) -> float:
    payload = os.urandom(args.size)
    per_producer = args.records // args.producers

    async def produce(p: int) -> None:
        async with client.producer(stream, f"bench-{round_no}-{p}") as producer:
            for i in range(per_producer):
                await producer.send(payload, f"key-{(p * per_producer + i) % 500}")
            await producer.flush()

    t0 = time.perf_counter()
    await asyncio.gather(*(produce(p) for p in range(args.producers)))
    return per_producer * args.producers / (time.perf_counter() - t0)


async def run(args, directory: str) -> dict:
    with LocalCluster(directory, nodes=3, port=0) as cluster:
        os.environ.update(cluster.client_env())     # its clients trust its CA
        async with aio.Client(cluster.address) as client:
            for policy in POLICIES:
                await client.create_stream(policy, partitions=args.partitions, replication_factor=args.rf,
                                           ingestion_policy=policy)
            rates: dict[str, list[float]] = {p: [] for p in POLICIES}
            for r in range(args.rounds):
                for policy in (POLICIES if r % 2 == 0 else POLICIES[::-1]):
                    rates[policy].append(await one_round(client, policy, args, r))
                    print(f"round {r} {policy}: {rates[policy][-1]:,.0f} records/s", file=sys.stderr, flush=True)
    return {p: {"records_per_s_median": round(statistics.median(v)), "rounds": [round(x) for x in v]}
            for p, v in rates.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=40_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rf", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sms-bench-") as directory:
        figures = asyncio.run(run(args, directory))
    on = figures["at_least_once_no_dup"]["records_per_s_median"]
    off = figures["at_least_once_dup_permitted"]["records_per_s_median"]
    print(json.dumps({
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()},
        "parameters": vars(args),
        "figures": figures,
        "dedup_cost_fraction": round(1 - on / off, 3),
        "target": "dedup_cost_fraction < 0.10",
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
