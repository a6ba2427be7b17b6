"""Does failure detection ever remove a healthy node? A long run under load with no fault.

Starts `LocalCluster` (control + `--nodes` storage nodes, separate processes), creates a
stream of `--partitions` partitions with RF 3, and has one de-duplicating producer send
`--rate` records/s of 100 B for `--duration-s` seconds, while the machine is also busy
with the nodes' own work (GC, fsyncs, compaction of nothing). No process is killed or
paused. At the end it reports every chain change in every partition's history (expected
none: a removal here is a false positive of the detector or of the session TTL), the
/suspects reports the nodes made, and the records acknowledged. Prints one JSON document.

    .venv/bin/python -m bench.detector_soak [--duration-s 600] [--rate 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

from sms import aio
from node.launcher import LocalCluster


async def _load(address: str, partitions: int, rate: int, duration_s: float) -> dict:
    async with aio.Client(address) as client:
        info = await client.create_stream("soak", partitions=partitions, replication_factor=3)
        epochs = {p.ordinal: p.chain_epoch for p in info.partitions}
        acked = failed = 0
        batch = max(1, rate // 20)                       # 20 batches a second
        async with client.producer("soak", "soak-producer") as producer:
            start = time.monotonic()
            pending = []
            tick = 0
            while time.monotonic() - start < duration_s:
                tick += 1
                records = [(f"k{(tick * batch + i) % 1000}", b"x" * 100) for i in range(batch)]
                pending.append(await producer.send_batch(records))
                while len(pending) > 8:
                    for r in await pending.pop(0):
                        acked, failed = (acked + 1, failed) if not isinstance(r, BaseException) else (acked, failed + 1)
                next_at = start + tick / 20
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            for fut in pending:
                for r in await fut:
                    acked, failed = (acked + 1, failed) if not isinstance(r, BaseException) else (acked, failed + 1)
        after = await client.get_stream_info("soak")
        changes = [{"partition": p.ordinal, **c} for p in after.partitions for c in p.history
                   if c["action"] != "created"]
        return {"acked": acked, "failed": failed, "chain_changes": changes,
                "epochs_before": epochs, "epochs_after": {p.ordinal: p.chain_epoch for p in after.partitions}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=4)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sms-bench-soak-") as directory, \
            LocalCluster(directory, nodes=args.nodes) as cluster:
        os.environ.update(cluster.client_env())     # its clients trust its CA
        result = asyncio.run(_load(cluster.address, args.partitions, args.rate, args.duration_s))
        suspects = []
        for node_id in cluster.procs:
            try:
                with open(f"{directory}/logs/{node_id}.log") as f:
                    suspects += [line.strip() for line in f if "refuses connections" in line]
            except OSError:
                pass
    out = {"bench": "detector_soak", "parameters": vars(args), **result,
           "false_removals": len([c for c in result["chain_changes"] if c["action"] == "removed"]),
           "suspect_reports_logged": suspects[:20], "wall_s": round(time.monotonic() - t0, 1)}
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
