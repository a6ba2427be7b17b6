"""Run the clickstream example end to end and check that every click is counted once.

Starts a local cluster (control + 3 storage nodes), applies `graph.yaml` (three streams,
two stages), starts `--workers` worker processes (`sms graph run`, each running both
stages on its one local Spark session: by default one, a JVM per machine, and two with
`--kill`, one to kill and one to take over), waits until they hold every input partition,
sends `--clicks` click events from `--users` users through a de-duplicating producer,
and waits until the running totals in `user_minutes` (the latest per user and minute)
add up to what was sent. It then compares
every (user, minute) total with the truth, prints a JSON summary (records/s through both
stages, from the first click sent to the last one counted), and stops everything. With
`--kill` it kill -9s one worker once a third of the clicks are counted: the counts must
still come out exact.

    .venv/bin/python examples/clickstream/run.py [--clicks 100000] [--users 200] [--kill]
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

from sms import aio, errors  # noqa: E402
from node.launcher import LocalCluster  # noqa: E402
from node.graph_commands import apply_graph  # noqa: E402
from sps.graph import load_graph  # noqa: E402

GRAPH = os.path.join(ROOT, "examples", "clickstream", "graph.yaml")


def start_worker(address: str, worker_id: str, log_dir: str, master: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = open(os.path.join(log_dir, f"{worker_id}.log"), "w")
    return subprocess.Popen([sys.executable, "-m", "node", "graph", "run", GRAPH, "--worker-id", worker_id,
                             "--address", address, "--master", master],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def cpu_s(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each process, and by its live
    descendants as "NAME children" (a worker's JVM is its child), from /proc; {} where
    there is no /proc."""
    if not os.path.isdir("/proc"):
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    parent, used = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(pid)] = int(fields[1])
        used[int(pid)] = (int(fields[11]) + int(fields[12])) / tick
    out = {}
    for name, root in pids.items():
        out[name] = used.get(root, 0.0)
        children = 0.0
        for pid in used:
            p = parent.get(pid)
            while p and p != root and p in parent:
                p = parent[p]
            children += used[pid] if p == root and pid != root else 0.0
        if children:
            out[f"{name} children"] = children
    return out


