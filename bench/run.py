"""The benchmark suite of issues 7 and 13: SMS workloads and their baselines, measured in one run.

    .venv/bin/python -m bench.run [--quick (default) | --full | --smoke] [--out DIR] [--skip-peers]

- quick (`make bench`): the reference point only (ingest, catch-up read of what it wrote,
  ack latency at 10/50/80 % of the measured max, end-to-end latency), the same ingest at
  replication 1, single `put_record` latency on the idle cluster, every baseline with
  small record counts, and the failover / repartition / growth benches in their smallest
  variants, and the other extras (idle cost, TLS, throttling, consumer groups, the archive
  tier of issue 18: bench/archive.py, the Kinesis endpoint through boto3 against kinesalite
  and boto3's ceiling, and SubscribeToShard latency, of issue 32: bench/kinesis.py) at their
  quick presets; under 3 minutes on a 2-core machine;
- full: the same with the big record counts, plus the ingest sweeps one factor at a time
  around the reference point (record size, replication, persistence, dedup, partitions,
  producers), the catch-up read of 1M records and the full extra benches;
- smoke: everything tiny, only checking that every piece still runs (< 60 s).

The reference point: 100-byte records, batches of 500, replication 3, persistence "disk",
dedup on (ingestion policy "at_least_once_no_dup", de-duplicating producers), 4
partitions, 8 producers. Baselines in the same run: raw LMDB, gRPC echo (limits), Redis
Streams (appendfsync always; through redis-py and through its own C client,
redis-benchmark) and NATS JetStream R1/R3 (peers; --skip-peers skips them). Like is
compared with like: RF 3 with NATS R3, RF 1 with a single Redis. Every SMS figure carries
the CPU microseconds per record of each process (bench/cpu.py: the control process, each
storage node and this client process, from /proc/<pid>/stat).

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
import copy
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

from bench import common

# --- every record count and duration of each mode -----------------------------------------
MODE_NAMES = ("smoke", "quick", "full")
# each setting's value in (smoke, quick, full)
_SETTINGS: dict[str, tuple] = {
    "reference_records": (5_000, 1_000_000, 1_000_000),      # reference ingest (quick: the 1M records);
                                                             # the catch-up read reads these back
    "rf1_records": (2_000, 500_000, 1_000_000),              # the reference ingest at replication 1
    "put_record_calls": (20, 300, 1_000),                    # single put_record calls, one at a time, idle cluster
    "sync_producer_records": (2_000, 300_000, 1_000_000),    # one SyncProducer, send() per record, one thread
    "sweeps": ({"dedup": [True, False], "replication": [1, 3, 5], "partitions": [1, 4]}, {},
               {"size": [100, 1024, 10240], "replication": [1, 3, 5], "persistence": ["disk", "disk_async"],
                "dedup": [True, False], "partitions": [1, 4, 16, 64], "producers": [1, 8, 64]}),
    "sweep_records": (2_000, 0, 200_000),                    # per sweep point
    "sweep_bytes_max": (20_000_000, 0, 100_000_000),         # per sweep point: fewer records of big sizes
    "ack_fractions": ([0.1, 0.5, 0.8],) * 3,
    "ack_duration_s": (0.5, 4.0, 10.0),
    "e2e_fraction": (0.5,) * 3,                              # offered load of the end-to-end run, of the max
    "e2e_duration_s": (0.5, 3.0, 10.0),
    "phase_timeout_s": (60, 90, 900),
    "raw_lmdb": ({"records": 5_000}, {"records": 200_000}, {"records": 1_000_000}),
    "grpc_echo": ({"records": 5_000, "duration_s": 0.15}, {"records": 100_000, "duration_s": 0.6},
                  {"records": 500_000, "duration_s": 4.0}),
    "redis_streams": ({"records": 5_000, "latency_duration_s": 0.5, "benchmark_records": 5_000},
                      {"records": 100_000, "latency_duration_s": 2.0, "benchmark_records": 500_000},
                      {"records": 200_000, "latency_duration_s": 5.0, "benchmark_records": 1_000_000}),
    "nats_js": ({"records": 5_000, "latency_duration_s": 0.5}, {"records": 50_000, "latency_duration_s": 2.0},
                {"records": 200_000, "latency_duration_s": 5.0}),
}
# the extra measurements (bench/extras), in the order they run, each's options in (smoke, quick, full)
_EXTRAS: dict[str, tuple] = {
    "failover_pause": ({"smoke": True, "heal_timeout_s": 30.0, "flush_timeout_s": 30.0},) * 2 + ({},),
    "repartition_pause": tuple({"keys": keys, "interval_ms": interval_ms, "partitions": 2, "rf": 2,
                                "warmup_s": warmup_s, "settle_s": settle_s}
                               for keys, interval_ms, warmup_s, settle_s in ((10, 100.0, 0.5, 0.2),
                                                                            (20, 50.0, 1.0, 0.5),
                                                                            (200, 100.0, 2.0, 2.0))),
    "growth": ({"smoke": True}, {"smoke": True}, {}),
    "rebalance": ({"smoke": True}, {"quick": True}, {}),
    "idle_cost": ({"steps": [40], "idle_s": 1.0, "settle_s": 1.0, "load_records": 4_000},
                  {"steps": [40, 400], "idle_s": 3.0, "settle_s": 2.0, "load_records": 20_000},
                  {"steps": [40, 400, 4000], "idle_s": 5.0, "settle_s": 12.0, "load_records": 40_000}),
}
_PRESET_EXTRAS = ("tls_cost", "encryption_cost", "throttle", "consumer_group", "archive",   # {"preset": <mode>}
                  "kinesis", "queues", "channels")

MODES: dict[str, dict] = {
    mode: copy.deepcopy({**{name: values[i] for name, values in _SETTINGS.items()},
                         "extras": {**{name: values[i] for name, values in _EXTRAS.items()},
                                    **{name: {"preset": mode} for name in _PRESET_EXTRAS}}})
    for i, mode in enumerate(MODE_NAMES)}

REFERENCE = {"size": 100, "batch": 500, "replication": 3, "persistence": "disk", "dedup": True,
             "partitions": 4, "producers": 8}
RF1 = {**REFERENCE, "replication": 1}        # compared with a single Redis
CATCH_UP_GOAL_RECORDS = 1_000_000
STREAM_CREATE_TIMEOUT_S = 60
# the goals: issue 33's "Done means" (issue 13's table before it: raw LMDB 0.30, RF 1 0.5,
# catch-up 2M Records/s and 10M Arrow rows/s, CPU 10 us)
LOG_TAIL_LINES = 80                 # of a node that ended badly, kept in the JSON
GOAL_RAW_LMDB = 0.20                 # ingest / raw LMDB per-record sync append, at least
GOAL_NATS_R3 = 6.0                   # ingest / NATS JetStream R3, at least
GOAL_RF1_REDIS_BENCHMARK = 0.6       # RF 1 ingest / Redis Streams through redis-benchmark, at least
GOAL_CATCH_UP_RECORDS_PER_S = 3_000_000    # one consumer, as Record objects, at least
GOAL_CATCH_UP_COLUMNS_PER_S = 8_000_000    # one consumer, as Arrow columns (RecordBatch.to_arrow), at least
GOAL_P99_VS_NATS_R3 = 1.0            # p99 ack at 50% load / NATS R3's, at most
GOAL_CPU_US_PER_RECORD = 12.0        # reference ingest, all processes, at most
GOAL_SYNC_PRODUCER = 0.8             # one sync producer in one thread / the reference's 8 asyncio producers, at least
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


async def _create(run: Run, client, stream: str, point: dict, phase: str) -> dict:
    from bench import sms_workloads as w
    return await run.acall(f"{phase}: create", w.create(client, stream, point["partitions"], point["replication"],
                                                         point["persistence"], point["dedup"]),
                           STREAM_CREATE_TIMEOUT_S)


async def _ingest_point(run: Run, client, cfg: dict, stream: str, point: dict, records: int, phase: str,
                        meter) -> dict:
    from bench import sms_workloads as w
    created = await _create(run, client, stream, point, phase)
    if "error" in created:
        return {"config": point, "error": created["error"]}
    common.progress(f"{phase}: ingest {records:,} records of {point['size']} B, batches of {point['batch']}, "
                    f"{point['producers']} producers, dedup {'on' if point['dedup'] else 'off'}, "
                    f"{point['partitions']} partitions, RF {point['replication']}, {point['persistence']}")
    out = await run.acall(f"{phase}: ingest", w.ingest(client, stream, records, point["size"], point["batch"],
                                                        point["producers"], point["dedup"], tag=phase, meter=meter),
                          cfg["phase_timeout_s"])
    if "error" not in out:
        common.progress(f"{phase}: {out['records_per_s']:,} records/s, {out['mb_per_s']} MB/s, "
                        f"{_cpu_text(out.get('cpu_per_record'))}"
                        + (f", {out['failed']} FAILED: {out['first_errors']}" if out["failed"] else ""))
    return {"config": point, "stream": created, **out}


def _cpu_text(c: dict | None) -> str:
    """'CPU 41.2 us/record (client 15.1, control 0.2, n1 9.3, ...)' for a progress line."""
    if not c or c.get("total_us_per_record") is None:
        return "CPU per record not measured"
    parts = ", ".join(f"{k} {v}" for k, v in c["us_per_record"].items())
    return f"CPU {c['total_us_per_record']} us/record ({parts})"


async def _reference(run: Run, client, cfg: dict, meter) -> dict:
    """Ingest at the reference point, read it all back, ack latency and end-to-end latency."""
    from bench import sms_workloads as w
    ref = REFERENCE
    stream = "reference"
    out: dict = {"config": ref}
    ingest = await _ingest_point(run, client, cfg, stream, ref, cfg["reference_records"], "sms reference", meter)
    out["ingest"] = ingest
    if "error" in ingest:
        return out
    written = ingest["acked"]
    catch = await run.acall("sms catch-up read", w.catch_up_read(client, stream, written, meter=meter),
                            cfg["phase_timeout_s"])
    if "error" not in catch and written < CATCH_UP_GOAL_RECORDS:
        catch["note"] = (f"{written:,} records instead of {CATCH_UP_GOAL_RECORDS:,} (the records the reference "
                         f"ingest wrote; this mode's time budget); --full reads 1M")
    out["catch_up_read"] = catch
    out["catch_up_read_columns"] = await run.acall(
        "sms catch-up read as columns", w.catch_up_read(client, stream, written, meter=meter, columns=True),
        cfg["phase_timeout_s"])
    max_rate = ingest["records_per_s"]
    if not max_rate:
        out["ack_latency"] = out["end_to_end_latency"] = {"error": "no ingest rate measured"}
        return out
    n_fr = len(cfg["ack_fractions"])
    out["ack_latency"] = await run.acall(
        "sms ack latency", w.ack_latency(client, stream, ref["size"], ref["batch"], ref["producers"], ref["dedup"],
                                         max_rate, tuple(cfg["ack_fractions"]), cfg["ack_duration_s"], meter=meter),
        cfg["phase_timeout_s"] + n_fr * cfg["ack_duration_s"])
    out["ack_latency_max_records_per_s"] = max_rate
    for key, subscribe in (("end_to_end_latency", False), ("end_to_end_latency_subscribe", True)):
        out[key] = await run.acall(
            f"sms end-to-end latency{' (subscribe)' if subscribe else ''}",
            w.end_to_end_latency(client, stream, ref["size"], ref["batch"], ref["producers"], ref["dedup"],
                                 cfg["e2e_fraction"] * max_rate, cfg["e2e_duration_s"], meter=meter,
                                 subscribe=subscribe, tag="e2e-subscribe" if subscribe else "e2e"),
            cfg["phase_timeout_s"] + cfg["e2e_duration_s"])
        if "error" not in out[key]:
            out[key]["fraction_of_max"] = cfg["e2e_fraction"]
    return out


async def _put_record_latency(run: Run, client, cfg: dict, meter) -> dict:
    """Single put_record calls, one at a time, on a fresh stream of the reference's layout."""
    from bench import sms_workloads as w
    stream = "put-record"
    created = await _create(run, client, stream, REFERENCE, "sms put_record latency")
    if "error" in created:
        return created
    out = await run.acall("sms put_record latency",
                          w.put_record_latency(client, stream, cfg["put_record_calls"], REFERENCE["size"], meter),
                          cfg["phase_timeout_s"])
    await _delete(client, stream)
    return {"stream": created, **out}


