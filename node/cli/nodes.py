"""`sms node`: list, add, drain, undrain and remove storage nodes."""

from __future__ import annotations

import argparse
import sys
import time

from node.cli.common import _client, _emit, _local_data_dir
from sms import limits


def _nodes_text(loads) -> str:
    lines = [f"{'node':<10} {'address':<22} {'state':<9} {'replicas':>8} {'heads':>6} {'learners':>8}"]
    for n in loads:
        state = "draining" if n.draining else ("live" if n.live else "down")
        lines.append(f"{n.node_id:<10} {n.address or '-':<22} {state:<9} {n.replicas:>8} {n.heads:>6} "
                     f"{n.learners:>8}")
    return "\n".join(lines)


def _nodes_json(loads) -> list[dict]:
    return [{"node_id": n.node_id, "address": n.address, "live": n.live, "draining": n.draining,
             "replicas": n.replicas, "heads": n.heads, "learners": n.learners} for n in loads]


def cmd_node(args) -> int:
    if args.node_cmd == "add":
        from node.launcher import add_node
        try:
            node = add_node(args.data_dir)
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"error: no local cluster in {args.data_dir} ({e}); `sms node add` adds to the "
                             f"cluster `sms up` runs there. On other hosts run `sms serve` with the "
                             f"cluster's --metastore: a node that registers takes its share too") from None
        _emit(args, {"node_id": node.node_id, "address": node.address, "pid": node.pid},
              f"node {node.node_id} started at {node.address} (pid {node.pid}); "
              f"replicas and heads move onto it while writes go on (`sms node list` shows them)")
        return 0
    with _client(args) as client:
        if args.node_cmd == "list":
            loads = client.list_nodes()
            _emit(args, _nodes_json(loads), _nodes_text(loads))
            return 0
        if args.node_cmd == "remove":
            return _remove_node(args, client)
        undo = args.node_cmd == "undrain" or args.undo
        loads = client.drain_node(args.node_id, undo=undo)
        if undo or not args.wait:
            what = "no longer draining" if undo else "draining: its replicas move to the other nodes"
            _emit(args, _nodes_json(loads), f"{args.node_id} is {what}\n{_nodes_text(loads)}")
            return 0
        deadline = time.monotonic() + args.timeout
        while True:
            mine = next((n for n in loads if n.node_id == args.node_id), None)
            held = 0 if mine is None else mine.replicas + mine.learners
            if held == 0:
                _emit(args, _nodes_json(loads), f"{args.node_id} holds no replica: it may be stopped\n"
                                                 f"{_nodes_text(loads)}")
                return 0
            if time.monotonic() > deadline:
                print(f"error: {args.node_id} still holds {held} replicas after {args.timeout:.0f} s "
                      f"(each needs a live node that is not draining and holds nothing of its chain)",
                      file=sys.stderr)
                return 1
            if not args.json:
                print(f"{args.node_id}: {held} replicas left", file=sys.stderr, flush=True)
            time.sleep(limits.NODE_DRAIN_POLL_S)
            loads = client.list_nodes()


def _remove_node(args, client) -> int:
    """`sms node remove N`: the cluster forgets the node (refused while it runs or holds
    replicas), then so does the local launcher of --data-dir, when the cluster is the one
    `sms up` runs there (node/launcher.py forget_node, where this version has it)."""
    loads = client.remove_node(args.node_id)
    local = _local_data_dir(args)
    forgotten_here = False
    if local is not None:
        from node import launcher
        if hasattr(launcher, "forget_node"):        # (written beside this command; absent in older trees)
            try:
                forgotten_here = launcher.forget_node(local, args.node_id)    # (False: not one of its nodes)
            except (OSError, ValueError, KeyError) as e:
                print(f"error: {args.node_id} was removed from the cluster, but the local cluster in {local} "
                      f"could not forget it: {e}", file=sys.stderr)
                return 1
    _emit(args, _nodes_json(loads), f"{args.node_id} removed: the cluster keeps no entry of it"
          + (f" (nor does the local cluster in {local})" if forgotten_here else "") + f"\n{_nodes_text(loads)}")
    return 0


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    """This module's commands, on the `sms` parser's subcommands (`common`: the client options)."""
    node = sub.add_parser("node", help="list storage nodes, add one to a local cluster, drain, undrain or remove one")
    nsub = node.add_subparsers(dest="node_cmd", required=True)
    nsub.add_parser("list", parents=[common], help="each storage node's replicas, heads and learners")
    nsub.add_parser("add", parents=[common],
                    help="start one more storage node in the local cluster of --data-dir; "
                         "replicas and heads rebalance onto it")
    d = nsub.add_parser("drain", parents=[common], help="move every replica off a node before removing it")
    d.add_argument("node_id", help="the storage node, as `sms node list` shows it")
    d.add_argument("--undo", action="store_true", help="stop draining: the node takes replicas again")
    d.add_argument("--wait", action="store_true", help="return once the node holds nothing, showing progress")
    d.add_argument("--timeout", type=float, default=limits.NODE_DRAIN_WAIT_S, help="seconds --wait waits (default 600)")
    ud = nsub.add_parser("undrain", parents=[common], help="stop draining a node: it takes replicas again")
    ud.add_argument("node_id", help="the storage node, as `sms node list` shows it")
    rm = nsub.add_parser("remove", parents=[common],
                         help="forget a drained node once it is stopped: `sms node list` no longer shows it")
    rm.add_argument("node_id", help="the storage node, as `sms node list` shows it")
    node.set_defaults(func=cmd_node)
