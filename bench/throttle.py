"""Throttling under load (issue 15): a limited partition, tenant or reader holds its limit
while the streams and tenants beside it keep their throughput, on one TLS cluster.

One `LocalCluster` of `--nodes` storage nodes (TLS, keys checked), three scenarios of
`--seconds` of load each:

1. Partition write limit: two streams of one partition (RF `--rf`), one updated to
   `write_records_per_s` = `--partition-limit`.
2. Tenant write limit: two tenants, one with `update_tenant(write_records_per_s=
   --tenant-limit)`, each with a stream of `--tenant-partitions` partitions written with
   a producer key of its own (`create_key("producer", tenant=...)`). Each live ingestion
   node holds an even share of a tenant's limit (ingestion/service.py TenantShares), so
   only the nodes that own the tenant's partitions count toward what it can reach.
3. Read limit: two streams of one partition (RF 1) filled alike, one with
   `read_bytes_per_s` = `--read-limit`, each read by one reader in pages of
   `--read-page` records from TRIM_HORIZON (starting over at the end).

In each, after one warm-up record per partition, the unlimited load runs alone, then
beside the limited one, then alone again (so that the drift of a shared machine shows),
with the CPU seconds of every process in each turn (bench/cpu.py).

Writers (`--writers` per partition) send `PutRecords` requests of `--batch` records of
`--size` bytes straight to the partition's ingestion owner, as a producer's transport
does (`Client.send_put_records`, no client-side retry), so that every `Throttled` answer
is counted; after one they back off PRODUCER_RETRY_BACKOFF_MS and send again.

Per limit: what was acknowledged (or read), the rate, the limit, and the limiter's bound
for the measured window, its token bucket's arithmetic (kernel/ratelimit.py): a full bucket
of PARTITION_LIMIT_BURST_S seconds' worth plus the rate times the window, plus one
request (one per node for a tenant, as in tests/integration/test_quotas.py) or one page
for a reader (a read is charged after it is done: retrieval/service.py). A read is
charged the stored batches its page touched, so the reader's figure that the bound is
about is `stored_bytes_charged`. Per unlimited neighbour: its rate alone and beside the
limited load, and the ratio of the rate beside to the mean of the two alone. `holds`
(acknowledged or charged <= bound) is reported, never asserted; neither is any timing.
Prints JSON.

    .venv/bin/python bench/throttle.py [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common, cpu  # noqa: E402
from node.launcher import LocalCluster  # noqa: E402
from sms import aio, errors, limits, wire  # noqa: E402
from sms.proto import sms_pb2  # noqa: E402
from sms.records import encode_put  # noqa: E402
from sms.types import PartitionInfo, StreamInfo  # noqa: E402

BACKOFF_S = limits.PRODUCER_RETRY_BACKOFF_MS / 1000    # after a Throttled (or other retriable) answer
BURST_S = limits.PARTITION_LIMIT_BURST_S
SETTLE_TIMEOUT_S = 30.0                                 # owners assigned, a limit in force on its node
POLL_S = 0.1
TENANTS = ("thr-limited", "thr-free")


# --- writing -------------------------------------------------------------------------------
@dataclasses.dataclass
class Tally:
    """What the writers of one load saw."""
    calls: int = 0
    records_acked: int = 0
    throttled_answers: int = 0          # requests answered Throttled (whole, or their records)
    throttled_records: int = 0          # records refused with Throttled (and sent again)
    other_errors: int = 0               # records or requests refused otherwise
    first_error: str | None = None

    def error(self, name: str, message: str) -> None:
        """One record refused."""
        if name == "Throttled":
            self.throttled_records += 1
            return
        self.other_errors += 1
        if self.first_error is None:
            self.first_error = f"{name}: {message}"[:300]


async def _owners(client: aio.Client, stream: str) -> StreamInfo:
    """The stream once every partition has an ingestion owner."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        info = await client.get_stream_info(stream)
        if all(p.ingestion_owner and p.ingestion_owner.address for p in info.partitions):
            return info
        if time.monotonic() > deadline:
            raise TimeoutError(f"{stream}: partitions without an ingestion owner after {SETTLE_TIMEOUT_S} s")
        await asyncio.sleep(POLL_S)


