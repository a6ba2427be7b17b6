# PYTHON_ARGCOMPLETE_OK  (argcomplete: `sms` completes its commands and options; see `sms completion`)
"""The `sms` command: run a local cluster or a node, administer streams, put and read.

Human-readable output by default, `--json` for scripts. Client commands find the
cluster from `--address`, else $SMS_ADDRESS, else DIR/cluster.json of `sms up`
(`--data-dir`, default ./sms-data), and first check that something accepts a connection
there (CLI_CONNECT_TIMEOUT_S). Named errors print as `error: Name: message` and exit 1;
usage errors exit 2; Ctrl-C exits 130. Long work (a repartition, a put from stdin, a read)
shows its progress on stderr when that is a terminal (`_progress`), never on stdout.
`sms completion SHELL` prints the shell code of argcomplete's completion.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import argcomplete

from sms import errors, limits, security
from sms.aio import TENANT_LIMITS

DEFAULT_DATA_DIR = "sms-data"
DEFAULT_PORT = 7480
DISTRIBUTION = "sms-sps"          # the package `sms --version` names (pyproject.toml's project.name)


def _address(args) -> str:
    """The cluster's address. Its CA, when known here (--ca-file, or the cluster.json of
    `sms up`), goes into $SMS_CA_FILE, which every client of this process and of the
    workers it starts reads (sms/security.py); "" there means plaintext. Each command calls
    it once: it exits with one line when nothing accepts a connection there."""
    if getattr(args, "ca_file", None):
        os.environ[security.ENV_CA_FILE] = os.path.abspath(args.ca_file)
    if getattr(args, "token", None):
        os.environ[security.ENV_TOKEN] = args.token
    if args.address:
        return _answering(args.address, "--address")
    if os.environ.get("SMS_ADDRESS"):
        return _answering(os.environ["SMS_ADDRESS"], "$SMS_ADDRESS")
    path = os.path.join(args.data_dir, "cluster.json")
    try:
        with open(path) as f:
            info = json.load(f)
        address = info["address"]
    except (OSError, ValueError, KeyError):
        raise SystemExit(f"error: no cluster address: pass --address, set SMS_ADDRESS, or run `sms up` "
                         f"(looked for {path})") from None
    if not getattr(args, "ca_file", None):
        os.environ[security.ENV_CA_FILE] = info.get("ca_file", "")
    if not getattr(args, "token", None) and not os.environ.get(security.ENV_TOKEN):
        os.environ[security.ENV_TOKEN] = info.get("token", "")
    return _answering(address, path)


def _answering(address: str, source: str) -> str:
    """`address` ("host:port[,host:port...]"), once one of its nodes accepts a TCP
    connection within CLI_CONNECT_TIMEOUT_S; else exit with one line. (Without this a
    stopped cluster costs an admin command CLIENT_LEADER_WAIT_S of retries, then gRPC's
    own text.) Only the connection is checked: TLS and the calls report their own errors."""
    from kernel import rpc
    seeds = [a.strip() for a in address.split(",") if a.strip()]

    async def probe() -> list[str]:
        return await asyncio.gather(*(rpc.probe_port(a, limits.CLI_CONNECT_TIMEOUT_S) for a in seeds))

    if rpc.PROBE_LISTENING not in asyncio.run(probe()):
        raise SystemExit(f"error: no cluster answers at {address} (from {source}): is it running? "
                         f"(`sms up` starts one)")
    return address


def _client(args):
    from sms.client import Client
    return Client(_address(args))


def _emit(args, obj, human: str) -> None:
    print(json.dumps(obj, indent=2, default=str) if args.json else human)


@contextlib.contextmanager
def _progress(first: str, *, stdout_too: bool = False) -> Iterator[Callable[[str], None] | None]:
    """A line of progress on long work (a spinner, `first` then what `update(text)` says,
    the time elapsed), drawn with rich on stderr and erased at the end; only when stderr is
    a terminal (rich's test: FORCE_COLOR and TTY_COMPATIBLE count too), so scripts, pipes
    and logs see exactly what they did without it. Yields `update`, or None when nothing is
    shown. Nothing goes to stdout. `stdout_too`: the command prints to stdout meanwhile,
    so the line is shown only when stdout is not a terminal (records on the screen are
    progress enough, and would tear the line)."""
    from rich.console import Console
    console = Console(stderr=True)
    if not console.is_terminal or (stdout_too and sys.stdout.isatty()):
        yield None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True, redirect_stdout=False, redirect_stderr=False) as bar:
        task = bar.add_task(first)
        yield lambda text: bar.update(task, description=text)


# --- cluster ---------------------------------------------------------------------------

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
        own = [k for k in ("node.listen", "node.cluster_listen", "node.metrics_listen")
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


def cmd_key(args) -> int:
    with _client(args) as client:
        if args.key_cmd == "create":
            info, token = client.create_key(args.role, streams=args.stream, name=args.name, tenant=args.tenant)
            _emit(args, {**info, "token": token},
                  f"key {info['key_id']} ({info['role']}"
                  + (f" of {', '.join(info['streams'])}" if info["streams"] else "") + ")\n"
                  f"token: {token}\n(shown this once: the cluster keeps only its hash)")
        elif args.key_cmd == "list":
            keys = client.list_keys()
            width = max([len("tenant")] + [len(k["tenant"]) for k in keys])
            lines = [f"{'key':<18} {'tenant':<{width}} {'role':<9} {'streams':<30} name"]
            lines += [f"{k['key_id']:<18} {k['tenant']:<{width}} {k['role']:<9} "
                      f"{','.join(k['streams']) or '(all)':<30} {k['name']}" for k in keys]
            _emit(args, keys, "\n".join(lines))
        elif args.key_cmd == "rotate-master":
            _rotate_master(args, client)
        else:
            client.revoke_key(args.key_id)
            _emit(args, {"revoked": args.key_id}, f"revoked {args.key_id}")
    return 0


def _rotate_master(args, client) -> None:
    """Master key rotation (docs/security.md): a new key in the key file, made current, then
    every encrypted stream's data key wrapped by it. On several hosts, put the new file on
    every host first (--no-new-key then only re-wraps)."""
    from kernel import encryption
    path = args.key_file or os.path.join(args.data_dir, "tls", "master.key")
    if not os.path.exists(path):
        raise SystemExit(f"error: no master key file at {path} (--key-file)")
    new_id = "" if args.no_new_key else encryption.add_master_key(path)
    count = client.rewrap_data_keys()
    _emit(args, {"key_file": path, "new_key": new_id, "rewrapped": count},
          (f"new master key {new_id} in {path}; " if new_id else "") + f"{count} data keys wrapped by it "
          "(the older keys may leave the file now)")


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
            lines = [f"group {d['group']} of {d['stream']}: {len(d['members'])} members"]
            lines += [f"  member {m['member']}  ({m['host']} pid {m['pid']}, heartbeat {m['heartbeat_age_ms']} ms ago)"
                      for m in d["members"]]
            lines += [f"  {p['partition_id']}  {p['state']:<6}  owner {p['owner'] or '-':<24}  checkpoint "
                      f"{p['checkpoint']:<40}  records {p['records']:>10,}  lag {p['lag_ms']:,} ms"
                      for p in d["partitions"]]
            _emit(args, d, "\n".join(lines))
        elif args.consumer_cmd == "reset":
            sns = dict(item.split("=", 1) for item in args.sequence_number or [])
            to = "AT_TIMESTAMP" if args.timestamp_ms is not None else "" if sns else args.to or "TRIM_HORIZON"
            client.reset_group(args.stream, args.group, to=to, timestamp_ms=args.timestamp_ms or 0,
                               sequence_numbers=sns)
            _emit(args, {"reset": args.group, "to": to or sns},
                  f"group {args.group} reset to {to or sns}: running members resume from there")
        else:
            client.delete_group(args.stream, args.group)
            _emit(args, {"deleted": args.group}, f"group {args.group} of {args.stream} deleted")
    return 0


def _tenant_limits(t: dict) -> str:
    shown = [f"{k.replace('_per_s', '')} {v:,}/s" if k.endswith("_per_s") else f"{k} {v:,}"
             for k, v in t.items() if k in TENANT_LIMITS and v]
    return ", ".join(shown) or "no limits"


def cmd_tenant(args) -> int:
    with _client(args) as client:
        if args.tenant_cmd == "create":
            client.create_tenant(args.name)
            _emit(args, {"created": args.name}, f"tenant {args.name} created")
        elif args.tenant_cmd == "list":
            tenants = client.describe_tenants()
            _emit(args, tenants, "\n".join(t["name"] + "  " + _tenant_limits(t) for t in tenants))
        elif args.tenant_cmd == "update":
            t = client.update_tenant(args.name, **{f: getattr(args, f) for f in TENANT_LIMITS})
            _emit(args, t, f"tenant {t['name']}: {_tenant_limits(t)}")
        else:
            client.delete_tenant(args.name)
            _emit(args, {"deleted": args.name}, f"tenant {args.name} deleted")
    return 0


def cmd_certs(args) -> int:
    from node import certs
    if args.certs_cmd == "init":
        out = certs.init_ca(args.dir, days=args.days)
        _emit(args, {"ca_file": os.path.abspath(out.cert_file), "key_file": os.path.abspath(out.key_file)},
              f"CA certificate {out.cert_file} (clients and nodes trust it)\n"
              f"CA key         {out.key_file} (mode 0600: whoever holds it can issue certificates)")
        return 0
    if args.certs_cmd == "revoke":
        with _client(args) as client:
            serial = client.revoke_certificate(args.certificate, args.reason)
        _emit(args, {"revoked": serial}, f"certificate {serial} revoked: no cluster port serves it from now on")
        return 0
    if args.certs_cmd == "revoked":
        with _client(args) as client:
            revoked = client.list_revoked_certificates()
        _emit(args, revoked, "\n".join(f"{c['serial']}  {_when(c['revoked_ms'])}  {c['reason']}" for c in revoked)
              or "no certificate is revoked")
        return 0
    out = certs.issue(args.ca_dir, args.out, node=args.node or "", client=args.client or "",
                      hosts=tuple(args.host), days=args.days)
    _emit(args, {"cert_file": os.path.abspath(out.cert_file), "key_file": os.path.abspath(out.key_file),
                 "serial": security.cert_serial(out.cert_file)},
          f"certificate {out.cert_file} (serial {security.cert_serial(out.cert_file)})\n"
          f"key         {out.key_file} (mode 0600)")
    return 0


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + " UTC"


def cmd_serve(args) -> int:
    from node import server
    return server.run(args)


def cmd_status(args) -> int:
    with _client(args) as client:
        cluster = client.describe_cluster()
        nodes = []
        for n in cluster.nodes:
            entry = {"node_id": n.node_id, "address": n.address, "roles": list(n.roles), "pid": n.pid,
                     "metrics_address": n.metrics_address}
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
                     + (f"  metrics {n['metrics_address']}" if n["metrics_address"] else ""))
        if n.get("storage_write_failures"):
            at = time.strftime("%H:%M:%S", time.localtime(n["storage_last_error_ms"] / 1000))
            lines.append(f"    storage: {n['storage_write_failures']} failed write transactions; "
                         f"the last at {at}: {n['storage_last_error']}")
        for r in n.get("replicas", []):
            lines.append(f"    {r['chain_id']:<28} {r['role']:<9} epoch {r['epoch']:<3} records {r['records']:<9} "
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
            lines.append(f"    ingest {p['chain_id']:<21} {p['policy']:<27} {'ready' if p['ready'] else 'REBUILDING'} "
                         f"sessions {t.get('sessions', 0)} entries {t.get('entries', 0)} "
                         f"dedup keys {t.get('dedup_keys', 0)} queued {p['queued_records']}")
    for d in streams:
        lines.append(_describe_text(d))
    _emit(args, {"control": cluster.control_address, "nodes": nodes, "streams": streams, "under_replicated": short},
          "\n".join(lines))
    return 0


# --- nodes -----------------------------------------------------------------------------



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


def _local_data_dir(args) -> str | None:
    """--data-dir, when the cluster this command reached is the one `sms up` runs there
    (its address came from DIR/cluster.json, not from --address or $SMS_ADDRESS)."""
    if args.address or os.environ.get("SMS_ADDRESS"):
        return None
    return args.data_dir if os.path.exists(os.path.join(args.data_dir, "cluster.json")) else None


# --- streams ---------------------------------------------------------------------------

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


def _describe_text(d: dict) -> str:
    lines = [f"stream {d['name']}: {d['status']}, {len(d['partitions'])} partitions, replication "
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
        for h in p["history"]:
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
            _emit(args, d, _describe_text(d))
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


# --- put / read ------------------------------------------------------------------------

def cmd_put(args) -> int:
    if args.key == "":         # (the API refuses it: before anything is read or sent)
        raise errors.InvalidPartitionKey(f"--key ''; a partition key has {limits.PARTITION_KEY_CHARS_MIN}.."
                                         f"{limits.PARTITION_KEY_CHARS_MAX} characters (leave --key out for a "
                                         f"random key per record)")
    lines = args.data if args.data else (line.rstrip("\n") for line in sys.stdin)
    results, failed = [], 0
    with _client(args) as client, \
            _progress(f"put {args.stream}: reading stdin") if not args.data else contextlib.nullcontext() as shown:
        batch: list = []

        def flush() -> None:
            nonlocal failed
            if not batch:
                return
            out = client.put_records(args.stream, batch)
            for r in out.records:
                failed += 0 if r.ok else 1
                results.append({"partition_id": r.partition_id, "sequence_number": r.sequence_number}
                               if r.ok else {"error": r.error_name, "message": r.error_message})
            batch.clear()
            if shown:
                shown(f"put {args.stream}: {len(results):,} records sent" + (f", {failed:,} failed" if failed else ""))

        headers = _parse_headers(args.header)
        for line in lines:
            key = uuid.uuid4().hex if args.key is None else args.key
            batch.append((key, line.encode(), None, headers) if headers else (key, line.encode()))
            if len(batch) == limits.PUT_RECORDS_COUNT_MAX:
                flush()
        flush()
    human = "\n".join(f"{r['partition_id']} {r['sequence_number']}" if "error" not in r
                      else f"error: {r['error']}: {r['message']}" for r in results)
    _emit(args, results, human)
    return 1 if failed else 0


def _parse_headers(specs: list[str] | None) -> dict[str, bytes]:
    """--header NAME=VALUE options as a record's headers (checked again by the client)."""
    out: dict[str, bytes] = {}
    for spec in specs or ():
        name, sep, value = spec.partition("=")
        if not sep or not name:
            raise errors.InvalidRecordHeader(f"--header {spec!r}; expected NAME=VALUE")
        if name in out:
            raise errors.InvalidRecordHeader(f"--header {name!r} given twice")
        out[name] = value.encode()
    return out


def _text(raw: bytes) -> str:
    """Bytes for a person: valid UTF-8 as it is; anything else as Python writes bytes,
    escaped (DE AD BE EF shows as \\xde\\xad\\xbe\\xef, never as text such as "deadbeef")."""
    text = _utf8(raw)
    return repr(raw)[2:-1] if text is None else text


def _utf8(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _record_json(r) -> dict:
    """A record for `--json`: "data" holds data that is valid UTF-8, else "data_b64" holds
    it in base64 (never both); header values likewise, in "headers" or "headers_b64"."""
    out = {"partition_id": r.partition_id, "sequence_number": r.sequence_number, "partition_key": r.partition_key,
           "arrival_time_ms": r.arrival_time_ms}
    text = _utf8(r.data)
    if text is None:
        out["data_b64"] = base64.b64encode(r.data).decode("ascii")
    else:
        out["data"] = text
    for name, value in (r.headers or {}).items():
        text = _utf8(value)
        if text is None:
            out.setdefault("headers_b64", {})[name] = base64.b64encode(value).decode("ascii")
        else:
            out.setdefault("headers", {})[name] = text
    return out


def _print_record(args, r) -> None:
    if args.json:
        print(json.dumps(_record_json(r)), flush=True)
        return
    headers = r.headers
    shown = " [" + ", ".join(f"{k}={_text(v)}" for k, v in headers.items()) + "]" if headers else ""
    print(f"{r.partition_id} {r.sequence_number} {r.partition_key}{shown}: {_text(r.data)}", flush=True)


def cmd_read(args) -> int:
    from sms.types import parse_partition_id
    if args.group:
        return _read_group(args)
    if args.partition == "all":
        return _read_lineage(args)
    with _client(args) as client, _reading(args) as count:
        ordinals = [parse_partition_id(args.partition)]
        iterators = {o: client.get_iterator(args.stream, o, args.iterator_type, sequence_number=args.sequence_number,
                                            timestamp_ms=args.timestamp_ms) for o in ordinals}
        shown = 0
        while iterators and (args.max is None or shown < args.max):
            idle = True
            for o, it in list(iterators.items()):
                want = limits.GET_RECORDS_COUNT_MAX if args.max is None else min(limits.GET_RECORDS_COUNT_MAX,
                                                                                 args.max - shown)
                if want <= 0:
                    break
                res = client.get_next_records(it, max_records=want, wait_ms=limits.CLI_FOLLOW_WAIT_MS if args.follow else 0,
                                              skip_trimmed=args.skip_trimmed)
                for r in res.records:
                    _print_record(args, r)
                shown += len(res.records)
                count(shown)
                idle = idle and not res.records
                if res.next_iterator is None:
                    del iterators[o]
                else:
                    iterators[o] = res.next_iterator
            if idle and not args.follow:
                break
    return 0


@contextlib.contextmanager
def _reading(args) -> Iterator[Callable[[int], None]]:
    """`sms read` without --follow: yields count(records read so far), shown in progress
    (see `_progress`) when stdout is not a terminal."""
    progress = _progress(f"read {args.stream}", stdout_too=True) if not args.follow else contextlib.nullcontext()
    with progress as shown:
        yield (lambda n: shown(f"read {args.stream}: {n:,} records")) if shown else (lambda n: None)


def _read_group(args) -> int:
    """As a member of a consumer group: a batch counts as processed once it is printed;
    without --follow it stops when nothing came for a second (checkpointing on the way out)."""
    kind = args.iterator_type.upper()
    if args.partition != "all" or kind not in ("TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"):
        raise errors.InvalidArgument("--group reads every partition, from TRIM_HORIZON, LATEST or AT_TIMESTAMP "
                                     "(for partitions the group has not read yet)")
    options = {"start": kind, "wait_ms": limits.CLI_GROUP_READ_WAIT_MS, "auto_checkpoint": args.max is None, "skip_trimmed": args.skip_trimmed}
    if kind == "AT_TIMESTAMP":
        options["timestamp_ms"] = args.timestamp_ms
    shown = 0
    with _client(args) as client, client.consumer(args.stream, args.group, **options) as consumer, \
            _reading(args) as count:
        while args.max is None or shown < args.max:
            batch = consumer.poll(None if args.follow else limits.CLI_GROUP_READ_IDLE_S)
            if batch is None:
                break
            taken = batch.records if args.max is None else batch.records[:args.max - shown]
            for r in taken:
                _print_record(args, r)
            shown += len(taken)
            count(shown)
            if args.max is not None:        # (only what was shown counts as processed)
                consumer.checkpoint(batch if len(taken) == len(batch.records)
                                    else dataclasses.replace(batch, records=taken))
    return 0


def _read_lineage(args) -> int:
    """Every partition of the stream, walking its lineage (parents before children)."""
    kind = args.iterator_type.upper()
    kwargs: dict = {"follow": args.follow, "skip_trimmed": args.skip_trimmed}
    skip_sn = None
    if kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
        if not args.sequence_number:
            raise errors.InvalidArgument(f"--from {kind} needs --sequence-number")
        kwargs["sequence_number"] = args.sequence_number
        skip_sn = args.sequence_number if kind == "AFTER_SEQUENCE_NUMBER" else None
    elif kind == "AT_TIMESTAMP":
        if args.timestamp_ms is None:
            raise errors.InvalidArgument("--from AT_TIMESTAMP needs --timestamp-ms")
        kwargs["timestamp_ms"] = args.timestamp_ms
    elif kind in ("TRIM_HORIZON", "LATEST"):
        kwargs["start"] = kind
    else:
        raise errors.InvalidIteratorType(f"iterator type {args.iterator_type!r}; expected TRIM_HORIZON, LATEST, "
                                         "AT_SEQUENCE_NUMBER, AFTER_SEQUENCE_NUMBER or AT_TIMESTAMP")
    from sms import aio
    address = _address(args)

    async def read(count: Callable[[int], None]) -> None:
        # asyncio: Ctrl-C cancels this task, so the read's generator is closed where it
        # runs (the sync client's generator, interrupted in another thread, could not be)
        shown = 0
        async with aio.Client(address) as client, \
                contextlib.aclosing(client.read_stream(args.stream, **kwargs)) as records:
            async for r in records:
                if skip_sn is not None and str(r.sequence_number) == str(skip_sn):
                    continue
                _print_record(args, r)
                shown += 1
                count(shown)
                if args.max is not None and shown >= args.max:
                    break

    with _reading(args) as count:
        asyncio.run(read(count))
    return 0


# --- stage graphs (sps/) ------------------------------------------------------------------

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
                lag = "?" if p["lag_ms"] is None else f"{p['lag_ms']} ms"
                lines.append(f"  {p['partition']:<24} owner {p['owner'] or '-':<20} checkpoint {p['checkpoint']:<40} "
                             f"records {p['records']:<8} {p['records_per_s']:>8}/s lag {lag}"
                             + (f"  snapshot at {p['state_snapshot'] or '-'}" if "state_snapshot" in p else "")
                             + (f"  last error: {p['last_error']}" if p["last_error"] else ""))
        _emit(args, rows, "\n".join(lines))
    return 0


# --- demo ------------------------------------------------------------------------------

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


# --- audit -----------------------------------------------------------------------------

_AGO_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _since_ms(text: str, now_ms: int | None = None) -> int:
    """`--since`: how long ago ("90s", "15m", "2h", "7d"), a UTC time ("2026-11-28",
    "2026-11-28T16:00:00Z", "2026-11-28 16:00"), or ms since the epoch."""
    import datetime
    text = text.strip()
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if text[-1:] in _AGO_UNITS_S and text[:-1].replace(".", "", 1).isdigit():
        return max(0, now_ms - int(float(text[:-1]) * _AGO_UNITS_S[text[-1]] * 1000))
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected how long ago (90s, 15m, 2h, 7d), a UTC time "
                                         f"(2026-11-28T16:00:00Z) or ms since the epoch") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0, int(when.timestamp() * 1000))


