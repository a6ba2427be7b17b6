"""How ingest throughput and the cluster's memory change when partitions, producers and
stored data grow ten-fold.

Three sweeps of two points each (small, then ten times bigger), on `LocalCluster`
(control + `--nodes` storage nodes, separate processes), replication factor 3,
persistence "disk", 100-byte records:

- partitions: `--partitions-small` vs ten times as many, the same total load: `--writers`
  asyncio writers putting `--records-partitions` records in `client.put_records` calls of
  `--batch` records (as ingest_read.py);
- producers: `--producers-small` vs ten times as many de-duplicating producers
  (`client.producer`, each one a session per partition), the same total load of
  `--records-producers` records over `--partitions` partitions, every producer sending
  as fast as send() takes records and then flushing;
- stored data: the ingest rate of `--measure-records` records (put_records, as in the
  partitions sweep) once the stream already holds `--stored-small` records, and again
  once it holds ten times as many.

After each point it reads the resident memory (VmRSS, with its anonymous and file-backed
parts, from /proc/<pid>/status) of every cluster process: the storage nodes summed, the
control process, and this (client) process. Each point of the partitions and producers
sweeps runs on a fresh cluster, so its memory is its own (`--smoke`: one cluster for
everything, for speed; its memory figures then accumulate). Each sweep reports its two
points and the ratio big/small of throughput and of the storage nodes' RSS. Prints one
JSON document on stdout, progress on stderr. Never asserts a timing; the load generator
shares the machine with the cluster.

    .venv/bin/python bench/growth.py [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common  # noqa: E402
from sms import aio  # noqa: E402
from node.launcher import LocalCluster  # noqa: E402

FACTOR = 10


def _status_kib(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                    out[name] = int(rest.split()[0])
    except OSError:
        pass
    return out


def memory(cluster: LocalCluster) -> dict:
    """RSS in MiB: the storage nodes summed (and each), the control process, this process."""
    nodes = {}
    anon = file = 0
    control = 0.0
    for node_id, node in cluster.procs.items():
        if node.proc is None or node.proc.poll() is not None:
            continue
        st = _status_kib(node.pid)
        if node.roles == "control":
            control += st.get("VmRSS", 0) / 1024
            continue
        nodes[node_id] = round(st.get("VmRSS", 0) / 1024, 1)
        anon += st.get("RssAnon", 0)
        file += st.get("RssFile", 0) + st.get("RssShmem", 0)
    me = _status_kib(os.getpid())
    return {"storage_nodes_rss_mib": round(sum(nodes.values()), 1),
            "storage_nodes_rss_anon_mib": round(anon / 1024, 1),
            "storage_nodes_rss_file_mib": round(file / 1024, 1),
            "per_node_rss_mib": nodes,
            "control_rss_mib": round(control, 1),
            "cluster_rss_mib": round(sum(nodes.values()) + control, 1),
            "client_rss_mib": round(me.get("VmRSS", 0) / 1024, 1),
            "machine_load_average_1m": round(os.getloadavg()[0], 2)}


class Clusters:
    """Fresh clusters per point (or, shared=True, one for all), always stopped, and the
    directories removed at the end."""

    def __init__(self, directory: str, nodes: int, shared: bool):
        self.directory = directory
        self.nodes = nodes
        self.shared = shared
        self._shared: LocalCluster | None = None
        self._n = 0
        self.start_s: list[float] = []

    def _start(self) -> LocalCluster:
        self._n += 1
        path = os.path.join(self.directory, f"cluster{self._n}")
        t0 = time.perf_counter()
        cluster = LocalCluster(path, nodes=self.nodes, port=0).start()
        os.environ.update(cluster.client_env())     # its clients trust its CA
        self.start_s.append(round(time.perf_counter() - t0, 1))
        return cluster

    @contextlib.asynccontextmanager
    async def one(self):
        if self.shared:
            if self._shared is None:
                self._shared = await asyncio.to_thread(self._start)
            yield self._shared
            return
        cluster = await asyncio.to_thread(self._start)
        try:
            yield cluster
        finally:
            await asyncio.to_thread(cluster.stop)
            shutil.rmtree(cluster.data_dir, ignore_errors=True)

    def close(self) -> None:
        if self._shared is not None:
            self._shared.stop()
            self._shared = None


def _stream_name(tag: str) -> str:
    return f"growth-{tag}-{time.monotonic_ns() % 10**9}"


async def put_load(client: aio.Client, stream: str, records: int, writers: int, batch: int, size: int,
                   key_base: int = 0) -> dict:
    """`writers` concurrent loops of put_records calls of `batch` records; records/s."""
    payload = os.urandom(size)
    per_writer = records // writers
    failed = 0
    calls: list[float] = []

    async def writer(w: int) -> None:
        nonlocal failed
        for start in range(0, per_writer, batch):
            n = min(batch, per_writer - start)
            recs = [(f"key-{w}-{(key_base + start + i) % 997}", payload) for i in range(n)]
            t = time.perf_counter()
            out = await client.put_records(stream, recs)
            calls.append(time.perf_counter() - t)
            failed += out.failed_record_count

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    elapsed = time.perf_counter() - t0
    total = per_writer * writers
    calls.sort()
    return {"records": total, "failed": failed, "seconds": round(elapsed, 2),
            "records_per_s": round((total - failed) / elapsed),
            "put_records_call_ms_p50": round(calls[len(calls) // 2] * 1000, 1) if calls else None,
            "put_records_call_ms_max": round(calls[-1] * 1000, 1) if calls else None}


async def producer_load(client: aio.Client, stream: str, records: int, producers: int, size: int,
                        tag: str) -> dict:
    """`producers` de-duplicating producers, each sending records/producers records on 1000
    keys as fast as send() takes them, then flushing; records/s."""
    payload = os.urandom(size)
    per = records // producers
    failed = 0
    duplicates = 0

    async def one(p: int) -> None:
        nonlocal failed, duplicates
        async with client.producer(stream, f"growth-{tag}-{p}") as producer:
            futs = []
            for i in range(per):
                futs.append(await producer.send(payload, f"key-{(p * per + i) % 1000}"))
            await producer.flush()
            for f in futs:
                if f.exception() is not None:
                    failed += 1
                elif f.result().duplicate:
                    duplicates += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(p) for p in range(producers)))
    elapsed = time.perf_counter() - t0
    total = per * producers
    return {"records": total, "failed": failed, "answered_duplicate": duplicates, "seconds": round(elapsed, 2),
            "records_per_s": round((total - failed) / elapsed)}


async def _create(client: aio.Client, name: str, partitions: int, rf: int) -> float:
    t0 = time.perf_counter()
    await client.create_stream(name, partitions=partitions, replication_factor=rf, persistence="disk")
    return round(time.perf_counter() - t0, 2)


def _summary(sweep: str, small: dict, big: dict) -> dict:
    return {"small": small, "big": big,
            "throughput_ratio_big_to_small": common.ratio(big["ingest"]["records_per_s"],
                                                          small["ingest"]["records_per_s"]),
            "storage_nodes_rss_ratio_big_to_small": common.ratio(big["memory_after"]["storage_nodes_rss_mib"],
                                                                 small["memory_after"]["storage_nodes_rss_mib"]),
            "cluster_rss_ratio_big_to_small": common.ratio(big["memory_after"]["cluster_rss_mib"],
                                                           small["memory_after"]["cluster_rss_mib"])}


async def sweep_partitions(args, clusters: Clusters) -> dict:
    points = []
    sizes = [args.partitions_small, args.partitions_small * FACTOR]
    if args.partitions_target and args.partitions_target not in sizes:
        sizes.append(args.partitions_target)
    for partitions in sizes:
        async with clusters.one() as cluster:
            async with aio.Client(cluster.address) as client:
                name = _stream_name(f"p{partitions}")
                create_s = await _create(client, name, partitions, args.rf)
                await put_load(client, name, args.batch * args.writers, args.writers, args.batch, args.size)  # warm-up
                before = memory(cluster)
                common.progress(f"partitions={partitions}: {args.records_partitions} records, {args.writers} writers")
                ingest = await put_load(client, name, args.records_partitions, args.writers, args.batch, args.size)
                after = memory(cluster)
                common.progress(f"partitions={partitions}: {ingest['records_per_s']:,} records/s, "
                                f"storage nodes {after['storage_nodes_rss_mib']} MiB")
                points.append({"partitions": partitions, "create_stream_s": create_s, "ingest": ingest,
                               "memory_before_load": before, "memory_after": after})
    out = _summary("partitions", *points[:2])
    if len(points) > 2:
        # issue 14's target: ingest at 64 partitions >= 0.8x ingest at 4, the same load
        out["target"] = points[2]
        out["throughput_ratio_target_to_small"] = common.ratio(points[2]["ingest"]["records_per_s"],
                                                               points[0]["ingest"]["records_per_s"])
    return out


async def sweep_producers(args, clusters: Clusters) -> dict:
    points = []
    for producers in (args.producers_small, args.producers_small * FACTOR):
        async with clusters.one() as cluster:
            async with aio.Client(cluster.address) as client:
                name = _stream_name(f"s{producers}")
                await _create(client, name, args.partitions, args.rf)
                await put_load(client, name, args.batch * args.writers, args.writers, args.batch, args.size)  # warm-up
                before = memory(cluster)
                common.progress(f"producers={producers}: {args.records_producers} records, "
                                f"{args.partitions} partitions")
                ingest = await producer_load(client, name, args.records_producers, producers, args.size,
                                             tag=f"{producers}")
                after = memory(cluster)
                common.progress(f"producers={producers}: {ingest['records_per_s']:,} records/s, "
                                f"storage nodes {after['storage_nodes_rss_mib']} MiB")
                points.append({"producers": producers, "sessions": producers * args.partitions,
                               "ingest": ingest, "memory_before_load": before, "memory_after": after})
    return _summary("producers", *points)


async def sweep_stored(args, clusters: Clusters) -> dict:
    points = []
    async with clusters.one() as cluster:
        async with aio.Client(cluster.address) as client:
            name = _stream_name("stored")
            await _create(client, name, args.partitions, args.rf)
            held = 0
            fills = []
            for target in (args.stored_small, args.stored_small * FACTOR):
                if target > held:
                    common.progress(f"stored data: filling {held:,} -> {target:,} records")
                    fill = await put_load(client, name, target - held, args.writers, args.batch, args.size,
                                          key_base=held)
                    held += fill["records"]
                    fills.append({"to_records": held, "records_per_s": fill["records_per_s"],
                                  "seconds": fill["seconds"]})
                before = memory(cluster)
                ingest = await put_load(client, name, args.measure_records, args.writers, args.batch, args.size,
                                        key_base=held)
                after = memory(cluster)
                common.progress(f"stored data: holding {held:,}: {ingest['records_per_s']:,} records/s, "
                                f"storage nodes {after['storage_nodes_rss_mib']} MiB")
                points.append({"stored_records_before": held, "ingest": ingest,
                               "memory_before_load": before, "memory_after": after})
                held += ingest["records"]
            disk = _du(cluster.data_dir)
    out = _summary("stored", *points)
    out["fills"] = fills
    out["cluster_data_dir_mib_at_end"] = disk
    return out


def _du(path: str) -> float:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, f)).st_blocks * 512
    return round(total / 2**20, 1)


async def _run(args, directory: str) -> dict:
    clusters = Clusters(directory, args.nodes, shared=args.smoke)
    out = {}
    try:
        for name, fn in (("partitions", sweep_partitions), ("producers", sweep_producers),
                         ("stored_data", sweep_stored)):
            if name in args.sweeps:
                t0 = time.perf_counter()
                out[name] = await fn(args, clusters)
                out[name]["sweep_s"] = round(time.perf_counter() - t0, 1)
    finally:
        await asyncio.to_thread(clusters.close)
    out["cluster_start_s"] = clusters.start_s
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer records (< 60 s)")
    p.add_argument("--smoke", action="store_true", help="tiny, one shared cluster: fastest, still real")
    p.add_argument("--sweeps", default="partitions,producers,stored_data")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--rf", type=int, default=3)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--batch", type=int, default=500, help="records per put_records call")
    p.add_argument("--writers", type=int, default=4, help="concurrent put_records loops")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the producers and stored-data sweeps")
    p.add_argument("--partitions-small", type=int, default=4)
    p.add_argument("--partitions-target", type=int, default=64,
                   help="one more point of the partitions sweep, compared with the small one (0: none)")
    p.add_argument("--producers-small", type=int, default=4)
    p.add_argument("--records-partitions", type=int, default=None)
    p.add_argument("--records-producers", type=int, default=None)
    p.add_argument("--stored-small", type=int, default=None)
    p.add_argument("--measure-records", type=int, default=None)
    return p


def _defaults(args) -> argparse.Namespace:
    """The options: parser defaults, under what `args` gives, then the mode's values."""
    args = common.mode_options(build_parser(), args, {
        "smoke": dict(records_partitions=4_000, records_producers=2_000, stored_small=2_000, measure_records=2_000),
        "quick": dict(records_partitions=100_000, records_producers=16_000, stored_small=10_000, measure_records=15_000),
        "full": dict(records_partitions=200_000, records_producers=80_000, stored_small=100_000, measure_records=50_000),
    })
    if isinstance(args.sweeps, str):
        args.sweeps = [s.strip() for s in args.sweeps.split(",") if s.strip()]
    return args


def run(args) -> dict:
    """The whole benchmark: one JSON-able document (the driver's entry point)."""
    args = _defaults(args)
    result, wall_s = common.run_in_tempdir("sms-bench-growth-", _run, args)
    return {"bench": "growth", "machine": common.machine(),
            "parameters": {**vars(args), "persistence": "disk", "factor": FACTOR,
                           "mode": "smoke" if args.smoke else "quick" if args.quick else "full"},
            **result, "wall_s": wall_s}


def main(argv: list[str] | None = None) -> int:
    import json
    doc = run(build_parser().parse_args(argv))
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
