"""A cluster that grows and shrinks under load: a node added, then a node drained.

Starts `LocalCluster` (control + `--nodes` storage nodes, separate processes) and a stream
of `--partitions` partitions at replication factor 3 under the open-loop de-duplicating
load of failover_pause.py (`--keys` keys, a record on each every `--interval-ms`). After
the warm-up one more storage node registers (what `sms serve` on a new host does) and
the chain manager moves replicas onto it (learners, then the replaced member leaves)
and hands heads over to it (control/chains.py rules 6 to 8). Reported:

- how long until the replicas were even (no node holding REBALANCE_IMBALANCE_MIN more
  than another, no learner left) and until the new node headed a chain;
- the write pause of the records sent while that happened: per key, the longest
  acknowledgement latency; p50 and max over the keys, beside the same figure before the
  node came (the baseline);
- then `drain_node` of the first node: how long until it held nothing, and the write
  pause meanwhile;
- at the end every record is read back (`read_stream`): acknowledged records lost and
  duplicated (expected 0).

Prints one JSON document on stdout, progress on stderr. Never asserts a timing.

    .venv/bin/python bench/rebalance.py [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common  # noqa: E402
from bench.failover_pause import STREAM, Load, _read_back, _wait_for  # noqa: E402
from node.launcher import STORAGE_ROLES, LocalCluster, NodeProcess  # noqa: E402
from sms import aio, hashing, limits  # noqa: E402


def _even(loads, nodes: set[str]) -> bool:
    live = {n.node_id: n for n in loads if n.live}
    if not nodes <= set(live) or any(n.learners for n in live.values()):
        return False
    counts = [live[n].replicas for n in nodes]
    return max(counts) - min(counts) < limits.REBALANCE_IMBALANCE_MIN


async def _run(args, directory: str) -> dict:
    cluster = LocalCluster(os.path.join(directory, "cluster"), nodes=args.nodes, port=0)
    os.environ.update(cluster.client_env())     # its clients trust its CA
    common.progress(f"starting a cluster of {args.nodes} storage nodes in {directory}")
    cluster.start()
    try:
        async with aio.Client(cluster.address) as client:
            info = await client.create_stream(STREAM, partitions=args.partitions, replication_factor=args.rf,
                                              persistence="disk")
            keys = [f"key-{i}" for i in range(args.keys)]
            key_ordinal = {k: info.open_partition_for_hash(hashing.hash_key_of(k)).ordinal for k in keys}
            ordinals = {p.ordinal for p in info.partitions}
            producer = client.producer(STREAM, "bench-rebalance", delivery_timeout_s=args.delivery_timeout_s)
            load = Load(producer, keys, key_ordinal, args.interval_ms / 1000, args.size)
            loader = asyncio.ensure_future(load.run())
            try:
                common.progress(f"load: {args.keys} keys every {args.interval_ms} ms; warm-up {args.warmup_s} s")
                t_start = time.perf_counter()
                await asyncio.sleep(args.warmup_s)
                new = f"n{args.nodes + 1}"
                before = await client.list_nodes()
                cluster.procs[new] = NodeProcess(new, STORAGE_ROLES, "127.0.0.1:0")
                t_add = time.perf_counter()
                await asyncio.to_thread(cluster.spawn, new)
                await asyncio.to_thread(cluster.wait_ready, [new])
                nodes = {n.node_id for n in before} | {new}
                common.progress(f"{new} registered; waiting for the replicas and heads to move")

                async def even():
                    return _even(await client.list_nodes(), nodes)
                await _wait_for(even, args.settle_timeout_s, "replicas even")
                t_even = time.perf_counter()

                async def headed():
                    return [n for n in await client.list_nodes() if n.node_id == new and n.heads]
                await _wait_for(headed, args.settle_timeout_s, f"{new} heading a chain")
                t_headed = time.perf_counter()
                after_add = await client.list_nodes()
                await asyncio.sleep(args.keep_s)
                victim = sorted(nodes)[0]
                t_drain = time.perf_counter()
                await client.drain_node(victim)
                common.progress(f"draining {victim}")

                async def drained():
                    return [n for n in await client.list_nodes() if n.node_id == victim and not n.replicas
                            and not n.learners]
                await _wait_for(drained, args.settle_timeout_s, f"{victim} drained")
                t_drained = time.perf_counter()
                after_drain = await client.list_nodes()
                await asyncio.sleep(args.keep_s)
            finally:
                load.stop.set()
                await loader
                await asyncio.wait_for(producer.close(), args.flush_timeout_s)
            read_back = await _read_back(client, load)
        return {
            "nodes_before": [[n.node_id, n.replicas, n.heads] for n in before],
            "nodes_after_add": [[n.node_id, n.replicas, n.heads] for n in after_add],
            "nodes_after_drain": [[n.node_id, n.replicas, n.heads, n.draining] for n in after_drain],
            "add_to_replicas_even_s": round(t_even - t_add, 2),
            "add_to_new_node_heading_s": round(t_headed - t_add, 2),
            "drain_to_empty_s": round(t_drained - t_drain, 2),
            "baseline": load.group(ordinals, t_start + 1.0, t_add),
            "while_adding": load.group(ordinals, t_add, t_headed),
            "while_draining": load.group(ordinals, t_drain, t_drained),
            "read_back": read_back,
        }
    finally:
        cluster.stop()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the defaults of `make bench`")
    p.add_argument("--smoke", action="store_true", help="tiny")
    p.add_argument("--keys", type=int, default=None, help="default 100 (smoke 10)")
    p.add_argument("--interval-ms", type=float, default=100.0)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=None, help="default 8 (smoke 4)")
    p.add_argument("--nodes", type=int, default=3, help="storage nodes before one is added")
    p.add_argument("--rf", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=None)
    p.add_argument("--keep-s", type=float, default=None, help="load kept this long after each step")
    p.add_argument("--settle-timeout-s", type=float, default=120.0)
    p.add_argument("--flush-timeout-s", type=float, default=60.0)
    p.add_argument("--delivery-timeout-s", type=float, default=100.0)
    return p


def run(args) -> dict:
    args = common.mode_options(build_parser(), args, {
        "smoke": dict(keys=10, partitions=4, warmup_s=1.0, keep_s=1.0),
        "quick": dict(keys=100, partitions=8, warmup_s=2.0, keep_s=2.0),
        "full": dict(keys=100, partitions=16, warmup_s=5.0, keep_s=5.0),
    })
    result, wall_s = common.run_in_tempdir("sms-bench-rebalance-", _run, args)
    return {"bench": "rebalance", "machine": common.machine(),
            "parameters": {**vars(args), "mode": "smoke" if args.smoke else "quick" if args.quick else "full"},
            **result, "wall_s": wall_s}


def main(argv: list[str] | None = None) -> int:
    import json
    print(json.dumps(run(build_parser().parse_args(argv)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
