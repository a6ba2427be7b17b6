"""What the archive tier (issue 18) costs and how fast it goes: on one LocalCluster of
3 storage nodes whose archivers write at once (SMS_ARCHIVE_FLUSH_S=0) and check every
0.2 s (retention too), with a `file://` fragment store in a temporary directory, for each
compression ("zstd", "none"), on a stream of 4 partitions, RF 3, ingestion policy
"at_least_once_dup_permitted" (no dedup window holding local copies), archive_after_s 1,
retention_s 3600:

- **ingest**: `records` click events (JSON of about 150 bytes, keyed by user: something
  for compression to work on) through `put_records` in batches of 500 from 8 concurrent
  lanes: records/s, MB/s, CPU per record of every process (bench/cpu.py);
- **archive write, following the ingest**: from the ingest's start until every
  partition's tail reports (NodeStatus `archived_sn`) the last acknowledged SN archived:
  records/s, raw MB/s (`sms_archive_raw_bytes`) and "archive_vs_ingest". The archiver
  trails the ingest by archive_after_s, so this is at most the ingest rate;
- **compression**: `sms_archive_raw_bytes` / `sms_archive_write_bytes` of the stream,
  summed over the storage nodes' Prometheus endpoints, and the fragment files on disk;
- **catch-up reads**: every partition from TRIM_HORIZON with `get_next_records`
  (max_records 10,000; the partitions concurrently, one client), (a) while every record
  is still local (the stream is created with local_retention_s an hour), then (b) once
  local_retention_s is lowered to 2 s and every replica's first local SN is past the
  records (a small tail written after them stays local: a log's newest batch is never
  deleted), so they come from the fragments: the same records, SNs and layout, read a
  few seconds apart. "archive_vs_local" = (b) / (a); target >= 0.5;
- **the archivers' own pace** (`backlog_records`): another stream written while
  archive_after_s is an hour, lowered to 1 s once its newest record is older than that:
  from the change until every tail has archived all of it, records/s and raw MB/s, and the
  storage nodes' CPU microseconds per archived record over that window;
- every record read back exactly once, in SN order per partition, with its data, both
  times, and the nodes' `sms_archive_read_records` covering the records; anything else is
  listed under "problems".

Prints JSON on stdout, progress on stderr, then one TARGET line per compression; never
asserts a timing (the machine's load average at the start and the end is in the JSON).

    .venv/bin/python -m bench.archive [--preset smoke|quick|full] [--records N] [--codecs zstd,none]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import ssl
import sys
import tempfile
from typing import NamedTuple
import time
import urllib.request
from collections import defaultdict

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common, cpu  # noqa: E402

PRESETS = {"smoke": {"records": 5_000, "backlog_records": 5_000, "wait_s": 30.0},
           "quick": {"records": 200_000, "backlog_records": 50_000, "wait_s": 60.0},
           "full": {"records": 1_000_000, "backlog_records": 1_000_000, "wait_s": 180.0}}
DEFAULTS = {"nodes": 3, "rf": 3, "partitions": 4, "batch": 500, "lanes": 8, "max_records": 10_000,
            "codecs": ["zstd", "none"], "archive_after_s": 1, "local_retention_s": 2, "retention_s": 3600,
            "backlog_records": 0,    # 0: no backlog run
            "wait_s": 60.0}          # the longest wait for records to move tier, per wait
POLICY = "at_least_once_dup_permitted"     # a de-duplicating stream keeps its dedup window locally
LONG_S = 3600                              # local_retention_s until the local read; the backlog's archive_after_s
# the nodes' archive settings (node/config.py): archive at once, check often
NODE_ENV = {"SMS_ARCHIVE_FLUSH_S": "0", "SMS_ARCHIVE_CHECK_INTERVAL_S": "0.2",
            "SMS_RETENTION_CHECK_INTERVAL_S": "0.2"}
POLL_S = 0.1
TAIL_RECORDS = 64                          # the tail written after the records, per try
SCRAPE_TIMEOUT_S = 10
BACKLOG_AGE_MARGIN_S = 0.5                 # the backlog's newest record is this much past archive_after_s
GOAL_ARCHIVE_VS_LOCAL = 0.5                # catch-up read from the archive / from local storage, at least

PAGES = ["/", "/search", "/cart", "/checkout", "/account", "/help"] + [f"/products/{i}" for i in range(40)] + \
        [f"/category/{c}" for c in ("shoes", "shirts", "bags", "hats", "outdoor", "kids")]
EVENTS = ["view"] * 6 + ["click"] * 5 + ["scroll"] * 3 + ["add_to_cart", "purchase", "search"]
REFERRERS = ["", "", "google.com", "bing.com", "facebook.com", "t.co", "newsletter", "duckduckgo.com"]
COUNTRIES = ["US", "US", "US", "DE", "GB", "FR", "IN", "BR", "JP", "CA", "NL", "ES"]
DEVICES = ["mobile", "mobile", "desktop", "desktop", "tablet"]


# --- the records ---------------------------------------------------------------------------
def click_events(n: int, seed: int = 18) -> list[tuple[str, bytes]]:
    """`n` click events as JSON (126..164 bytes, about 150), keyed by their user: the same in every run."""
    rnd = random.Random(seed)
    ts = 1_717_000_000_000
    out = []
    for _ in range(n):
        ts += rnd.randrange(0, 7)
        user = rnd.randrange(100_000)
        data = (f'{{"ts":{ts},"user":"u{user:06d}","session":"{rnd.getrandbits(32):08x}",'
                f'"event":"{rnd.choice(EVENTS)}","page":"{rnd.choice(PAGES)}","ref":"{rnd.choice(REFERRERS)}",'
                f'"country":"{rnd.choice(COUNTRIES)}","device":"{rnd.choice(DEVICES)}"}}')
        out.append((f"u{user:06d}", data.encode()))
    return out


# --- the cluster's state -------------------------------------------------------------------
async def _storage_nodes(client) -> list:
    return [n for n in (await client.describe_cluster()).nodes if "storage" in n.roles]


async def _replicas(client, nodes: list, stream: str, partitions: int) -> dict[int, list]:
    """ordinal -> every replica's NodeStatus entry (sms_pb2.ReplicaStatus)."""
    from sms.proto import sms_pb2, sms_pb2_grpc
    req = sms_pb2.NodeStatusRequest(chain_ids=[f"{stream}:{o}" for o in range(partitions)])
    # (sms.aio.Client.node_status leaves the archive's fields out: the raw answer)
    answers = await asyncio.gather(*(client._call(n.address, sms_pb2_grpc.ControlStub, "NodeStatus", req)
                                     for n in nodes))
    out: dict[int, list] = defaultdict(list)
    for resp in answers:
        for r in resp.replicas:
            name, _, ordinal = r.chain_id.rpartition(":")
            if name == stream:
                out[int(ordinal)].append(r)
    return out