async def _sync_producer(run: Run, client, cfg: dict, meter, address: str) -> dict:
    """One synchronous producer in one thread (the README's way) on a stream of the
    reference's layout: against the reference's 8 asyncio producers."""
    from bench import sms_workloads as w
    stream = "sync-producer"
    created = await _create(run, client, stream, REFERENCE, "sms sync producer")
    if "error" in created:
        return created
    records = cfg["sync_producer_records"]
    common.progress(f"sms sync producer: {records:,} records of {REFERENCE['size']} B, send() per record, "
                    f"one thread")
    out = await run.acall("sms sync producer", asyncio.to_thread(
        w.sync_producer_ingest, address, stream, records, REFERENCE["size"], meter), cfg["phase_timeout_s"])
    if "error" not in out:
        common.progress(f"sms sync producer: {out['records_per_s']:,} records/s, "
                        f"{_cpu_text(out.get('cpu_per_record'))}")
    await _delete(client, stream)
    return {"stream": created, **out}


async def _delete(client, stream: str) -> None:
    with contextlib.suppress(Exception):        # (only to free the cluster; not a figure)
        await asyncio.wait_for(client.delete_stream(stream), 30)


async def _three_node_figures(run: Run, client, cfg: dict, meter, address: str) -> dict:
    """On the 3-node cluster: single put_record latency while it is still idle, the
    reference point, one sync producer, and the reference ingest at replication 1."""
    out = {"put_record_latency": await _put_record_latency(run, client, cfg, meter),
           "reference": await _reference(run, client, cfg, meter)}
    await _delete(client, "reference")
    out["sync_producer"] = await _sync_producer(run, client, cfg, meter, address)
    out["rf1"] = await _ingest_point(run, client, cfg, "rf1", RF1, cfg["rf1_records"], "sms rf1", meter)
    await _delete(client, "rf1")
    return out