async def _writer(client: aio.Client, stream: str, partition: PartitionInfo, tag: str, params: dict,
                  deadline: float, tally: Tally) -> None:
    """put_records requests of one partition until the deadline, to its ingestion owner."""
    records = [(f"{tag}-{i}", os.urandom(params["size"]), partition.hash_lo) for i in range(params["batch"])]
    entries, _hashes = wire.encode_puts(records, encode_put)
    request = sms_pb2.PutRecordsRequest(stream=stream, count=len(entries), entries=b"".join(entries))
    address = partition.ingestion_owner.address
    while time.monotonic() < deadline:
        tally.calls += 1
        try:
            answer = await client.send_put_records(address, request)
            refused = [(e.name, e.message) for e in answer.errors]
        except errors.SmsError as e:            # (a tenant over its share: the whole request)
            if not e.retriable:
                raise
            refused = [(e.name, e.message)] * len(entries)
        tally.records_acked += len(entries) - len(refused)
        if not refused:
            continue
        names = {name for name, _m in refused}
        if "Throttled" in names:
            tally.throttled_answers += 1
        for name, message in refused:
            tally.error(name, message)
        await asyncio.sleep(BACKOFF_S)
        if names - {"Throttled"}:               # (the owner moved, or is on its way: look again)
            address = (await _owners(client, stream)).partition(partition.ordinal).ingestion_owner.address


async def _load(client: aio.Client, stream: str, params: dict, deadline: float) -> dict:
    """`writers` per partition of the stream until the deadline: what they saw."""
    info = await _owners(client, stream)
    tally = Tally()
    t0 = time.perf_counter()
    await asyncio.gather(*(_writer(client, stream, p, f"w{w}", params, deadline, tally)
                           for p in info.partitions for w in range(params["writers"])))
    seconds = time.perf_counter() - t0
    return {"stream": stream, "partitions": len(info.partitions),
            "owners": sorted({p.ingestion_owner.node_id for p in info.partitions}),
            "seconds": round(seconds, 4), "records_per_s": round(tally.records_acked / seconds),
            **dataclasses.asdict(tally)}


async def _warm(client: aio.Client, stream: str) -> None:
    """One record on each partition before the turns, so that first-use work (channels,
    a partition's ingest state, a node's first reads of the key and of the tenant's
    limits) falls in none of them. It takes one token of a limited bucket, so the bound
    stays an upper bound."""
    info = await _owners(client, stream)
    out = await client.put_records(stream, [(f"warm-{p.ordinal}", b"warm", p.hash_lo) for p in info.partitions])
    if out.failed_record_count:
        raise RuntimeError(f"{stream}: warm-up write failed: {out.records}")


async def _loads(pairs: list[tuple[aio.Client, str]], params: dict) -> list[dict]:
    """The streams loaded at once, for params["seconds"]."""
    deadline = time.monotonic() + params["seconds"]
    return list(await asyncio.gather(*(_load(c, s, params, deadline) for c, s in pairs)))


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


async def _turns(alone, both, rate: str, what: str, meter: cpu.Meter) -> tuple[dict, dict]:
    """The unlimited load alone, then beside the limited one, then alone again (so that
    drift of a shared machine shows, and falls on the baseline as much as on the load
    beside): the limited load's figures, and the unlimited one's in turns with the ratio
    of its rate beside the limited one to its mean rate alone, and the CPU seconds of
    every process in each turn (how busy the machine's cores were)."""
    turns, used = {}, {}
    for turn, load in (("alone_before", alone), ("both", both), ("alone_after", alone)):
        common.progress(f"throttle: {what}: {turn}")
        meter.start()
        t0 = time.perf_counter()
        turns[turn] = await load()
        seconds = time.perf_counter() - t0
        cpu_s = meter.stop(0)["cpu_s"]
        used[turn] = {"cpu_s": cpu_s, "cores_busy": round(sum(cpu_s.values()) / seconds, 2)}
    (before,), (limited, beside), (after,) = turns["alone_before"], turns["both"], turns["alone_after"]
    return limited, {"unlimited_alone_before": before, "unlimited_beside_limited": beside,
                     "unlimited_alone_after": after,
                     "unlimited_ratio_beside_to_alone": _ratio(beside[rate], (before[rate] + after[rate]) / 2),
                     "cpu": used}


# --- the scenarios --------------------------------------------------------------------------
async def _in_force(cluster: LocalCluster, address: str, stream: str, field: str, value: int) -> float:
    """Wait until the node at `address` sees the stream's limit (each node answers
    DescribeStream from its own view of the metadata); the seconds it took."""
    t0 = time.monotonic()
    async with aio.Client(address, **cluster.client_options()) as there:
        while getattr(await there.get_stream_info(stream), field) != value:
            if time.monotonic() - t0 > SETTLE_TIMEOUT_S:
                raise TimeoutError(f"{stream}: {field}={value} not in force on {address} after {SETTLE_TIMEOUT_S} s")
            await asyncio.sleep(POLL_S)
    return round(time.monotonic() - t0, 2)