async def _wait(what: str, check, deadline: float) -> float:
    """Polls `check()` (async, truthy when done) every POLL_S until `deadline`; the
    perf_counter time at which it held."""
    while True:
        if await check():
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done in time")
        await asyncio.sleep(POLL_S)


class ScrapeAuth(NamedTuple):
    """How a scrape reaches a node's /metrics: the cluster CA ("" for plaintext) and a
    key that may read it (a secure node wants one: node/metrics.py)."""
    ca_file: str
    token: str


def _scrape(url: str, auth: ScrapeAuth) -> dict[str, list]:
    from prometheus_client.parser import text_string_to_metric_families
    context = ssl.create_default_context(cafile=auth.ca_file) if url.startswith("https:") and auth.ca_file else None
    headers = {"Authorization": f"Bearer {auth.token}"} if auth.token else {}
    text = urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=context,
                                  timeout=SCRAPE_TIMEOUT_S).read().decode()
    out: dict[str, list] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name].append((sample.labels, sample.value))
    return out


async def _counters(nodes: list, auth: ScrapeAuth, stream: str) -> dict[str, float]:
    """The stream's sms_archive_* counters, summed over the storage nodes."""
    scheme = "https" if auth.ca_file else "http"
    scrapes = await asyncio.gather(*(asyncio.to_thread(_scrape, f"{scheme}://{n.metrics_address}/metrics", auth)
                                     for n in nodes if n.metrics_address))
    out: dict[str, float] = defaultdict(float)
    for samples in scrapes:
        for name, values in samples.items():
            if name.startswith("sms_archive_") and name.endswith("_total"):
                out[name[len("sms_archive_"):-len("_total")]] += sum(v for labels, v in values
                                                                     if labels.get("stream") == stream)
    return dict(out)


