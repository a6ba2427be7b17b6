"""`sms up`, `serve`, `status`, `demo`, `config` and `completion`: running a cluster and looking at it
(`status`: nodes, replicas, streams, and a line per channel from node/cli/channels.py)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
import threading
import time

import argcomplete

from node.cli.channels import summary as channel_summary
from node.cli.common import DEFAULT_PORT, _client, _emit
from node.cli.streams import _describe, _describe_text
from sms import errors, limits
from sms.metadata import chain_name


def _port_busy(host: str, port: int) -> bool:
    """Whether a process listens on host:port (bound as gRPC binds: SO_REUSEADDR, so a
    closed connection lingering in TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _port_busy_exit(address: str) -> SystemExit:
    return SystemExit(f"error: {address} is in use (another `sms up`?); choose another port with --port N "
                      f"(0: any free port)")


def _short_of_replicas(streams: list[dict], registered) -> list[dict]:
    """The partitions (of `_describe` dicts) whose chain has fewer members on registered
    nodes than the stream's replication factor (control/chains.py `under_replicated`)."""
    from control.chains import under_replicated
    out = []
    for d in streams:
        if d["status"] == "DELETING":
            continue
        for p in d["partitions"]:
            members = [m["node_id"] for m in p["chain"]]
            if under_replicated(members, d["replication_factor"], registered):
                out.append({"stream": d["name"], "partition_id": p["partition_id"], "members": members,
                            "live_members": sum(m in registered for m in members),
                            "replication_factor": d["replication_factor"], "learners": p["learners"]})
    return out


def _watch_replicas(cluster, stop: threading.Event) -> None:
    """`sms up`'s thread that says, every UP_WATCH_INTERVAL_S, what changed of drains
    (`list_nodes`) and of partitions short of replicas (the control leader's
    `sms_under_replicated_partitions`: one scrape, whatever the number of streams);
    node/launcher.py ReplicaWatch words it. A look that fails (the control node
    restarting, say) says nothing; the next one tries again."""
    from node.launcher import ReplicaWatch
    from sms.client import Client
    watch = ReplicaWatch()
    client = None
    try:
        while not stop.is_set():
            try:
                client = client or Client(cluster.address, **cluster.client_options())
                loads = client.list_nodes()
                short = _leader_short_of_replicas(cluster)
                lines = watch.lines(loads, short) if short is not None else []
            except Exception:          # noqa: BLE001 (the cluster busy or restarting: the next look)
                lines = []
            for line in lines:
                if not stop.is_set():
                    print(line, flush=True)
            stop.wait(limits.UP_WATCH_INTERVAL_S)
    finally:
        if client is not None:
            client.close()


def _leader_short_of_replicas(cluster) -> dict[str, int] | None:
    """stream -> partitions short of replicas, as the control leader of a local cluster
    exports them (node/metrics.py); None when no control node answers as the leader."""
    import ssl
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    context = ssl.create_default_context(cafile=cluster.ca_file) if cluster.tls else None
    token = cluster.monitor_token or cluster.admin_token         # (/metrics wants a key: node/metrics.py)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for node in (cluster.procs[n] for n in cluster.control_ids):
        if not node.metrics_address:
            continue
        url = f"{'https' if cluster.tls else 'http'}://{node.metrics_address}/metrics"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=context,
                                        timeout=limits.UP_WATCH_INTERVAL_S) as answer:
                text = answer.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            if family.name == "sms_under_replicated_partitions":      # (the leader's alone)
                return {s.labels["stream"]: int(s.value) for s in family.samples if s.value > 0}
    return None


