"""The benchmark suite of issue 7: SMS workloads and their baselines, measured in one run.

    .venv/bin/python -m bench.run [--quick (default) | --full | --smoke] [--out DIR] [--skip-peers]

- quick (`make bench`): the reference point only (ingest, catch-up read of what it wrote,
  ack latency at 10/50/80 % of the measured max, end-to-end latency), every baseline with
  small record counts, and the failover / repartition / growth benches in their smallest
  variants; under 3 minutes on a 2-core machine;
- full: the same with the big record counts, plus the ingest sweeps one factor at a time
  around the reference point (record size, replication, persistence, dedup, partitions,
  producers), the catch-up read of 1M records and the full extra benches;
- smoke: everything tiny, only checking that every piece still runs (< 60 s).

The reference point: 100-byte records, batches of 500, replication 3, persistence "disk",
dedup on (ingestion policy "at_least_once_no_dup", de-duplicating producers), 4
partitions, 8 producers. Baselines in the same run: raw LMDB, gRPC echo (limits), Redis
Streams (appendfsync always) and NATS JetStream R1/R3 (peers; --skip-peers skips them).

Prints one JSON document on stdout and writes it to DIR/latest.json (default
bench/results/), draws the charts into DIR (bench/chart.py), and ends with one line per
target on stderr. Progress lines go to stderr. The exit status is 1 if a phase raised (its
traceback is in the JSON under "errors") or records were failed / lost / miscounted (under
"problems"), else 0; a missed target is not a failure.
Never a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

from bench import common

# --- every record count and duration of each mode -----------------------------------------
MODES: dict[str, dict] = {
    "smoke": {
        "reference_records": 5_000,           # reference ingest; the catch-up read reads these back
        "sweeps": {"dedup": [True, False], "replication": [1, 3, 5], "partitions": [1, 4]},
        "sweep_records": 2_000,               # per sweep point
        "sweep_bytes_max": 20_000_000,        # per sweep point: fewer records of big sizes
        "ack_fractions": [0.1, 0.5, 0.8],
        "ack_duration_s": 0.5,
        "e2e_fraction": 0.5,                  # offered load of the end-to-end run, of the max
        "e2e_duration_s": 0.5,
        "phase_timeout_s": 60,
        "raw_lmdb": {"records": 5_000},
        "grpc_echo": {"records": 5_000, "duration_s": 0.15},
        "redis_streams": {"records": 5_000, "latency_duration_s": 0.5},
        "nats_js": {"records": 5_000, "latency_duration_s": 0.5},
        "extras": {"failover_pause": {"smoke": True, "heal_timeout_s": 30.0, "flush_timeout_s": 30.0},
                   "repartition_pause": {"keys": 10, "interval_ms": 100.0, "partitions": 2, "rf": 2,
                                         "warmup_s": 0.5, "settle_s": 0.2},
                   "growth": {"smoke": True}},
    },
    "quick": {
        "reference_records": 1_000_000,       # also the catch-up read: the 1M records
        "sweeps": {},
        "sweep_records": 0,
        "sweep_bytes_max": 0,
        "ack_fractions": [0.1, 0.5, 0.8],
        "ack_duration_s": 4.0,
        "e2e_fraction": 0.5,
        "e2e_duration_s": 3.0,
        "phase_timeout_s": 90,
        "raw_lmdb": {"records": 200_000},
        "grpc_echo": {"records": 100_000, "duration_s": 0.6},
        "redis_streams": {"records": 100_000, "latency_duration_s": 2.0},
        "nats_js": {"records": 50_000, "latency_duration_s": 2.0},
        "extras": {"failover_pause": {"smoke": True, "heal_timeout_s": 30.0, "flush_timeout_s": 30.0},
                   "repartition_pause": {"keys": 20, "interval_ms": 50.0, "partitions": 2, "rf": 2,
                                         "warmup_s": 1.0, "settle_s": 0.5},
                   "growth": {"smoke": True}},
    },
    "full": {
        "reference_records": 1_000_000,
        "sweeps": {"size": [100, 1024, 10240], "replication": [1, 3, 5], "persistence": ["disk", "disk_async"],
                   "dedup": [True, False], "partitions": [1, 4, 16, 64], "producers": [1, 8, 64]},
        "sweep_records": 200_000,
        "sweep_bytes_max": 100_000_000,
        "ack_fractions": [0.1, 0.5, 0.8],
        "ack_duration_s": 10.0,
        "e2e_fraction": 0.5,
        "e2e_duration_s": 10.0,
        "phase_timeout_s": 900,
        "raw_lmdb": {"records": 1_000_000},
        "grpc_echo": {"records": 500_000, "duration_s": 4.0},
        "redis_streams": {"records": 200_000, "latency_duration_s": 5.0},
        "nats_js": {"records": 200_000, "latency_duration_s": 5.0},
        "extras": {"failover_pause": {},
                   "repartition_pause": {"keys": 200, "interval_ms": 100.0, "partitions": 2, "rf": 2,
                                         "warmup_s": 2.0, "settle_s": 2.0},
                   "growth": {}},
    },
}

REFERENCE = {"size": 100, "batch": 500, "replication": 3, "persistence": "disk", "dedup": True,
             "partitions": 4, "producers": 8}
CATCH_UP_GOAL_RECORDS = 1_000_000
LATENCY_TARGET_FRACTION = 0.5
PEERS = ("redis_streams", "nats_js")
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


class Run:
    """Collects the phases' errors; a phase that raises is recorded, the run goes on."""

    def __init__(self) -> None:
        self.errors: list[dict] = []

    def failed(self, phase: str, e: BaseException) -> dict:
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        self.errors.append({"phase": phase, "error": repr(e)[:500], "traceback": tb})
        common.progress(f"ERROR in {phase}: {e!r}\n{tb}")
        return {"error": repr(e)[:500]}

    def call(self, phase: str, fn, *args, **kwargs):
        common.progress(f"== {phase}")
        t0 = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
        except Exception as e:
            return self.failed(phase, e)
        if isinstance(out, dict):
            out.setdefault("phase_wall_s", round(time.perf_counter() - t0, 1))
        return out

    async def acall(self, phase: str, coro, timeout_s: float):
        """Await `coro` with a deadline; a timeout or an exception becomes {"error": ...}."""
        common.progress(f"== {phase}")
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=15)
            return self.failed(phase, TimeoutError(f"{phase} did not finish within {timeout_s} s"))
        try:
            return task.result()
        except Exception as e:
            return self.failed(phase, e)


