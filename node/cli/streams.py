"""`sms stream`: create, describe, list, update, repartition, trim, export, import and delete streams."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

from node.cli.common import _client, _emit, _progress
from sms import errors, limits


def _archive_arguments(p: argparse.ArgumentParser, create: bool) -> None:
    """The archive tier's options of `stream create` and `stream update` (None: not given)."""
    p.add_argument("--archive", metavar="URL",
                   help="keep old records in a fragment store: file:///path (a directory, such as a shared "
                        "mount) or s3://bucket/prefix (boto3; endpoint and credentials from its environment)"
                        + ("" if create else "; only for a stream without one"))
    p.add_argument("--archive-after-s", type=int, metavar="S",
                   help="records older than this go to the archive"
                        + (f" (default {limits.ARCHIVE_AFTER_S_DEFAULT})" if create else ""))
    p.add_argument("--local-retention-s", type=int, metavar="S",
                   help="replicas keep records this long once archived (at least --archive-after-s"
                        + (f"; default {limits.LOCAL_RETENTION_S_DEFAULT})" if create else ")"))
    p.add_argument("--compression", choices=["zstd", "none"],
                   help="of the archive's fragments" + (" (default zstd)" if create else ""))
    p.add_argument("--encryption", choices=["aes-256-gcm", "none"],
                   help="store batches sealed with AES-256-GCM under a data key of the stream's own "
                        "(docs/security.md)" + (" (default none)" if create else "; from now on"))


def _describe(info) -> dict:
    return {
        "name": info.name, "status": info.status.value, "replication_factor": info.replication_factor,
        "min_in_sync": info.min_in_sync,
        "persistence": info.persistence.value, "ingestion_policy": info.ingestion_policy.value,
        "retention_hours": info.retention_hours, "map_version": info.map_version,
        "partitions": [{
            "partition_id": p.partition_id, "state": p.state.value, "hash_lo": str(p.hash_lo),
            "hash_hi": str(p.hash_hi), "valid_from_ms": p.valid_from_ms, "valid_to_ms": p.valid_to_ms,
            "parents": list(p.parents), "children": list(p.children), "chain_epoch": p.chain_epoch,
            "chain": [{"node_id": m.node_id, "address": m.address, "role": m.role} for m in p.chain],
            "ingestion_owner": p.ingestion_owner.node_id if p.ingestion_owner else None,
            "learners": [m.node_id for m in p.learners],
            "history": list(p.history),
            "ending_sn": None if p.ending_sn is None else str(p.ending_sn), "sealed": p.sealed,
        } for p in info.partitions],
        "retention_s": info.retention_s, "protect_unread": info.protect_unread,
        "auto_split_records_per_s": info.auto_split_records_per_s, "repartition": info.repartition,
        "consumers": list(info.consumers),
        "limits_per_partition": {"write_records_per_s": info.write_records_per_s,
                                 "write_bytes_per_s": info.write_bytes_per_s, "read_bytes_per_s": info.read_bytes_per_s},
        "archive": ({"store": info.archive, "archive_after_s": info.archive_after_s,
                     "local_retention_s": info.local_retention_s, "compression": info.compression}
                    if info.archive else None),
        "encryption": info.encryption}


def _retention_text(d: dict) -> str:
    """The stream's retention as it is kept: seconds when set in seconds that are not
    whole hours (retention_hours is then only its rounded form), else hours."""
    seconds = d.get("retention_s") or 0
    if seconds and seconds % 3600:
        return f"{seconds:,} s"
    return f"{seconds // 3600 if seconds else d['retention_hours']} h"