def cmd_up(args) -> int:
    from node.launcher import LocalCluster
    host = "127.0.0.1"                      # (LocalCluster's default host)
    if args.port and _port_busy(host, args.port):
        raise _port_busy_exit(f"{host}:{args.port}")
    if args.config:             # (checked here, then every node reads it: node/config.py)
        from node import config
        try:
            values = config.load(args.config)
        except config.ConfigError as e:
            raise SystemExit(f"error: {e}") from None
        own = [k for k in ("node.listen", "node.cluster_listen", "node.metrics_listen", "node.kinesis_listen")
               if values[k].source == os.path.abspath(args.config) or values[k].source == args.config]
        if own:                     # (one address for every node: all but one would fail to bind)
            raise SystemExit(f"error: {args.config}: {', '.join(own)} is a node's own address; `sms up` chooses "
                             "each node's (leave it out of a file for sms up)")
        os.environ[config.ENV_CONFIG] = os.path.abspath(args.config)
        try:
            config.apply(values)    # (the launcher's own: timeouts.node_stop_s)
        except config.ConfigError as e:
            raise SystemExit(f"error: {e}") from None
    try:        # (on an existing DIR: every storage node recorded in DIR/nodes.json, node/launcher.py)
        cluster = LocalCluster(args.data_dir, nodes=args.nodes, port=args.port, metastore=args.metastore,
                               controls=args.controls, tls=not args.insecure, ca_dir=args.ca_dir, host=host)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.insecure:
        print("warning: --insecure: plaintext on every port, and any process that reaches one may call "
              "anything; for local experiments only", file=sys.stderr, flush=True)
    try:
        cluster.start()
    except RuntimeError as e:
        if not args.port or "Failed to bind to address" not in str(e):
            raise
        raise _port_busy_exit(f"{host}:{args.port}") from None      # taken since the check above
    problem = cluster.make_monitor_key()       # (Prometheus's key, in cluster.json: node/launcher.py)
    if problem:
        print(f"warning: {problem}; `sms key create --role monitor` makes one", file=sys.stderr, flush=True)
    print(f"address: {cluster.address}", flush=True)
    key = "?token=<the token in cluster.json>" if cluster.tls else ""      # (never the token itself on stdout)
    print(f"console: {cluster.console_url}{key} (read-only; the browser must trust the cluster CA)", flush=True)
    if cluster.tls:
        print(f"tls: CA {cluster.ca_file}; admin token in {os.path.join(cluster.data_dir, 'cluster.json')} "
              f"(the sms command and sms.Client.from_cluster_file use both), and Prometheus's key for /metrics "
              f"as monitor_token", flush=True)
    if cluster.kinesis_endpoint:
        print(f"kinesis: {cluster.kinesis_endpoint} (eval \"$(sms key aws)\" points the AWS CLI and SDKs at it, "
              f"with the admin key's AWS credentials; then: aws kinesis list-streams. docs/kinesis.md)", flush=True)
    storage = [n for n, p in cluster.procs.items() if p.roles != "control"]
    started = (f"{len(storage)} storage nodes" if storage == [f"n{i}" for i in range(1, args.nodes + 1)]
               else f"{len(storage)} storage nodes: {', '.join(storage)}, as recorded in {cluster.data_dir}/nodes.json")
    print(f"data: {cluster.data_dir} ({started}, {args.controls} control; metadata in "
          f"{cluster.metastore}); Ctrl-C stops", flush=True)
    # drains and partitions short of replicas, as they change (a line each)
    watcher = threading.Thread(target=_watch_replicas, args=(cluster, stop), name="up-watch", daemon=True)
    watcher.start()
    try:
        while not stop.wait(limits.NODE_SUPERVISE_POLL_S):
            for line in cluster.supervise(stopping=stop.is_set):      # a node that died starts again
                print(line, file=sys.stderr, flush=True)
    finally:
        stop.set()
        cluster.stop()
        watcher.join(timeout=limits.UP_WATCH_INTERVAL_S)      # (a look under way at a stopped cluster: not waited for)
        print("stopped", flush=True)
    return 0


def cmd_serve(args) -> int:
    from node import config, server
    try:       # (what the command line leaves out, from the configuration: node.id, metastore.url, ...)
        config.serve_args(args)
    except config.ConfigError as e:
        raise SystemExit(f"sms serve: {e}") from None
    return server.run(args)