def _store_bytes(root: str) -> tuple[int, int]:
    """(files, bytes) under `root`."""
    files = size = 0
    for directory, _dirs, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                size += os.path.getsize(os.path.join(directory, name))
                files += 1
    return files, size


# --- the workloads -------------------------------------------------------------------------
async def _ingest(client, stream: str, recs: list, batch: int, lanes: int, meter: cpu.Meter) -> dict:
    """`lanes` concurrent loops of put_records over `recs` in groups of `batch`; the
    acknowledged (sn, data) of each partition under "acked"."""
    groups = [recs[i:i + batch] for i in range(0, len(recs), batch)]
    results: list = [None] * len(groups)
    errors: list[str] = []
    todo = iter(range(len(groups)))

    async def lane() -> None:
        for g in todo:
            try:
                results[g] = await client.put_records(stream, groups[g])
            except Exception as e:  # counted, shown in the result
                errors.append(repr(e)[:200])

    meter.start()
    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(lanes)))
    secs = time.perf_counter() - t0
    acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    failed = 0
    for g, out in enumerate(results):
        if out is None:
            failed += len(groups[g])
            continue
        for r, (_key, data) in zip(out.records, groups[g]):
            if r.ok:
                acked[r.partition_ordinal].append((r.sn, data))
            else:
                failed += 1
                if len(errors) < 5:
                    errors.append(f"{r.error_name}: {r.error_message}"[:200])
    n = sum(len(v) for v in acked.values())
    nbytes = sum(len(d) for v in acked.values() for _sn, d in v)
    for v in acked.values():
        v.sort()
    return {"records": len(recs), "acked": n, "failed": failed, "first_errors": errors[:5],
            "seconds": round(secs, 3), "records_per_s": round(n / secs), "mb_per_s": round(nbytes / secs / 1e6, 2),
            "data_bytes": nbytes, "cpu_per_record": meter.stop(n), "t0": t0, "t_end": t0 + secs,
            "path": f"client.put_records({batch} records), {lanes} concurrent lanes", "_acked": acked}


