"""A Markdown summary of a bench/run.py result: the targets, the reference point (and RF 1)
beside its baselines, single put_record latency, the CPU per record of each process for
every SMS figure, the sweeps, and the failover / repartition / growth / TLS / throttling
figures. The tables of docs/performance.md are this output.

    .venv/bin/python -m bench.report [bench/results/latest.json]
"""

from __future__ import annotations

import datetime
import json
import os
import sys

from bench.common import dig
from bench.cpu import CLIENT


_get = dig


def _n(x, digits: int = 0) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and digits:
        return f"{x:,.{digits}f}"
    return f"{round(x):,}" if isinstance(x, (int, float)) else str(x)


def _lat(lat: dict | None) -> str:
    if not lat or not lat.get("count"):
        return "-"
    return f"{lat['p50_ms']:.0f} / {lat['p99_ms']:.0f} / {lat['p999_ms']:.0f}"


def targets(r: dict) -> list[str]:
    out = ["| target | goal | value | met |", "|---|---|---|---|"]
    for t in r.get("targets", []):
        if "target" not in t:
            continue
        op = t.get("goal_op", ">=")
        verdict = {True: "**met**", False: "missed", None: "n/a"}[t["met"]]
        out.append(f"| {t['target']} | {op} {_n(t['goal'], 2) if t['goal'] < 100 else _n(t['goal'])} | "
                   f"{'-' if t['value'] is None else (_n(t['value'], 3) if t['value'] < 100 else _n(t['value']))} "
                   f"| {verdict} |")
    return out


def reference(r: dict) -> list[str]:
    ref = _get(r, "sms", "reference") or {}
    b = r.get("baselines") or {}
    ingest = ref.get("ingest") or {}
    read = ref.get("catch_up_read") or {}
    rows = [("SMS, de-duplicating producers (the reference point)", ingest.get("records_per_s"),
             read.get("records_per_s"), None),
            ("SMS, read as Arrow columns (RecordBatch.to_arrow)", None,
             _get(ref, "catch_up_read_columns", "records_per_s"), None),
            ("SMS at RF 1, otherwise the reference point", _get(r, "sms", "rf1", "records_per_s"), None, None)]
    acks = {round(a.get("fraction_of_max", 0) * 100): a for a in ref.get("ack_latency") or []}
    rows += [("raw LMDB, one process (sync append / cursor scan)", _get(b, "raw_lmdb", "append_records_per_s"),
              _get(b, "raw_lmdb", "scan_records_per_s"), None),
             ("gRPC echo of the same batches (best mode)", _get(b, "grpc_echo", "best_records_per_s"), None, None),
             ("Redis Streams, appendfsync always, through redis-py (XADD pipelines / XRANGE)",
              _get(b, "redis_streams", "ingest_records_per_s"), _get(b, "redis_streams", "read_records_per_s"),
              _get(b, "redis_streams", "batch_ack_latency", "latency")),
             ("Redis Streams, appendfsync always, through redis-benchmark (C; XADD pipelines)",
              _get(b, "redis_streams", "redis_benchmark", "records_per_s"), None, None),
             ("NATS JetStream R1 (async publish)", _get(b, "nats_js", "r1", "ingest_records_per_s"),
              _get(b, "nats_js", "r1", "read_records_per_s"), _get(b, "nats_js", "r1", "batch_ack_latency", "latency")),
             ("NATS JetStream R3 (async publish)", _get(b, "nats_js", "r3", "ingest_records_per_s"),
              _get(b, "nats_js", "r3", "read_records_per_s"), _get(b, "nats_js", "r3", "batch_ack_latency", "latency"))]
    out = ["| system | ingest records/s | read records/s | batch ack p50 / p99 / p99.9 ms at 50% load |",
           "|---|---|---|---|"]
    for name, ing, rd, lat in rows:
        if name.startswith("SMS, de-duplicating"):
            lat = _get(acks.get(50), "latency")
        out.append(f"| {name} | {_n(ing)} | {_n(rd)} | {_lat(lat)} |")
    out += ["", "| SMS offered load (of the measured max) | records/s | ack p50 / p99 / p99.9 ms (a call of 500) |",
            "|---|---|---|"]
    for pct, a in sorted(acks.items()):
        out.append(f"| {pct}% | {_n(a.get('offered_records_per_s'))} | {_lat(a.get('latency'))} |")
    for key, how in (("end_to_end_latency", "long-polling"), ("end_to_end_latency_subscribe", "subscribed")):
        e2e = ref.get(key) or {}
        if e2e:
            out.append(f"| end to end at {round(e2e.get('fraction_of_max', 0.5) * 100)}%: put to a {how} "
                       f"consumer's receipt | {_n(e2e.get('offered_records_per_s'))} | {_lat(e2e.get('latency'))} |")
    single = _get(r, "sms", "put_record_latency") or {}
    if single.get("latency"):
        out.append(f"| one put_record at a time, idle cluster ({_n(single.get('calls'))} calls of one record) "
                   f"| - | {_lat(single.get('latency'))} |")
    return out


