"""One node process (`sms serve`): the roles it runs, bound to one gRPC port.

Roles: control (stream admin), storage (replicas, chain protocol), ingestion (PutRecords;
needs storage in this version, as a partition's ingestion owner is its chain head's
node), retrieval (reads; needs storage, as it reads the local replica). Every process
also answers the read-only Control calls, so any address is a discovery point. The
process registers an ephemeral /nodes/<id> entry once it serves; SIGTERM or SIGINT
stop it cleanly (server drained, replicas closed, registration removed).
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import io
import json
import logging
import os
import signal
import time

import grpc

from control import auth
from kernel import encryption
from control.revocation import RevokedCerts
from node import config, logs
from node import tls as node_tls
from sms import limits, metadata, security, wire
from kernel import rpc
from sms.errors import InvalidArgument, SmsError
from sms.types import NodeInfo

log = logging.getLogger("node.server")

ROLES = ("control", "storage", "ingestion", "retrieval")


def parse_roles(text: str) -> tuple[str, ...]:
    roles = tuple(r.strip() for r in text.split(",") if r.strip())
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles:
        raise InvalidArgument(f"roles {text!r}; expected a comma-separated subset of {', '.join(ROLES)}")
    if ("ingestion" in roles or "retrieval" in roles) and "storage" not in roles:
        raise InvalidArgument("ingestion and retrieval run beside storage in this version: add the storage role")
    return roles


async def _watch_parent(parent_pid: int, stop: asyncio.Event, *, any_process: bool = False) -> None:
    """Stop when the launching process is gone: we were re-parented, or (`any_process`:
    `sms node add` names the `sms up` launcher, which is not our parent) it no longer exists."""
    while not stop.is_set():
        if any_process:
            try:
                os.kill(parent_pid, 0)
                gone = False
            except ProcessLookupError:
                gone = True
            except PermissionError:
                gone = False
        else:
            gone = os.getppid() != parent_pid
        if gone:
            log.warning("launcher %d is gone; stopping", parent_pid)
            stop.set()
            return
        await asyncio.sleep(limits.PARENT_CHECK_INTERVAL_S)


def _write_session_file(path: str, store) -> None:
    """Test clusters only (`--session-file`): the ZooKeeper session's id and password,
    so a fault test can expire the session from outside. Never set in production."""
    client_id = getattr(store, "client_id", None)
    if not path or client_id is None:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"session_id": client_id[0], "password": client_id[1].hex()}, f)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def metrics_listen_for(listen: str) -> str:
    """Where /metrics is served unless configured: a node listening on a port of its
    choosing (HOST:P) serves it at HOST:P + METRICS_PORT_OFFSET, the same across restarts
    and easy to list for Prometheus; on any free port (P 0), any free port too."""
    host, _, port = listen.rpartition(":")
    if port.isdigit() and int(port) and int(port) + limits.METRICS_PORT_OFFSET <= 65535:
        return f"{host}:{int(port) + limits.METRICS_PORT_OFFSET}"
    return f"{host}:0"


async def serve(node_id: str, roles: tuple[str, ...], metastore_url: str, data_dir: str, listen: str,
                ready_file: str | None = None, exit_with_parent: bool = False, session_file: str = "",
                exit_with_pid: int = 0, tls: security.TlsConfig | None = None, cluster_listen: str = "",
                bootstrap_token: str = "", metrics_listen: str = "",
                tls_files: tuple[str, str] = ("", ""), master_keys: "encryption.MasterKeys | None" = None,
                master_key_file: str = "", kinesis_listen: str = "") -> None:
    """`tls`: this node's certificate and the cluster's CA (node/tls.py: a client port and
    a cluster port, and every client call's key checked); None: one plaintext port for
    everything, no credentials. `bootstrap_token`: the cluster's first admin key, made
    once in its life (`sms up`). `metrics_listen`: where /metrics is served (default: the
    client port's host, any free port), over HTTPS with `tls_files` (certificate, key);
    `kinesis_listen` likewise for the Kinesis endpoint ("off": none).

    The steps, in order (`_Node`): the metadata store, the ports, the services of the
    roles, the servers started, metrics and the console, the registration, the control
    role's election, serving; then, once stopped, the same taken down."""
    node = _Node(node_id, roles, data_dir, tls, master_keys, master_key_file)
    stop = node.watch_signals(exit_with_pid, exit_with_parent)
    await node.open_store(metastore_url)
    await node.open_ports(listen, cluster_listen, bootstrap_token)
    await node.add_services()
    await node.start_servers()
    node.serve_metrics(metrics_listen or metrics_listen_for(listen), tls_files)
    await node.start_kinesis(kinesis_listen, tls_files)
    await node.register()
    node.start_control()
    await node.serving(session_file, ready_file)
    await stop.wait()
    await node.stop()


class _Node:
    """One node process's parts, made by `serve` in steps and taken down by `stop`."""

    def __init__(self, node_id: str, roles: tuple[str, ...], data_dir: str, tls: security.TlsConfig | None,
                 master_keys: "encryption.MasterKeys | None", master_key_file: str) -> None:
        self.node_id = node_id
        self.roles = roles
        self.data_dir = data_dir
        self.tls = tls
        self.master_keys = master_keys
        self.master_key_file = master_key_file
        self.loop = asyncio.get_running_loop()
        self.started_ms = int(time.time() * 1000)       # this process's incarnation
        self.channels = rpc.NodeChannels(tls)            # this node's TLS, for its calls to other nodes
        self.parent_watch: asyncio.Task | None = None
        self.background: set[asyncio.Task] = set()
        self.keys = self.revoked = None
        self.storage = self.ingestion = self.retrieval = self.election = self.queues = None
        self.deliveries = None
        self.registrations: list[tuple[str, bytes]] = []
        self.kinesis_address = ""
        self.kinesis_task: asyncio.Task | None = None
        self.kinesis_client = None
        self.kinesis_stop = asyncio.Event()

    def in_background(self, coroutine) -> None:
        task = self.loop.create_task(coroutine)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def watch_signals(self, exit_with_pid: int, exit_with_parent: bool) -> asyncio.Event:
        """The event that stops the node: SIGTERM, SIGINT, or its launcher gone."""
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, stop.set)
        self.loop.add_signal_handler(signal.SIGUSR1, _log_tasks)
        if exit_with_pid:
            self.parent_watch = self.loop.create_task(_watch_parent(exit_with_pid, stop, any_process=True))
        elif exit_with_parent:
            self.parent_watch = self.loop.create_task(_watch_parent(os.getppid(), stop))
        return stop

    async def open_store(self, metastore_url: str) -> None:
        from control.admin import ensure_roots
        from metastore import open_metastore
        from metastore.view import ClusterView
        self.store = open_metastore(metastore_url)
        await self.store.start()
        await ensure_roots(self.store)
        self.view = ClusterView(self.store)
        await self.view.start()

    async def open_ports(self, listen: str, cluster_listen: str, bootstrap_token: str) -> None:
        """The client port, and on a TLS node the cluster port (servers[1:]), which serves
        what nodes call of each other: the chain's protocols and reads of other replicas;
        admin and client calls need the client port and a key, even for a holder of a node
        certificate."""
        self.host = listen.rsplit(":", 1)[0]
        self.cluster_address = ""
        if self.tls is None:
            self.server = grpc.aio.server(options=rpc.SERVER_OPTIONS)
            self.servers = [self.server]
            port = self.server.add_insecure_port(listen)
        else:
            # a TLS node checks every client call's key (control/auth.py)
            self.keys = auth.KeyTable(self.store, master_keys=self.master_keys)
            if bootstrap_token:
                if await auth.bootstrap_admin_key(self.store, bootstrap_token, self.master_keys):
                    log.info("created the cluster's first admin key (%s)", auth.parse_token(bootstrap_token)[0])
            self.server = grpc.aio.server(options=rpc.SERVER_OPTIONS,
                                          interceptors=[node_tls.ClientPortGuard(self.keys)])
            port = self.server.add_secure_port(listen, node_tls.client_port_credentials(self.tls))
            self.revoked = RevokedCerts(self.store)
            await self.revoked.start()
            inner = grpc.aio.server(options=rpc.SERVER_OPTIONS, interceptors=[node_tls.ClusterPortGuard(self.revoked)])
            self.servers = [self.server, inner]
            cluster_listen = cluster_listen or f"{self.host}:0"
            cluster_port = inner.add_secure_port(cluster_listen, node_tls.cluster_port_credentials(self.tls))
            if cluster_port == 0:
                raise SystemExit(f"cannot listen on {cluster_listen}")
            self.cluster_address = f"{cluster_listen.rsplit(':', 1)[0]}:{cluster_port}"
        if port == 0:
            raise SystemExit(f"cannot listen on {listen}")
        self.address = f"{self.host}:{port}"

    async def add_services(self) -> None:
        """Control (every node serves its discovery calls, whatever its roles), health, and
        the services of this node's roles."""
        from control.service import ControlService
        from node.health import NodeHealth
        from sms.proto import sms_pb2_grpc
        roles = self.roles
        self.control = ControlService(self.view, None, control_role="control" in roles)
        from node import config
        self.control.node_settings = (self.node_id, config.show(config.APPLIED) if config.APPLIED else [])
        here = os.path.abspath(self.data_dir)
        self.control.channels.defaults = {       # (docs/channels.md: one catalog for every node)
            "catalog_uri": limits.CHANNEL_CATALOG_URI or f"sqlite:///{here}/channels/catalog.db",
            "warehouse": limits.CHANNEL_WAREHOUSE or f"file://{here}/channels/warehouse"}
        for srv in self.servers:          # (the cluster port serves its discovery reads only: node/tls.py)
            sms_pb2_grpc.add_ControlServicer_to_server(self.control, srv)
        self.health = NodeHealth(("control",) + tuple(r for r in ("storage", "ingestion", "retrieval") if r in roles))
        self.health.add_to(self.server)
        await self.health.starting()
        self.stream_keys = encryption.StreamKeys(self.store, self.master_keys or encryption.MasterKeys.none(),
                                                 self.master_key_file)
        if "storage" in roles:
            self._add_storage()
        if "ingestion" in roles:
            from ingestion.service import IngestionService
            from storage.head import HeadSession
            # the chain heads this node ingests for are its own storage role's replicas:
            # batches reach them by a direct call (storage/head.py), not over loopback gRPC
            storage = self.storage
            local_head = (lambda: HeadSession(storage)) if storage is not None else None
            self.ingestion = IngestionService(self.node_id, self.view, local_head=local_head, channels=self.channels)
            self.ingestion.start()
            for srv in self.servers:      # (the cluster port serves PutRecords only: node/tls.py)
                sms_pb2_grpc.add_IngestionServicer_to_server(self.ingestion, srv)
            # the owners of queues' partitions whose head is here (docs/queues.md): each a
            # client of this cluster as this node (its certificate, the cluster ports)
            from queues.service import QueueService
            from sms import aio
            view = self.view

            async def cluster_ports() -> dict[str, str]:
                return {n.address: n.internal_address for n in (await view.nodes()).values()}
            internal = aio.Client(self.cluster_address or self.address, ca_file="", token="", tls_config=self.tls,
                                  cluster_ports=cluster_ports)
            self.queues = QueueService(self.node_id, self.view, internal)
            self.queues.start()
            for srv in self.servers:
                sms_pb2_grpc.add_QueuesServicer_to_server(self.queues, srv)
            # the workers of channels' partitions whose head is here (docs/channels.md)
            from delivery.manager import ChannelManager
            self.deliveries = ChannelManager(self.node_id, self.view, aio.Client(
                self.cluster_address or self.address, ca_file="", token="", tls_config=self.tls,
                cluster_ports=cluster_ports))
            self.deliveries.start()
        if "retrieval" in roles:
            from retrieval.service import RetrievalService
            from sms.tokens import TokenCodec
            secret = await self.store.get(metadata.CLUSTER_SECRET)
            tokens = TokenCodec(bytes.fromhex(secret.value.decode()))
            self.retrieval = RetrievalService(self.storage, self.view, tokens, keys=self.stream_keys)
            for srv in self.servers:
                sms_pb2_grpc.add_RetrievalServicer_to_server(self.retrieval, srv)

    def _add_storage(self) -> None:
        from metastore import MetaStoreError, NodeExistsError
        from sms.proto import sms_pb2_grpc
        from storage.service import StorageNode, StorageService
        node_id, store, started_ms = self.node_id, self.store, self.started_ms
        self.storage = StorageNode(node_id, self.data_dir, store, incarnation=started_ms, keys=self.stream_keys,
                                   channels=self.channels)
        storage_service = StorageService(self.storage, self.roles, os.getpid())
        self.control.storage_service = storage_service
        for srv in self.servers:
            sms_pb2_grpc.add_StorageServicer_to_server(storage_service, srv)

        async def report_disk_failed() -> None:
            """Our disk failed (storage/log.py StorageHealth): say so under /disk_failed, so
            the chain manager takes this incarnation out of its chains (control/manager.py)."""
            path, value = metadata.disk_failed_path(node_id), str(started_ms).encode()
            for _ in range(limits.DISK_FAILED_REPORT_ATTEMPTS):
                try:
                    try:
                        await store.create(path, value)
                    except NodeExistsError:
                        await store.set(path, value)
                    return
                except MetaStoreError:       # the metadata store is unreachable: try again
                    log.exception("reporting the failed disk failed; retrying")
                    await asyncio.sleep(limits.LINK_RETRY_INTERVAL_S)

        def fenced() -> None:
            self.in_background(report_disk_failed())
            self.in_background(self.health.failed_disk())
        # called on the thread that found the failure
        self.storage.logs.health.on_fence = lambda: self.loop.call_soon_threadsafe(fenced)

    async def start_servers(self) -> None:
        for srv in self.servers:
            await srv.start()
        if self.storage is not None:
            await self.storage.start()

    def serve_metrics(self, metrics_listen: str, tls_files: tuple[str, str]) -> None:
        """/metrics, and on a control node the web console (node/console.py), read-only, on
        the same port (on a secure cluster, /api/state wants a cluster admin's key, as the
        gRPC API would)."""
        from node.console import Console
        from node.metrics import NodeCollector, serve_metrics
        control = self.control
        self.collector = NodeCollector(self.loop, self.node_id, self.roles, self.data_dir, storage=self.storage,
                                       ingestion=self.ingestion, view=self.view,
                                       is_leader=lambda: control.admin is not None, groups=control.groups,
                                       queues=self.queues, channels=self.deliveries, tls=self.tls)
        keys = self.keys if self.tls is not None else None
        console = (Console(self.loop, self.node_id, self.view, control.groups,
                           is_leader=lambda: control.admin is not None, keys=keys,
                           address=self.address, ca=self.tls.ca if self.tls is not None else None)
                   if "control" in self.roles else None)
        self.metrics_server, self.metrics_address = serve_metrics(
            metrics_listen or f"{self.host}:0", self.collector, *(tls_files if self.tls is not None else ("", "")),
            app=console, keys=keys)

    async def start_kinesis(self, kinesis_listen: str, tls_files: tuple[str, str]) -> None:
        """The Kinesis Data Streams endpoint (kinesis/), on a port of its own: its calls go
        to this node's client port, made as the key that signed each request."""
        if kinesis_listen == "off":
            return
        from control import auth
        from kinesis.credentials import SigningKeys
        from kinesis.server import KinesisApp, listen, serve
        from kinesis.service import KinesisService
        from sms import aio
        host, _, port = (kinesis_listen or f"{self.host}:0").rpartition(":")
        try:
            sock = listen(host.strip("[]"), int(port))
        except (OSError, ValueError) as e:
            raise SystemExit(f"sms serve: the Kinesis endpoint cannot listen on {kinesis_listen}: {e}") from None
        bound = sock.getsockname()[1]
        self.kinesis_address = f"{'https' if self.tls is not None else 'http'}://{host}:{bound}"
        # (no token of its own: each call carries the one delegated to the key that signed its request)
        self.kinesis_client = aio.Client(self.address, ca_file=self.tls.ca_file if self.tls is not None else "",
                                         token="")
        master = self.master_keys if self.master_keys is not None and self.master_keys.current else None
        delegate = (lambda key_id: auth.delegate(master, key_id)) if self.tls is not None and master else None
        signing = SigningKeys(self.store, master) if self.tls is not None else None
        if self.tls is not None and master is None:
            log.warning("the Kinesis endpoint refuses every request: this node has no master key to open the keys' "
                        "AWS secrets with (encryption.master_key_file)")
        service = KinesisService(self.kinesis_client, delegate)
        app = KinesisApp(service, signing, limits.KINESIS_ACCOUNT_ID)
        cert, key = tls_files if self.tls is not None else ("", "")
        self.kinesis_task = self.loop.create_task(serve(app, sock, self.kinesis_stop, cert, key), name="kinesis")

    async def _register_once(self, path: str, value: bytes) -> None:
        """Create our ephemeral entry; an entry left by our own killed predecessor
        vanishes when its session expires, so wait that long before giving up."""
        from metastore import NodeExistsError
        deadline = time.monotonic() + 2 * limits.METASTORE_SESSION_TTL_S
        while True:
            try:
                await self.store.create(path, value, ephemeral=True)
                return
            except NodeExistsError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{path} is held by another live process")
                await asyncio.sleep(limits.METASTORE_POLL_INTERVAL_S)

    async def register(self) -> None:
        info = NodeInfo(node_id=self.node_id, address=self.address, roles=self.roles, pid=os.getpid(),
                        started_ms=self.started_ms, cluster_address=self.cluster_address,
                        metrics_address=self.metrics_address, kinesis_address=self.kinesis_address)
        self.registrations = [(metadata.node_path(self.node_id), metadata.node_to_bytes(info))]
        for path, value in self.registrations:
            await self._register_once(path, value)

    def start_control(self) -> None:
        """The control role: it takes part in the election; the leader runs the chain
        manager, the repartitioner and stream admin."""
        if "control" not in self.roles:
            return
        from control.admin import StreamAdmin
        from control.election import LeaderElection
        from control.manager import ChainManager
        from control.repartition import Repartitioner
        store, control = self.store, self.control
        manager = ChainManager(store, self.channels)
        repartitioner = Repartitioner(store, self.channels)
        admin = StreamAdmin(store, self.view, master_keys=self.master_keys, channels=self.channels)
        admin.poke_repartitioner = repartitioner.poke

        async def elected() -> None:
            control.admin = admin
            manager.start()
            repartitioner.start()

        async def deposed() -> None:
            control.admin = None
            await manager.stop()
            await repartitioner.stop()

        self.election = LeaderElection(store, self.node_id, self.address, self.started_ms, elected, deposed)
        self.election.start()

    async def _register_again(self, session_file: str) -> None:
        """Our session expired (we were paused): register again, with the same
        incarnation, until it holds (a node that is not registered serves no chain)."""
        from metastore import MetaStoreError
        await self.health.unregistered()
        while True:
            try:
                for path, value in self.registrations:
                    await self._register_once(path, value)
                break
            except (MetaStoreError, SystemExit) as e:
                log.error("registering again after the session expired failed (%s); retrying", e)
                await asyncio.sleep(limits.METASTORE_SESSION_TTL_S)
        _write_session_file(session_file, self.store)
        await self.health.serving()

    async def serving(self, session_file: str, ready_file: str | None) -> None:
        self.store.on_session_lost(lambda: self.in_background(self._register_again(session_file)))
        _write_session_file(session_file, self.store)
        await self.health.serving()
        log.info("node %s serving %s on %s (%s; wire codec: %s; metrics on %s)", self.node_id, ",".join(self.roles),
                 self.address, f"TLS, cluster port {self.cluster_address}" if self.tls else "plaintext: --insecure",
                 wire.IMPLEMENTATION, self.metrics_address)
        if ready_file:
            tmp = ready_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"node_id": self.node_id, "address": self.address, "cluster_address": self.cluster_address,
                           "metrics_address": self.metrics_address, "kinesis_address": self.kinesis_address,
                           "pid": os.getpid()}, f)
            os.replace(tmp, ready_file)

    async def stop(self) -> None:
        from node.metrics import stop_metrics
        log.info("node %s stopping", self.node_id)
        await self.health.stopping()
        if self.election is not None:      # first: a stopping cluster must not look like failing nodes
            await self.election.stop()
        if self.parent_watch is not None:
            self.parent_watch.cancel()
        if self.kinesis_task is not None:
            self.kinesis_stop.set()
            try:
                async with asyncio.timeout(limits.KINESIS_GRACEFUL_S + 1):
                    await self.kinesis_task
            except (TimeoutError, Exception) as e:       # (its own failure is logged, the node still stops)
                log.warning("the Kinesis endpoint did not stop cleanly: %r", e)
            await self.kinesis_client.close()
        await asyncio.gather(*(srv.stop(grace=1.0) for srv in self.servers))
        await asyncio.to_thread(stop_metrics, self.metrics_server, self.collector)
        if self.revoked is not None:
            await self.revoked.close()
        if self.deliveries is not None:
            await self.deliveries.close()
        if self.queues is not None:
            await self.queues.close()
        if self.ingestion is not None:
            await self.ingestion.close()
        if self.storage is not None:
            await self.storage.close()
        if self.retrieval is not None:
            self.retrieval.archive.close()
        self.view.close()
        await self.store.close()