def _audit_limit(text: str) -> int:
    n = int(text) if text.strip().isdigit() else 0
    if not 1 <= n <= limits.AUDIT_READ_EVENTS_MAX:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 1 to {limits.AUDIT_READ_EVENTS_MAX}")
    return n


def _audit_who(who: dict) -> str:
    """An audit line's `who` in words (kernel/audit.py)."""
    if "key_id" in who:
        return f"key {who['key_id']} ({who.get('role', '?')} of {who.get('tenant', '?')})"
    if "claimed_key_id" in who:
        return f"a token claiming key {who['claimed_key_id']}"
    if "node" in who:
        return f"node {who['node']} (certificate {who.get('serial', '?')})"
    if "cert" in who:
        return f"certificate {who['cert']} ({who.get('unit', '?')}, {who.get('serial', '?')})"
    return "(cut)" if who.get("cut") else "(no credential)"


def _audit_line(e: dict) -> str:
    line = (f"{e.get('time', '?')}  {e.get('node', '?'):<8} {e.get('action', '?'):<19} {e.get('target') or '-'}  "
            f"{e.get('outcome', '?')}  by {_audit_who(e.get('who') or {})}  from {e.get('from') or '?'}")
    return line + (f"  {e['detail']}" if e.get("detail") else "")


def cmd_audit(args) -> int:
    """`sms audit`: every node's audit log (kernel/audit.py), merged by time."""
    with _client(args) as client:
        got = client.read_audit(args.since or 0, args.limit)
    for node_id, error in sorted(got["unanswered"].items()):
        print(f"warning: node {node_id} did not answer ({error}): its events are missing", file=sys.stderr)
    if got["truncated"]:
        print(f"note: older events were left out: the newest {args.limit} are shown (--since, --limit)",
              file=sys.stderr)
    _emit(args, got, "\n".join(_audit_line(e) for e in got["events"]) or "no audit events")
    return 0