def _measured_ingest(out: dict, point: dict) -> dict | None:
    """The ingest already measured at `point` (the reference or RF 1), if it succeeded."""
    for measured, ingest in ((REFERENCE, _get(out, "reference", "ingest")), (RF1, out.get("rf1"))):
        if point == measured and isinstance(ingest, dict) and "error" not in ingest:
            return ingest
    return None


async def _sweep_points(run: Run, client, cfg: dict, meter, points: list, out: dict) -> None:
    for factor, value, point in points:
        entry = {"factor": factor, "value": value, "is_reference_point": point == REFERENCE}
        done = _measured_ingest(out, point)
        if done is not None:
            out["sweeps"][factor].append({**entry, **done, "note": "measured above (reference or rf1), "
                                                                   "with that figure's record count"})
            continue
        stream = _point_name(factor, value)
        res = await _ingest_point(run, client, cfg, stream, point, _sweep_records(cfg, point),
                                  f"sms sweep {stream}", meter)
        out["sweeps"][factor].append({**entry, **res})
        await _delete(client, stream)


async def _on_cluster(run: Run, cfg: dict, workdir: str, nodes: int, points: list, out: dict) -> None:
    from bench import cpu
    from sms import aio
    from node.launcher import LocalCluster
    t0 = time.perf_counter()
    common.progress(f"== sms: starting LocalCluster, control + {nodes} storage nodes")
    try:
        cluster = LocalCluster(os.path.join(workdir, f"sms-{nodes}"), nodes=nodes, port=0).start()
        os.environ.update(cluster.client_env())     # its clients trust its CA
    except Exception as e:
        out["clusters"].append({"storage_nodes": nodes, **run.failed(f"sms cluster of {nodes} nodes", e)})
        return
    meter = cpu.Meter(cpu.cluster_pids(cluster))
    info = {"storage_nodes": nodes, "start_s": round(time.perf_counter() - t0, 2), "pids": meter.pids}
    try:
        async with aio.Client(cluster.address) as client:
            if nodes == 3:
                out.update(await _three_node_figures(run, client, cfg, meter, cluster.address))
            await _sweep_points(run, client, cfg, meter, points, out)
    finally:
        t1 = time.perf_counter()
        cluster.stop()
        info["exited_early"] = {k: v for k, v in cluster.exited().items() if v not in (0, -15)}
        for node_id in info["exited_early"]:     # where it hung: its stacks are at the end of its log
            tail = _log_tail(os.path.join(cluster.data_dir, "logs", f"{node_id}.log"))
            info.setdefault("logs", {})[node_id] = tail
            common.progress(f"sms cluster of {nodes} nodes: {node_id} ended badly; the end of its log:\n{tail}")
        info["stop_s"] = round(time.perf_counter() - t1, 2)
        out["clusters"].append(info)