async def _put_tail(client, stream: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    """A few records on every partition (each partition's newest batch, kept locally)."""
    acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for attempt in range(20):
        recs = [(f"tail-{attempt}-{i}", f'{{"tail":{attempt},"i":{i}}}'.encode()) for i in range(TAIL_RECORDS)]
        out = await client.put_records(stream, recs)
        for r, (_key, data) in zip(out.records, recs):
            if r.ok:
                acked[r.partition_ordinal].append((r.sn, data))
        if all(acked.get(o) for o in range(partitions)):
            return acked
    raise RuntimeError(f"{stream}: tail records never reached every partition")


async def _read(client, stream: str, partitions: int, max_records: int,
                meter: cpu.Meter = cpu.NONE) -> tuple[dict, dict[int, list]]:
    """Every partition from TRIM_HORIZON to its first empty page, concurrently: records/s
    and the records of each partition (checked after the clock stops)."""
    pages: dict[int, list] = {o: [] for o in range(partitions)}
    calls = 0

    async def read(ordinal: int) -> None:
        nonlocal calls
        it = await client.get_iterator(stream, ordinal, "TRIM_HORIZON")
        while it:
            page = await client.get_next_records(it, max_records=max_records)
            calls += 1
            if not page.records:
                break
            pages[ordinal].append(page.records)
            it = page.next_iterator

    meter.start()
    t0 = time.perf_counter()
    await asyncio.gather(*(read(o) for o in range(partitions)))
    secs = time.perf_counter() - t0
    got = {o: [r for p in ps for r in p] for o, ps in pages.items()}
    n = sum(len(v) for v in got.values())
    cpu_figures = meter.stop(n)
    nbytes = sum(len(r.data) for v in got.values() for r in v)
    return ({"records": n, "seconds": round(secs, 3), "records_per_s": round(n / secs) if secs > 0 else None,
             "mb_per_s": round(nbytes / secs / 1e6, 2) if secs > 0 else None, "get_next_records_calls": calls,
             "cpu_per_record": cpu_figures,
             "consumer": f"one client, every partition concurrently, get_next_records(max_records={max_records}) "
                         f"from TRIM_HORIZON until an empty page"}, got)


def _verify(what: str, acked: dict[int, list], got: dict[int, list]) -> tuple[dict, list[str]]:
    """Every acknowledged record read back exactly once, in SN order, with its data."""
    problems = []
    per = {}
    for o in sorted(set(acked) | set(got)):
        want, have = acked.get(o, []), got.get(o, [])
        sns = [r.sn for r in have]
        ok = sns == [sn for sn, _ in want]
        if not ok:
            wanted, seen = {sn for sn, _ in want}, set(sns)
            in_order = all(a < b for a, b in zip(sns, sns[1:]))
            problems.append(f"{what} partition {o}: read {len(sns):,} records for {len(want):,} acknowledged: "
                            f"{len(wanted - seen):,} missing, {len(seen - wanted):,} never acknowledged, "
                            f"{len(sns) - len(seen):,} duplicated, {'in' if in_order else 'OUT OF'} SN order")
        else:
            bad = sum(r.data != d for r, (_sn, d) in zip(have, want))
            if bad:
                problems.append(f"{what} partition {o}: {bad:,} records read back with other data")
                ok = False
        per[str(o)] = {"acknowledged": len(want), "read": len(sns), "ok": ok}
    return {"exactly_once_in_order": not problems, "per_partition": per}, problems


def _cpu_total(figures: dict) -> float | None:
    """Every process's CPU microseconds per record of a workload's figures."""
    return (figures.get("cpu_per_record") or {}).get("total_us_per_record")


def _last_sns(acked: dict[int, list]) -> dict[int, int]:
    return {o: v[-1][0] for o, v in acked.items() if v}


async def _archived(client, nodes, stream: str, partitions: int, last: dict[int, int], field: str = "archived_sn"):
    reps = await _replicas(client, nodes, stream, partitions)
    return all(max((int(getattr(r, field) or 0) for r in reps.get(o, [])), default=0) >= sn
               for o, sn in last.items())


# --- one compression -----------------------------------------------------------------------
async def _codec(client, nodes: list, auth: ScrapeAuth, store: str, codec: str, recs: list, params: dict,
                 pids: dict[str, int]) -> tuple[dict, list[str]]:
    parts = params["partitions"]
    all_meter = cpu.Meter(pids)
    problems: list[str] = []
    out: dict = {"compression": codec}
    stream = f"archive-{codec}"
    url = f"file://{os.path.join(store, codec)}"
    layout = {"partitions": parts, "replication_factor": params["rf"], "ingestion_policy": POLICY,
              "archive": url, "retention_s": params["retention_s"], "compression": codec}

    # 1. ingest; 2. the archive following it (local copies kept until the local read is done)
    await client.create_stream(stream, archive_after_s=params["archive_after_s"], local_retention_s=LONG_S,
                               **layout)
    common.progress(f"archive {codec}: ingest {len(recs):,} click events into {stream!r} (archive_after_s "
                    f"{params['archive_after_s']})")
    ing = await _ingest(client, stream, recs, params["batch"], params["lanes"], all_meter)
    acked = ing.pop("_acked")
    t0, t_end = ing.pop("t0"), ing.pop("t_end")
    out["ingest"] = ing
    if ing["failed"]:
        problems.append(f"archive {codec} ingest: {ing['failed']} records failed, first: {ing['first_errors']}")
    common.progress(f"archive {codec}: ingest {ing['records_per_s']:,} records/s, {ing['mb_per_s']} MB/s, "
                    f"{_cpu_total(ing)} us CPU per record")
    last = _last_sns(acked)
    t_archived = await _wait(f"{stream}: archived", lambda: _archived(client, nodes, stream, parts, last),
                             time.monotonic() + params["wait_s"])
    counters = await _counters(nodes, auth, stream)
    raw, written = counters.get("raw_bytes", 0), counters.get("write_bytes", 0)
    secs = t_archived - t0
    out["archive_following_ingest"] = {
        "records": ing["acked"], "seconds_from_ingest_start": round(secs, 3),
        "seconds_after_ingest_end": round(t_archived - t_end, 3),
        "records_per_s": round(ing["acked"] / secs), "raw_mb_per_s": round(raw / secs / 1e6, 2),
        "archive_vs_ingest": common.ratio(ing["acked"] / secs, ing["records_per_s"]),
        "note": f"from the ingest's start until every tail's archived_sn reached the last acknowledged SN; the "
                f"archiver trails the ingest by archive_after_s ({params['archive_after_s']} s) and a check "
                f"interval, so this is at most the ingest rate (the archiver's own pace: archiver_backlog)"}
    common.progress(f"archive {codec}: archived {secs:.2f} s after the ingest started "
                    f"({t_archived - t_end:.2f} s after it ended): "
                    f"{out['archive_following_ingest']['records_per_s']:,} records/s, "
                    f"{out['archive_following_ingest']['raw_mb_per_s']} MB/s raw")

    # 3. compression
    files, on_disk = _store_bytes(os.path.join(store, codec, stream))
    out["compression_ratio"] = {
        "raw_bytes": int(raw), "written_bytes": int(written), "ratio": common.ratio(raw, written),
        "fragments": int(counters.get("fragments", 0)), "records_archived": int(counters.get("write_records", 0)),
        "files_in_store": files, "bytes_in_store": on_disk,
        "data_bytes_to_store_bytes": common.ratio(ing["data_bytes"], on_disk),
        "note": "raw / written from the nodes' sms_archive_raw_bytes and sms_archive_write_bytes (stored "
                "batches: headers, keys, data); data_bytes_to_store_bytes: the records' data alone against "
                "the fragment files on disk"}
    common.progress(f"archive {codec}: compression {out['compression_ratio']['ratio']} "
                    f"({int(raw):,} raw bytes -> {int(written):,} in {files} fragment files)")

    # 4a. catch-up read while every record is local
    read_a, got = await _read(client, stream, parts, params["max_records"], all_meter)
    check, bad = _verify(f"archive {codec} read while local", acked, got)
    got = None
    read_a["check"] = check
    problems += bad
    out["catch_up_read_local"] = read_a
    common.progress(f"archive {codec}: catch-up read while local {read_a['records_per_s']:,} records/s, "
                    f"{_cpu_total(read_a)} us CPU per record")

    # a tail that stays local (a log's newest batch is never deleted), local retention down
    # to local_retention_s, and wait until no replica holds the records read above
    tail = await _put_tail(client, stream, parts)
    firsts = {o: v[0][0] for o, v in tail.items()}
    t_drop = time.perf_counter()
    await client.update_stream(stream, local_retention_s=params["local_retention_s"])

    async def dropped() -> bool:
        reps = await _replicas(client, nodes, stream, parts)
        return all(reps.get(o) and all(int(r.first_sn or 0) >= sn for r in reps[o]) for o, sn in firsts.items())
    await _wait(f"{stream}: local copies dropped", dropped, time.monotonic() + params["wait_s"])
    out["local_copies_dropped_s"] = round(time.perf_counter() - t_drop, 3)
    common.progress(f"archive {codec}: every replica dropped its local copies {out['local_copies_dropped_s']} s "
                    f"after local_retention_s went to {params['local_retention_s']}")
    for o, v in tail.items():
        acked[o] = sorted(acked[o] + v)

    # 4b. the same catch-up read, now from the archive
    before = (await _counters(nodes, auth, stream)).get("read_records", 0)
    read_b, got = await _read(client, stream, parts, params["max_records"], all_meter)
    served = (await _counters(nodes, auth, stream)).get("read_records", 0) - before
    read_b["records_from_archive"] = int(served)
    read_b["records_tail_local"] = sum(len(v) for v in tail.values())
    check, bad = _verify(f"archive {codec} read from the archive", acked, got)
    got = None
    read_b["check"] = check
    problems += bad
    if served < ing["acked"]:
        problems.append(f"archive {codec}: the nodes served {int(served):,} records from the archive, "
                        f"expected at least {ing['acked']:,}")
    out["catch_up_read_archive"] = read_b
    out["archive_vs_local"] = common.ratio(read_b["records_per_s"], read_a["records_per_s"])
    common.progress(f"archive {codec}: catch-up read from the archive {read_b['records_per_s']:,} records/s "
                    f"({int(served):,} records served from fragments), {_cpu_total(read_b)} us CPU per record; "
                    f"archive / local {out['archive_vs_local']}")
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.delete_stream(stream), 30)

    if params["backlog_records"]:
        res, bad = await _backlog(client, nodes, auth, f"backlog-{codec}", layout, recs[:params["backlog_records"]],
                                  params, pids)
        out["archiver_backlog"] = res
        problems += bad
    return out, problems