def _describe_text(d: dict, history: bool = False) -> str:
    """The stream as lines; each chain's changes only with `history` (sms stream describe
    --history): on a long-lived stream they are most of it."""
    opened = sum(1 for p in d["partitions"] if p["state"] == "OPEN")
    closed = len(d["partitions"]) - opened
    counted = f"{opened} open partitions" + (f" ({closed} closed)" if closed else "")
    lines = [f"stream {d['name']}: {d['status']}, {counted}, replication "
             f"{d['replication_factor']} (min in-sync {d.get('min_in_sync', 1)}), {d['persistence']}, "
             f"{d['ingestion_policy']}, "
             f"retention {_retention_text(d)}, map version {d['map_version']}"
             + (f", encrypted at rest ({d['encryption']})" if d.get("encryption", "none") != "none" else "")]
    if d.get("archive"):
        a = d["archive"]
        lines.append(f"  archive {a['store']} ({a['compression']}): records older than {a['archive_after_s']} s, "
                     f"kept locally {a['local_retention_s']} s, in the archive for the retention")
    set_limits = {k: v for k, v in (d.get("limits_per_partition") or {}).items() if v}
    if set_limits:
        lines.append("  limits per partition: " + ", ".join(f"{k.replace('_per_s', '')} {v:,}/s"
                                                            for k, v in set_limits.items()))
    for p in d["partitions"]:
        chain = " -> ".join(m["node_id"] for m in p["chain"])
        lines.append(f"  {p['partition_id']} {p['state']:<6} chain {chain} (epoch {p['chain_epoch']}) "
                     f"hash [{p['hash_lo']}, {p['hash_hi']})")
        if p.get("parents") or p.get("children"):
            lineage = []
            if p["parents"]:
                lineage.append("from " + ", ".join(f"p{o:04d}" for o in p["parents"]))
            if p["children"]:
                lineage.append("into " + ", ".join(f"p{o:04d}" for o in p["children"]))
            if p.get("ending_sn") is not None:
                lineage.append(f"ending SN {p['ending_sn']}")
            lines.append("      " + "; ".join(lineage))
        if p["learners"]:
            lines.append(f"      copying to join: {', '.join(p['learners'])}")
        if p["state"] == "OPEN" and p["chain"] and len(p["chain"]) < d.get("min_in_sync", 1):
            lines.append(f"      refusing new records (NotEnoughReplicas): {len(p['chain'])} member(s), "
                         f"min in-sync {d['min_in_sync']}")
        for h in p["history"] if history else ():
            if h["action"] == "created":
                continue
            when = time.strftime("%H:%M:%S", time.localtime(h["at_ms"] / 1000))
            lines.append(f"      {when} epoch {h['epoch']}: {h['action']} {h['node']}: {h['reason']}")
    return "\n".join(lines)


