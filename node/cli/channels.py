"""`sms channel`: channels, a stream delivered into Parquet files or an Iceberg table
(docs/channels.md, "sms channel"): create, describe, list, update, delete. `summary` is the line of
each channel in `sms status`."""

from __future__ import annotations

import argparse
import dataclasses
import time

from node.cli.common import _client, _emit
from sms import errors

# (as control/channels.py, which checks them; not imported, so that `sms` starts quickly)
STARTS = ("TRIM_HORIZON", "LATEST")
FORMATS = ("BYTES", "JSON")
COMPRESSIONS = ("NONE", "GZIP", "ZSTD", "SNAPPY")       # FILES: NONE, GZIP, ZSTD; ICEBERG: NONE, ZSTD, SNAPPY
COLUMN_TYPES = "string, long, double, boolean, timestamp, binary"
ICEBERG_SCHEME = "iceberg://"
ERROR_CHARS_SHOWN = 200                                 # of a partition's last error, in `sms status`


def _partition_id(ordinal: int) -> str:
    return f"p{ordinal:04d}"


def _shown(c) -> dict:
    d = dataclasses.asdict(c)
    d["status"] = c.status.value
    d["uid"] = f"{c.uid:x}"
    d["schema"] = [{"name": n, "type": t} for n, t in c.schema]
    for p in d["partitions"]:
        p["partition_id"] = _partition_id(p["ordinal"])
    return d


def where(d) -> str:
    """A destination in short: its url, or iceberg://namespace.table."""
    return d.url if d.kind == "FILES" else f"{ICEBERG_SCHEME}{d.namespace}.{d.table}"


def _destination_text(d) -> str:
    if d.kind == "FILES":
        return f"{d.url} ({d.compression} Parquet, {d.key_template})"
    hourly = ", by hour" if d.partition_by_hour else ""
    return f"{where(d)} ({d.compression}{hourly}; catalog {d.catalog_uri}, warehouse {d.warehouse or '-'})"


def _line(c, full: bool = True) -> str:
    """The channel in a line; its destination in short (`where`) unless `full`."""
    made = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.created_ms / 1000))
    fmt = c.record_format
    if c.schema:
        fmt += " (" + ", ".join(f"{n}:{t}" for n, t in c.schema) + ")"
    dead = f"  dead letters to {c.dead_letter_url}" if c.dead_letter_url else ""
    to = _destination_text(c.destination) if full else where(c.destination)
    return (f"{c.name}  on {c.stream}  {c.status.value}  to {to}  from {c.start}  "
            f"freshness {c.data_freshness_s} s  {fmt}{dead}  (made {made})")


def _age(ms: int, now_ms: int) -> str:
    return f"{max(0, now_ms - ms) / 1000:.1f} s ago" if ms else "never"


def _partition_line(p, now_ms: int) -> str:
    error = p.error.replace("\n", " ")
    return (f"    {_partition_id(p.ordinal)}  at {p.position or '-'}  records {p.records}  files {p.files}  "
            f"dead letters {p.dead_letters}  committed {_age(p.last_commit_ms, now_ms)}  lag "
            f"{'-' if p.lag_records is None else format(p.lag_records, ',')} records {p.lag_ms / 1000:.1f} s"
            f"  node {p.node or '-'}" + (f"  FAILING: {error}" if error else ""))


def _described(c) -> str:
    now_ms = int(time.time() * 1000)
    lines = [_line(c)]
    lines += [_partition_line(p, now_ms) for p in c.partitions] or ["    no partition has started yet"]
    return "\n".join(lines)


def summary(c) -> tuple[dict, str]:
    """A described channel in `sms status`: a dict for --json and one line, with its worst
    partition lag and the partitions whose last attempt failed."""
    failing = {_partition_id(p.ordinal): p.error for p in c.partitions if p.error}
    lag_ms = max((p.lag_ms for p in c.partitions), default=0)
    shown = {"name": c.name, "stream": c.stream, "status": c.status.value, "destination": where(c.destination),
             "partitions": len(c.partitions), "records": sum(p.records for p in c.partitions),
             "worst_lag_ms": lag_ms, "errors": failing}
    if failing:
        pid, error = next(iter(failing.items()))
        more = f" (and {len(failing) - 1} more)" if len(failing) > 1 else ""
        health = f"FAILING {pid}: {error.splitlines()[0][:ERROR_CHARS_SHOWN] if error.strip() else '?'}{more}"
    elif not c.partitions:
        health = "not started yet"
    else:
        health = f"worst lag {lag_ms / 1000:.1f} s"
    return shown, (f"channel {c.name}  on {c.stream}  to {where(c.destination)}  "
                   f"records {shown['records']}  {health}")


def _schema(text: str | None) -> list[tuple[str, str]]:
    """--schema name:type,name:type; its names and types are checked by the cluster."""
    if not text:
        return []
    out = []
    for column in text.split(","):
        name, colon, type_ = column.strip().partition(":")
        if not colon or not name.strip() or not type_.strip():
            raise errors.InvalidArgument(f"--schema column {column.strip()[:80]!r}: expected name:type "
                                         f"(types: {COLUMN_TYPES})")
        out.append((name.strip(), type_.strip()))
    return out