async def _backlog(client, nodes, auth: ScrapeAuth, stream: str, layout: dict, recs: list, params: dict,
                   pids: dict[str, int]) -> tuple[dict, list[str]]:
    """The archivers' own pace and CPU: a stream written while archive_after_s is an
    hour, then lowered, so that all of it is due at once."""
    parts = layout["partitions"]
    await client.create_stream(stream, archive_after_s=LONG_S, local_retention_s=LONG_S, **layout)
    common.progress(f"archiver backlog: {len(recs):,} records into {stream!r} (archive_after_s {LONG_S})")
    ing = await _ingest(client, stream, recs, params["batch"], params["lanes"], cpu.NONE)
    acked = ing.pop("_acked")
    t_end = ing.pop("t_end")
    problems = [f"{stream} ingest: {ing['failed']} records failed, first: {ing['first_errors']}"] \
        if ing["failed"] else []
    last = _last_sns(acked)
    n = sum(len(v) for v in acked.values())
    # (every record old enough to be archived at once when archive_after_s changes)
    await asyncio.sleep(max(0.0, t_end + params["archive_after_s"] + BACKLOG_AGE_MARGIN_S - time.perf_counter()))
    meter = cpu.Meter({k: v for k, v in pids.items() if k in {node.node_id for node in nodes}})
    deadline = time.monotonic() + params["wait_s"]
    meter.start()
    t0 = time.perf_counter()
    await client.update_stream(stream, archive_after_s=params["archive_after_s"])
    t_archived = await _wait(f"{stream}: archived", lambda: _archived(client, nodes, stream, parts, last),
                             deadline)
    cpu_figures = meter.stop(n)
    counters = await _counters(nodes, auth, stream)
    raw = counters.get("raw_bytes", 0)
    secs = t_archived - t0
    out = {"records": n, "seconds": round(secs, 3), "records_per_s": round(n / secs),
           "raw_mb_per_s": round(raw / secs / 1e6, 2), "raw_bytes": int(raw),
           "ratio": common.ratio(raw, counters.get("write_bytes", 0)), "storage_cpu_per_record": cpu_figures,
           "note": f"a stream written while archive_after_s was {LONG_S} s, then lowered to "
                   f"{params['archive_after_s']} s once its newest record was older than that: from the "
                   f"update_stream call until every tail's archived_sn reached its last SN (the archivers' own "
                   f"pace, including up to one check interval before their first pass and the 0.1 s poll: for "
                   f"a backlog archived in a pass or two, a lower bound); CPU: the storage "
                   f"nodes' over that window (encoding, writing the fragment files, indexing; local copies stay: "
                   f"local_retention_s is {LONG_S} s, so nothing is verified or deleted yet)"}
    common.progress(f"archiver backlog: {n:,} records archived in {secs:.2f} s = {out['records_per_s']:,} records/s, "
                    f"{out['raw_mb_per_s']} MB/s raw; storage nodes "
                    f"{(cpu_figures or {}).get('total_us_per_record')} us CPU per record")
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.delete_stream(stream), 30)
    return out, problems