def _log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


async def sms_suite(run: Run, cfg: dict, workdir: str) -> dict:
    # the sweep points, grouped by the storage nodes they need (RF 5 needs 5)
    by_nodes: dict[int, list] = {3: []}
    for factor, values in cfg["sweeps"].items():
        for v in values:
            point = {**REFERENCE, factor: v}
            by_nodes.setdefault(max(3, point["replication"]), []).append((factor, v, point))
    out: dict = {"reference": None, "rf1": None, "put_record_latency": None,
                 "sweeps": {f: [] for f in cfg["sweeps"]}, "clusters": []}
    for nodes in sorted(by_nodes):
        await _on_cluster(run, cfg, workdir, nodes, by_nodes[nodes], out)
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
        elif name == "rebalance":
            from bench import rebalance
            out[name] = run.call("extra rebalance", rebalance.run, dict(params))
        elif name == "repartition_pause":
            out[name] = run.call("extra repartition_pause", _repartition, params, workdir)
        elif name == "idle_cost":
            from bench import idle_cost
            out[name] = run.call("extra idle_cost", idle_cost.run, per_stream=10, nodes=3, rf=3, **params)
        elif name == "tls_cost":
            from bench import tls_cost
            out[name] = run.call("extra tls_cost", tls_cost.run_preset, params["preset"])
        elif name == "encryption_cost":
            from bench import encryption_cost
            out[name] = run.call("extra encryption_cost", encryption_cost.run_preset, params["preset"])
        elif name == "throttle":
            from bench import throttle
            out[name] = run.call("extra throttle", throttle.run_preset, params["preset"])
        elif name == "consumer_group":
            from bench import consumer_group
            out[name] = run.call("extra consumer_group", consumer_group.run_preset, params["preset"])
        elif name == "archive":
            from bench import archive
            out[name] = run.call("extra archive", archive.run_preset, params["preset"])
        elif name == "kinesis":
            from bench import kinesis
            out[name] = run.call("extra kinesis", kinesis.run_preset, params["preset"])
        elif name == "queues":
            from bench import queues
            out[name] = run.call("extra queues", queues.run_preset, params["preset"])
        elif name == "channels":
            from bench import channels
            out[name] = run.call("extra channels", channels.run_preset, params["preset"])
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


