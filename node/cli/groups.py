"""`sms consumer`: consumer groups, their members, checkpoints and lag; moving or deleting a group."""

from __future__ import annotations

import argparse
import dataclasses

from node.cli.common import _client, _emit


def _lag(records: int | None, ms: int) -> str:
    """A partition's lag as `sms consumer describe` shows it: records, and seconds when behind."""
    if records is None:
        return "- (no position yet)"
    return f"{records:,} records" + (f" ({ms / 1000:.1f} s)" if records else "")


def cmd_consumer(args) -> int:
    """Consumer groups (sms/consumer.py) and the stream's registered consumers."""
    with _client(args) as client:
        if args.consumer_cmd == "list":
            groups = client.list_groups(args.stream)
            registered = [c for c in client.get_stream_info(args.stream).consumers if c not in groups]
            _emit(args, {"groups": groups, "registered": registered},
                  "\n".join([f"{g}  (group)" for g in groups] + [f"{c}  (registered consumer)" for c in registered])
                  or f"stream {args.stream} has no consumers")
        elif args.consumer_cmd == "describe":
            d = client.describe_group(args.stream, args.group)
            lines = [f"group {d.group} of {d.stream}: {len(d.members)} members, lag {d.lag_records:,} records"]
            lines += [f"  member {m.member}  ({m.host} pid {m.pid}, heartbeat {m.heartbeat_age_ms} ms ago)"
                      for m in d.members]
            lines += [f"  {p.partition_id}  {p.state:<6}  owner {p.owner or '-':<24}  checkpoint "
                      f"{p.checkpoint:<40}  done {p.records:>10,}  lag {_lag(p.lag_records, p.lag_ms)}"
                      for p in d.partitions]
            _emit(args, dataclasses.asdict(d) | {"lag_records": d.lag_records}, "\n".join(lines))
        elif args.consumer_cmd == "reset":
            sns = dict(item.split("=", 1) for item in args.sequence_number or [])
            d = client.describe_group(args.stream, args.group)      # (GroupNotFound before any plan)
            to, target, plan = reset_plan(d, args.to, args.timestamp_ms, sns)
            lines = [f"  {p['partition_id']}  {p['state']:<6}  from {p['checkpoint'] or '-':<40}  to {p['to']}"
                     for p in plan]
            if not args.execute:
                _emit(args, {"plan": plan, "executed": False},
                      "\n".join([f"the plan for group {args.group} of {args.stream} (nothing changed: add --execute "
                                 f"to apply it){': ' + target if target else ''}"] + lines))
                return 0
            client.reset_group(args.stream, args.group, to=to, timestamp_ms=args.timestamp_ms or 0,
                               sequence_numbers=sns)
            _emit(args, {"reset": args.group, "to": to or sns, "plan": plan, "executed": True},
                  "\n".join([f"group {args.group} reset to {to or sns}: running members resume from there"] + lines))
        else:
            client.delete_group(args.stream, args.group)
            _emit(args, {"deleted": args.group}, f"group {args.group} of {args.stream} deleted")
    return 0


def reset_plan(described, to: str | None, timestamp_ms: int | None,
               sns: dict[str, str]) -> tuple[str, str, list[dict]]:
    """What `sms consumer reset` (and the web console, node/console.py) does to a group
    (`describe_group`'s answer): the `to` for `reset_group` ("" with per-partition SNs),
    that target in words, and per partition its checkpoint now and where it goes."""
    to = "AT_TIMESTAMP" if timestamp_ms is not None else "" if sns else to or "TRIM_HORIZON"
    target = (f"the first record at or after {timestamp_ms} ms" if to == "AT_TIMESTAMP" else
              "the end of the partition when executed" if to == "LATEST" else
              "the oldest record kept" if to == "TRIM_HORIZON" else "")
    plan = [{"partition_id": p.partition_id, "state": p.state, "checkpoint": p.checkpoint,
             "to": sns.get(p.partition_id, sns.get(str(p.ordinal), "TRIM_HORIZON")) if sns else to}
            for p in described.partitions]
    return to, target, plan


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    """This module's commands, on the `sms` parser's subcommands (`common`: the client options)."""
    consumer = sub.add_parser("consumer", help="consumer groups: members, checkpoints, lag; move or delete a group")
    gsub = consumer.add_subparsers(dest="consumer_cmd", required=True)
    gl = gsub.add_parser("list", parents=[common], help="a stream's consumer groups and registered consumers")
    gl.add_argument("stream", help="the stream's name")
    for name, text in (("describe", "a group's members, and per partition its owner, checkpoint and lag"),
                       ("delete", "delete a group (its checkpoints; it no longer protects unread records)")):
        g = gsub.add_parser(name, parents=[common], help=text)
        g.add_argument("stream", help="the stream's name")
        g.add_argument("group", help="the consumer group's name")
    gr = gsub.add_parser("reset", parents=[common], help="move a group's checkpoints (running members follow): "
                                                         "shows the plan; --execute applies it")
    gr.add_argument("stream", help="the stream's name")
    gr.add_argument("group", help="the consumer group's name")
    where = gr.add_mutually_exclusive_group()
    where.add_argument("--to", choices=["TRIM_HORIZON", "LATEST"],
                       help="the oldest record kept, or the end of each partition now (default TRIM_HORIZON)")
    where.add_argument("--timestamp-ms", type=int, help="the first record at or after this time (ms since the epoch)")
    where.add_argument("--sequence-number", action="append", metavar="PARTITION=SN",
                       help="resume after this SN in this partition (repeat; partitions not named: TRIM_HORIZON)")
    gr.add_argument("--execute", action="store_true",
                    help="apply the plan (without it: show each partition's checkpoint now and where it would go, "
                         "and change nothing)")
    consumer.set_defaults(func=cmd_consumer)