def _cpu_figures(r: dict) -> list[tuple[str, dict | None]]:
    """(name, cpu_per_record) of every SMS figure of the run."""
    sms = r.get("sms") or {}
    ref = sms.get("reference") or {}
    acks = ref.get("ack_latency") if isinstance(ref.get("ack_latency"), list) else []
    rows = [("reference ingest", _get(ref, "ingest", "cpu_per_record")),
            ("RF 1 ingest", _get(sms, "rf1", "cpu_per_record")),
            ("catch-up read (per record read)", _get(ref, "catch_up_read", "cpu_per_record"))]
    rows += [(f"ack latency at {a.get('fraction_of_max', 0):.0%} load", a.get("cpu_per_record")) for a in acks]
    rows += [("catch-up read as Arrow columns", _get(ref, "catch_up_read_columns", "cpu_per_record")),
             ("end to end (write and tail)", _get(ref, "end_to_end_latency", "cpu_per_record")),
             ("end to end (write and subscribe)", _get(ref, "end_to_end_latency_subscribe", "cpu_per_record")),
             ("single put_record, idle", _get(sms, "put_record_latency", "cpu_per_record"))]
    for factor, points in (sms.get("sweeps") or {}).items():
        rows += [(f"sweep {factor} = {p.get('value')}", p.get("cpu_per_record"))
                 for p in points if isinstance(p, dict) and not p.get("note")]
    return [(name, c) for name, c in rows if isinstance(c, dict) and c.get("us_per_record")]


def cpu(r: dict) -> list[str]:
    """CPU microseconds per record of each process, for every SMS figure, and Redis's."""
    rows = _cpu_figures(r)
    if not rows:
        return []
    procs = sorted(dict.fromkeys(p for _, c in rows for p in c["us_per_record"]), key=lambda p: p == CLIENT)
    out = [f"| CPU us per record | records | {' | '.join(procs)} | all processes |",
           "|---|---|" + "---|" * (len(procs) + 1)]
    for name, c in rows:
        cells = " | ".join(_n(c["us_per_record"].get(p), 1) for p in procs)
        out.append(f"| {name} | {_n(c.get('records'))} | {cells} | {_n(c.get('total_us_per_record'), 1)} |")
    rb = _get(r, "baselines", "redis_streams", "redis_benchmark", "cpu_per_record") or {}
    if rb.get("us_per_record"):
        parts = ", ".join(f"{p} {_n(v, 1)}" for p, v in rb["us_per_record"].items())
        out.append(f"\nRedis Streams through redis-benchmark, CPU us per record: {parts}; "
                   f"all processes {_n(rb.get('total_us_per_record'), 1)}.")
    return out


def sweeps(r: dict) -> list[str]:
    sw = _get(r, "sms", "sweeps") or {}
    if not sw:
        return []
    out = ["| factor | value | ingest records/s | MB/s |", "|---|---|---|---|"]
    for factor, points in sw.items():
        for p in points if isinstance(points, list) else []:
            out.append(f"| {factor} | {p.get('value')}{' (reference)' if p.get('is_reference_point') else ''} | "
                       f"{_n(p.get('records_per_s'))} | {_n(p.get('mb_per_s'), 1)} |")
    return out