def _ingest_versus(name: str, goal: float, ingest, ingest_what: str, peer, peer_value, peer_what: str,
                   detail: str) -> dict:
    """The target ingest records/s / a peer's (or limit's) records/s, at least `goal`."""
    rate = _get(ingest, "records_per_s")
    if not rate:
        return common.target(name, None, goal, detail=_why_missing(ingest, ingest_what))
    if not peer_value:
        return common.target(name, None, goal, detail=_why_missing(peer, peer_what))
    return common.target(name, rate / peer_value, goal,
                         detail=f"sms {rate:,} records/s vs {peer_value:,} records/s; {detail}")


def _rf1_target(sms: dict | None, redis) -> dict:
    """RF 1 ingest against a single Redis through its own C client; the redis-py figure
    and the RF 3 ratio beside it."""
    bench = _get(redis, "redis_benchmark")
    bench_rate = _get(bench, "records_per_s")
    t = _ingest_versus("RF 1 ingest / Redis Streams (appendfsync always) through redis-benchmark",
                       GOAL_RF1_REDIS_BENCHMARK, _get(sms, "rf1"), "sms rf1 ingest",
                       redis if bench is None else bench, bench_rate, "redis_streams redis-benchmark",
                       f"{_get(bench, 'client') or 'redis-benchmark'}; same record size and batch size")
    redis_py = _get(redis, "ingest_records_per_s")
    t["redis_py_records_per_s"] = redis_py
    t["extra_ratio_rf1_to_redis_py"] = common.ratio(_get(sms, "rf1", "records_per_s"), redis_py)
    t["extra_ratio_rf3_to_redis_benchmark"] = common.ratio(_get(sms, "reference", "ingest", "records_per_s"),
                                                           bench_rate)
    return t