def cmd_status(args) -> int:
    with _client(args) as client:
        cluster = client.describe_cluster()
        nodes = []
        for n in cluster.nodes:
            entry = {"node_id": n.node_id, "address": n.address, "roles": list(n.roles), "pid": n.pid,
                     "metrics_address": n.metrics_address, "kinesis_address": n.kinesis_address}
            try:
                if "storage" in n.roles:
                    status = client.node_status(n.address)
                    entry["replicas"] = status["replicas"]
                    entry["storage_write_failures"] = status["storage_write_failures"]
                    entry["storage_last_error"] = status["storage_last_error"]
                    entry["storage_last_error_ms"] = status["storage_last_error_ms"]
                    entry["links"] = status["links"]
                if "ingestion" in n.roles:
                    entry["ingestion"] = client.ingestion_status(n.address)["partitions"]
            except errors.SmsError as e:
                entry["error"] = f"{e.name}: {e.message}"
            nodes.append(entry)
        streams = []
        for name in client.list_streams():
            try:
                streams.append(_describe(client.get_stream_info(name)))
            except errors.StreamNotFound:
                continue      # deleted meanwhile
        channels = []
        try:
            listed = client.list_channels()
        except errors.InternalError as e:      # a control of a release before channels (mid-upgrade: it
            if not e.message.startswith("UNIMPLEMENTED"):     # has none; docs/operations.md, "Upgrades")
                raise
            listed = []
        for c in listed:
            try:
                channels.append(channel_summary(client.describe_channel(c.name)))
            except errors.ChannelNotFound:
                continue      # deleted meanwhile
    short = _short_of_replicas(streams, {n.node_id for n in cluster.nodes})
    lines = [f"control: {cluster.control_address}"]
    if short:
        lines.append(f"under-replicated: {len(short)} partition{'s' if len(short) != 1 else ''} with fewer live "
                     f"members than their replication factor")
        for p in short:
            lines.append(f"    {p['stream']}/{p['partition_id']}: {p['live_members']} of {p['replication_factor']} "
                         f"(chain {' -> '.join(p['members'])}"
                         + (f"; copying to join: {', '.join(p['learners'])}" if p["learners"] else "") + ")")
    else:
        lines.append("replication: every partition has its replication factor")
    for n in nodes:
        lines.append(f"node {n['node_id']:<8} {n['address']:<22} pid {n['pid']:<8} {','.join(n['roles'])}"
                     + (f"  metrics {n['metrics_address']}" if n["metrics_address"] else "")
                     + (f"  kinesis {n['kinesis_address']}" if n["kinesis_address"] else ""))
        if n.get("storage_write_failures"):
            at = time.strftime("%H:%M:%S", time.localtime(n["storage_last_error_ms"] / 1000))
            lines.append(f"    storage: {n['storage_write_failures']} failed write transactions; "
                         f"the last at {at}: {n['storage_last_error']}")
        for r in n.get("replicas", []):
            lines.append(f"    {chain_name(r['chain_id']):<28} {r['role']:<9} epoch {r['epoch']:<3} records {r['records']:<9} "
                         f"committed {r['committed_sn']}")
            if r.get("archive"):
                a = r["archive"]
                behind = f", {a['lag_ms'] / 1000:.1f} s behind" if a["lag_ms"] else ""
                lines.append(f"      archived to {a['archived_sn']} (verified to {a['verified_sn']}){behind}"
                             + (f"; FAILING: {a['error']}" if a["error"] else ""))
        for link in n.get("links", []):
            arrow = "->" if link["direction"] == "out" else "<-"
            lines.append(f"    link {arrow} {link['peer'] or '?':<20} chains {link['chains']:<6} frames {link['frames']:<9} "
                         f"messages {link['messages']:<10} {'connected' if link['connected'] else 'DISCONNECTED'}")
        for p in n.get("ingestion", []):
            t = p["table"]
            lines.append(f"    ingest {chain_name(p['chain_id']):<21} {p['policy']:<27} {'ready' if p['ready'] else 'REBUILDING'} "
                         f"sessions {t.get('sessions', 0)} entries {t.get('entries', 0)} "
                         f"dedup keys {t.get('dedup_keys', 0)} queued {p['queued_records']}")
    for d in streams:
        lines.append(_describe_text(d, history=True))     # (status: why each chain is as it is)
    lines += [line for _, line in channels]
    _emit(args, {"control": cluster.control_address, "nodes": nodes, "streams": streams, "under_replicated": short,
                 "channels": [shown for shown, _ in channels]},
          "\n".join(lines))
    return 0


def cmd_demo(args) -> int:
    """Start a local cluster, write records over many keys, read them back, check, stop."""
    if args.keep:
        return _demo(args, args.data_dir)
    with tempfile.TemporaryDirectory(prefix="sms-demo-") as data_dir:
        return _demo(args, data_dir)


