"""`sms queue`: queues on streams (docs/queues.md): create, describe, list, update, delete."""

from __future__ import annotations

import argparse
import dataclasses
import time

from node.cli.common import _client, _emit


def _shown(q) -> dict:
    d = dataclasses.asdict(q)
    d["status"] = q.status.value
    d["uid"] = f"{q.uid:x}"
    return d


def _line(q) -> str:
    dead = f"dead letters after {q.max_receive_count} receives" if q.max_receive_count else "no dead letters"
    start = f"AT_TIMESTAMP {q.timestamp_ms}" if q.start == "AT_TIMESTAMP" else q.start
    made = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(q.created_ms / 1000))
    return (f"{q.name}  on {q.stream}  {q.status.value}  from {start}  visibility {q.visibility_s} s  {dead}  "
            f"(made {made})")


def cmd_queue(args) -> int:
    with _client(args) as client:
        if args.queue_cmd == "create":
            q = client.create_queue(args.stream, args.name, starting_position=args.start,
                                    timestamp_ms=args.timestamp_ms or 0, visibility_timeout_s=args.visibility_s,
                                    max_receive_count=0 if args.no_dead_letters else args.max_receive_count)
            _emit(args, _shown(q), f"queue created: {_line(q)}")
        elif args.queue_cmd == "describe":
            q = client.describe_queue(args.name)
            _emit(args, _shown(q), _line(q))
        elif args.queue_cmd == "list":
            queues = client.list_queues(args.stream or "")
            _emit(args, [_shown(q) for q in queues], "\n".join(_line(q) for q in queues) or "no queues")
        elif args.queue_cmd == "update":
            q = client.update_queue(args.name, visibility_timeout_s=args.visibility_s,
                                    max_receive_count=0 if args.no_dead_letters else args.max_receive_count)
            _emit(args, _shown(q), f"queue updated: {_line(q)}")
        else:
            client.delete_queue(args.name)
            _emit(args, {"deleted": args.name}, f"queue {args.name} deleted (its stream and records stay)")
    return 0


def _settings(p: argparse.ArgumentParser) -> None:
    p.add_argument("--visibility-s", type=int, help="seconds a received record stays invisible (0-43200; default 30)")
    dead = p.add_mutually_exclusive_group()
    dead.add_argument("--max-receive-count", type=int,
                      help="receives before a record becomes a dead letter (1-1000; default 6)")
    dead.add_argument("--no-dead-letters", action="store_true",
                      help="no dead letters: a record goes round until it is acknowledged or trimmed")


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    """This module's commands, on the `sms` parser's subcommands (`common`: the client options)."""
    queue = sub.add_parser("queue", help="queues on streams: records delivered one by one, acknowledged, redelivered")
    qsub = queue.add_subparsers(dest="queue_cmd", required=True)
    c = qsub.add_parser("create", parents=[common], help="a queue on a stream")
    c.add_argument("stream", help="the stream it delivers")
    c.add_argument("name", help="the queue's name ([a-zA-Z0-9_.-], at most 128)")
    c.add_argument("--start", choices=["LATEST", "TRIM_HORIZON", "AT_TIMESTAMP"], default="LATEST",
                   help="where delivery begins (default LATEST: what is written from now on)")
    c.add_argument("--timestamp-ms", type=int, help="AT_TIMESTAMP's time (ms since the epoch)")
    _settings(c)
    ql = qsub.add_parser("list", parents=[common], help="the queues (of one stream with --stream)")
    ql.add_argument("--stream", help="only the queues of this stream")
    for name, text in (("describe", "a queue's settings"),
                       ("delete", "delete a queue and its delivery state (the stream and its records stay)")):
        q = qsub.add_parser(name, parents=[common], help=text)
        q.add_argument("name", help="the queue's name")
    u = qsub.add_parser("update", parents=[common], help="change a queue's visibility timeout or dead letters")
    u.add_argument("name", help="the queue's name")
    _settings(u)
    queue.set_defaults(func=cmd_queue)
