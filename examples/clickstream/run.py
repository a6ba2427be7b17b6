"""Run the clickstream example end to end and check that every click is counted once.

Starts a local cluster (control + 3 storage nodes), applies `graph.yaml` (three streams,
two stages), starts two worker processes per stage (`sms graph run`, each with its own
local Spark), sends `--clicks` click events from `--users` users through a
de-duplicating producer, and waits until the per-user-per-minute counts in
`user_minutes` add up to what was sent. It then compares every (user, minute) total with
the truth, prints a JSON summary (records/s through both stages), and stops everything.
With `--kill` it kill -9s one worker of each stage halfway through: the counts must
still come out exact.

    .venv/bin/python examples/clickstream/run.py [--clicks 20000] [--users 200] [--kill]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from sms import aio  # noqa: E402
from node.launcher import LocalCluster  # noqa: E402
from node.graph_commands import apply_graph  # noqa: E402
from sps.graph import load_graph  # noqa: E402

GRAPH = os.path.join(ROOT, "examples", "clickstream", "graph.yaml")


def start_worker(address: str, metastore: str, stage: str, worker_id: str, log_dir: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = open(os.path.join(log_dir, f"{worker_id}.log"), "w")
    return subprocess.Popen([sys.executable, "-m", "node", "graph", "run", GRAPH, "--stage", stage,
                             "--worker-id", worker_id, "--address", address, "--metastore", metastore,
                             "--master", "local[1]"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


async def produce(address: str, clicks: int, users: int, truth: Counter) -> float:
    rng = random.Random(7)
    base_ms = int(time.time() * 1000)
    async with aio.Client(address) as client:
        async with client.producer("clicks", "clickstream-example") as producer:
            futures = []
            for i in range(clicks):
                user = f"user-{rng.randrange(users)}"
                ts = base_ms + i * 3          # a few minutes of clicks
                truth[(user, ts // 60000)] += 1
                click = {"user": user, "url": f"/page/{rng.randrange(50)}", "ts": ts}
                futures.append(await producer.send(json.dumps(click).encode(), user))
            await producer.flush()
            for f in futures:
                f.result()
    return time.monotonic()


async def counted(address: str) -> Counter:
    totals: Counter = Counter()
    async with aio.Client(address) as client:
        async for r in client.read_stream("user_minutes"):
            d = json.loads(r.data)
            totals[(d["user"], d["minute"])] += d["count"]
    return totals


async def main_async(args, data_dir: str) -> dict:
    with LocalCluster(os.path.join(data_dir, "cluster"), nodes=3, port=0) as cluster:
        os.environ.update(cluster.client_env())     # its clients trust its CA
        graph = load_graph(GRAPH)
        await apply_graph(cluster.address, graph)
        log_dir = os.path.join(data_dir, "workers")
        os.makedirs(log_dir)
        workers = {f"{stage}-{i}": start_worker(cluster.address, cluster.metastore, stage, f"{stage}-{i}", log_dir)
                   for stage in ("parse", "count") for i in (1, 2)}
        try:
            truth: Counter = Counter()
            started = time.monotonic()
            produce_task = asyncio.ensure_future(produce(cluster.address, args.clicks, args.users, truth))
            killed = []
            if args.kill:
                await asyncio.sleep(args.kill_after_s)
                for victim in ("parse-1", "count-1"):
                    workers[victim].kill()
                    killed.append(victim)
            produced_at = await produce_task
            deadline = time.monotonic() + args.timeout_s
            totals: Counter = Counter()
            while time.monotonic() < deadline:
                totals = await counted(cluster.address)
                if sum(totals.values()) >= args.clicks:
                    break
                await asyncio.sleep(1.0)
            done_at = time.monotonic()
            wrong = {k: (totals.get(k, 0), v) for k, v in truth.items() if totals.get(k, 0) != v}
            extra = {k: v for k, v in totals.items() if k not in truth}
            return {"clicks": args.clicks, "users": args.users, "workers": sorted(workers), "killed": killed,
                    "counted": sum(totals.values()), "exact": not wrong and not extra,
                    "wrong_minutes": len(wrong), "examples_wrong": list(wrong.items())[:3],
                    "produce_s": round(produced_at - started, 2), "end_to_end_s": round(done_at - started, 2),
                    "records_per_s_through_both_stages": round(args.clicks / (done_at - started)),
                    "worker_logs": log_dir}
        finally:
            for p in workers.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in workers.values():
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clicks", type=int, default=20_000)
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--kill", action="store_true", help="kill -9 one worker of each stage midway")
    ap.add_argument("--kill-after-s", type=float, default=15.0)
    ap.add_argument("--timeout-s", type=float, default=240.0)
    args = ap.parse_args()
    data_dir = tempfile.mkdtemp(prefix="sms-clickstream-")
    result = asyncio.run(main_async(args, data_dir))
    print(json.dumps(result, indent=2))
    return 0 if result["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