# --- SMS ------------------------------------------------------------------------------------------
def _point_name(factor: str, value) -> str:
    v = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
    return f"{factor}-{v}".replace("_", "-")


async def _ingest_point(run: Run, client, cfg: dict, stream: str, point: dict, records: int, phase: str) -> dict:
    from bench import sms_workloads as w
    created = await run.acall(f"{phase}: create", w.create(client, stream, point["partitions"], point["replication"],
                                                            point["persistence"], point["dedup"]), 60)
    if "error" in created:
        return {"config": point, "error": created["error"]}
    common.progress(f"{phase}: ingest {records:,} records of {point['size']} B, batches of {point['batch']}, "
                    f"{point['producers']} producers, dedup {'on' if point['dedup'] else 'off'}, "
                    f"{point['partitions']} partitions, RF {point['replication']}, {point['persistence']}")
    out = await run.acall(f"{phase}: ingest", w.ingest(client, stream, records, point["size"], point["batch"],
                                                        point["producers"], point["dedup"], tag=phase),
                          cfg["phase_timeout_s"])
    if "error" not in out:
        common.progress(f"{phase}: {out['records_per_s']:,} records/s, {out['mb_per_s']} MB/s"
                        + (f", {out['failed']} FAILED: {out['first_errors']}" if out["failed"] else ""))
    return {"config": point, "stream": created, **out}