def cmd_stream(args) -> int:
    with _client(args) as client:
        if args.stream_cmd == "create":
            info = client.create_stream(args.name, args.partitions, args.replication_factor,
                                        persistence=args.persistence, ingestion_policy=args.ingestion_policy,
                                        retention_hours=args.retention_hours, retention_s=args.retention_s,
                                        dedup_window_s=args.dedup_window_s, min_in_sync=args.min_in_sync,
                                        archive=args.archive or "", archive_after_s=args.archive_after_s or 0,
                                        local_retention_s=args.local_retention_s or 0,
                                        compression=args.compression or "",
                                        encryption=args.encryption or "none")
            d = _describe(info)
            _emit(args, d, _describe_text(d))
        elif args.stream_cmd == "describe":
            d = _describe(client.get_stream_info(args.name))
            _emit(args, d, _describe_text(d, history=args.history))
        elif args.stream_cmd == "list":
            names = client.list_streams()
            _emit(args, names, "\n".join(names) if names else "(no streams)")
        elif args.stream_cmd == "delete":
            client.delete_stream(args.name)
            _emit(args, {"deleted": args.name}, f"deleted {args.name}")
        elif args.stream_cmd == "repartition":
            if args.split is not None:
                op, call = "split", lambda: client.split(args.name, args.split, args.at_hash)
            elif args.merge is not None:
                op, call = "merge", lambda: client.merge(args.name, *args.merge)
            else:
                op, call = "scale", lambda: client.scale(args.name, args.scale)
            with _progress(f"{op} {args.name}: requested") as shown:
                info = call() if shown is None else _repartition_shown(client, args.name, op, call, shown)
            d = _describe(info)
            _emit(args, d, _describe_text(d))
        elif args.stream_cmd == "update":
            protect = None if args.protect_unread is None else args.protect_unread == "true"
            info = client.update_stream(args.name, retention_hours=args.retention_hours, retention_s=args.retention_s,
                                        protect_unread=protect, auto_split_records_per_s=args.auto_split_rate,
                                        auto_split_period_s=args.auto_split_period_s,
                                        write_records_per_s=args.write_records_per_s,
                                        write_bytes_per_s=args.write_bytes_per_s,
                                        read_bytes_per_s=args.read_bytes_per_s, archive=args.archive,
                                        archive_after_s=args.archive_after_s,
                                        local_retention_s=args.local_retention_s, compression=args.compression,
                                        encryption=args.encryption)
            d = _describe(info)
            _emit(args, d, _describe_text(d))
        elif args.stream_cmd in ("export", "import"):
            from node import backup
            what = f"{args.stream_cmd} {args.name}"
            with _progress(f"{what}: starting") as shown:
                progress = None if shown is None else (lambda n: shown(f"{what}: {n:,} records"))
                if args.stream_cmd == "export":
                    doc = client._run(backup.export_stream(client._aio, args.name, args.dir, progress))
                    out = {"stream": args.name, "dir": args.dir, "records": doc["records"],
                           "partitions": len(doc["partitions"])}
                    text = f"exported {doc['records']} records of {len(doc['partitions'])} partitions to {args.dir}"
                else:
                    out = client._run(backup.import_stream(client._aio, args.dir, args.name, progress))
                    text = f"imported {out['records']} records into {args.name} ({out['partitions']} partitions)"
            _emit(args, out, text)
        elif args.stream_cmd == "trim":
            client.trim_stream(args.name, before_sn=args.before_sn, before_time_ms=args.before_time_ms)
            _emit(args, {"trimmed": args.name}, f"trim of {args.name} requested; replicas delete in the background")
    return 0