def _destination(args) -> dict:
    """DESTINATION and its options as ChannelDestination's fields; an option that does not
    fit the kind is left for the cluster to refuse by name."""
    d: dict = {}
    if args.destination.startswith(ICEBERG_SCHEME):
        namespace, _, table = args.destination[len(ICEBERG_SCHEME):].partition(".")
        d.update(kind="ICEBERG", namespace=namespace, table=table)
    else:
        d.update(kind="FILES", url=args.destination)
    for field in ("compression", "key_template", "catalog_uri", "warehouse"):
        if getattr(args, field):
            d[field] = getattr(args, field)
    if args.partition_by_hour:
        d["partition_by_hour"] = True
    return d


def cmd_channel(args) -> int:
    with _client(args) as client:
        if args.channel_cmd == "create":
            schema = _schema(args.schema)
            record_format = args.format or ("JSON" if schema else "BYTES")
            c = client.create_channel(args.stream, args.name, _destination(args), data_freshness_s=args.freshness,
                                      starting_position=args.start, record_format=record_format, schema=schema,
                                      dead_letter_url=args.dead_letter_url or "")
            _emit(args, _shown(c), f"channel created: {_line(c)}")
        elif args.channel_cmd == "describe":
            c = client.describe_channel(args.name)
            _emit(args, _shown(c), _described(c))
        elif args.channel_cmd == "list":
            channels = client.list_channels(args.stream or "")
            _emit(args, [_shown(c) for c in channels],
                  "\n".join(_line(c, full=False) for c in channels) or "no channels")
        elif args.channel_cmd == "update":
            c = client.update_channel(args.name, data_freshness_s=args.freshness)
            _emit(args, _shown(c), f"channel updated: {_line(c)}")
        else:
            client.delete_channel(args.name)
            _emit(args, {"deleted": args.name},
                  f"channel {args.name} deleted (what it delivered stays; so do its stream and records)")
    return 0


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    """This module's commands, on the `sms` parser's subcommands (`common`: the client options)."""
    channel = sub.add_parser("channel", help="channels: a stream delivered continuously into Parquet files or an "
                                             "Iceberg table")
    csub = channel.add_subparsers(dest="channel_cmd", required=True)
    c = csub.add_parser("create", parents=[common], help="a channel delivering a stream")
    c.add_argument("stream", help="the stream it delivers")
    c.add_argument("name", help="the channel's name ([a-zA-Z0-9_.-], at most 128)")
    c.add_argument("destination", help="file:///dir or s3://bucket/prefix (Parquet files), or "
                                       "iceberg://namespace.table (a table of the cluster's catalog unless "
                                       "--catalog-uri)")
    c.add_argument("--freshness", type=int, metavar="S",
                   help="a record reaches the destination within about S seconds (1-900; default 60)")
    c.add_argument("--start", choices=STARTS, default="TRIM_HORIZON",
                   help="where delivery begins (default TRIM_HORIZON: every record the stream holds)")
    c.add_argument("--compression", choices=COMPRESSIONS,
                   help="of the Parquet files (default ZSTD; files: NONE, GZIP, ZSTD; Iceberg: NONE, ZSTD, SNAPPY)")
    c.add_argument("--key-template", help="files: the names of the files under the url, of {stream}, {partition}, "
                                          "{start}, {year}, {month}, {day}, {hour}; must hold {partition} and "
                                          "{start} (default: by stream, partition, date and hour, then "
                                          "{start}.parquet)")
    c.add_argument("--catalog-uri", help="Iceberg: the catalog, sqlite:////absolute/path.db or an http(s):// REST "
                                         "catalog (default: the cluster's)")
    c.add_argument("--warehouse", help="Iceberg: where the table's files go, file:///dir or s3://bucket/prefix "
                                       "(default: the cluster's)")
    c.add_argument("--partition-by-hour", action="store_true",
                   help="Iceberg: partition the table by the hour of arrival_time")
    c.add_argument("--format", choices=FORMATS,
                   help="BYTES: each record's data as it is; JSON: data parsed into the --schema columns, "
                        "or into columns inferred from the records without one (default: JSON with --schema, "
                        "else BYTES)")
    c.add_argument("--schema", metavar="NAME:TYPE,...",
                   help=f"JSON's columns, name:type,... (types: {COLUMN_TYPES}; none: inferred)")
    c.add_argument("--dead-letter-url", metavar="URL",
                   help="JSON: where records that do not parse go, file:///dir or s3://bucket/prefix (required "
                        "with JSON)")
    cl = csub.add_parser("list", parents=[common], help="the channels (of one stream with --stream)")
    cl.add_argument("--stream", help="only the channels of this stream")
    for name, text in (("describe", "a channel's settings and each partition's progress"),
                       ("delete", "delete a channel and its progress (what it delivered, the stream and its "
                                  "records stay)")):
        p = csub.add_parser(name, parents=[common], help=text)
        p.add_argument("name", help="the channel's name")
    u = csub.add_parser("update", parents=[common], help="change a channel's data freshness")
    u.add_argument("name", help="the channel's name")
    u.add_argument("--freshness", type=int, metavar="S", required=True,
                   help="a record reaches the destination within about S seconds (1-900)")
    channel.set_defaults(func=cmd_channel)
