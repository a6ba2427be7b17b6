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


async def serve(node_id: str, roles: tuple[str, ...], metastore_url: str, data_dir: str, listen: str,
                ready_file: str | None = None, exit_with_parent: bool = False, session_file: str = "",
                exit_with_pid: int = 0, tls: security.TlsConfig | None = None, cluster_listen: str = "",
                bootstrap_token: str = "", metrics_listen: str = "",
                tls_files: tuple[str, str] = ("", ""), master_keys: "encryption.MasterKeys | None" = None,
                master_key_file: str = "") -> None:
    """`tls`: this node's certificate and the cluster's CA (node/tls.py: a client port and
    a cluster port, and every client call's key checked); None: one plaintext port for
    everything, no credentials. `bootstrap_token`: the cluster's first admin key, made
    once in its life (`sms up`). `metrics_listen`: where /metrics is served (default: the
    client port's host, any free port), over HTTPS with `tls_files` (certificate, key)."""
    from control.admin import StreamAdmin, ensure_roots
    from control.election import LeaderElection
    from control.manager import ChainManager
    from control.repartition import Repartitioner
    from metastore import MetaStoreError, NodeExistsError, open_metastore
    from metastore.view import ClusterView
    from control.service import ControlService
    from ingestion.service import IngestionService
    from node.console import Console
    from node.health import NodeHealth
    from node.metrics import NodeCollector, serve_metrics, stop_metrics
    from retrieval.service import RetrievalService
    from sms.tokens import TokenCodec
    from sms.proto import sms_pb2_grpc
    from storage.head import HeadSession
    from storage.service import StorageNode, StorageService

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _log_tasks)
    parent_watch = (loop.create_task(_watch_parent(exit_with_pid, stop, any_process=True)) if exit_with_pid
                    else loop.create_task(_watch_parent(os.getppid(), stop)) if exit_with_parent else None)

    store = open_metastore(metastore_url)
    await store.start()
    await ensure_roots(store)
    view = ClusterView(store)
    await view.start()

    channels = rpc.NodeChannels(tls)       # this node's TLS, for its calls to other nodes
    host = listen.rsplit(":", 1)[0]
    cluster_address = ""
    revoked = None
    if tls is None:
        server = grpc.aio.server(options=rpc.SERVER_OPTIONS)
        servers = [server]
        port = server.add_insecure_port(listen)
    else:
        # a TLS node checks every client call's key (control/auth.py)
        keys = auth.KeyTable(store)
        if bootstrap_token:
            if await auth.bootstrap_admin_key(store, bootstrap_token):
                log.info("created the cluster's first admin key (%s)", auth.parse_token(bootstrap_token)[0])
        server = grpc.aio.server(options=rpc.SERVER_OPTIONS, interceptors=[node_tls.ClientPortGuard(keys)])
        port = server.add_secure_port(listen, node_tls.client_port_credentials(tls))
        revoked = RevokedCerts(store)
        await revoked.start()
        inner = grpc.aio.server(options=rpc.SERVER_OPTIONS, interceptors=[node_tls.ClusterPortGuard(revoked)])
        servers = [server, inner]
        cluster_listen = cluster_listen or f"{host}:0"
        cluster_port = inner.add_secure_port(cluster_listen, node_tls.cluster_port_credentials(tls))
        if cluster_port == 0:
            raise SystemExit(f"cannot listen on {cluster_listen}")
        cluster_address = f"{cluster_listen.rsplit(':', 1)[0]}:{cluster_port}"
    if port == 0:
        raise SystemExit(f"cannot listen on {listen}")
    address = f"{host}:{port}"

    started_ms = int(time.time() * 1000)      # this process's incarnation
    control = ControlService(view, None, control_role="control" in roles)
    # the cluster port (servers[1:]) serves what nodes call of each other: the chain's
    # protocols and reads of other replicas; admin and client calls need the client port
    # and a key, even for a holder of a node certificate
    sms_pb2_grpc.add_ControlServicer_to_server(control, server)
    # (every node serves the Control service: discovery calls, whatever its roles)
    health = NodeHealth(("control",) + tuple(r for r in ("storage", "ingestion", "retrieval") if r in roles))
    health.add_to(server)
    await health.starting()
    background: set[asyncio.Task] = set()

    def in_background(coroutine) -> None:
        task = loop.create_task(coroutine)
        background.add(task)
        task.add_done_callback(background.discard)
    storage = ingestion = election = retrieval = None
    stream_keys = encryption.StreamKeys(store, master_keys or encryption.MasterKeys.none(), master_key_file)
    if "storage" in roles:
        storage = StorageNode(node_id, data_dir, store, incarnation=started_ms, keys=stream_keys, channels=channels)
        storage_service = StorageService(storage, roles, os.getpid())
        control.storage_service = storage_service
        for srv in servers:
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

        reports: set[asyncio.Task] = set()

        def report() -> None:
            task = loop.create_task(report_disk_failed())
            reports.add(task)
            task.add_done_callback(reports.discard)
        def fenced() -> None:
            report()
            in_background(health.failed_disk())
        # called on the thread that found the failure
        storage.logs.health.on_fence = lambda: loop.call_soon_threadsafe(fenced)
    if "ingestion" in roles:
        # the chain heads this node ingests for are its own storage role's replicas: batches
        # reach them by a direct call (storage/head.py), not over loopback gRPC
        local_head = (lambda: HeadSession(storage)) if storage is not None else None
        ingestion = IngestionService(node_id, view, local_head=local_head, channels=channels)
        ingestion.start()
        sms_pb2_grpc.add_IngestionServicer_to_server(ingestion, server)
    if "retrieval" in roles:
        secret = await store.get(metadata.CLUSTER_SECRET)
        tokens = TokenCodec(bytes.fromhex(secret.value.decode()))
        retrieval = RetrievalService(storage, view, tokens, keys=stream_keys)
        for srv in servers:
            sms_pb2_grpc.add_RetrievalServicer_to_server(retrieval, srv)
    for srv in servers:
        await srv.start()
    if storage is not None:
        await storage.start()

    collector = NodeCollector(loop, node_id, roles, data_dir, storage=storage, ingestion=ingestion, view=view,
                              is_leader=lambda: control.admin is not None, groups=control.groups)
    # the web console (node/console.py), read-only, on the metrics port of a control node
    # (on a secure cluster, /api/state wants a cluster admin's key, as the gRPC API would)
    console = (Console(loop, node_id, view, control.groups, is_leader=lambda: control.admin is not None,
                       keys=keys if tls is not None else None)
               if "control" in roles else None)
    metrics_server, metrics_address = serve_metrics(metrics_listen or f"{host}:0", collector,
                                                    *(tls_files if tls is not None else ("", "")), app=console,
                                                    keys=keys if tls is not None else None)
    info = NodeInfo(node_id=node_id, address=address, roles=roles, pid=os.getpid(), started_ms=started_ms,
                    cluster_address=cluster_address, metrics_address=metrics_address)
    async def register(path: str, value: bytes) -> None:
        """Create our ephemeral entry; an entry left by our own killed predecessor
        vanishes when its session expires, so wait that long before giving up."""
        deadline = time.monotonic() + 2 * limits.METASTORE_SESSION_TTL_S
        while True:
            try:
                await store.create(path, value, ephemeral=True)
                return
            except NodeExistsError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{path} is held by another live process")
                await asyncio.sleep(limits.METASTORE_POLL_INTERVAL_S)

    registrations = [(metadata.node_path(node_id), metadata.node_to_bytes(info))]
    for path, value in registrations:
        await register(path, value)
    if "control" in roles:
        manager = ChainManager(store, channels)
        repartitioner = Repartitioner(store, channels)
        admin = StreamAdmin(store, view, master_keys=master_keys, channels=channels)
        admin.poke_repartitioner = repartitioner.poke

        async def elected() -> None:
            control.admin = admin
            manager.start()
            repartitioner.start()

        async def deposed() -> None:
            control.admin = None
            await manager.stop()
            await repartitioner.stop()

        election = LeaderElection(store, node_id, address, started_ms, elected, deposed)
        election.start()

    async def register_again() -> None:
        await health.unregistered()
        while True:               # (until it holds: a node that is not registered serves no chain)
            try:
                for path, value in registrations:
                    await register(path, value)
                break
            except (MetaStoreError, SystemExit) as e:
                log.error("registering again after the session expired failed (%s); retrying", e)
                await asyncio.sleep(limits.METASTORE_SESSION_TTL_S)
        _write_session_file(session_file, store)
        await health.serving()

    def reregister() -> None:   # our session expired (we were paused): register again
        in_background(register_again())

    store.on_session_lost(reregister)
    _write_session_file(session_file, store)
    await health.serving()
    log.info("node %s serving %s on %s (%s; wire codec: %s; metrics on %s)", node_id, ",".join(roles), address,
             f"TLS, cluster port {cluster_address}" if tls else "plaintext: --insecure", wire.IMPLEMENTATION,
             metrics_address)
    if ready_file:
        tmp = ready_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"node_id": node_id, "address": address, "cluster_address": cluster_address,
                       "metrics_address": metrics_address, "pid": os.getpid()}, f)
        os.replace(tmp, ready_file)

    await stop.wait()
    log.info("node %s stopping", node_id)
    await health.stopping()
    if election is not None:      # first: a stopping cluster must not look like failing nodes
        await election.stop()
    if parent_watch is not None:
        parent_watch.cancel()
    await asyncio.gather(*(srv.stop(grace=1.0) for srv in servers))
    await asyncio.to_thread(stop_metrics, metrics_server, collector)
    if revoked is not None:
        await revoked.close()
    if ingestion is not None:
        await ingestion.close()
    if storage is not None:
        await storage.close()
    if retrieval is not None:
        retrieval.archive.close()
    view.close()
    await store.close()


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
             "node.metrics_listen": ("--metrics-listen", getattr(args, "metrics_listen", None))}
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
                      master_keys=master_keys, master_key_file=master_key_file))
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