# --- configuration ---------------------------------------------------------------------

def cmd_config(args) -> int:
    """`sms config show`: every setting a node started here would have, and its source."""
    from node import config
    try:
        values = config.load(args.config)
    except config.ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    rows = config.show(values)
    width = max(len(r["key"]) for r in rows)
    lines = [f"{r['key']:<{width}}  {r['value']!r:<24} {r['source']}" for r in rows]
    _emit(args, rows, "\n".join(lines))
    return 0


# --- shell completion ------------------------------------------------------------------

COMPLETION_SHELLS = ("bash", "zsh", "fish")


def cmd_completion(args) -> int:
    """argcomplete's shell code for `sms` (what `register-python-argcomplete sms` prints)."""
    print(argcomplete.shellcode(["sms"], shell=args.shell), end="")
    return 0


# --- parser ----------------------------------------------------------------------------

def _version() -> str:
    """The installed distribution's version, else (a source tree not installed) the one
    in pyproject.toml next to this package."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pass
    import tomllib
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]["version"]
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        return "unknown"


class _VersionAction(argparse.Action):
    """`--version`: the version is looked up only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"sms {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--address", help="any node's HOST:PORT (default: $SMS_ADDRESS or DIR/cluster.json)")
    common.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="local cluster directory (default ./sms-data)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--token", help="a key's token (default: $SMS_TOKEN, or the admin token of "
                                        "DIR/cluster.json); see `sms key create`")
    common.add_argument("--ca-file", help="the cluster CA's certificate, to reach a TLS cluster by --address "
                                          "(default: $SMS_CA_FILE, or the one DIR/cluster.json names)")

    p = argparse.ArgumentParser(prog="sms", description="SMS: chained-replication stream storage")
    p.add_argument("--version", action=_VersionAction, help="print the version of the sms-sps package and exit")
    sub = p.add_subparsers(dest="cmd", required=True)

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
    serve.add_argument("--node-id", required=True, help="this node's id in the cluster (e.g. n1)")
    serve.add_argument("--roles", default="storage,ingestion,retrieval",
                       help="comma-separated: control, storage, ingestion, retrieval "
                            "(default storage,ingestion,retrieval)")
    serve.add_argument("--metastore", required=True,
                       help="zk://host:port[,host:port...]/prefix, or embedded:///path/meta.lmdb (one host only)")
    serve.add_argument("--data-dir", required=True, help="this node's LMDB data directory")
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

    put = sub.add_parser("put", parents=[common], help="put records from arguments or stdin lines")
    put.add_argument("stream", help="the stream's name")
    put.add_argument("data", nargs="*", help="one record each (none: one record per line of stdin)")
    put.add_argument("--key", help=f"partition key, {limits.PARTITION_KEY_CHARS_MIN}..{limits.PARTITION_KEY_CHARS_MAX} "
                                   "characters (default: a random key per record)")
    put.add_argument("--header", action="append", metavar="NAME=VALUE",
                     help="a header every record carries (repeatable; read back by `sms read`)")
    put.set_defaults(func=cmd_put)

    read = sub.add_parser("read", parents=[common], help="read records",
                          description="Print records, one a line: PARTITION SN KEY [HEADERS]: DATA. Data that is "
                                      "not valid UTF-8 shows as Python writes bytes, escaped "
                                      "(\\xde\\xad\\xbe\\xef). With --json, one object a line; data that is "
                                      "not valid UTF-8 comes in base64 as \"data_b64\" instead of \"data\" "
                                      "(header values: \"headers_b64\" instead of \"headers\"). Ctrl-C stops, "
                                      "with exit code 130.")
    read.add_argument("stream", help="the stream's name")
    read.add_argument("--partition", default="all",
                      help="one partition (e.g. p0001 or 1); default all, walking the lineage")
    read.add_argument("--from", dest="iterator_type", default="TRIM_HORIZON",
                      help="TRIM_HORIZON, LATEST, AT_SEQUENCE_NUMBER, AFTER_SEQUENCE_NUMBER or AT_TIMESTAMP")
    read.add_argument("--sequence-number", help="the SN for --from AT_SEQUENCE_NUMBER or AFTER_SEQUENCE_NUMBER")
    read.add_argument("--timestamp-ms", type=int, help="the time for --from AT_TIMESTAMP, ms since the epoch")
    read.add_argument("--max", type=int, help="stop after this many records")
    read.add_argument("--follow", action="store_true", help="keep tailing, until Ctrl-C (exit code 130)")
    read.add_argument("--skip-trimmed", action="store_true",
                      help="records deleted (retention, a trim) before they were read: go on from the oldest left "
                           "instead of failing with RecordsTrimmed")
    read.add_argument("--group", help="read as a member of this consumer group: from its checkpoints, sharing "
                                      "the partitions with its other members, checkpointing what was shown")
    read.set_defaults(func=cmd_read)

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

    key = sub.add_parser("key", help="credentials: keys with a role (admin, producer, consumer, monitor)")
    ksub = key.add_subparsers(dest="key_cmd", required=True)
    kc = ksub.add_parser("create", parents=[common], help="a new key; its token is printed this once")
    kc.add_argument("--role", required=True, choices=["admin", "producer", "consumer", "monitor"],
                    help="admin: everything; producer: write; consumer: read; monitor: /metrics only (Prometheus)")
    kc.add_argument("--stream", action="append", default=[], help="limit the key to this stream (repeat)")
    kc.add_argument("--name", default="", help="what the key is for")
    kc.add_argument("--tenant", default="", help="the key's tenant (default: the caller's own)")
    ksub.add_parser("list", parents=[common], help="every key: id, tenant, role, streams, name (never a secret)")
    kr = ksub.add_parser("revoke", parents=[common], help="delete a key: returns once no node admits its token any more (about a second)")
    kr.add_argument("key_id", help="the key's id, as `sms key list` shows it")
    km = ksub.add_parser("rotate-master", parents=[common],
                         help="encryption at rest: a new master key in the key file, then every stream's data key "
                              "wrapped by it")
    km.add_argument("--key-file", default="", help="the master key file (default: DIR/tls/master.key of `sms up`)")
    km.add_argument("--no-new-key", action="store_true",
                    help="only re-wrap, by the current key of the leader's file (a new one was put on every host)")
    key.set_defaults(func=cmd_key)

    tenant = sub.add_parser("tenant", help="tenants: each sees only its own streams, under its own names")
    tsub = tenant.add_subparsers(dest="tenant_cmd", required=True)
    tc = tsub.add_parser("create", parents=[common], help="a new tenant (then: sms key create --tenant NAME)")
    tc.add_argument("name", help="the tenant's name ([a-z0-9-])")
    tsub.add_parser("list", parents=[common], help="every tenant, with its limits")
    tu = tsub.add_parser("update", parents=[common], help="a tenant's limits: throughput over all its partitions, "
                                                          "and caps on what it holds (0 removes one)")
    tu.add_argument("name", help="the tenant's name")
    tu.add_argument("--write-records-per-s", type=int, help="records/s written over all its partitions")
    tu.add_argument("--write-bytes-per-s", type=int, help="bytes/s written over all its partitions")
    tu.add_argument("--read-bytes-per-s", type=int, help="bytes/s read over all its partitions")
    tu.add_argument("--streams-max", type=int, help="streams it may have")
    tu.add_argument("--partitions-max", type=int, help="open partitions over all its streams")
    tu.add_argument("--retention-hours-max", type=int,
                    help="hours its records may be kept (its streams' retention, and unread records protected)")
    td = tsub.add_parser("delete", parents=[common], help="delete a tenant without streams, and its keys")
    td.add_argument("name", help="the tenant's name")
    tenant.set_defaults(func=cmd_tenant)

    consumer = sub.add_parser("consumer", help="consumer groups: members, checkpoints, lag; move or delete a group")
    gsub = consumer.add_subparsers(dest="consumer_cmd", required=True)
    gl = gsub.add_parser("list", parents=[common], help="a stream's consumer groups and registered consumers")
    gl.add_argument("stream", help="the stream's name")
    for name, text in (("describe", "a group's members, and per partition its owner, checkpoint and lag"),
                       ("delete", "delete a group (its checkpoints; it no longer protects unread records)")):
        g = gsub.add_parser(name, parents=[common], help=text)
        g.add_argument("stream", help="the stream's name")
        g.add_argument("group", help="the consumer group's name")
    gr = gsub.add_parser("reset", parents=[common], help="move a group's checkpoints (running members follow)")
    gr.add_argument("stream", help="the stream's name")
    gr.add_argument("group", help="the consumer group's name")
    where = gr.add_mutually_exclusive_group()
    where.add_argument("--to", choices=["TRIM_HORIZON", "LATEST"],
                       help="the oldest record kept, or the end of each partition now (default TRIM_HORIZON)")
    where.add_argument("--timestamp-ms", type=int, help="the first record at or after this time (ms since the epoch)")
    where.add_argument("--sequence-number", action="append", metavar="PARTITION=SN",
                       help="resume after this SN in this partition (repeat; partitions not named: TRIM_HORIZON)")
    consumer.set_defaults(func=cmd_consumer)

    certs = sub.add_parser("certs", help="a cluster CA, and certificates for nodes and clients (TLS)")
    csub = certs.add_subparsers(dest="certs_cmd", required=True)
    ci = csub.add_parser("init", help="create a CA: DIR/ca.pem (give it to clients) and DIR/ca.key (keep it safe)")
    ci.add_argument("--dir", required=True, help="where the CA goes")
    ci.add_argument("--days", type=int, default=3650, help="how long the CA certificate is valid (default 3650)")
    ci.add_argument("--json", action="store_true", help="machine-readable output")
    cs = csub.add_parser("issue", help="a node's or a client's certificate and key, signed by the CA")
    cs.add_argument("--ca-dir", required=True, help="the CA's directory (`sms certs init --dir`)")
    who = cs.add_mutually_exclusive_group(required=True)
    who.add_argument("--node", help="a node id: the certificate `sms serve --node-id ID` serves with")
    who.add_argument("--client", help="a client's name: a certificate a client may present")
    cs.add_argument("--host", action="append", default=[],
                    help="a name or address clients reach the node at (repeat; localhost is always in)")
    cs.add_argument("--out", default=".", help="directory for NAME.pem and NAME.key (default .)")
    cs.add_argument("--days", type=int, default=825, help="how long the certificate is valid (default 825)")
    cs.add_argument("--json", action="store_true", help="machine-readable output")
    cr = csub.add_parser("revoke", parents=[common],
                         help="no cluster port serves this certificate any more (a node key that leaked)")
    cr.add_argument("certificate", help="its PEM file, or its serial in hex (`sms certs issue` prints it)")
    cr.add_argument("--reason", default="", help="kept with it, shown by `sms certs revoked`")
    csub.add_parser("revoked", parents=[common], help="the revoked certificates")
    certs.set_defaults(func=cmd_certs)

    aud = sub.add_parser("audit", parents=[common], help="the audit log: who changed what, refused calls (every node)",
                         description="Every node's audit events (docs/security.md, \"Audit log\"), merged by time: "
                                     "changes of streams, tenants, keys, certificates, nodes and consumer groups, and "
                                     "refused credentials and calls; who, what, the outcome and from where. Admins "
                                     "of the default tenant only.")
    aud.add_argument("--since", type=_since_ms, help="events from then on: how long ago (90s, 15m, 2h, 7d), a UTC "
                                                     "time (2026-11-28T16:00:00Z) or ms since the epoch "
                                                     "(default: every event kept)")
    aud.add_argument("--limit", type=_audit_limit, default=limits.AUDIT_READ_EVENTS_MAX, metavar="N",
                     help=f"the newest N events (default and most: {limits.AUDIT_READ_EVENTS_MAX})")
    aud.set_defaults(func=cmd_audit)

    status = sub.add_parser("status", parents=[common], help="nodes, chains, roles, process ids")
    status.set_defaults(func=cmd_status)

    demo = sub.add_parser("demo", parents=[common], help="start a cluster, put and read records, stop")
    demo.add_argument("--nodes", type=int, default=3, help="storage nodes to run (default 3)")
    demo.add_argument("--records", type=int, default=20_000, help="records to put and read back (default 20000)")
    demo.add_argument("--keep", action="store_true", help="use --data-dir instead of a temp dir")
    demo.set_defaults(func=cmd_demo)

    conf = sub.add_parser("config", help="the settings a node reads (TOML file, environment) and their sources")
    csub2 = conf.add_subparsers(dest="config_cmd", required=True)
    cshow = csub2.add_parser("show", help="every setting in force here, and where its value came from")
    cshow.add_argument("--config", help="a TOML file of settings (default: $SMS_CONFIG)")
    cshow.add_argument("--json", action="store_true", help="JSON output: key, value, source, env, limit, help")
    conf.set_defaults(func=cmd_config)

    completion = sub.add_parser(
        "completion", help="shell code that completes sms commands and options (argcomplete)",
        description="Print the shell code that completes sms commands and options. In ~/.bashrc: "
                    'eval "$(sms completion bash)"; in ~/.zshrc (after compinit): eval "$(sms completion zsh)"; '
                    "in ~/.config/fish/config.fish: sms completion fish | source")
    completion.add_argument("shell", choices=COMPLETION_SHELLS, help="the shell to complete in")
    completion.set_defaults(func=cmd_completion)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    if argv is None:
        # under the shell's completion hook ($_ARGCOMPLETE set) this prints the candidates and
        # exits; otherwise it returns at once
        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()        # (a reader gone shows here, not in the interpreter's flush at exit)
        return code
    except errors.SmsError as e:
        print(f"error: {e.name}: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _stdout_closed()


# `sms ... | head`: the reader of stdout went away. git and coreutils die of SIGPIPE then,
# quietly, and the shell sees status 141 (128 + SIGPIPE); Python ignores SIGPIPE and raises
# BrokenPipeError instead, so the command exits the same way by hand: no traceback, 141.
EXIT_STDOUT_CLOSED = 128 + signal.SIGPIPE


def _stdout_closed() -> int:
    """No traceback, and stdout pointed at /dev/null: what is still buffered for it has
    nowhere to go, and the interpreter's last flush at exit must not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):         # (no stdout file descriptor: nothing will be flushed to it)
        pass
    return EXIT_STDOUT_CLOSED


if __name__ == "__main__":
    sys.exit(main())
