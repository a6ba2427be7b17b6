"""The local cluster (`sms up`): control processes and N storage nodes on one machine.

Every node is a separate `sms serve` process sharing one metadata store: by default an
embedded store file in the data directory, or ZooKeeper (`metastore="zk://..."`). With
`controls=2` or more, the control processes elect a leader and the others stand by.
Each node keeps its LMDB data under DIR/<node_id>, so a restart
with the same directory finds its streams again. Children stop by themselves when the
launcher dies (`--exit-with-parent`), and `stop()` sends SIGTERM, then SIGKILL after
NODE_STOP_TIMEOUT_S.
`sms up` calls `supervise()` every NODE_SUPERVISE_POLL_S: a node that exited without
being stopped here is started again (same id, data directory and, for a control node,
client address), at most NODE_RESTARTS_MAX times within NODE_RESTART_WINDOW_S.
Tests use `LocalCluster` directly to kill, pause and restart nodes.

`make_monitor_key` (what `sms up` calls once its nodes are up) gives Prometheus a key of
role `monitor` (node/metrics.py): its token in DIR/tls/monitor.token and, as
`monitor_token`, in DIR/cluster.json (both 0600); a later start keeps it while the key
exists.

DIR/nodes.json records the storage nodes that belong to the cluster: every one ever
started on DIR (by `sms up` or `sms node add`), until `forget_node` drops it (`sms node
remove`). `sms up` on an existing DIR starts every recorded node, and `sms node add`
gives the next id never used. `ReplicaWatch` is what `sms up` says of drains and of
partitions short of replicas.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from kernel import encryption
from node import logs
from sms import limits

STORAGE_ROLES = "storage,ingestion,retrieval"
ENV_CA_DIR = "SMS_CA_DIR"        # the CA a local cluster issues its node certificates from
ENV_BOOTSTRAP_TOKEN = "SMS_BOOTSTRAP_TOKEN"   # the token of a new local cluster's first admin key
ENV_MASTER_KEY_FILE = "SMS_ENCRYPTION_MASTER_KEY_FILE"   # the setting encryption.master_key_file (node/config.py)
NODES_FILE = "nodes.json"        # DIR/nodes.json: the storage nodes that belong to the cluster
MONITOR_TOKEN_FILE = "monitor.token"     # DIR/tls/monitor.token: Prometheus's key (make_monitor_key)
MONITOR_KEY_NAME = "monitor (sms up): Prometheus scrapes /metrics"
_LOCK_FILE = ".nodes.lock"       # DIR/.nodes.lock: held while nodes.json or cluster.json is rewritten
_NODE_ID = re.compile(r"^n([1-9][0-9]*)$")      # the storage node ids the launcher gives

log = logging.getLogger(__name__)


@dataclass
class NodeProcess:
    node_id: str
    roles: str
    listen: str
    proc: subprocess.Popen | None = None
    address: str = ""
    cluster_address: str = ""      # a TLS node's cluster port ("" when plaintext: the one address)
    metrics_address: str = ""      # its Prometheus endpoint (node/metrics.py)
    kinesis_address: str = ""      # its Kinesis Data Streams endpoint, a URL (kinesis/)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0


class LocalCluster:
    def __init__(self, data_dir: str, nodes: int = 3, port: int = 0, host: str = "127.0.0.1",
                 metastore: str | None = None, controls: int = 1, expose_sessions: bool = False,
                 tls: bool = True, ca_dir: str | None = None, admin_token: str | None = None):
        self.data_dir = os.path.abspath(data_dir)
        # secure by default: a CA (ca_dir, else $SMS_CA_DIR, else DIR/tls/ca; created when
        # missing) issues every node a certificate in DIR/tls/nodes (docs/security.md)
        self.tls = tls
        self.ca_dir = os.path.abspath(ca_dir or os.environ.get(ENV_CA_DIR) or os.path.join(self.data_dir, "tls", "ca"))
        # and a first admin key (control/auth.py): its token is admin_token, else
        # $SMS_BOOTSTRAP_TOKEN, else the one of an earlier start (DIR/tls/admin.token), else new
        self._admin_token = admin_token or ""
        self._monitor_token = _read_token(os.path.join(self.data_dir, "tls", MONITOR_TOKEN_FILE)) if tls else ""
        self.expose_sessions = expose_sessions     # fault tests: nodes write their ZooKeeper session
        self.launcher_pid = 0        # set by `sms node add`: new nodes live as long as this process
        self.host = host
        self.metastore = metastore or f"embedded://{os.path.join(self.data_dir, 'meta.lmdb')}"
        self.procs: dict[str, NodeProcess] = {"control": NodeProcess("control", "control", f"{host}:{port}")}
        for i in range(2, controls + 1):
            self.procs[f"control{i}"] = NodeProcess(f"control{i}", "control", f"{host}:0")
        # a new DIR: n1..n<nodes>; an existing one: every node recorded in DIR/nodes.json too
        for node_id in storage_node_ids(self.data_dir, nodes):
            self.procs[node_id] = NodeProcess(node_id, STORAGE_ROLES, f"{host}:0")
        # supervision (`supervise()`): nodes stopped on purpose are held down; a restarted
        # node is starting until its ready file appears; each node's recent restart times
        self.clock = time.monotonic
        self._held_down: set[str] = set()
        self._starting: dict[str, float] = {}       # node id -> when it was spawned (clock)
        self._restarts: dict[str, collections.deque[float]] = {}
        self._given_up: set[str] = set()

    @property
    def address(self) -> str:
        return self.procs["control"].address

    @property
    def console_url(self) -> str:
        """The web console (node/console.py), served by the first control node on its metrics port."""
        address = self.procs["control"].metrics_address if "control" in self.procs else ""
        return f"{'https' if self.tls else 'http'}://{address}/console/" if address else ""

    @property
    def kinesis_endpoint(self) -> str:
        """The Kinesis endpoint URL of the first node that serves one (every node does)."""
        return next((n.kinesis_address for n in self.procs.values() if n.kinesis_address), "")

    @property
    def ca_file(self) -> str:
        """The CA certificate clients trust ("" for a plaintext cluster)."""
        return os.path.join(self.ca_dir, "ca.pem") if self.tls else ""

    @property
    def admin_token(self) -> str:
        """The token of the cluster's first admin key ("" for a plaintext cluster: no keys)."""
        if not self.tls:
            return ""
        if not self._admin_token:
            from control import auth
            path = os.path.join(self.data_dir, "tls", "admin.token")
            token = os.environ.get(ENV_BOOTSTRAP_TOKEN, "")
            if not token and os.path.exists(path):
                with open(path) as f:
                    token = f.read().strip()
            self._admin_token = token or auth.new_token()[1]
        return self._admin_token

    @property
    def monitor_token(self) -> str:
        """The token of the `monitor` key that `make_monitor_key` made ("": none)."""
        return self._monitor_token

    def make_monitor_key(self) -> str:
        """Give Prometheus a key of role `monitor` (node/metrics.py): the one of an earlier
        start (DIR/tls/monitor.token) while it exists, else a new one, made with the admin
        key; its token goes to DIR/tls/monitor.token and to DIR/cluster.json as
        `monitor_token` (0600 both), never to the output. Returns "" or what went wrong
        (the admin key revoked, say: the token then stays as it was)."""
        if not self.tls:
            return ""
        from control import auth
        from sms.client import Client
        from sms.errors import SmsError
        token = self._monitor_token
        try:
            key_id = auth.parse_token(token)[0] if token else ""
        except SmsError:
            key_id = ""                            # (a damaged file: a new key)
        try:
            with Client(self.address, **self.client_options()) as client:
                if not key_id or key_id not in {k["key_id"] for k in client.list_keys()}:
                    _info, token = client.create_key("monitor", name=MONITOR_KEY_NAME)
        except (SmsError, OSError) as e:
            return f"no monitor key for Prometheus ({type(e).__name__}: {e})"
        _write_private(os.path.join(self.data_dir, "tls", MONITOR_TOKEN_FILE), token)
        self._monitor_token = token
        self._write_cluster_json(keep_added=True)
        return ""

    def _admin_token_file(self) -> str:
        path = os.path.join(self.data_dir, "tls", "admin.token")
        _write_private(path, self.admin_token)
        return path

    def client_env(self) -> dict[str, str]:
        """The environment under which clients (and the workers a harness starts) reach
        this cluster as its admin: $SMS_CA_FILE ("" for plaintext) and $SMS_TOKEN
        (sms/security.py)."""
        return {"SMS_CA_FILE": self.ca_file, "SMS_TOKEN": self.admin_token}

    def client_options(self) -> dict:
        """What `sms.Client(cluster.address, **options)` needs to reach this cluster as its admin."""
        return {"ca_file": self.ca_file, "token": self.admin_token}

    def _tls_args(self, node: "NodeProcess") -> list[str]:
        if not self.tls:
            return ["--insecure"]
        from node import certs
        host = node.listen.rsplit(":", 1)[0]
        issued = certs.ensure_node_cert(self.ca_dir, os.path.join(self.data_dir, "tls", "nodes"), node.node_id,
                                        hosts=(host, socket.gethostname()))
        args = ["--ca-file", self.ca_file, "--cert-file", issued.cert_file, "--key-file", issued.key_file]
        if node.roles == "control":
            args += ["--bootstrap-token-file", self._admin_token_file()]
        return args

    def _paths(self, node_id: str) -> tuple[str, str]:
        run = os.path.join(self.data_dir, "run")
        return os.path.join(run, f"{node_id}.json"), os.path.join(self.data_dir, "logs", f"{node_id}.log")

    def spawn(self, node_id: str) -> None:
        node = self.procs[node_id]
        self._held_down.discard(node_id)       # (supervised again, also once given up: started by hand)
        self._given_up.discard(node_id)
        self._starting.pop(node_id, None)
        ready, logfile = self._paths(node_id)
        os.makedirs(os.path.dirname(ready), mode=0o700, exist_ok=True)
        os.makedirs(os.path.dirname(logfile), mode=0o700, exist_ok=True)
        if os.path.exists(ready):
            os.unlink(ready)
        if "storage" in node.roles:
            record_node(self.data_dir, node_id)      # (from now on it belongs to the cluster)
        listen = node.listen
        if node.address and listen.endswith(":0") and node.roles == "control":
            listen = node.address   # keep the client address stable across restarts
        cmd = [sys.executable, "-m", "node", "serve", "--node-id", node_id, "--roles", node.roles,
               "--metastore", self.metastore, "--data-dir", os.path.join(self.data_dir, node_id),
               "--listen", listen, "--ready-file", ready] + self._tls_args(node)
        if node.metrics_address:
            cmd += ["--metrics-listen", node.metrics_address]     # (Prometheus's targets and the console's address
            #                                                       survive a restart)
        if node.kinesis_address:      # (an SDK's endpoint URL survives a restart)
            cmd += ["--kinesis-listen", node.kinesis_address.split("://", 1)[1]]
        # a node added to a running `sms up` (`sms node add`) lives as long as that launcher
        cmd += ["--exit-with-pid", str(self.launcher_pid)] if self.launcher_pid else ["--exit-with-parent"]
        if self.expose_sessions:
            cmd += ["--session-file", os.path.join(os.path.dirname(ready), f"{node_id}.session")]
        cmd = self.command_prefix(node_id) + cmd
        # no preexec_fn: it runs Python between fork and exec, where gRPC's fork
        # handlers break a child of a process that has live channels
        # the node logs to DIR/logs/NODE.log itself, rotated (node/logs.py); what it writes
        # outside logging (a start-up error, a crash, a stack dump) goes to NODE.out
        env = {**os.environ, logs.ENV_FILE: logfile}
        if not env.get(ENV_MASTER_KEY_FILE) and not env.get(encryption.ENV_MASTER_KEY):
            env[ENV_MASTER_KEY_FILE] = self.master_key_file      # (the cluster's own, made at start)
        # channels that name no Iceberg catalog share the cluster's (docs/channels.md)
        env.setdefault("SMS_CHANNELS_CATALOG_URI", f"sqlite:///{self.data_dir}/channels/catalog.db")
        env.setdefault("SMS_CHANNELS_WAREHOUSE", f"file://{self.data_dir}/channels/warehouse")
        with os.fdopen(os.open(_out_file(logfile), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
            node.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=bool(self.launcher_pid), env=env)

    def command_prefix(self, node_id: str) -> list[str]:
        """What runs a node's command (none here; network-fault tests run each node in a
        network namespace of its own: `ip netns exec NS`, tests/netfault/cluster.py)."""
        return []

    def wait_ready(self, node_ids: list[str], timeout_s: float = limits.NODE_START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(node_ids)
        while pending:
            for node_id in list(pending):
                node = self.procs[node_id]
                _, logfile = self._paths(node_id)
                if node.proc.poll() is not None:
                    raise RuntimeError(f"node {node_id} exited with {node.proc.returncode}; see {logfile} and "
                                       f"{_out_file(logfile)}:\n" + _tail(logfile) + _tail(_out_file(logfile)))
                if self._take_ready(node_id):
                    pending.remove(node_id)
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"nodes {pending} not ready after {timeout_s}s")
            if pending:
                time.sleep(0.05)

    def _take_ready(self, node_id: str) -> bool:
        """Whether the node has written its ready file (atomically, node/server.py); if so,
        its addresses are taken from it."""
        ready, _ = self._paths(node_id)
        if not os.path.exists(ready):
            return False
        with open(ready) as f:
            facts = json.load(f)
        node = self.procs[node_id]
        node.address = facts["address"]
        node.cluster_address = facts.get("cluster_address", "")
        node.metrics_address = facts.get("metrics_address", "")
        node.kinesis_address = facts.get("kinesis_address", "")
        return True

    @property
    def master_key_file(self) -> str:
        """DIR/tls/master.key: the cluster's master keys for encrypted streams (docs/security.md),
        made at the first start, mode 0600."""
        return os.path.join(self.data_dir, "tls", "master.key")

    def start(self) -> "LocalCluster":
        os.makedirs(self.data_dir, mode=0o700, exist_ok=True)
        os.chmod(self.data_dir, 0o700)                # (an older directory too: its owner's only)
        os.makedirs(os.path.dirname(self.master_key_file), mode=0o700, exist_ok=True)
        encryption.new_key_file(self.master_key_file)
        try:
            for node_id in self.procs:
                self.spawn(node_id)
            self.wait_ready(list(self.procs))
        except BaseException:
            self.stop()
            raise
        self._write_cluster_json()
        return self

    def _write_cluster_json(self, keep_added: bool = False) -> None:
        """DIR/cluster.json: the address, credentials and nodes. With `keep_added`, the
        nodes that `sms node add` appended to it (started by another process) stay."""
        path = os.path.join(self.data_dir, "cluster.json")
        removed = removed_node_ids(self.data_dir)          # (`forget_node` since this start)
        nodes = [{"node_id": n.node_id, "roles": n.roles, "pid": n.pid, "address": n.address,
                  "metrics_address": n.metrics_address, "kinesis_address": n.kinesis_address}
                 for n in self.procs.values() if n.node_id not in removed]
        info = {"address": self.address, "ca_file": self.ca_file, "token": self.admin_token,
                "monitor_token": self.monitor_token,
                "launcher_pid": os.getpid(),
                "metastore": self.metastore,
                "console": self.console_url,
                "kinesis_endpoint": self.kinesis_endpoint,
                "nodes": nodes}
        with _locked(self.data_dir):          # (`sms node add` appends to it meanwhile)
            if keep_added:
                try:
                    with open(path) as f:
                        nodes += [n for n in json.load(f)["nodes"] if n["node_id"] not in self.procs]
                except (OSError, ValueError, KeyError):
                    pass
            _write_json(path, info)

    def supervise(self, stopping: Callable[[], bool] = lambda: False) -> list[str]:
        """One round of `sms up`'s supervision (called every NODE_SUPERVISE_POLL_S): start
        again each node that exited without being stopped here (`stop`, `kill`, `restart`
        hold a node down), at most NODE_RESTARTS_MAX times per node within
        NODE_RESTART_WINDOW_S, after which it stays down. Does not wait for a restarted
        node: a later round sees its ready file and rewrites cluster.json. Returns one line
        per event for the operator; `stopping()` true skips restarts (the launcher is
        stopping, and its nodes may be exiting of the same Ctrl-C)."""
        lines: list[str] = []
        ready = False
        for node_id, node in list(self.procs.items()):
            if node.proc is None or node_id in self._held_down or node_id in self._given_up:
                continue
            code = node.proc.poll()
            if node_id in self._starting and code is None:
                if self._take_ready(node_id):
                    del self._starting[node_id]
                    ready = True
                elif self.clock() - self._starting[node_id] > limits.NODE_START_TIMEOUT_S:
                    node.proc.kill()        # hung while starting: counts as a death in the next round
                    node.proc.wait()
                continue
            if code is None or stopping():
                continue
            self._starting.pop(node_id, None)
            if node_id in removed_node_ids(self.data_dir):
                del self.procs[node_id]
                lines.append(f"node {node_id} (pid {node.pid}) exited; it was removed from the cluster "
                             f"({NODES_FILE}), so it is not started again")
                ready = True          # (cluster.json without it)
                continue
            lines.append(self._restart_dead(node_id, code))
        if ready:
            self._write_cluster_json(keep_added=True)
        return lines

    def _restart_dead(self, node_id: str, code: int) -> str:
        """Start again a node that exited with `code` (negative: the signal), within its
        restart budget; the operator's line about it."""
        node = self.procs[node_id]
        now = self.clock()
        recent = self._restarts.setdefault(node_id, collections.deque())
        while recent and now - recent[0] > limits.NODE_RESTART_WINDOW_S:
            recent.popleft()
        _, logfile = self._paths(node_id)
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        died = f"node {node_id} (pid {node.pid}) {how}"
        if code == 0:                   # (stopped on purpose, e.g. SIGTERM after a drain: it stays down)
            self._held_down.add(node_id)
            return f"node {node_id} (pid {node.pid}) stopped cleanly; it stays down until `sms up` starts again"
        window = f"in the last {limits.NODE_RESTART_WINDOW_S:g} s"
        if len(recent) >= limits.NODE_RESTARTS_MAX:
            self._given_up.add(node_id)
            return (f"{died}; it stays down: restarted {len(recent)} times {window} (see {logfile} and "
                    f"{_out_file(logfile)})")
        recent.append(now)
        try:
            self.spawn(node_id)
        except Exception as e:          # noqa: BLE001 (its log directory or certificate unwritable, say)
            self._given_up.add(node_id)
            return f"{died}; it stays down: it could not be started again: {e}"
        self._starting[node_id] = now
        return f"{died}; restarting ({len(recent)} of {limits.NODE_RESTARTS_MAX} {window})"

    def signal(self, node_id: str, sig: int) -> None:
        self.procs[node_id].proc.send_signal(sig)

    def kill(self, node_id: str) -> None:
        node = self.procs[node_id]
        self._held_down.add(node_id)
        node.proc.kill()
        node.proc.wait()

    def restart(self, node_id: str) -> None:
        node = self.procs[node_id]
        if node.proc and node.proc.poll() is None:
            self._stop_one(node)
        self.spawn(node_id)
        self.wait_ready([node_id])
        self._write_cluster_json()

    def _stop_one(self, node: NodeProcess) -> None:
        self._held_down.add(node.node_id)
        if node.proc is None or node.proc.poll() is not None:
            return
        try:
            node.proc.send_signal(signal.SIGCONT)
            node.proc.terminate()
            node.proc.wait(timeout=limits.NODE_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait()

    @property
    def control_ids(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.roles == "control"]

    def stop(self) -> None:
        """SIGTERM every child (control first: a stopping cluster must not look to the
        chain manager like failing nodes), SIGKILL what is left after the timeout."""
        order = ([n for n in self.procs.values() if n.roles == "control"]
                 + [n for n in self.procs.values() if n.roles != "control"])
        self._held_down.update(self.procs)
        for node in order:
            if node.proc and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
                node.proc.terminate()
        deadline = time.monotonic() + limits.NODE_STOP_TIMEOUT_S
        for node in order:
            if node.proc is None:
                continue
            try:
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s of SIGTERM; its stacks go to its NODE.out, then SIGKILL",
                            node.node_id, limits.NODE_STOP_TIMEOUT_S)
                node.proc.send_signal(signal.SIGUSR2)      # every thread's stack to the log (faulthandler)
                node.proc.send_signal(signal.SIGUSR1)      # every asyncio task's stack to the log
                try:
                    node.proc.wait(timeout=limits.NODE_STACK_DUMP_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
                node.proc.kill()
                node.proc.wait()

    def exited(self) -> dict[str, int]:
        return {n.node_id: n.proc.returncode for n in self.procs.values()
                if n.proc is not None and n.proc.poll() is not None}

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _out_file(logfile: str) -> str:
    """Where a node's standard output and error go, beside its log."""
    return logfile.removesuffix(".log") + ".out"


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def add_node(data_dir: str, timeout_s: float = limits.NODE_START_TIMEOUT_S) -> NodeProcess:
    """Start one more storage node for the local cluster that `sms up` runs in `data_dir`
    (`sms node add`): the next id never used (`next_node_id`), the same metadata store,
    stopped with that launcher. Recorded in DIR/nodes.json (so every later `sms up`
    starts it too) and in DIR/cluster.json."""
    data_dir = os.path.abspath(data_dir)
    path = os.path.join(data_dir, "cluster.json")
    with open(path) as f:
        info = json.load(f)
    with _locked(data_dir):           # (two adds at once take two ids)
        node_id = next_node_id(data_dir)
        _update_record(data_dir, lambda nodes, removed: (nodes + [node_id], removed))
    ca_file = info.get("ca_file", "")
    cluster = LocalCluster(data_dir, nodes=0, metastore=info["metastore"], tls=bool(ca_file),
                           ca_dir=os.path.dirname(ca_file) if ca_file else None, admin_token=info.get("token") or None)
    cluster.launcher_pid = info["launcher_pid"]
    host = info["address"].rsplit(":", 1)[0]
    cluster.procs = {node_id: NodeProcess(node_id, STORAGE_ROLES, f"{host}:0")}
    try:
        cluster.spawn(node_id)
        cluster.wait_ready([node_id], timeout_s)
    except BaseException:
        cluster.stop()
        with _locked(data_dir):        # (it never served: not a node of the cluster)
            _update_record(data_dir, lambda nodes, removed: ([n for n in nodes if n != node_id], removed))
        raise
    node = cluster.procs[node_id]
    with _locked(data_dir):
        with open(path) as f:
            info = json.load(f)         # (as `sms up` last wrote it)
        info["nodes"].append({"node_id": node_id, "roles": node.roles, "pid": node.pid, "address": node.address,
                              "metrics_address": node.metrics_address, "kinesis_address": node.kinesis_address})
        _write_json(path, info)
    return node


class ReplicaWatch:
    """What `sms up` says of its cluster's replicas, polled every UP_WATCH_INTERVAL_S once
    its nodes are up: each draining node (what it still holds, and when it is drained),
    and the partitions whose chain has fewer live members than the replication factor
    (when the cluster falls short, and when it is whole again). `lines` returns only what
    changed since the last call."""

    def __init__(self):
        self._draining: dict[str, int] = {}      # draining node -> replicas + learners it held last
        self._short = 0                          # partitions short of replicas at the last look

    def lines(self, loads, short: dict[str, int]) -> list[str]:
        """`loads`: `list_nodes()` (sms.types.NodeLoad); `short`: stream -> its partitions
        short of replicas (the control leader's `sms_under_replicated_partitions`)."""
        return self._drains(loads) + self._replicas(short)

    def _drains(self, loads) -> list[str]:
        out = []
        now = {n.node_id: n.replicas + n.learners for n in loads if n.draining}
        for node_id, held in now.items():
            before = self._draining.get(node_id)
            if before is None and held:
                out.append(f"node {node_id} is draining: {held} replicas left to move to the other nodes; the drain "
                           f"goes on (`sms node drain {node_id} --undo` stops it)")
            elif before is None:
                out.append(f"node {node_id} is draining and holds no replica: it may be stopped "
                           f"(`sms node drain {node_id} --undo` takes it back)")
            elif held == 0 and before:
                out.append(f"node {node_id} is drained: it holds no replica and may be stopped")
        for node_id in self._draining.keys() - now.keys():
            out.append(f"node {node_id} is no longer draining")
        self._draining = now
        return out

    def _replicas(self, short: dict[str, int]) -> list[str]:
        total = sum(short.values())
        before, self._short = self._short, total
        if total and not before:
            named = sorted(short.items())
            more = f" and {len(named) - limits.UP_STREAMS_NAMED_MAX} more streams" if len(named) > limits.UP_STREAMS_NAMED_MAX else ""
            streams = ", ".join(f"{name}: {n}" for name, n in named[:limits.UP_STREAMS_NAMED_MAX])
            return [f"under-replicated: {total} partition{'s' if total != 1 else ''} with fewer live members than "
                    f"their replication factor ({streams}{more}); `sms status` shows them"]
        if before and not total:
            return ["replication: every partition has its replication factor again"]
        return []


# --- DIR/nodes.json: the storage nodes that belong to the cluster -----------------------
#
# {"nodes": ["n1", "n2", "n3", "n4"], "removed": ["n5"]}: every storage node started on
# DIR, each with its data in DIR/<id>, in the order they joined; and the ids forgotten
# (`forget_node`), which are never started again nor given to a new node. Read and
# rewritten under DIR/.nodes.lock (flock), atomically.

@contextlib.contextmanager
def _locked(data_dir: str):
    """DIR/.nodes.lock, held (flock: released if the process dies). Not re-entrant."""
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    with os.fdopen(os.open(os.path.join(data_dir, _LOCK_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                   "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _ordinal(node_id: str) -> int:
    m = _NODE_ID.match(node_id)
    return int(m.group(1)) if m else 0


def _read_record(data_dir: str) -> tuple[list[str], list[str]] | None:
    """(nodes, removed) of DIR/nodes.json; None when there is none. A DIR of an older
    release has none: its nodes are those its cluster.json lists and the DIR/n<k>
    directories (a node `sms node add` made, which a restart then left out)."""
    try:
        with open(os.path.join(data_dir, NODES_FILE)) as f:
            d = json.load(f)
        return [str(n) for n in d.get("nodes", [])], [str(n) for n in d.get("removed", [])]
    except FileNotFoundError:
        pass
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{os.path.join(data_dir, NODES_FILE)} cannot be read ({e}); it lists the cluster's "
                         f"storage nodes, as {{\"nodes\": [\"n1\", ...], \"removed\": [...]}}") from None
    try:
        with open(os.path.join(data_dir, "cluster.json")) as f:
            listed = [n["node_id"] for n in json.load(f)["nodes"] if "storage" in n.get("roles", "")]
    except (OSError, ValueError, KeyError, TypeError):
        listed = []
    try:
        dirs = [n for n in os.listdir(data_dir) if _NODE_ID.match(n) and os.path.isdir(os.path.join(data_dir, n))]
    except OSError:
        dirs = []
    if not listed and not dirs:
        return None
    return sorted(set(listed) | set(dirs), key=lambda n: (_ordinal(n), n)), []


def _update_record(data_dir: str, change: Callable[[list[str], list[str]], tuple[list[str], list[str]]]) -> None:
    """Rewrite DIR/nodes.json with `change(nodes, removed)` (under `_locked`)."""
    nodes, removed = _read_record(data_dir) or ([], [])
    new_nodes, new_removed = change(list(nodes), list(removed))
    if (new_nodes, new_removed) != (nodes, removed) or not os.path.exists(os.path.join(data_dir, NODES_FILE)):
        _write_private(os.path.join(data_dir, NODES_FILE),
                       json.dumps({"nodes": new_nodes, "removed": new_removed}, indent=2) + "\n")


def recorded_node_ids(data_dir: str) -> list[str]:
    """The storage nodes that belong to the cluster in `data_dir`, in the order they joined."""
    record = _read_record(os.path.abspath(data_dir))
    return record[0] if record else []


def removed_node_ids(data_dir: str) -> set[str]:
    """The ids `forget_node` dropped: never started again, never given again."""
    record = _read_record(os.path.abspath(data_dir))
    return set(record[1]) if record else set()


def storage_node_ids(data_dir: str, nodes: int) -> list[str]:
    """The storage nodes `sms up --nodes N` runs on `data_dir`: n1..nN (but for removed
    ones) and every node recorded there, in id order."""
    record = _read_record(os.path.abspath(data_dir))
    recorded, removed = record if record else ([], [])
    ids = {f"n{i}" for i in range(1, nodes + 1)} - set(removed) | set(recorded)
    return sorted(ids, key=lambda n: (_ordinal(n), n))


def record_node(data_dir: str, node_id: str) -> None:
    """`node_id` belongs to the cluster from now on (LocalCluster.spawn of a storage node)."""
    data_dir = os.path.abspath(data_dir)
    with _locked(data_dir):
        _update_record(data_dir, lambda nodes, removed: (nodes + [node_id] if node_id not in nodes else nodes,
                                                         removed))


def next_node_id(data_dir: str) -> str:
    """The lowest n<k> that no node of the cluster has, had (removed), or left a data
    directory or a cluster.json entry under."""
    data_dir = os.path.abspath(data_dir)
    nodes, removed = _read_record(data_dir) or ([], [])
    taken = set(nodes) | set(removed) | set(os.listdir(data_dir))
    try:
        with open(os.path.join(data_dir, "cluster.json")) as f:
            taken |= {n["node_id"] for n in json.load(f)["nodes"]}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    ordinal = 1
    while f"n{ordinal}" in taken:
        ordinal += 1
    return f"n{ordinal}"


def forget_node(data_dir: str, node_id: str) -> bool:
    """Drop `node_id` from the cluster in `data_dir` (`sms node remove`, once the node is
    drained and stopped): no later `sms up` starts it, a running one does not restart it
    when it exits, `sms node add` never gives its id again, and DIR/cluster.json no
    longer lists it. Its data directory DIR/<node_id> is left as it is. Returns whether
    it was recorded here; an id that was not is marked removed all the same (the
    cluster may have known it from a `sms serve` started by hand: its id stays taken)."""
    data_dir = os.path.abspath(data_dir)
    with _locked(data_dir):
        recorded, _removed = _read_record(data_dir) or ([], [])
        _update_record(data_dir, lambda nodes, removed: ([n for n in nodes if n != node_id],
                                                         removed + [node_id] if node_id not in removed else removed))
        path = os.path.join(data_dir, "cluster.json")
        try:
            with open(path) as f:
                info = json.load(f)
            if any(n.get("node_id") == node_id for n in info["nodes"]):
                info["nodes"] = [n for n in info["nodes"] if n.get("node_id") != node_id]
                _write_json(path, info)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return node_id in recorded


def _read_token(path: str) -> str:
    """The token kept in `path` ("": no such file)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def _write_json(path: str, obj) -> None:
    """Replace the file at `path` with `obj` as JSON, atomically; mode 0600 (it holds the
    admin token)."""
    _write_private(path, json.dumps(obj, indent=2))


def _write_private(path: str, text: str) -> None:
    """Replace `path` atomically, mode 0600."""
    from node import certs
    certs.write_file(path, text.encode(), private=True)