# --- the bench -----------------------------------------------------------------------------
def run(params: dict) -> dict:
    from node.launcher import LocalCluster
    from sms import aio
    t_start = time.perf_counter()
    base = tempfile.mkdtemp(prefix="sms-bench-archive-")
    store = os.path.join(base, "store")
    os.makedirs(store)
    recs = click_events(params["records"])
    sizes = sorted(len(d) for _k, d in recs)
    old_env = {k: os.environ.get(k) for k in NODE_ENV}
    os.environ.update(NODE_ENV)
    result: dict = {"bench": "archive", "parameters": params, "node_env": NODE_ENV,
                    "load_average": {"start": [round(x, 2) for x in os.getloadavg()]},
                    "record_bytes": {"min": sizes[0], "median": sizes[len(sizes) // 2], "max": sizes[-1]},
                    "codecs": {}}
    problems: list[str] = []
    cluster = None
    try:
        common.progress(f"archive: starting LocalCluster, control + {params['nodes']} storage nodes")
        cluster = LocalCluster(os.path.join(base, "c"), nodes=params["nodes"], port=0).start()
        pids = cpu.cluster_pids(cluster)

        async def main() -> None:
            async with aio.Client(cluster.address, **cluster.client_options()) as client:
                nodes = await _storage_nodes(client)
                for codec in params["codecs"]:
                    try:
                        res, bad = await _codec(client, nodes, ScrapeAuth(cluster.ca_file, cluster.admin_token), store,
                                                codec, recs, params, pids)
                    except Exception as e:
                        res, bad = {"error": repr(e)[:500]}, [f"archive {codec}: {e!r}"[:500]]
                        common.progress(f"archive {codec}: ERROR {e!r}")
                    result["codecs"][codec] = res
                    problems.extend(bad)
        asyncio.run(main())
    finally:
        if cluster is not None:
            cluster.stop()
            gone = {k: v for k, v in cluster.exited().items() if v not in (0, -15)}
            if gone:
                problems.append(f"archive: processes ended badly: {gone}")
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(base, ignore_errors=True)
    result["load_average"]["end"] = [round(x, 2) for x in os.getloadavg()]
    result["problems"] = problems
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    return result


def run_preset(preset: str = "quick") -> dict:
    """bench/run.py's extra: the defaults at one of PRESETS."""
    return run({**DEFAULTS, **PRESETS[preset]})


def targets(result) -> list[dict]:
    """One target per compression: catch-up read from the archive / read while local >= 0.5."""
    out = []
    codecs = (result or {}).get("codecs") if isinstance(result, dict) else None
    for codec in (codecs or {}) or DEFAULTS["codecs"]:
        name = f"archive catch-up read / local catch-up read, compression {codec}"
        c = (codecs or {}).get(codec)
        value = c.get("archive_vs_local") if isinstance(c, dict) else None
        if value is None:
            why = (f"archive bench failed: {c['error']}" if isinstance(c, dict) and c.get("error") else
                   f"archive bench skipped: {result['skipped']}" if isinstance(result, dict) and result.get("skipped")
                   else f"archive bench failed: {result['error']}" if isinstance(result, dict) and result.get("error")
                   else "archive bench: not measured")
            out.append(common.target(name, None, GOAL_ARCHIVE_VS_LOCAL, detail=why))
            continue
        a, b = c["catch_up_read_local"], c["catch_up_read_archive"]
        out.append(common.target(name, value, GOAL_ARCHIVE_VS_LOCAL,
                                 detail=f"{b['records_per_s']:,} records/s from the fragments "
                                        f"({b['records_from_archive']:,} records) vs {a['records_per_s']:,} "
                                        f"records/s from local storage; one client, 4 partitions concurrently"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    ap.add_argument("--records", type=int, help="instead of the preset's")
    ap.add_argument("--codecs", default=",".join(DEFAULTS["codecs"]), help="comma-separated: zstd,none")
    args = ap.parse_args(argv)
    params = {**DEFAULTS, **PRESETS[args.preset], "codecs": [c for c in args.codecs.split(",") if c]}
    if args.records:
        params["records"] = args.records
    common.tune_gc()
    result = run(params)
    result["targets"] = targets(result)
    print(json.dumps(result, indent=2, default=str))
    common.print_verdicts(result["targets"], result["problems"])
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