def _demo(args, data_dir: str) -> int:
    from sms.client import Client
    from node.launcher import LocalCluster
    print(f"starting a local cluster: control + {args.nodes} storage nodes (data in {data_dir})", flush=True)
    with LocalCluster(data_dir, nodes=args.nodes, port=0) as cluster, \
            Client(cluster.address, **cluster.client_options()) as client:
        print(f"address: {cluster.address}")
        stream = f"demo-{int(time.time())}"
        info = client.create_stream(stream, partitions=4, replication_factor=min(3, args.nodes))
        print(_describe_text(_describe(info)))
        keys = [f"user-{i}" for i in range(50)]
        t0 = time.perf_counter()
        sent = 0
        for start in range(0, args.records, limits.PUT_RECORDS_COUNT_MAX):
            batch = [(keys[i % len(keys)], f"event {i}".encode())
                     for i in range(start, min(args.records, start + limits.PUT_RECORDS_COUNT_MAX))]
            out = client.put_records(stream, batch)
            if out.failed_record_count:
                raise SystemExit(f"error: {out.failed_record_count} records failed")
            sent += len(batch)
        put_s = time.perf_counter() - t0
        print(f"put {sent} records over {len(keys)} keys in {put_s:.2f}s ({sent / put_s:,.0f} records/s)")
        t0 = time.perf_counter()
        got = []
        for p in info.partitions:
            it = client.get_iterator(stream, p.partition_id, "TRIM_HORIZON")
            while it:
                res = client.get_next_records(it, max_records=limits.GET_RECORDS_COUNT_MAX)
                got.extend(res.records)
                if not res.records:
                    break
                it = res.next_iterator
        read_s = time.perf_counter() - t0
        print(f"read {len(got)} records back in {read_s:.2f}s ({len(got) / max(read_s, 1e-9):,.0f} records/s)")
        for r in got[:3]:
            print(f"  {r.partition_id} sn {r.sequence_number} key {r.partition_key}: {r.data.decode()}")
        per_key: dict[str, list[int]] = {}
        for r in sorted(got, key=lambda r: r.sn):
            per_key.setdefault(r.partition_key, []).append(int(r.data.split()[1]))
        in_order = all(v == sorted(v) for v in per_key.values())
        ok = len(got) == sent and in_order
        print(f"check: {len(got)}/{sent} records, per-key order {'kept' if in_order else 'BROKEN'}: "
              f"{'OK' if ok else 'FAILED'}")
    print("cluster stopped")
    return 0 if ok else 1


def cmd_config(args) -> int:
    """`sms config show`: every setting a node started here would have, and its source;
    with --node, the settings a running node has (it answers them: NodeStatus)."""
    from node import config
    if args.node:
        with _client(args) as client:
            nodes = {n.node_id: n for n in client.describe_cluster().nodes}
            if args.node not in nodes:
                raise errors.NodeNotFound(f"no live node {args.node!r}; live: {', '.join(sorted(nodes)) or 'none'}")
            _node_id, rows = client.node_settings(nodes[args.node].address)
    else:
        try:
            values = config.load(args.config)
        except config.ConfigError as e:
            raise SystemExit(f"error: {e}") from None
        rows = config.show(values)
    width = max(len(r["key"]) for r in rows)
    lines = [f"{r['key']:<{width}}  {r['value']!r:<24} {r['source']}" for r in rows]
    _emit(args, rows, "\n".join(lines))
    return 0


COMPLETION_SHELLS = ("bash", "zsh", "fish")