def _log_tasks() -> None:
    """Every asyncio task's stack, to the log (SIGUSR1)."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(limit=limits.TASK_STACK_FRAMES_MAX, file=out)
    log.warning("asyncio tasks (SIGUSR1):\n%s", out.getvalue())


def run(args) -> int:
    # what a node writes (its data directory, logs, archive fragments) is its owner's only
    # (docs/security.md): directories 0700, files 0600
    os.umask(0o077)
    _make_private(args.data_dir)
    # the configuration first (node/config.py): it sets sms/limits.py's tunables and the
    # log settings before anything uses them
    flags = {"node.listen": ("--listen", args.listen), "node.cluster_listen": ("--cluster-listen", args.cluster_listen),
             "node.metrics_listen": ("--metrics-listen", getattr(args, "metrics_listen", None)),
             "node.kinesis_listen": ("--kinesis-listen", getattr(args, "kinesis_listen", None))}
    try:
        values = config.load(getattr(args, "config", None), flags=flags)
        config.apply(values)
        logs.configure(args.node_id)
    except (config.ConfigError, logs.LogConfigError) as e:
        raise SystemExit(f"sms serve: {e}") from None
    from kernel import audit            # this node's audit log (docs/security.md, "Audit log")
    try:
        audit.configure(values["log.audit_file"].value or os.path.join(args.data_dir, audit.FILE_NAME), args.node_id)
    except OSError as e:
        raise SystemExit(f"sms serve: log.audit_file: {e}") from None
    listen = values["node.listen"].value or "127.0.0.1:0"
    roles = parse_roles(args.roles)
    if "storage" in roles:      # the data directory's format first: a newer one is refused untouched
        from storage import dataformat
        try:
            dataformat.open_dir(os.path.join(args.data_dir, "storage"))
        except dataformat.DataFormatError as e:
            raise SystemExit(f"sms serve: {e.name}: {e}") from None
        except OSError as e:
            raise SystemExit(f"sms serve: the data directory {args.data_dir}: {e}") from None
    # SIGUSR2 writes every thread's stack to the log, SIGUSR1 every asyncio task's (serve()):
    # what a launcher sends a node that did not stop in time, so its log says where it hung
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    # The hot path allocates short-lived objects only; the default generation-0 threshold
    # (700) ran a collection every few batches, ~10% of a node's CPU in profiles. The
    # modules loaded so far are frozen out of every collection.
    gc.freeze()
    gc.set_threshold(*limits.SERVER_GC_THRESHOLDS)
    tls = node_tls_config(args)
    bootstrap_token = ""
    if args.bootstrap_token_file:
        try:
            with open(args.bootstrap_token_file) as f:
                bootstrap_token = f.read().strip()
            auth.parse_token(bootstrap_token)
        except (OSError, SmsError) as e:
            raise SystemExit(f"sms serve: --bootstrap-token-file {args.bootstrap_token_file}: {e}") from None
    master_key_file = values["encryption.master_key_file"].value
    try:
        master_keys = encryption.MasterKeys.load(master_key_file)
    except ValueError as e:
        raise SystemExit(f"sms serve: {e}") from None
    log.info("configuration: %s", ", ".join(f"{v.setting.key}={v.value!r} ({v.source})"
                                            for v in values.values() if v.source != "default") or "the defaults")
    asyncio.run(serve(args.node_id, roles, args.metastore, args.data_dir, listen, args.ready_file,
                      args.exit_with_parent, args.session_file or "", args.exit_with_pid or 0,
                      tls=tls, cluster_listen=values["node.cluster_listen"].value, bootstrap_token=bootstrap_token,
                      metrics_listen=values["node.metrics_listen"].value,
                      tls_files=(args.cert_file or "", args.key_file or ""),
                      master_keys=master_keys, master_key_file=master_key_file,
                      kinesis_listen=values["node.kinesis_listen"].value))
    return 0


def _make_private(data_dir: str) -> None:
    """Tighten a data directory written before nodes kept theirs private (an upgrade):
    directories 0700, files 0600. A handful of files (LMDB environments, logs)."""
    if not data_dir or not os.path.isdir(data_dir):
        return
    for root, dirs, files in os.walk(data_dir):
        os.chmod(root, 0o700)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o600)


def node_tls_config(args) -> security.TlsConfig | None:
    """The node's certificate, key and CA (`--ca-file --cert-file --key-file`), checked to
    be a node certificate for this node id; None with `--insecure`."""
    files = (args.ca_file, args.cert_file, args.key_file)
    if args.insecure:
        if any(files):
            raise SystemExit("sms serve: --insecure and TLS files exclude each other")
        return None
    if not all(files):
        raise SystemExit("sms serve: a node needs --ca-file, --cert-file and --key-file (issue them with "
                         "`sms certs issue --node ID`), or --insecure to serve plaintext")
    try:
        tls = security.TlsConfig.from_files(*files)
    except InvalidArgument as e:
        raise SystemExit(f"sms serve: {e.message}") from None
    cert = security.parse_cert(tls.cert)
    if cert.unit != security.NODE_UNIT or cert.name != args.node_id:
        raise SystemExit(f"sms serve: {args.cert_file} is a certificate of {cert.unit or 'no unit'} "
                         f"{cert.name!r}, not of node {args.node_id!r}")
    return tls