def _repartition_shown(client, name: str, op: str, call: Callable, shown: Callable[[str], None]):
    """`call()` (a repartition, which returns once done) in a thread of its own, while
    this one shows the phase of the stream's repartition under way (control/phases.py)."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["info"] = call()
        except BaseException as e:        # (raised again below, in the command's thread)
            outcome["error"] = e

    worker = threading.Thread(target=run, name="repartition", daemon=True)
    worker.start()
    while True:
        worker.join(limits.REPARTITION_PHASE_POLL_S)
        if not worker.is_alive():
            break
        try:
            state = client.get_stream_info(name).repartition or {}
        except errors.SmsError:
            continue
        phase = state.get("phase", "")
        if phase and not state.get("done"):
            steps = f", {state['steps_done']} steps done" if state.get("steps_done") else ""
            shown(f"{op} {name}: {phase.lower()}{steps}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["info"]


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    """This module's commands, on the `sms` parser's subcommands (`common`: the client options)."""
    stream = sub.add_parser("stream", help="create, describe, list or delete streams")
    ssub = stream.add_subparsers(dest="stream_cmd", required=True)
    c = ssub.add_parser("create", parents=[common], help="a new stream: partitions, replication, persistence")
    c.add_argument("name", help="the stream's name")
    c.add_argument("--partitions", type=int, default=1, help="partitions to begin with (default 1)")
    c.add_argument("--replication-factor", "--rf", type=int, default=1,
                   help="replicas of each partition, one per storage node in its chain (default 1)")
    c.add_argument("--persistence", default="disk", choices=["disk", "disk_async", "memory"],
                   help="disk: fsynced per batch (default); disk_async: written per batch, flushed by the "
                        "OS; memory: lost when a node restarts")
    c.add_argument("--ingestion-policy", default="at_least_once_no_dup",
                   help="at_least_once_no_dup (default: a retried write is stored once), "
                        "at_least_once_dup_permitted or best_effort")
    c.add_argument("--retention-hours", type=int, default=0,
                   help=f"how long records are kept (default {limits.RETENTION_HOURS_DEFAULT}, or the tenant's "
                        "retention cap when shorter)")
    c.add_argument("--dedup-window-s", type=int, default=limits.DEDUP_WINDOW_MS_DEFAULT // 1000,
                   help="how long a retried write is recognised as a duplicate, seconds "
                        f"(default {limits.DEDUP_WINDOW_MS_DEFAULT // 1000})")
    c.add_argument("--min-in-sync", type=int, default=1, metavar="N",
                   help="refuse new records (NotEnoughReplicas, retried) while a partition's chain has fewer "
                        "than N members (1..replication factor; default 1)")
    c.add_argument("--retention-s", type=int, default=0, help="how long records are kept, seconds (overrides "
                   "--retention-hours); with an archive, how long the archive keeps them")
    _archive_arguments(c, create=True)
    for name, text in (("describe", "a stream's partitions, hash ranges, chains and lineage"),
                       ("delete", "delete a stream and its records")):
        s = ssub.add_parser(name, parents=[common], help=text)
        s.add_argument("name", help="the stream's name")
        if name == "describe":
            s.add_argument("--history", action="store_true", help="each chain's changes too (members added, "
                                                                 "removed, heads handed over)")
    ssub.add_parser("list", parents=[common], help="the names of the streams")
    r = ssub.add_parser("repartition", parents=[common], help="split, merge or scale a stream while it runs")
    r.add_argument("name", help="the stream's name")
    how = r.add_mutually_exclusive_group(required=True)
    how.add_argument("--split", metavar="PARTITION", help="split this partition (e.g. p0001 or 1)")
    how.add_argument("--merge", nargs=2, metavar="PARTITION", help="merge two adjacent partitions")
    how.add_argument("--scale", type=int, metavar="N", help="split and merge toward N even partitions")
    r.add_argument("--at-hash", help="split point: the first hash key of the upper child (default: the middle)")
    u = ssub.add_parser("update", parents=[common], help="change retention, protection or auto-splitting")
    u.add_argument("name", help="the stream's name")
    u.add_argument("--retention-hours", type=int, help="how long records are kept, hours")
    u.add_argument("--retention-s", type=int, help="how long records are kept, seconds")
    u.add_argument("--protect-unread", choices=["true", "false"],
                   help="true: retention keeps records its consumer groups have not read yet")
    u.add_argument("--auto-split-rate", type=int, help="records/s per partition that triggers a split (0: off)")
    u.add_argument("--auto-split-period-s", type=int,
                   help="seconds a partition must stay above --auto-split-rate before it splits")
    u.add_argument("--write-records-per-s", type=int, help="write limit per partition, records/s (0: none)")
    u.add_argument("--write-bytes-per-s", type=int, help="write limit per partition, bytes/s (0: none)")
    u.add_argument("--read-bytes-per-s", type=int, help="read limit per partition, bytes/s (0: none)")
    _archive_arguments(u, create=False)
    ex = ssub.add_parser("export", parents=[common],
                         help="write a stream's records and lineage to a directory of Parquet files (a backup)")
    ex.add_argument("name", help="the stream's name")
    ex.add_argument("dir", help="a new or empty directory")
    im = ssub.add_parser("import", parents=[common], help="create a new stream from an export's directory")
    im.add_argument("dir", help="the directory `sms stream export` wrote")
    im.add_argument("name", help="the new stream's name (it must not exist)")
    t = ssub.add_parser("trim", parents=[common], help="delete old records now")
    t.add_argument("name", help="the stream's name")
    t.add_argument("--before-sn", help="records of this SN's partition before it")
    t.add_argument("--before-time-ms", type=int, help="records of every partition older than this")
    stream.set_defaults(func=cmd_stream)