async def _reference(run: Run, client, cfg: dict) -> dict:
    """Ingest at the reference point, read it all back, ack latency and end-to-end latency."""
    from bench import sms_workloads as w
    ref = REFERENCE
    stream = "reference"
    out: dict = {"config": ref}
    ingest = await _ingest_point(run, client, cfg, stream, ref, cfg["reference_records"], "sms reference")
    out["ingest"] = ingest
    if "error" in ingest:
        return out
    written = ingest["acked"]
    catch = await run.acall("sms catch-up read", w.catch_up_read(client, stream, written), cfg["phase_timeout_s"])
    if "error" not in catch and written < CATCH_UP_GOAL_RECORDS:
        catch["note"] = (f"{written:,} records instead of {CATCH_UP_GOAL_RECORDS:,} (the records the reference "
                         f"ingest wrote; this mode's time budget); --full reads 1M")
    out["catch_up_read"] = catch
    max_rate = ingest["records_per_s"]
    if not max_rate:
        out["ack_latency"] = out["end_to_end_latency"] = {"error": "no ingest rate measured"}
        return out
    n_fr = len(cfg["ack_fractions"])
    out["ack_latency"] = await run.acall(
        "sms ack latency", w.ack_latency(client, stream, ref["size"], ref["batch"], ref["producers"], ref["dedup"],
                                         max_rate, tuple(cfg["ack_fractions"]), cfg["ack_duration_s"]),
        cfg["phase_timeout_s"] + n_fr * cfg["ack_duration_s"])
    out["ack_latency_max_records_per_s"] = max_rate
    out["end_to_end_latency"] = await run.acall(
        "sms end-to-end latency",
        w.end_to_end_latency(client, stream, ref["size"], ref["batch"], ref["producers"], ref["dedup"],
                             cfg["e2e_fraction"] * max_rate, cfg["e2e_duration_s"]),
        cfg["phase_timeout_s"] + cfg["e2e_duration_s"])
    if "error" not in out["end_to_end_latency"]:
        out["end_to_end_latency"]["fraction_of_max"] = cfg["e2e_fraction"]
    return out


async def _delete(client, stream: str) -> None:
    with contextlib.suppress(Exception):        # (only to free the cluster; not a figure)
        await asyncio.wait_for(client.delete_stream(stream), 30)


async def sms_suite(run: Run, cfg: dict, workdir: str) -> dict:
    from sms import aio
    from sms.launcher import LocalCluster
    # the sweep points, grouped by the storage nodes they need (RF 5 needs 5)
    points: list[tuple[str, object, dict]] = []
    for factor, values in cfg["sweeps"].items():
        for v in values:
            points.append((factor, v, {**REFERENCE, factor: v}))
    out: dict = {"reference": None, "sweeps": {f: [] for f in cfg["sweeps"]}, "clusters": []}
    by_nodes: dict[int, list] = {}
    for p in points:
        by_nodes.setdefault(max(3, p[2]["replication"]), []).append(p)
    by_nodes.setdefault(3, [])
    for nodes in sorted(by_nodes):
        t0 = time.perf_counter()
        common.progress(f"== sms: starting LocalCluster, control + {nodes} storage nodes")
        try:
            cluster = LocalCluster(os.path.join(workdir, f"sms-{nodes}"), nodes=nodes, port=0).start()
        except Exception as e:
            out["clusters"].append({"storage_nodes": nodes, **run.failed(f"sms cluster of {nodes} nodes", e)})
            continue
        info = {"storage_nodes": nodes, "start_s": round(time.perf_counter() - t0, 2)}
        try:
            async with aio.Client(cluster.address) as client:
                if nodes == 3:
                    out["reference"] = await _reference(run, client, cfg)
                    await _delete(client, "reference")
                for factor, value, point in by_nodes[nodes]:
                    entry = {"factor": factor, "value": value}
                    if point == REFERENCE and out["reference"] and "error" not in out["reference"]["ingest"]:
                        ref = out["reference"]["ingest"]
                        out["sweeps"][factor].append({**entry, "is_reference_point": True, **ref,
                                                      "note": "the reference point's ingest (reference_records)"})
                        continue
                    stream = _point_name(factor, value)
                    res = await _ingest_point(run, client, cfg, stream, point,
                                              _sweep_records(cfg, point), f"sms sweep {stream}")
                    out["sweeps"][factor].append({**entry, "is_reference_point": point == REFERENCE, **res})
                    await _delete(client, stream)
        finally:
            t1 = time.perf_counter()
            cluster.stop()
            info["exited_early"] = {k: v for k, v in cluster.exited().items() if v not in (0, -15)}
            info["stop_s"] = round(time.perf_counter() - t1, 2)
            out["clusters"].append(info)
    for factor in out["sweeps"]:
        order = cfg["sweeps"][factor]
        out["sweeps"][factor].sort(key=lambda e: order.index(e["value"]))
    return out