async def wait_ready(address: str, graph, workers: dict, timeout_s: float) -> None:
    """Until every stage's every input partition has an owner (the workers' Spark sessions
    are up: a worker claims nothing before)."""
    deadline = time.monotonic() + timeout_s
    async with aio.Client(address) as client:
        while True:
            owned = total = 0
            balanced = True
            for stage in graph.stages.values():
                for stream in stage.inputs:
                    try:
                        parts = (await client.describe_group(stream, stage.name))["partitions"]
                    except errors.GroupNotFound:
                        parts = []
                    n = len((await client.get_stream_info(stream)).partitions)
                    total += n
                    owned += sum(1 for p in parts if p["owner"])
                    # (each worker holds its share: none takes a lease from another mid-run)
                    balanced = balanced and len({p["owner"] for p in parts if p["owner"]}) >= min(n, len(workers))
            if total and owned >= total and balanced:
                return
            dead = [w for w, p in workers.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready ({owned}/{total} partitions owned; exited: {dead})")
            await asyncio.sleep(0.2)


def make_clicks(clicks: int, users: int, truth: Counter) -> list[list[tuple[str, bytes]]]:
    """The clicks to send, in batches of 500 (made before the clock starts: the figure is
    the pipeline's, not the making of made-up data), and the truth: clicks per (user,
    minute)."""
    rng = random.Random(7)
    base_ms = int(time.time() * 1000)
    batches, chunk = [], []
    for i in range(clicks):
        user = f"user-{rng.randrange(users)}"
        ts = base_ms + i * 3          # a few minutes of clicks
        truth[(user, ts // 60000)] += 1
        chunk.append((user, json.dumps({"user": user, "url": f"/page/{rng.randrange(50)}", "ts": ts}).encode()))
        if len(chunk) == 500 or i == clicks - 1:
            batches.append(chunk)
            chunk = []
    return batches


async def produce(address: str, batches: list[list[tuple[str, bytes]]]) -> float:
    async with aio.Client(address) as client:
        async with client.producer("clicks", "clickstream-example") as producer:
            futures = [await producer.send_batch(chunk) for chunk in batches]     # one future per 500 clicks
            await producer.flush()
            for f in futures:
                failed = (await f).failed                 # (index, named error) of each record not stored
                if failed:
                    raise failed[0][1]
    return time.monotonic()


async def stored_totals(address: str) -> Counter:
    totals: Counter = Counter()
    async with aio.Client(address) as client:
        async for r in client.read_stream("user_minutes"):
            d = json.loads(r.data)
            totals[(d["user"], d["window_start"] // 60000)] = d["count"]
    return totals


class Counted:
    """Each (user, minute)'s running total as the count stage writes it: the latest record
    of its window (a user's records are in one partition at a time, in order), followed
    as they commit (a subscription, not a re-read of the stream per check)."""

    def __init__(self, address: str):
        self.address = address
        self.totals: Counter = Counter()
        self.clicks = 0                  # the sum of the totals
        self._task: asyncio.Task | None = None

    async def _follow(self) -> None:
        async with aio.Client(self.address) as client:
            async for r in client.read_stream("user_minutes", follow=True):
                d = json.loads(r.data)
                key = (d["user"], d["window_start"] // 60000)
                self.clicks += d["count"] - self.totals[key]
                self.totals[key] = d["count"]

    def __enter__(self) -> "Counted":
        self._task = asyncio.ensure_future(self._follow())
        return self

    def __exit__(self, *exc) -> None:
        self._task.cancel()

    async def until(self, clicks: int, deadline: float) -> None:
        while self.clicks < clicks and time.monotonic() < deadline:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.05)


async def main_async(args, data_dir: str) -> dict:
    with LocalCluster(os.path.join(data_dir, "cluster"), nodes=3, port=0) as cluster:
        os.environ.update(cluster.client_env())     # its clients trust its CA
        graph = load_graph(GRAPH)
        await apply_graph(cluster.address, graph)
        log_dir = os.path.join(data_dir, "workers")
        os.makedirs(log_dir)
        workers = {f"worker-{i}": start_worker(cluster.address, f"worker-{i}", log_dir, args.master)
                   for i in range(1, args.workers + 1)}
        try:
            await wait_ready(cluster.address, graph, workers, args.timeout_s)
            truth: Counter = Counter()
            batches = make_clicks(args.clicks, args.users, truth)
            roots = {**{w: p.pid for w, p in workers.items()},
                     **{n: node.proc.pid for n, node in cluster.procs.items() if node.proc is not None}}
            cpu_before = {**cpu_s(roots), "this process (producer, checker)": sum(os.times()[:2])}
            counted = Counted(cluster.address)
            with counted:
                started = time.monotonic()
                produce_task = asyncio.ensure_future(produce(cluster.address, batches))
                killed = []
                if args.kill:
                    await counted.until(args.clicks // 3, started + args.timeout_s)
                    workers["worker-1"].kill()
                    killed.append("worker-1")
                produced_at = await produce_task
                await counted.until(args.clicks, time.monotonic() + args.timeout_s)
                done_at = time.monotonic()
            # the check reads the output stream again, whole: what is stored, not what was seen
            totals = await stored_totals(cluster.address)
            if totals != counted.totals:
                raise RuntimeError("the output stream read again differs from what its subscription showed")
            cpu_after = {**cpu_s(roots), "this process (producer, checker)": sum(os.times()[:2])}
            wrong = {k: (totals.get(k, 0), v) for k, v in truth.items() if totals.get(k, 0) != v}
            extra = {k: v for k, v in totals.items() if k not in truth}
            return {"clicks": args.clicks, "users": args.users, "workers": sorted(workers), "killed": killed,
                    "counted": sum(totals.values()), "exact": not wrong and not extra,
                    "wrong_minutes": len(wrong), "examples_wrong": list(wrong.items())[:3],
                    "produce_s": round(produced_at - started, 2), "end_to_end_s": round(done_at - started, 2),
                    "records_per_s_through_both_stages": round(args.clicks / (done_at - started)),
                    "cpu_s_while_measured": {k: round(cpu_after[k] - cpu_before.get(k, 0.0), 1)
                                             for k in cpu_after if k in cpu_before},
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
    ap.add_argument("--clicks", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--kill", action="store_true", help="kill -9 one worker once a third of the clicks are counted")
    ap.add_argument("--workers", type=int, help="worker processes, each running both stages (default: 1, and 2 "
                                                "with --kill)")
    ap.add_argument("--master", default="local[2]", help="each worker's Spark master")
    ap.add_argument("--timeout-s", type=float, default=240.0)
    args = ap.parse_args()
    if args.workers is None:
        args.workers = 2 if args.kill else 1
    if args.workers < 1 or (args.kill and args.workers < 2):
        ap.error("--workers: at least 1, and 2 with --kill (one to kill, one to take over)")
    data_dir = tempfile.mkdtemp(prefix="sms-clickstream-")
    result = asyncio.run(main_async(args, data_dir))
    print(json.dumps(result, indent=2))
    return 0 if result["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