def _p99_target(ref: dict, nats) -> dict:
    """p99 ack latency at 50 % of the max vs NATS R3's batch ack p99 at 50 % of its max."""
    r3 = _get(nats, "r3")
    acks = _get(ref, "ack_latency")
    name = "p99 ack latency at 50% load / NATS R3 batch ack p99 at 50% load"
    at50 = next((a for a in acks if a.get("fraction_of_max") == LATENCY_TARGET_FRACTION), None) \
        if isinstance(acks, list) else None
    p99 = _get(at50, "latency", "p99_ms")
    nats_p99 = _get(r3, "batch_ack_latency", "latency", "p99_ms")
    nats_sync_p99 = _get(r3, "sync_publish_latency", "latency", "p99_ms")
    goal = GOAL_P99_VS_NATS_R3
    if not p99:
        t = common.target(name, None, goal, higher_is_better=False,
                          detail=_why_missing(acks if at50 is None else at50, "sms ack latency at 50%"))
    elif not nats_p99:
        t = common.target(name, None, goal, higher_is_better=False,
                          detail=_why_missing(nats if r3 is None else r3, "nats_js r3 batch ack latency"))
    else:
        extra = f"; {at50['errors']} sms calls failed, {at50['dropped']} dropped" \
            if at50.get("errors") or at50.get("dropped") else ""
        t = common.target(name, p99 / nats_p99, goal, higher_is_better=False,
                          detail=f"sms p99 {p99} ms ({at50['latency']['count']} calls of {at50['records_per_call']}) "
                                 f"vs NATS R3 p99 {nats_p99} ms ({_get(r3, 'batch_ack_latency', 'latency', 'count')} "
                                 f"windows of {_get(r3, 'batch_ack_latency', 'records_per_call')}){extra}")
    t["extra_ratio_to_nats_r3_sync_publish_p99"] = common.ratio(p99, nats_sync_p99)
    t["nats_r3_sync_publish_p99_ms"] = nats_sync_p99
    return t


def _catch_up_target(ref: dict, columns: bool = False) -> dict:
    catch = _get(ref, "catch_up_read_columns" if columns else "catch_up_read")
    rate = _get(catch, "records_per_s")
    name = f"catch-up read records/s as {'Arrow columns' if columns else 'Record objects'} (absolute)"
    goal = GOAL_CATCH_UP_COLUMNS_PER_S if columns else GOAL_CATCH_UP_RECORDS_PER_S
    if not rate:
        return common.target(name, None, goal, detail=_why_missing(catch, "sms catch-up read"))
    ok = "" if catch.get("count_matches") else \
        f"; COUNT MISMATCH: read {catch['records_read']:,}, expected {catch['records_expected']:,}"
    return common.target(name, rate, goal, detail=f"{catch['records_read']:,} records, one consumer, "
                                                  f"from TRIM_HORIZON{ok}")


def _cpu_target(ingest) -> dict:
    """CPU microseconds per record acknowledged, summed over every process, reference ingest."""
    name = "CPU per record, all processes, reference ingest (us)"
    c = _get(ingest, "cpu_per_record")
    total = _get(c, "total_us_per_record")
    if total is None:
        return common.target(name, None, GOAL_CPU_US_PER_RECORD, higher_is_better=False,
                             detail=_why_missing(ingest if c is None else c, "sms reference ingest CPU per record"))
    return common.target(name, total, GOAL_CPU_US_PER_RECORD, higher_is_better=False,
                         detail=f"{_cpu_text(c)} over {c['records']:,} records acknowledged")


def _sync_producer_target(sms: dict | None, ingest) -> dict:
    """One SyncProducer, send() per record in one thread, against the reference's 8
    asyncio producers with send_batch (the same layout, another stream, same run)."""
    sync = _get(sms, "sync_producer")
    t = _ingest_versus("one sync producer in one thread / the reference's 8 asyncio producers", GOAL_SYNC_PRODUCER,
                       sync, "sms sync producer", ingest, _get(ingest, "records_per_s"), "sms reference ingest",
                       "send() per record then flush(), against send_batch() of 500 from 8 producers")
    t["cpu_per_record"] = _get(sync, "cpu_per_record", "us_per_record")
    return t