def _sweep_records(cfg: dict, point: dict) -> int:
    n = min(cfg["sweep_records"], cfg["sweep_bytes_max"] // point["size"])
    return max(n, point["batch"], point["producers"])


# --- baselines and extra benches ------------------------------------------------------------------
def baselines(run: Run, cfg: dict, workdir: str, skip_peers: bool) -> dict:
    from bench.baselines import grpc_echo, nats_js, raw_lmdb, redis_streams
    ref = REFERENCE
    common_args = {"size": ref["size"], "batch": ref["batch"]}
    out: dict = {}

    def sub(name: str) -> str:
        d = os.path.join(workdir, name)
        os.makedirs(d, exist_ok=True)
        return d

    out["raw_lmdb"] = run.call("baseline raw_lmdb", raw_lmdb.run, sub("raw_lmdb"), **common_args, **cfg["raw_lmdb"])
    out["grpc_echo"] = run.call("baseline grpc_echo", lambda: asyncio.run(
        grpc_echo.run(sub("grpc_echo"), **common_args, **cfg["grpc_echo"])))
    for name, mod in (("redis_streams", redis_streams), ("nats_js", nats_js)):
        if skip_peers:
            out[name] = {"skipped": "--skip-peers"}
            continue
        out[name] = run.call(f"baseline {name}", lambda m=mod, n=name: asyncio.run(
            m.run(sub(n), **common_args, latency_fraction=LATENCY_TARGET_FRACTION, **cfg[n])))
    return out


def extras(run: Run, cfg: dict, workdir: str) -> dict:
    out: dict = {}
    for name, params in cfg["extras"].items():
        if params is None:
            out[name] = {"skipped": "not run in this mode (time budget)"}
            continue
        if name == "failover_pause":
            from bench import failover_pause
            out[name] = run.call("extra failover_pause", failover_pause.run, dict(params))
        elif name == "growth":
            from bench import growth
            out[name] = run.call("extra growth", growth.run, dict(params))
        elif name == "repartition_pause":
            out[name] = run.call("extra repartition_pause", _repartition, params, workdir)
    return out


def _repartition(params: dict, workdir: str) -> dict:
    from bench import repartition_pause
    ns = argparse.Namespace(size=100, **params)
    t0 = time.perf_counter()
    res = asyncio.run(repartition_pause.run(ns))
    return {"bench": "repartition_pause", "parameters": vars(ns),
            "offered_records_per_s": round(ns.keys * 1000 / ns.interval_ms), **res,
            "wall_s": round(time.perf_counter() - t0, 1)}


# --- targets --------------------------------------------------------------------------------------
def _get(d, *path):
    for p in path:
        if isinstance(d, dict):
            d = d.get(p)
        elif isinstance(d, list) and isinstance(p, int) and -len(d) <= p < len(d):
            d = d[p]
        else:
            return None
    return d


def _why_missing(d, what: str) -> str:
    if d is None:
        return f"{what}: not measured"
    if isinstance(d, dict) and d.get("skipped"):
        return f"{what} skipped: {d['skipped']}"
    if isinstance(d, dict) and d.get("error"):
        return f"{what} failed: {d['error']}"
    return f"{what}: figure missing"


def targets(sms: dict | None, base: dict) -> list[dict]:
    ref = _get(sms, "reference") or {}
    ingest = _get(ref, "ingest", "records_per_s")
    ingest_why = _why_missing(_get(ref, "ingest"), "sms reference ingest")
    out = []

    def versus(name: str, goal: float, peer, peer_value, peer_what: str, detail: str) -> dict:
        if not ingest:
            return common.target(name, None, goal, detail=ingest_why)
        if not peer_value:
            return common.target(name, None, goal, detail=_why_missing(peer, peer_what))
        return common.target(name, ingest / peer_value, goal,
                             detail=f"sms {ingest:,} records/s vs {peer_value:,} records/s; {detail}")

    redis = base.get("redis_streams")
    out.append(versus("ingest / Redis Streams (appendfsync always) ingest", 2.0, redis,
                      _get(redis, "ingest_records_per_s"), "redis_streams", "same records and batch size"))
    nats = base.get("nats_js")
    r3 = _get(nats, "r3")
    out.append(versus("ingest / NATS JetStream R3 ingest", 5.0, nats if r3 is None else r3,
                      _get(r3, "ingest_records_per_s"), "nats_js r3", "same records and batch size"))
    raw = base.get("raw_lmdb")
    out.append(versus("ingest / raw LMDB sync append", 0.25, raw, _get(raw, "append_records_per_s"),
                      "raw_lmdb", "raw_lmdb append_records_per_s (per-record keys, one synced txn per batch)"))

    # p99 ack latency at 50 % of the max vs NATS R3's batch ack p99 at 50 % of its max
    acks = _get(ref, "ack_latency")
    name = "p99 ack latency at 50% load / NATS R3 batch ack p99 at 50% load"
    at50 = next((a for a in acks if a.get("fraction_of_max") == LATENCY_TARGET_FRACTION), None) \
        if isinstance(acks, list) else None
    p99 = _get(at50, "latency", "p99_ms")
    nats_p99 = _get(r3, "batch_ack_latency", "latency", "p99_ms")
    nats_sync_p99 = _get(r3, "sync_publish_latency", "latency", "p99_ms")
    if not p99:
        t = common.target(name, None, 2.0, higher_is_better=False,
                          detail=_why_missing(acks if at50 is None else at50, "sms ack latency at 50%"))
    elif not nats_p99:
        t = common.target(name, None, 2.0, higher_is_better=False,
                          detail=_why_missing(nats if r3 is None else r3, "nats_js r3 batch ack latency"))
    else:
        extra = f"; {at50['errors']} sms calls failed, {at50['dropped']} dropped" \
            if at50.get("errors") or at50.get("dropped") else ""
        t = common.target(name, p99 / nats_p99, 2.0, higher_is_better=False,
                          detail=f"sms p99 {p99} ms ({at50['latency']['count']} calls of {at50['records_per_call']}) "
                                 f"vs NATS R3 p99 {nats_p99} ms ({_get(r3, 'batch_ack_latency', 'latency', 'count')} "
                                 f"windows of {_get(r3, 'batch_ack_latency', 'records_per_call')}){extra}")
    t["goal_op"] = "<="
    t["extra_ratio_to_nats_r3_sync_publish_p99"] = common.ratio(p99, nats_sync_p99)
    t["nats_r3_sync_publish_p99_ms"] = nats_sync_p99
    out.append(t)

    catch = _get(ref, "catch_up_read")
    rate = _get(catch, "records_per_s")
    name = "catch-up read records/s (absolute)"
    if not rate:
        out.append(common.target(name, None, 1e6, detail=_why_missing(catch, "sms catch-up read")))
    else:
        ok = "" if catch.get("count_matches") else \
            f"; COUNT MISMATCH: read {catch['records_read']:,}, expected {catch['records_expected']:,}"
        out.append(common.target(name, rate, 1e6, detail=f"{catch['records_read']:,} records, one consumer, "
                                                          f"from TRIM_HORIZON{ok}"))
    return out


def problems(result: dict) -> list[str]:
    """What went wrong without an exception: failed or lost records, count mismatches,
    failed open-loop calls, nodes that died. Each one makes the exit status 1."""
    out: list[str] = []
    sms = result.get("sms") or {}
    ref = sms.get("reference") or {}
    points = [("reference ingest", ref.get("ingest"))] + [
        (f"sweep {e.get('factor')}={e.get('value')}", e) for v in (sms.get("sweeps") or {}).values() for e in v]
    for name, r in points:
        if isinstance(r, dict) and r.get("failed"):
            out.append(f"sms {name}: {r['failed']} records failed, first: {r.get('first_errors')}")
    catch = ref.get("catch_up_read")
    if isinstance(catch, dict) and catch.get("count_matches") is False:
        out.append(f"sms catch-up read: read {catch['records_read']:,} records, expected {catch['records_expected']:,}")
    for a in ref.get("ack_latency") if isinstance(ref.get("ack_latency"), list) else []:
        if a.get("errors") or a.get("dropped"):
            out.append(f"sms ack latency at {a['fraction_of_max']:.0%}: {a['errors']} calls failed, "
                       f"{a['dropped']} dropped; first error: {a.get('first_error')}")
    e2e = ref.get("end_to_end_latency")
    if isinstance(e2e, dict) and (e2e.get("missing") or e2e.get("reader_errors") or e2e.get("ack_errors")):
        out.append(f"sms end-to-end: {e2e.get('missing')} acked records never received, "
                   f"reader errors {e2e.get('reader_errors')}, {e2e.get('ack_errors')} failed sends "
                   f"(first: {e2e.get('first_ack_error')})")
    for c in sms.get("clusters") or []:
        if c.get("exited_early"):
            out.append(f"sms cluster of {c['storage_nodes']} nodes: processes ended badly: {c['exited_early']}")
    rb = _get(result, "extras", "failover_pause", "read_back")
    if isinstance(rb, dict) and (rb.get("acked_lost") or rb.get("duplicated_records")):
        out.append(f"failover_pause: {rb.get('acked_lost')} acknowledged records lost, "
                   f"{rb.get('duplicated_records')} duplicated")
    return out


# --- the driver -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick", help="the default (< 3 min)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full", help="the sweeps, 1M records")
    mode.add_argument("--smoke", dest="mode", action="store_const", const="smoke", help="tiny: does it all run")
    p.add_argument("--out", default=RESULTS_DIR, help="directory of latest.json and the charts")
    p.add_argument("--skip-peers", action="store_true", help="skip Redis Streams and NATS JetStream")
    args = p.parse_args(argv)
    mode_name = args.mode or "quick"
    cfg = MODES[mode_name]
    t_start = time.perf_counter()
    run = Run()
    common.progress(f"bench.run --{mode_name}{' --skip-peers' if args.skip_peers else ''}")
    gc_tuning = common.tune_gc()             # every in-process client alike, ours and the peers'
    result: dict = {"bench": "sms_suite", "mode": mode_name, "started_unix": round(time.time()),
                    "machine": {**common.machine(), "client_gc": gc_tuning},
                    "parameters": {"reference": REFERENCE, "mode": cfg, "skip_peers": args.skip_peers,
                                   "latency_target_fraction": LATENCY_TARGET_FRACTION}}
    workdir = tempfile.mkdtemp(prefix="sms-bench-run-")
    try:
        t0 = time.perf_counter()
        try:
            result["sms"] = asyncio.run(sms_suite(run, cfg, workdir))
        except Exception as e:
            result["sms"] = run.failed("sms", e)
        result["sms"]["wall_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        result["baselines"] = baselines(run, cfg, workdir, args.skip_peers)
        result["baselines"]["wall_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        result["extras"] = extras(run, cfg, workdir)
        result["extras"]["wall_s"] = round(time.perf_counter() - t0, 1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    try:
        result["targets"] = targets(result.get("sms"), result.get("baselines", {}))
    except Exception as e:
        result["targets"] = [run.failed("targets", e)]
    try:
        result["problems"] = problems(result)
    except Exception as e:
        result["problems"] = [f"problems() failed: {e!r}"]
    result["errors"] = run.errors
    result["wall_s"] = round(time.perf_counter() - t_start, 1)

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "latest.json")

    def write() -> None:
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=2, default=str)
            f.write("\n")
        os.replace(path + ".tmp", path)

    write()                                   # before the charts: a chart failure loses nothing
    try:
        from bench import chart
        result["charts"] = chart.charts(result, args.out)
    except Exception as e:
        result["charts"] = run.failed("charts", e)
        result["errors"] = run.errors
    write()
    print(json.dumps(result, indent=2, default=str))

    common.progress(f"done in {result['wall_s']} s ({mode_name}); JSON in {path}")
    for t in result["targets"]:
        if "target" not in t:
            continue
        verdict = {True: "MET", False: "MISSED", None: "N/A"}[t["met"]]
        op = t.get("goal_op", ">=")
        value = "None" if t["value"] is None else f"{t['value']:,.3f}"
        print(f"TARGET {verdict:6} {t['target']}: {value} (goal {op} {t['goal']:,}) - {t['detail']}",
              file=sys.stderr)
    for e in run.errors:
        print(f"ERROR  {e['phase']}: {e['error']}", file=sys.stderr)
    for text in result["problems"]:
        print(f"PROBLEM {text}", file=sys.stderr)
    return 1 if run.errors or result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