def extras(r: dict) -> list[str]:
    e = r.get("extras") or {}
    out = []
    fp = e.get("failover_pause") or {}
    if fp.get("kills"):
        out += ["| killed (kill -9) | removed from chain after | write pause, affected keys p50 / max | "
                "unaffected keys p50 / max |", "|---|---|---|---|"]
        for k in fp["kills"]:
            a, u = _get(k, "affected", "write_pause") or {}, _get(k, "unaffected", "write_pause") or {}
            out.append(f"| {k['role']} | {_n(k.get('kill_to_victim_removed_s'), 2)} s | "
                       f"{_n(a.get('p50_ms'))} / {_n(a.get('max_ms'))} ms | "
                       f"{_n(u.get('p50_ms'))} / {_n(u.get('max_ms'))} ms |")
        rb = fp.get("read_back") or {}
        out.append(f"\nFailover (4 storage nodes, RF 3, {_n(fp.get('offered_records_per_s'))} records/s offered): "
                   f"{_n(fp.get('records_acked'))} of {_n(fp.get('records_sent'))} records acknowledged; read back, "
                   f"{_n(rb.get('acked_lost'))} acknowledged records lost and {_n(rb.get('duplicated_records'))} "
                   f"duplicated.")
    rp = e.get("repartition_pause") or {}
    if rp.get("switches"):
        out += ["", f"Repartition ({_n(rp.get('offered_records_per_s'))} records/s offered, one de-duplicating "
                    "producer; the longest ack latency per key of records sent during each switch):", "",
                "| switch | call | affected keys p50 / max | other keys p50 / max |", "|---|---|---|---|"]
        for s in rp["switches"]:
            a, o = s.get("affected_keys") or {}, s.get("other_keys") or {}
            out.append(f"| {s['op']} | {s['call_s']:.2f} s | {_n(a.get('p50_ms'))} / {_n(a.get('max_ms'))} ms | "
                       f"{_n(o.get('p50_ms'))} / {_n(o.get('max_ms'))} ms |")
        b = rp.get("baseline_outside_switches") or {}
        out.append(f"| (outside any switch) | | {_n(b.get('p50_ms'))} / {_n(b.get('max_ms'))} ms | |")
    rb = e.get("rebalance") or {}
    if rb.get("add_to_replicas_even_s") is not None:
        base, add, drain = (rb.get(k, {}).get("write_pause") or {} for k in ("baseline", "while_adding",
                                                                             "while_draining"))
        back = rb.get("read_back") or {}
        out += ["", "A node added under load, then one drained (RF 3; the longest ack latency per key of "
                    "records sent meanwhile):", "",
                "| step | done after | write pause p50 / max |", "|---|---|---|",
                f"| (before) | | {_n(base.get('p50_ms'))} / {_n(base.get('max_ms'))} ms |",
                f"| node added: replicas even | {rb.get('add_to_replicas_even_s')} s | |",
                f"| node added: it heads a chain | {rb.get('add_to_new_node_heading_s')} s | "
                f"{_n(add.get('p50_ms'))} / {_n(add.get('max_ms'))} ms |",
                f"| node drained | {rb.get('drain_to_empty_s')} s | {_n(drain.get('p50_ms'))} / "
                f"{_n(drain.get('max_ms'))} ms |",
                "", f"Read back: {_n(back.get('acked_lost'))} acknowledged records lost, "
                    f"{_n(back.get('duplicated_records'))} duplicated."]
    g = e.get("growth") or {}
    rows = []
    for sweep in ("partitions", "producers", "stored_data"):
        s = g.get(sweep) or {}
        small, big = s.get("small") or {}, s.get("big") or {}
        ri = s.get("throughput_ratio_big_to_small")
        rm = s.get("storage_nodes_rss_ratio_big_to_small")
        if small or big:
            rows.append(f"| {sweep} | {_n(_get(small, 'ingest', 'records_per_s'))} -> "
                        f"{_n(_get(big, 'ingest', 'records_per_s'))} | {ri if ri is not None else '-'} | "
                        f"{_n(_get(small, 'memory_after', 'storage_nodes_rss_mib'))} -> "
                        f"{_n(_get(big, 'memory_after', 'storage_nodes_rss_mib'))} MiB | {rm if rm is not None else '-'} |")
    if rows:
        out += ["", "Growth (each factor ten-fold at the same load; RSS summed over the storage nodes):", "",
                "| grows ten-fold | ingest records/s | ratio | storage nodes' RSS | ratio |",
                "|---|---|---|---|---|", *rows]
    idle = e.get("idle_cost") or {}
    if idle.get("steps"):
        out += ["", "An idle cluster as partitions grow (RF 3, 3 storage nodes; CPU over seconds of nothing):", "",
                "| partitions | created in | idle CPU, % of a core per process (max) | loaded: one stream's ingest |",
                "|---|---|---|---|"]
        for st in idle["steps"]:
            per = ", ".join(f"{k} {v}" for k, v in sorted((st.get("idle_percent_of_a_core") or {}).items()))
            loaded = st.get("loaded") or {}
            load = (f"{_n(loaded.get('records_per_s'))} records/s into {loaded.get('stream_partitions')} partitions"
                    if loaded else "-")
            out.append(f"| {_n(st.get('partitions'))} | {st.get('created')} in {st.get('create_s')} s | "
                       f"{per} ({st.get('idle_percent_max')}) | {load} |")
    tls = e.get("tls_cost") or {}
    if tls.get("tls"):
        out += ["", f"TLS against plaintext (the same load, clusters taken in turns; issue 15's limit: a cost of at "
                    f"most {tls.get('target_cost_pct_max')}%):", "",
                "| cluster | ingest records/s, median (best) | cluster CPU us per record, median |", "|---|---|---|"]
        for mode in ("tls", "plaintext"):
            m = tls.get(mode) or {}
            out.append(f"| {mode} | {_n(m.get('records_per_s_median'))} ({_n(m.get('records_per_s_best'))}) | "
                       f"{m.get('cluster_cpu_us_per_record_median')} |")
        out += ["", f"TLS / plaintext: {tls.get('throughput_ratio_tls_to_plaintext')} "
                    f"(a cost of {tls.get('tls_cost_pct')}%)."]
    enc = e.get("encryption_cost") or {}
    if enc.get("encrypted"):
        out += ["", f"Encryption at rest against clear (issue 30; one cluster, the two streams taken in turns; the "
                    f"target: at most {enc.get('target_ingest_cost_pct_max')}% less ingest):", "",
                "| stream | ingest records/s, median (best) | catch-up read records/s, median | "
                "cluster CPU us per record, median |", "|---|---|---|---|"]
        for mode in ("encrypted", "clear"):
            m = enc.get(mode) or {}
            out.append(f"| {mode} | {_n(m.get('records_per_s_median'))} ({_n(m.get('records_per_s_best'))}) | "
                       f"{_n(m.get('read_records_per_s_median'))} | {m.get('cluster_cpu_us_per_record_median')} |")
        out += ["", f"Encrypted / clear: ingest {enc.get('ingest_ratio_encrypted_to_clear')} (a cost of "
                    f"{enc.get('ingest_cost_pct')}%), read {enc.get('read_ratio_encrypted_to_clear')} "
                    f"(a cost of {enc.get('read_cost_pct')}%)."]
    th = e.get("throttle") or {}
    if th.get("holds"):
        out += ["", f"Throttling under load (issue 15; {_get(th, 'params', 'seconds')} s per load; the limited load "
                    "beside an unlimited one, which also runs alone before and after):", "",
                "| limit | limited: achieved (limiter's bound) | Throttled answers | holds | "
                "unlimited: alone before / beside / alone after (ratio beside / alone) |", "|---|---|---|---|---|"]
        for scenario, what, rate, unit in (("partition_limit", "partition write", "records_per_s", "records/s"),
                                           ("tenant_limit", "tenant write", "records_per_s", "records/s"),
                                           ("read_limit", "partition read", "stored_bytes_per_s", "bytes/s")):
            s = th.get(scenario) or {}
            lim = s.get("limited") or {}
            limit = lim.get("limit_records_per_s", lim.get("limit_bytes_per_s"))
            bound = lim.get("bound_records_per_s", lim.get("bound_stored_bytes_per_s"))
            alone = " / ".join(_n(_get(s, k, rate)) for k in ("unlimited_alone_before", "unlimited_beside_limited",
                                                               "unlimited_alone_after"))
            holds = {True: "yes", False: "NO"}.get(lim.get("holds"), "-")
            out.append(f"| {what} {_n(limit)} {unit} | {_n(lim.get(rate))} ({_n(bound)}) | "
                       f"{_n(lim.get('throttled_answers'))} | {holds} | {alone} "
                       f"({s.get('unlimited_ratio_beside_to_alone')}) |")
    return out


def report(r: dict) -> str:
    when = datetime.datetime.fromtimestamp(r.get("started_unix", 0), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    m = r.get("machine") or {}
    head = [f"Run of {when}, `python -m bench.run --{r.get('mode')}` ({r.get('wall_s')} s): "
            f"{m.get('cores')} cores ({m.get('cpu')}), {m.get('memory_gib')} GiB, Python {m.get('python')}, "
            f"load average at start {m.get('load_average_at_start')}.", ""]
    parts = [targets(r), reference(r), cpu(r), sweeps(r), extras(r)]
    return "\n".join(head + [line for p in parts if p for line in p + [""]])


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                              "results", "latest.json")
    with open(path) as f:
        print(report(json.load(f)))


if __name__ == "__main__":
    main()