def cmd_completion(args) -> int:
    """argcomplete's shell code for `sms` (what `register-python-argcomplete sms` prints)."""
    print(argcomplete.shellcode(["sms"], shell=args.shell), end="")
    return 0


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    """This module's commands, on the `sms` parser's subcommands (`common`: the client options)."""
    up = sub.add_parser("up", parents=[common], help="run a local multi-process cluster",
                        description="Run a control process and storage nodes on this machine until Ctrl-C or "
                                    "SIGTERM. A node that dies is started again (at most "
                                    f"{limits.NODE_RESTARTS_MAX} times in {limits.NODE_RESTART_WINDOW_S:g} s), "
                                    "with a line on stderr.")
    up.add_argument("--nodes", type=int, default=3, help="storage nodes to run (default 3)")
    up.add_argument("--port", type=int, default=DEFAULT_PORT,
                    help=f"client port of the control node (default {DEFAULT_PORT}; 0: any free port)")
    up.add_argument("--controls", type=int, default=1, help="control processes (more than one elect a leader)")
    up.add_argument("--metastore", help="zk://host:port[,host:port]/prefix (default: an embedded store in DIR)")
    up.add_argument("--insecure", action="store_true",
                    help="plaintext, no certificates (local experiments only; TLS is the default)")
    up.add_argument("--ca-dir", help="the CA that issues the node certificates (default: $SMS_CA_DIR, else "
                                     "DIR/tls/ca, created when missing)")
    up.add_argument("--config", help="a TOML file of settings every node reads (docs/operations.md, "
                                     "\"Configuration\")")
    up.set_defaults(func=cmd_up)

    serve = sub.add_parser("serve", help="run one node process")
    serve.add_argument("--node-id", help="this node's id in the cluster (e.g. n1; default: the configuration's "
                                          "node.id; each of these flags may come from the --config file instead)")
    serve.add_argument("--roles", help="comma-separated: control, storage, ingestion, retrieval "
                                       "(default: node.roles, else storage,ingestion,retrieval)")
    serve.add_argument("--metastore",
                       help="zk://host:port[,host:port...]/prefix, or embedded:///path/meta.lmdb (one host only; "
                            "default: metastore.url)")
    serve.add_argument("--data-dir", help="this node's LMDB data directory (default: node.data_dir)")
    serve.add_argument("--listen", help="the client port, HOST:PORT (0: any free port; default: the configuration's "
                                        "node.listen, else 127.0.0.1:0)")
    serve.add_argument("--config", help="a TOML file of settings (default: $SMS_CONFIG; docs/operations.md, "
                                        "\"Configuration\")")
    serve.add_argument("--cluster-listen", help="the cluster port of a TLS node (default: the --listen host, "
                                                "any free port)")
    serve.add_argument("--ca-file", help="the cluster CA's certificate (PEM)")
    serve.add_argument("--cert-file", help="this node's certificate (PEM, from `sms certs issue --node ID`)")
    serve.add_argument("--key-file", help="this node's private key (PEM)")
    serve.add_argument("--insecure", action="store_true", help="serve plaintext on one port, without TLS")
    serve.add_argument("--kinesis-listen", help="where the Kinesis Data Streams API is served, HOST:PORT, or off "
                                                "(default: the --listen host, any free port; HTTPS with the node's "
                                                "certificate unless --insecure; docs/kinesis.md)")
    serve.add_argument("--metrics-listen", help="where Prometheus scrapes /metrics, HOST:PORT (default: the --listen "
                                                "host, any free port; HTTPS with the node's certificate unless "
                                                "--insecure)")
    serve.add_argument("--bootstrap-token-file", help="a file holding the token of the cluster's first admin "
                                                      "key, created once in the cluster's life (`sms up` sets it)")
    serve.add_argument("--ready-file", help="a JSON file written once the node serves: its addresses "
                                            "(`sms up` waits for it)")
    serve.add_argument("--exit-with-parent", action="store_true", help="stop when the launching process dies")
    serve.add_argument("--exit-with-pid", type=int, default=0, help="stop when process PID is gone")
    serve.add_argument("--session-file", help=argparse.SUPPRESS)   # fault tests: expose the ZooKeeper session
    serve.set_defaults(func=cmd_serve)

    status = sub.add_parser("status", parents=[common], help="nodes, chains, roles, process ids, streams, channels")
    status.set_defaults(func=cmd_status)

    demo = sub.add_parser("demo", parents=[common], help="start a cluster, put and read records, stop")
    demo.add_argument("--nodes", type=int, default=3, help="storage nodes to run (default 3)")
    demo.add_argument("--records", type=int, default=20_000, help="records to put and read back (default 20000)")
    demo.add_argument("--keep", action="store_true", help="use --data-dir instead of a temp dir")
    demo.set_defaults(func=cmd_demo)

    conf = sub.add_parser("config", help="the settings a node reads (TOML file, environment) and their sources")
    csub2 = conf.add_subparsers(dest="config_cmd", required=True)
    cshow = csub2.add_parser("show", parents=[common],
                             help="every setting in force here (or on a running node: --node), and where its value "
                                  "came from; --json: key, value, source, env, limit, help")
    cshow.add_argument("--config", help="a TOML file of settings (default: $SMS_CONFIG)")
    cshow.add_argument("--node", help="a running node's id: the settings it runs with (asks the node)")
    conf.set_defaults(func=cmd_config)

    completion = sub.add_parser(
        "completion", help="shell code that completes sms commands and options (argcomplete)",
        description="Print the shell code that completes sms commands and options. In ~/.bashrc: "
                    'eval "$(sms completion bash)"; in ~/.zshrc (after compinit): eval "$(sms completion zsh)"; '
                    "in ~/.config/fish/config.fish: sms completion fish | source")
    completion.add_argument("shell", choices=COMPLETION_SHELLS, help="the shell to complete in")
    completion.set_defaults(func=cmd_completion)