def targets(sms: dict | None, base: dict, extra: dict | None = None) -> list[dict]:
    """Issue 13's table: each target met, missed or n/a, with its ratio; then the extras'
    (issue 18's archive: a catch-up read from the archive against one from local storage)."""
    ref = _get(sms, "reference") or {}
    ingest = _get(ref, "ingest")
    raw, nats = base.get("raw_lmdb"), base.get("nats_js")
    r3 = _get(nats, "r3")
    return [
        _ingest_versus("ingest / raw LMDB sync append", GOAL_RAW_LMDB, ingest, "sms reference ingest", raw,
                       _get(raw, "append_records_per_s"), "raw_lmdb",
                       "raw_lmdb append_records_per_s (per-record keys, one synced txn per batch)"),
        _ingest_versus("ingest / NATS JetStream R3 ingest", GOAL_NATS_R3, ingest, "sms reference ingest",
                       nats if r3 is None else r3, _get(r3, "ingest_records_per_s"), "nats_js r3",
                       "same records and batch size, RF 3 against R3"),
        _rf1_target(sms, base.get("redis_streams")),
        _catch_up_target(ref),
        _catch_up_target(ref, columns=True),
        _p99_target(ref, nats),
        _cpu_target(ingest),
        _sync_producer_target(sms, ingest),
        *_archive_targets(extra),
        _encryption_target(extra),
        *_kinesis_targets(extra),
        *_queue_targets(extra),
        *_channel_targets(extra),
    ]


def _encryption_target(extra: dict | None) -> dict:
    """Issue 30's: an encrypted stream takes at least 85% of the ingest of the same stream
    stored in clear (same cluster, same run)."""
    enc = _get(extra, "encryption_cost") or {}
    ratio = enc.get("ingest_ratio_encrypted_to_clear")
    name, goal = "encrypted ingest / clear ingest", 0.85
    if ratio is None:
        return common.target(name, None, goal, detail=enc.get("skipped") or "encryption_cost was not run")
    return common.target(name, ratio, goal, detail=f"medians {enc['encrypted']['records_per_s_median']:,} / "
                                                   f"{enc['clear']['records_per_s_median']:,} records/s")


def _kinesis_targets(extra: dict | None) -> list[dict]:
    """Issue 32's: the Kinesis endpoint through boto3 against boto3's ceiling and
    kinesalite, and SubscribeToShard's put-to-receive p99 (bench/kinesis.py)."""
    from bench import kinesis
    k = _get(extra, "kinesis")
    return kinesis.targets(k if k is not None else {"skipped": "not run in this mode"})


def _queue_targets(extra: dict | None) -> list[dict]:
    """Issue 34's: queue receive+ack throughput, redelivery after a worker's death (bench/queues.py)."""
    from bench import queues
    q = _get(extra, "queues")
    return queues.targets(q if q is not None else {"skipped": "not run in this mode"})


def _channel_targets(extra: dict | None) -> list[dict]:
    """Issue 34's: delivery into Iceberg against the catch-up rate, and the freshness lag at a
    steady load (bench/channels.py)."""
    from bench import channels
    c = _get(extra, "channels")
    return channels.targets(c if c is not None else {"skipped": "not run in this mode"})


def _archive_targets(extra: dict | None) -> list[dict]:
    from bench import archive
    arch = _get(extra, "archive")
    return archive.targets(arch if arch is not None else {"skipped": "not run in this mode"})


