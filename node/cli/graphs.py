"""`sms graph`: stream-processing stage graphs (sps/)."""

from __future__ import annotations

import argparse

from node.cli.common import _address, _emit
from sms import errors


def cmd_graph(args) -> int:
    import asyncio

    from node import graph_commands as commands
    from sps.graph import load_graph
    graph = load_graph(args.graph)
    if args.graph_cmd == "apply":
        done = asyncio.run(commands.apply_graph(_address(args), graph))
        _emit(args, done, f"streams created: {', '.join(done['streams_created']) or '(none)'}; "
                          f"stages registered: {', '.join(done['stages_registered'])}")
    elif args.graph_cmd == "run":
        names = args.stage or graph.order()
        unknown = [n for n in names if n not in graph.stages]
        if unknown:
            raise errors.InvalidArgument(f"no stage {unknown[0]!r} in {args.graph}; it has "
                                         + ", ".join(sorted(graph.stages)))
        done = asyncio.run(commands.run_stages(_address(args), [graph.stages[n] for n in dict.fromkeys(names)],
                                               args.worker_id, args.master))
        _emit(args, done, f"worker {done['worker']} stopped: {done['processed']} records processed")
    else:
        rows = asyncio.run(commands.graph_status(_address(args), graph))
        lines = []
        for st in rows:
            lines.append(f"stage {st['stage']}: {len(st['workers'])} workers ({', '.join(st['workers']) or 'none'}); "
                         f"{st['failures']} failed records, {st['dead_letters']} dead letters "
                         f"(to {st['dead_letter_stream']})"
                         + (f"; state changelog {st['changelog']}" if "changelog" in st else ""))
            for p in st["partitions"]:
                lag = ("-" if p["lag_records"] is None else f"{p['lag_records']:,} records") + \
                    ("" if not p["lag_ms"] else f" ({p['lag_ms'] / 1000:.1f} s)")
                lines.append(f"  {p['partition']:<24} owner {p['owner'] or '-':<20} checkpoint {p['checkpoint']:<40} "
                             f"records {p['records']:<8} {p['records_per_s']:>8}/s lag {lag}"
                             + (f"  snapshot at {p['state_snapshot'] or '-'}" if "state_snapshot" in p else "")
                             + (f"  last error: {p['last_error']}" if p["last_error"] else ""))
        _emit(args, rows, "\n".join(lines))
    return 0


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    """This module's commands, on the `sms` parser's subcommands (`common`: the client options)."""
    graph = sub.add_parser("graph", help="stream-processing stage graphs (YAML)")
    gsub = graph.add_subparsers(dest="graph_cmd", required=True)
    for name, text in (("apply", "create the graph's streams and its stages' dead-letter streams"),
                       ("run", "run a worker of one stage, several, or all of them"),
                       ("status", "owner, checkpoint and lag of each stage's partitions")):
        g = gsub.add_parser(name, parents=[common], help=text)
        g.add_argument("graph", help="the graph's YAML file")
        g.add_argument("--metastore", help=argparse.SUPPRESS)     # (no longer needed: accepted, unused)
        if name == "run":
            g.add_argument("--stage", action="append",
                           help="a stage to run (repeat for several in this process, sharing one Spark "
                                "session); default: every stage of the graph")
            g.add_argument("--worker-id", help="default: HOST-PID")
            g.add_argument("--master", default="local[2]", help="Spark master URL (default local[2])")
    graph.set_defaults(func=cmd_graph)