async def partition_limit(cluster: LocalCluster, params: dict) -> dict:
    limit = params["partition_limit"]
    async with aio.Client(cluster.address, **cluster.client_options()) as client:
        for name in ("thr-part-limited", "thr-part-free"):
            await client.create_stream(name, partitions=1, replication_factor=params["rf"])
        await client.update_stream("thr-part-limited", write_records_per_s=limit)
        owner = (await _owners(client, "thr-part-limited")).partition(0).ingestion_owner.address
        in_force_s = await _in_force(cluster, owner, "thr-part-limited", "write_records_per_s", limit)
        common.progress(f"throttle: partition limit {limit}/s in force after {in_force_s} s")
        free, both = [(client, "thr-part-free")], [(client, "thr-part-limited"), (client, "thr-part-free")]
        for c, stream in both:
            await _warm(c, stream)
        limited, neighbour = await _turns(lambda: _loads(free, params), lambda: _loads(both, params),
                                          "records_per_s", "streams", cpu.Meter(cpu.cluster_pids(cluster)))
    return {"limit_in_force_after_s": in_force_s, "limited": _bounded(limited, params, limit), **neighbour}


async def tenant_limit(cluster: LocalCluster, params: dict) -> dict:
    limit = params["tenant_limit"]
    opts = cluster.client_options()
    async with aio.Client(cluster.address, **opts) as admin:
        producers = {}
        for tenant in TENANTS:
            await admin.create_tenant(tenant)
            _key, admin_token = await admin.create_key("admin", tenant=tenant, name=f"{tenant} admin")
            async with aio.Client(cluster.address, ca_file=opts["ca_file"], token=admin_token) as own:
                await own.create_stream("load", partitions=params["tenant_partitions"],
                                        replication_factor=params["rf"])
            _key, producers[tenant] = await admin.create_key("producer", tenant=tenant, name=f"{tenant} producer")
        # before the tenant's first write: a node reads its limits at the first one
        await admin.update_tenant(TENANTS[0], write_records_per_s=limit)
        nodes = sum(1 for n in (await admin.describe_cluster()).nodes if "ingestion" in n.roles)
    limited_c, free_c = (aio.Client(cluster.address, ca_file=opts["ca_file"], token=producers[t]) for t in TENANTS)
    async with limited_c, free_c:
        common.progress(f"throttle: tenant limit {limit}/s over {nodes} ingestion nodes")
        free, both = [(free_c, "load")], [(limited_c, "load"), (free_c, "load")]
        for c, stream in both:
            await _warm(c, stream)
        limited, neighbour = await _turns(lambda: _loads(free, params), lambda: _loads(both, params),
                                          "records_per_s", "tenants", cpu.Meter(cpu.cluster_pids(cluster)))
    share = -(-limit // nodes)
    return {"ingestion_nodes": nodes, "share_per_node_records_per_s": share,
            "limited": _bounded(limited, params, limit, owners=len(limited["owners"]), share=share), **neighbour}


def _bounded(out: dict, params: dict, limit: int, owners: int = 1, share: int | None = None) -> dict:
    """A limited load's figures with the limiter's bound for its window: a full bucket
    (BURST_S of the rate) and the rate over the window on each node that holds a bucket,
    plus one request each (test_quotas.py's slack)."""
    rate = owners * (share or limit)
    bound = round(rate * (out["seconds"] + BURST_S) + owners * params["batch"])
    return {**out, "limit_records_per_s": limit, "reachable_records_per_s": rate, "burst_s": BURST_S,
            "bound_records": bound, "bound_records_per_s": round(bound / out["seconds"]),
            "holds": out["records_acked"] <= bound}


async def _fill(client: aio.Client, stream: str, records: int, size: int, batch: int) -> None:
    payload = os.urandom(size)
    for start in range(0, records, batch):
        n = min(batch, records - start)
        out = await client.put_records(stream, [(f"r-{start + i}", payload) for i in range(n)])
        if out.failed_record_count:
            raise RuntimeError(f"{stream}: {out.failed_record_count} records failed while filling")


async def _read(client: aio.Client, stream: str, page: int, deadline: float) -> dict:
    """One reader from TRIM_HORIZON until the deadline, starting over at the end of what
    is there (`passes`)."""
    records = data_bytes = charged = calls = page_charged_max = passes = 0
    t0 = time.perf_counter()
    iterator = None
    while time.monotonic() < deadline:
        if iterator is None:
            iterator = await client.get_iterator(stream, 0, "TRIM_HORIZON")
            passes += 1
        got = await client.get_next_record_batch(iterator, max_records=page)
        calls += 1
        iterator = got.next_iterator if len(got.batch) else None
        records += len(got.batch)
        data_bytes += sum(len(r.data) for r in got.batch.records())
        this = sum(len(b) for b, _s, _e in got.batch.slices)    # what the read limit charges: stored batches
        charged += this
        page_charged_max = max(page_charged_max, this)
    seconds = time.perf_counter() - t0
    return {"stream": stream, "seconds": round(seconds, 4), "calls": calls, "passes": passes,
            "records_read": records, "data_bytes": data_bytes, "stored_bytes_charged": charged,
            "data_bytes_per_s": round(data_bytes / seconds), "stored_bytes_per_s": round(charged / seconds),
            "page_charged_bytes_max": page_charged_max}


async def _reads(client: aio.Client, streams: list[str], params: dict) -> list[dict]:
    """One reader per stream at once, for params["seconds"]."""
    deadline = time.monotonic() + params["seconds"]
    return list(await asyncio.gather(*(_read(client, s, params["read_page"], deadline) for s in streams)))


async def read_limit(cluster: LocalCluster, params: dict) -> dict:
    limit, size = params["read_limit"], params["read_size"]
    # more than the limited reader can take in the window, so that it reads one pass
    records = math.ceil(limit * (params["seconds"] + BURST_S) * 1.2 / size) + params["read_page"]
    async with aio.Client(cluster.address, **cluster.client_options()) as client:
        for name in ("thr-read-limited", "thr-read-free"):
            await client.create_stream(name, partitions=1, replication_factor=1)
            await _fill(client, name, records, size, params["read_page"])
        await client.update_stream("thr-read-limited", read_bytes_per_s=limit)
        replica = (await client.get_stream_info("thr-read-limited")).partition(0).chain[0].address
        in_force_s = await _in_force(cluster, replica, "thr-read-limited", "read_bytes_per_s", limit)
        common.progress(f"throttle: read limit {limit} B/s in force after {in_force_s} s")
        free, both = ["thr-read-free"], ["thr-read-limited", "thr-read-free"]
        for stream in both:
            await client.get_iterator(stream, 0, "TRIM_HORIZON")     # (no read charged)
        limited, neighbour = await _turns(lambda: _reads(client, free, params), lambda: _reads(client, both, params),
                                          "stored_bytes_per_s", "readers", cpu.Meter(cpu.cluster_pids(cluster)))
    # (a lone reader runs at the bound's edge: its window is kept to 0.1 ms for this)
    bound = round(limit * (limited["seconds"] + BURST_S) + limited["page_charged_bytes_max"])
    limited.update({"limit_bytes_per_s": limit, "burst_s": BURST_S, "bound_stored_bytes": bound,
                    "bound_stored_bytes_per_s": round(bound / limited["seconds"]),
                    "holds": limited["stored_bytes_charged"] <= bound})
    return {"records_filled": records, "record_bytes": size, "limit_in_force_after_s": in_force_s,
            "limited": limited, **neighbour}


# --- the driver -----------------------------------------------------------------------------
def run(params: dict) -> dict:
    t0 = time.perf_counter()
    base = tempfile.mkdtemp(prefix="sms-bench-throttle-")
    cluster = None
    try:
        cluster = LocalCluster(os.path.join(base, "cluster"), nodes=params["nodes"], port=0, tls=True).start()
        out = {"partition_limit": asyncio.run(partition_limit(cluster, params)),
               "tenant_limit": asyncio.run(tenant_limit(cluster, params)),
               "read_limit": asyncio.run(read_limit(cluster, params))}
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    holds = {"partition_write_limit": out["partition_limit"]["limited"]["holds"],
             "tenant_write_limit": out["tenant_limit"]["limited"]["holds"],
             "read_limit": out["read_limit"]["limited"]["holds"]}
    return {"bench": "throttle", "params": params, **out, "holds": holds,
            "wall_s": round(time.perf_counter() - t0, 1)}


PRESETS = {
    "smoke": {"seconds": 0.5},
    "quick": {"seconds": 4.0},
    "full": {"seconds": 15.0},
}


DEFAULTS = {"nodes": 3, "rf": 3, "writers": 2, "batch": 100, "size": 100, "partition_limit": 500,
            "tenant_limit": 900, "tenant_partitions": 3, "read_limit": 200_000, "read_size": 1000, "read_page": 100}


def run_preset(preset: str = "quick") -> dict:
    """bench/run.py's extra: the defaults at one of PRESETS."""
    return run({**DEFAULTS, **PRESETS[preset]})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, help="of each load (default: the preset's)")
    for name, value in DEFAULTS.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    args = ap.parse_args(argv)
    preset = PRESETS["smoke" if args.smoke else "quick" if args.quick else "full"]
    params = {name: getattr(args, name) for name in DEFAULTS}
    params["seconds"] = args.seconds or preset["seconds"]
    if not 0 < params["batch"] <= min(params["partition_limit"], -(-params["tenant_limit"] // params["nodes"])):
        ap.error("--batch must fit in one second's worth of each limit, or a batch passes only on a full bucket")
    machine = common.machine()
    print(json.dumps({**run(params), "machine": machine}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