def _sms_problems(sms: dict) -> list[str]:
    """Failed or miscounted records and failed calls of the SMS workloads."""
    out: list[str] = []
    ref = sms.get("reference") or {}
    points = [("reference ingest", ref.get("ingest")), ("rf1 ingest", sms.get("rf1")),
              ("sync producer", sms.get("sync_producer"))] + [
        (f"sweep {e.get('factor')}={e.get('value')}", e) for v in (sms.get("sweeps") or {}).values() for e in v]
    for name, r in points:
        if isinstance(r, dict) and r.get("failed"):
            out.append(f"sms {name}: {r['failed']} records failed, first: {r.get('first_errors')}")
    for key in ("catch_up_read", "catch_up_read_columns"):
        catch = ref.get(key)
        if isinstance(catch, dict) and catch.get("count_matches") is False:
            out.append(f"sms {key.replace('_', ' ')}: read {catch['records_read']:,} records, "
                       f"expected {catch['records_expected']:,}")
    for a in ref.get("ack_latency") if isinstance(ref.get("ack_latency"), list) else []:
        if a.get("errors") or a.get("dropped"):
            out.append(f"sms ack latency at {a['fraction_of_max']:.0%}: {a['errors']} calls failed, "
                       f"{a['dropped']} dropped; first error: {a.get('first_error')}")
    for key in ("end_to_end_latency", "end_to_end_latency_subscribe"):
        e2e = ref.get(key)
        if isinstance(e2e, dict) and (e2e.get("missing") or e2e.get("reader_errors") or e2e.get("ack_errors")):
            out.append(f"sms {key.replace('_', ' ')}: {e2e.get('missing')} acked records never received, "
                       f"reader errors {e2e.get('reader_errors')}, {e2e.get('ack_errors')} failed sends "
                       f"(first: {e2e.get('first_ack_error')})")
    single = sms.get("put_record_latency")
    if isinstance(single, dict) and single.get("errors"):
        out.append(f"sms put_record latency: {single['errors']} calls failed, first: {single.get('first_error')}")
    for c in sms.get("clusters") or []:
        if c.get("exited_early"):
            out.append(f"sms cluster of {c['storage_nodes']} nodes: processes ended badly: {c['exited_early']}")
    return out


def problems(result: dict) -> list[str]:
    """What went wrong without an exception: failed or lost records, count mismatches,
    failed open-loop calls, nodes that died, a peer client that failed. Each one makes
    the exit status 1."""
    out = _sms_problems(result.get("sms") or {})
    rb = _get(result, "extras", "failover_pause", "read_back")
    if isinstance(rb, dict) and (rb.get("acked_lost") or rb.get("duplicated_records")):
        out.append(f"failover_pause: {rb.get('acked_lost')} acknowledged records lost, "
                   f"{rb.get('duplicated_records')} duplicated")
    rb = _get(result, "extras", "rebalance", "read_back")
    if isinstance(rb, dict) and (rb.get("acked_lost") or rb.get("duplicated_records")):
        out.append(f"rebalance: {rb.get('acked_lost')} acknowledged records lost, "
                   f"{rb.get('duplicated_records')} duplicated")
    for mode in ("tls", "plaintext"):
        failed = sum(r.get("failed") or 0 for r in _get(result, "extras", "tls_cost", mode, "rounds") or [])
        if failed:
            out.append(f"tls_cost: {failed} records failed on the {mode} cluster")
    for mode in ("encrypted", "clear"):
        for r in _get(result, "extras", "encryption_cost", mode, "rounds") or []:
            if r.get("failed") or r.get("read_records") != r.get("read_expected"):
                out.append(f"encryption_cost: on the {mode} stream {r.get('failed')} records failed, "
                           f"{r.get('read_records')} read of {r.get('read_expected')} stored")
    for scenario in ("partition_limit", "tenant_limit", "read_limit"):
        for load, f in (_get(result, "extras", "throttle", scenario) or {}).items():
            done = f.get("records_acked", f.get("records_read")) if isinstance(f, dict) else None
            if done == 0 or (isinstance(f, dict) and f.get("other_errors")):
                out.append(f"throttle {scenario} {load}: {done} records acknowledged (or read), "
                           f"{f.get('other_errors') or 0} refused other than Throttled, first: {f.get('first_error')}")
    cg = _get(result, "extras", "consumer_group")
    if isinstance(cg, dict) and "records_put" in cg:
        for key in ("read_stream", "group_1_member", "group_2_members"):
            got = (cg.get(key) or {}).get("records")
            if got != cg["records_put"]:
                out.append(f"consumer_group {key}: read {got} records of {cg['records_put']}")
    out += [f"archive: {text}" for text in _get(result, "extras", "archive", "problems") or []]
    out += [f"kinesis: {text}" for text in _get(result, "extras", "kinesis", "problems") or []]
    rb = _get(result, "baselines", "redis_streams", "redis_benchmark")
    if isinstance(rb, dict) and (rb.get("error") or rb.get("stream_length_matches") is False):
        out.append(f"redis-benchmark: {rb.get('error') or ''} stream length {rb.get('stream_length')} "
                   f"for {rb.get('records')} XADDs")
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
        result["targets"] = targets(result.get("sms"), result.get("baselines", {}), result.get("extras"))
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
