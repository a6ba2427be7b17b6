"""A node's Prometheus endpoint: the event metrics of kernel/metrics.py, and what the node
holds, read when Prometheus scrapes (prometheus_client).

`sms serve --metrics-listen HOST:PORT` (default: the client port's host, any free port)
serves `/metrics` over HTTPS with the node's certificate on a secure cluster (Prometheus
trusts the cluster CA: `tls_config: {ca_file: ca.pem}`), plain HTTP with `--insecure`. The
address is in the node's registration, `sms status` and `sms up`'s cluster.json.

On a secure cluster a scrape needs a key (control/auth.py): `Authorization: Bearer
<token>` of a `monitor` key, or of an admin key, of the default tenant (the labels name
every tenant's streams and consumers), which is what Prometheus's `authorization` scrape
setting sends. No token, or one of no valid key: 401 with `WWW-Authenticate: Bearer`;
a key without that right: 403; a key that cannot be checked now (the metadata store does
not answer): 503. Only /metrics and /history are guarded here: every other path goes to
the web console (node/console.py), which checks its own (/api/state wants a cluster
admin's key; its static files are public), or is 404. A plaintext node (`--insecure`)
checks nothing.

`GET /history` (same key) answers the node's own short history as JSON (`HistorySampler`,
node/console_history.py): every HISTORY_SAMPLE_S ($SMS_HISTORY_SAMPLE_S) a thread of the
metrics server reads this node's records written and read per stream (its counters, in
process) and the consumer lag it exports, into ring buffers of an hour; the web console
draws its charts from every node's.

What a scrape reads is gathered on the node's event loop (the structures are the loop's),
within METRICS_SCRAPE_TIMEOUT_S; a node too busy to answer in time gives an empty scrape
for those, and `sms_scrape_errors_total` says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import threading
import time

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, Counter, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from control import auth, chains
from sms import limits, seqno
from kernel.metrics import PUT_RECORDS, READ_RECORDS, REGISTRY
from node.console_history import COUNTERS, History, node_series, sample_s_from
from sms.leases import SHARD_END, Lease
from sms.errors import SmsError, Unauthenticated
from sms.metadata import ConsumerRecord, consumer_path, parse_chain_id
from sms.types import partition_id

log = logging.getLogger(__name__)

# no `<counter>_created` series (one per counter and label set: 107 per storage node, of
# no use to an alert or a dashboard; Prometheus's own exporters leave them out too)
disable_created_metrics()

SCRAPE_ERRORS = Counter("sms_scrape_errors", "Scrapes whose node state could not be read in time",
                        registry=REGISTRY)
# the process's own (CPU, memory, open files, GC), as prometheus_client's default registry has them
for _standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_standard)


def _expiries(tls) -> list[tuple[str, float]]:
    """(node or ca, its not-after time) of a TLS node's certificate and CA (none: plaintext)."""
    if tls is None:
        return []
    from cryptography import x509
    out = []
    for name, pem in (("node", tls.cert), ("ca", tls.ca)):
        if pem:
            cert = x509.load_pem_x509_certificate(pem)
            out.append((name, cert.not_valid_after_utc.timestamp()))
    return out


class NodeCollector:
    """What the node holds: replicas, peer links, LMDB, de-dup tables, and on the control
    leader every chain."""

    def __init__(self, loop: asyncio.AbstractEventLoop, node_id: str, roles: tuple[str, ...], data_dir: str,
                 storage=None, ingestion=None, view=None, is_leader=lambda: False, groups=None, queues=None,
                 channels=None, tls=None):
        self.loop = loop
        self.node_id = node_id
        self.roles = roles
        self.data_dir = data_dir
        self.storage = storage
        self.ingestion = ingestion
        self.view = view
        self.is_leader = is_leader
        self.groups = groups          # control/groups.py: consumer groups' and SPS stages' leases
        self.queues = queues          # queues/service.py: the owners of queues' partitions here
        self.channels = channels      # delivery/manager.py: the channel workers here
        self._lag: tuple[float, list] | None = None     # (when, the consumer lag families)
        self._lag_lock = asyncio.Lock()                  # (one metadata reading at a time: scrapes, history)
        self.sampler: HistorySampler | None = None       # (serve_metrics starts it)
        self.certificates = _expiries(tls)                # (certificate, not after: s since the epoch)

    def describe(self):
        """Nothing ahead of a scrape (else registering would call collect() on the event
        loop's own thread, which waits for the loop)."""
        return []

    def collect(self):
        info = GaugeMetricFamily("sms_node_info", "This node: its id and roles (always 1)",
                                 labels=["node", "roles"])
        info.add_metric([self.node_id, ",".join(self.roles)], 1)
        yield info
        if self.certificates:
            expiry = GaugeMetricFamily("sms_tls_certificate_expiry_timestamp_seconds",
                                       "When a certificate this node presents (node) or trusts (ca) expires",
                                       labels=["certificate"])
            for name, not_after in self.certificates:
                expiry.add_metric([name], not_after)
            yield expiry
        future = asyncio.run_coroutine_threadsafe(self._snapshot(), self.loop)
        try:
            snap = future.result(timeout=limits.METRICS_SCRAPE_TIMEOUT_S)
        except Exception:                    # noqa: BLE001 (a scrape never fails the node)
            future.cancel()                  # (not left running on the loop)
            SCRAPE_ERRORS.inc()
            log.warning("metrics: the node's state could not be read for a scrape", exc_info=True)
            return
        yield from snap

    async def _snapshot(self) -> list:
        out = []
        if self.storage is not None:
            out += self._storage()
            out += await self.consumer_lag()
        if self.ingestion is not None:
            out += self._ingestion()
        if self.queues is not None:
            out += self._queues()
        if self.channels is not None:
            out += self._channels()
        if self.view is not None and self.is_leader():
            out += await self._chains()
        return out

    def _storage(self) -> list:
        node = self.storage
        epoch = GaugeMetricFamily("sms_replica_epoch", "The chain epoch of each replica held here, by role",
                                  labels=["stream", "partition", "role"])
        records = GaugeMetricFamily("sms_replica_records", "Records held by each replica",
                                    labels=["stream", "partition"])
        behind = GaugeMetricFamily("sms_replica_uncommitted_records",
                                   "Records a replica holds past the chain's commit point: on the head, what is "
                                   "still on its way down the chain (replication lag in records)",
                                   labels=["stream", "partition", "role"])
        behind_s = GaugeMetricFamily("sms_replica_uncommitted_seconds",
                                     "Age of the oldest record past the commit point, by the SNs' times "
                                     "(replication lag)", labels=["stream", "partition", "role"])
        for s in node.status():
            stream, ordinal = parse_chain_id(s["chain_id"])
            pid, role = partition_id(ordinal), s["role"] or "none"
            epoch.add_metric([stream, pid, role], s["epoch"])
            records.add_metric([stream, pid], s["records"])
            last, committed = s["last_sn"], s["committed_sn"]
            lag = seqno.counter_of(last) - seqno.counter_of(committed) if last and committed else 0
            behind.add_metric([stream, pid, role], max(0, lag))
            age = seqno.timestamp_ms_of(last) - seqno.timestamp_ms_of(committed) if lag > 0 else 0
            behind_s.add_metric([stream, pid, role], max(0, age) / 1000)
        archive_lag = GaugeMetricFamily("sms_archive_lag_seconds",
                                        "How long the oldest committed record not archived is past the stream's "
                                        "archive_after_s (on the partition's tail; 0: archiving keeps up)",
                                        labels=["stream", "partition"])
        archive_failing = GaugeMetricFamily("sms_archive_failing",
                                            "1 while the partition's last archive step failed (retried with backoff)",
                                            labels=["stream", "partition"])
        local_first = GaugeMetricFamily("sms_replica_local_first_timestamp_seconds",
                                        "Time (by its SN) of the oldest record a replica stores locally",
                                        labels=["stream", "partition"])
        for cid, part in list(node.archiver.parts.items()):
            stream, ordinal = parse_chain_id(cid)
            archive_lag.add_metric([stream, partition_id(ordinal)], part.lag_ms / 1000)
            archive_failing.add_metric([stream, partition_id(ordinal)], 1 if part.error else 0)
        for cid, replica in list(node.replicas.items()):
            if replica.log.first_sn:
                stream, ordinal = parse_chain_id(cid)
                local_first.add_metric([stream, partition_id(ordinal)],
                                       seqno.timestamp_ms_of(replica.log.first_sn) / 1000)
        connected = GaugeMetricFamily("sms_peer_link_connected", "A replication stream to (out) or from (in) a "
                                      "peer node is connected", labels=["peer", "direction"])
        chains = GaugeMetricFamily("sms_peer_link_chains", "Chain links a replication stream carries",
                                   labels=["peer", "direction"])
        frames = CounterMetricFamily("sms_peer_link_frames", "Frames sent or received on a replication stream "
                                     "since the node started", labels=["peer", "direction"])
        for link in node.link_status():
            labels = [link.peer, "out" if link.outgoing else "in"]
            connected.add_metric(labels, 1 if link.connected else 0)
            chains.add_metric(labels, link.chains)
            frames.add_metric(labels, link.frames)
        failures, _last = node.logs.write_failures()
        failed = CounterMetricFamily("sms_storage_write_failures", "LMDB write transactions that failed (a full or "
                                     "failing disk) since the node started")
        failed.add_metric([], failures)
        used = GaugeMetricFamily("sms_lmdb_used_bytes", "Bytes of an LMDB environment's map in use",
                                 labels=["persistence"])
        size = GaugeMetricFamily("sms_lmdb_map_bytes", "The size an LMDB environment may grow to (LMDB_MAP_BYTES)",
                                 labels=["persistence"])
        for persistence, env in node.logs.envs.items():
            info, stat = env.info(), env.stat()
            used.add_metric([persistence.value], (info["last_pgno"] + 1) * stat["psize"])
            size.add_metric([persistence.value], info["map_size"])
        disk = shutil.disk_usage(self.data_dir if os.path.isdir(self.data_dir) else "/")
        free = GaugeMetricFamily("sms_disk_free_bytes", "Free bytes on the data directory's file system")
        free.add_metric([], disk.free)
        total = GaugeMetricFamily("sms_disk_bytes", "Size of the data directory's file system")
        total.add_metric([], disk.total)
        return [epoch, records, behind, behind_s, archive_lag, archive_failing, local_first, connected, chains,
                frames, failed, used, size, free, total]

    @property
    def has_lag(self) -> bool:
        """Whether this node exports consumer lag (a storage node reading the metadata store)."""
        return self.storage is not None and self.groups is not None and self.view is not None

    async def consumer_lag(self) -> list:
        """The consumer lag families (none where not `has_lag`), computed at most every
        METRICS_LAG_REFRESH_S (metadata reads): scrapes and history samples between reuse
        them."""
        if not self.has_lag:
            return []
        async with self._lag_lock:
            now = time.monotonic()
            if self._lag is None or now - self._lag[0] >= limits.METRICS_LAG_REFRESH_S:
                self._lag = (now, await self._consumer_lag())
            return self._lag[1]

    async def _consumer_lag(self) -> list:
        """How far each consumer group (SPS stages are groups too) and registered consumer
        is behind, per partition this node heads: from the partition's commit point here
        and the checkpoints in the metadata store."""
        labels = ["stream", "partition", "consumer", "kind"]
        lag = GaugeMetricFamily("sms_consumer_lag_records", "Committed records a consumer group, SPS stage or "
                                "registered consumer has not checkpointed (on the partition's head)", labels=labels)
        lag_s = GaugeMetricFamily("sms_consumer_lag_seconds", "Age of the newest committed record past a consumer's "
                                   "checkpoint, by the SNs' times (on the partition's head)", labels=labels)
        heads: dict[str, dict[int, dict]] = {}
        for s in self.storage.status():
            if s["role"] == "head" and s["committed_sn"]:
                stream, ordinal = parse_chain_id(s["chain_id"])
                heads.setdefault(stream, {})[ordinal] = s
        for stream, parts in heads.items():
            try:
                names = await self.groups.list(stream)
                checkpoints = []
                for group in names:
                    leases, _members = await self.groups.state(stream, group)
                    for _key, value, version in leases:
                        try:
                            lease = Lease.from_bytes(value, version)
                        except (ValueError, KeyError, TypeError):
                            continue
                        checkpoints.append((group, "group", lease.ordinal, lease.checkpoint))
                sv = await self.view.stream(stream)
                for name in sv.consumers:
                    if name in names:
                        continue                       # (a group registers as a consumer too: counted above)
                    entry = await self.view.store.get(consumer_path(stream, name))
                    done_at = dict(ConsumerRecord.from_bytes(entry.value).checkpoints) if entry is not None else {}
                    for ordinal in parts:      # (no checkpoint of a partition yet: all of it is unread)
                        sn = done_at.get(ordinal)
                        done = "TRIM_HORIZON" if sn is None else SHARD_END if sn == ConsumerRecord.SHARD_END_SN \
                            else str(sn)
                        checkpoints.append((name, "consumer", ordinal, done))
            except Exception:                  # noqa: BLE001 (deleted meanwhile, or the store slow: next scrape)
                log.debug("metrics: consumer lag of %s not read", stream, exc_info=True)
                continue
            for name, kind, ordinal, done in checkpoints:
                s = parts.get(ordinal)
                if s is None:
                    continue
                behind = seqno.behind(done, ordinal, s["committed_sn"], s["first_sn"])
                if behind is not None:
                    values = [stream, partition_id(ordinal), name, kind]
                    lag.add_metric(values, behind[0])
                    lag_s.add_metric(values, behind[1] / 1000)
        return [lag, lag_s]

    def _ingestion(self) -> list:
        labels = ["stream", "partition"]
        entries = GaugeMetricFamily("sms_dedup_entries", "Submissions held in de-dup sessions, above their HWMs",
                                    labels=labels)
        sessions = GaugeMetricFamily("sms_dedup_sessions", "Producer sessions in a partition's de-dup table",
                                     labels=labels)
        keys = GaugeMetricFamily("sms_dedup_keys", "Keys in a partition's de-dup window", labels=labels)
        queued = GaugeMetricFamily("sms_ingest_queued_records", "Records waiting for their batch to be written",
                                   labels=labels)
        inflight = GaugeMetricFamily("sms_ingest_inflight_batches", "Batches on their way down the chain",
                                     labels=labels)
        for part in list(self.ingestion.partitions.values()):
            st = part.status()
            stream, ordinal = parse_chain_id(st["chain_id"])
            values = [stream, partition_id(ordinal)]
            entries.add_metric(values, st["table"]["entries"])
            sessions.add_metric(values, st["table"]["sessions"])
            keys.add_metric(values, st["table"]["dedup_keys"])
            queued.add_metric(values, st["queued_records"])
            inflight.add_metric(values, st["inflight_batches"])
        return [entries, sessions, keys, queued, inflight]

    def _queues(self) -> list:
        """Each queue partition owned here (on the partition's head): its records by state,
        and how old its oldest record not done is (docs/queues.md)."""
        labels = ["queue", "stream", "partition"]
        records = GaugeMetricFamily("sms_queue_records", "Records of a queue's partition not done, by state: "
                                    "available, in_flight, dead (dead letters)", labels=labels + ["state"])
        oldest = GaugeMetricFamily("sms_queue_oldest_age_seconds", "Age of the oldest record of a queue's partition "
                                   "not done (0: none): how far its workers are behind", labels=labels)
        now_ms = time.time() * 1000
        for st in self.queues.status():
            values = [st["queue"], st["stream"], partition_id(st["ordinal"])]
            for state in ("available", "in_flight", "dead"):
                records.add_metric(values + [state], st[state])
            oldest.add_metric(values, max(0.0, (now_ms - st["oldest_ms"]) / 1000) if st["oldest_ms"] else 0.0)
        return [records, oldest]

    def _channels(self) -> list:
        """Each channel partition worked on here (on the partition's head): how far its
        destination is behind, what it delivered, and whether it is failing
        (docs/channels.md)."""
        labels = ["channel", "stream", "partition"]
        lag = GaugeMetricFamily("sms_channel_lag_seconds", "How far a channel's destination is behind its "
                                "partition: the oldest record read and not committed, or the stream's lag",
                                labels=labels)
        records = CounterMetricFamily("sms_channel_records", "Records a channel delivered into its destination",
                                      labels=labels)
        commits = CounterMetricFamily("sms_channel_commits", "Commits (files, table appends) of a channel",
                                      labels=labels)
        dead = CounterMetricFamily("sms_channel_dead_letters", "Records of a channel that did not parse",
                                   labels=labels)
        failures = CounterMetricFamily("sms_channel_failures", "Failed attempts of a channel's worker since it "
                                       "started here (each retried)", labels=labels)
        last = GaugeMetricFamily("sms_channel_last_commit_timestamp_seconds", "When a channel last committed a "
                                 "partition's records (0: not yet)", labels=labels)
        failing = GaugeMetricFamily("sms_channel_failing", "1 while a channel's last attempt failed", labels=labels)
        for st in self.channels.status():
            values = [st["channel"], st["stream"], partition_id(st["ordinal"])]
            lag.add_metric(values, st["lag_s"])
            records.add_metric(values, st["records"])
            commits.add_metric(values, st["commits"])
            dead.add_metric(values, st["dead_letters"])
            failures.add_metric(values, st["failures"])
            last.add_metric(values, st["last_commit_ms"] / 1000)
            failing.add_metric(values, 1 if st["error"] else 0)
        return [lag, records, commits, dead, failures, last, failing]

    async def _chains(self) -> list:
        labels = ["stream", "partition"]
        members = GaugeMetricFamily("sms_chain_members", "Replicas in a partition's chain (the control leader)",
                                    labels=labels)
        wanted = GaugeMetricFamily("sms_chain_replication_factor", "The replicas a partition's chain should have",
                                   labels=labels)
        learners = GaugeMetricFamily("sms_chain_learners", "Replicas being copied into a partition's chain",
                                     labels=labels)
        epoch = GaugeMetricFamily("sms_chain_epoch", "A partition's chain epoch (a change of members raises it)",
                                  labels=labels)
        short = GaugeMetricFamily("sms_under_replicated_partitions",
                                  "Partitions of a stream whose chain has fewer members on registered nodes than "
                                  "the replication factor (the control leader; 0 when whole)", labels=["stream"])
        registered = await self.view.nodes()
        for name in await self.view.list_streams():
            try:
                sv = await self.view.stream(name)
            except Exception:                # noqa: BLE001 (deleted meanwhile)
                continue
            rf = sv.config.replication_factor
            for ordinal, chain in sv.chains.items():
                values = [name, partition_id(ordinal)]
                members.add_metric(values, len(chain.members))
                wanted.add_metric(values, rf)
                learners.add_metric(values, len(chain.learners))
                epoch.add_metric(values, chain.epoch)
            short.add_metric([name], sum(1 for chain in sv.chains.values()
                                         if chains.under_replicated(chain.members, rf, registered)))
        return [members, wanted, learners, epoch, short]


class HistorySampler:
    """This node's own history, without credentials (node/console_history.py): every
    `sample_s`, on a daemon thread of its own, its records written and read per stream
    (the kernel/metrics.py counters, read in process) and the consumer lag it exports
    (the collector's, on the event loop: one metadata reading per METRICS_LAG_REFRESH_S at
    most, shared with scrapes). Samples are taken at multiples of `sample_s` since the
    epoch, so every node's fall in the same bucket. Served as GET /history."""

    def __init__(self, collector: NodeCollector, sample_s: float):
        self.collector = collector
        self.history = History(sample_s, counters=tuple(COUNTERS))
        self.failures = 0                          # samples not taken (logged)
        self._lock = threading.Lock()              # (the history: this thread writes, HTTP threads read)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-history", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=limits.METRICS_SCRAPE_TIMEOUT_S + 1)

    def snapshot(self) -> dict:
        """What /history answers: the node, and its series as [time ms, value] lists
        (counters cumulative: "in:<stream>", "out:<stream>"; gauges: "lag:<stream>/<consumer>"
        records, "lag_s:<stream>/<consumer>" seconds)."""
        with self._lock:
            return {"node_id": self.collector.node_id, "counters": sorted(COUNTERS), **self.history.snapshot()}

    def _run(self) -> None:
        step_ms = max(1, int(self.history.sample_s * 1000))
        last_ms = 0
        while True:
            now_ms = int(time.time() * 1000)
            at_ms = max((now_ms // step_ms + 1) * step_ms, last_ms + step_ms)   # (the next multiple not taken)
            last_ms = at_ms
            if self._stop.wait((at_ms - now_ms) / 1000):
                return
            try:
                values = node_series(self._read())
            except Exception:                      # noqa: BLE001 (a sample never fails the node)
                self.failures += 1
                log.warning("metrics: the history's sample was not taken", exc_info=True)
                continue
            with self._lock:
                self.history.offer(at_ms, values)

    def _read(self) -> list[tuple[str, dict, float]]:
        """(name, labels, value) of this node's samples the history keeps."""
        families = [f for counter in (PUT_RECORDS, READ_RECORDS) for f in counter.collect()]
        if self.collector.has_lag:
            future = asyncio.run_coroutine_threadsafe(self.collector.consumer_lag(), self.collector.loop)
            try:
                families += future.result(timeout=limits.METRICS_SCRAPE_TIMEOUT_S)
            except Exception:                      # noqa: BLE001 (the loop too busy: this sample without lag)
                future.cancel()
                log.debug("metrics: no consumer lag for the history's sample", exc_info=True)
        return [(s.name, s.labels, s.value) for f in families for s in f.samples]


def serve_metrics(listen: str, collector: NodeCollector, cert_file: str = "", key_file: str = "", app=None,
                  keys: auth.KeyTable | None = None):
    """Start the node's HTTP(S) server on `listen` (HOST:PORT, 0: any free port): /metrics,
    and every other path to `app` (a WSGI app: the web console on a control node; None:
    404). With `keys` (a secure node's KeyTable, read on the collector's event loop),
    /metrics and /history want a monitor or admin key of the default tenant. Starts the
    node's HistorySampler (collector.sampler). Returns (the server, its address)."""
    import ssl
    from wsgiref.simple_server import make_server

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

    metrics_app = make_wsgi_app(REGISTRY)
    try:
        sampler = HistorySampler(collector, sample_s_from(os.environ))
    except ValueError as e:
        raise SystemExit(f"sms serve: {e}") from None

    def dispatch(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path in ("/metrics", "/history"):
            if keys is not None:
                refused = _refusal(environ, keys, collector.loop)
                if refused is not None:
                    status, headers, text = refused
                    body = text.encode() + b"\n"
                    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                                            ("Content-Length", str(len(body)))] + headers)
                    return [body]
            if path == "/history":
                body = json.dumps(sampler.snapshot()).encode()
                start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                                          ("Cache-Control", "no-store")])
                return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]
            return metrics_app(environ, start_response)
        if app is not None:
            return app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: this node serves /metrics\n"]

    host, _, port = listen.rpartition(":")
    bare = host.strip("[]")                   # ([::1]:9401: an IPv6 host)
    REGISTRY.register(collector)
    try:
        class Server(ThreadingWSGIServer):
            """Each request on a thread of its own, its TLS handshake included (not in the
            accepting thread, where one silent client would stop every other), within
            METRICS_REQUEST_TIMEOUT_S."""
            address_family = socket.AF_INET6 if ":" in bare else socket.AF_INET

            def get_request(self):
                sock, address = super().get_request()
                sock.settimeout(limits.METRICS_REQUEST_TIMEOUT_S)
                return sock, address

            def finish_request(self, request, client_address):
                if isinstance(request, ssl.SSLSocket):
                    request.do_handshake()
                super().finish_request(request, client_address)

            def handle_error(self, request, client_address):
                log.debug("metrics: a request from %s failed", client_address, exc_info=True)

        server = make_server(bare, int(port), dispatch, Server, handler_class=_SilentHandler)
        if cert_file and key_file:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert_file, key_file)
            server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    except (OSError, ValueError, ssl.SSLError) as e:
        REGISTRY.unregister(collector)
        raise SystemExit(f"sms serve: cannot serve metrics on {listen}: {e} (set another with --metrics-listen "
                         f"or node.metrics_listen; by default a node on port P serves them on P + "
                         f"{limits.METRICS_PORT_OFFSET})") from None
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    collector.sampler = sampler
    sampler.start()
    return server, f"{host}:{server.server_port}"


REALM = 'Bearer realm="sms metrics"'


def _refusal(environ, keys: auth.KeyTable, loop: asyncio.AbstractEventLoop) -> tuple[str, list, str] | None:
    """Why a request may not read /metrics, as (status, headers, text); None: it may. The
    token is taken from the Authorization header only (never from the URL, which proxies
    and logs keep)."""
    scheme, _, token = environ.get("HTTP_AUTHORIZATION", "").strip().partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    if not token:
        return ("401 Unauthorized", [("WWW-Authenticate", REALM)],
                f"{environ.get('PATH_INFO', '/metrics')} wants a monitor key's token (sms key create --role "
                "monitor; sms up writes one as monitor_token in cluster.json): Authorization: Bearer <token>")
    future = asyncio.run_coroutine_threadsafe(keys.authenticate(token), loop)
    try:
        principal = future.result(timeout=limits.METRICS_SCRAPE_TIMEOUT_S)
    except Unauthenticated as e:
        return "401 Unauthorized", [("WWW-Authenticate", f'{REALM}, error="invalid_token"')], e.message
    except SmsError as e:                    # (Unavailable: the metadata store does not answer)
        return "503 Service Unavailable", [], f"the key could not be checked now: {e.message}"
    except TimeoutError:                     # (the node's loop did not answer within the scrape's bound)
        future.cancel()
        return "503 Service Unavailable", [], "the key could not be checked now (the node is too busy)"
    if not principal.allows(auth.METRICS, None):
        return ("403 Forbidden", [("WWW-Authenticate", f'{REALM}, error="insufficient_scope"')],
                f"key {principal.key_id} ({principal.role} of tenant {principal.tenant}) may not read the metrics: "
                "a monitor or admin key of the default tenant may")
    return None


def stop_metrics(server, collector: NodeCollector) -> None:
    if collector.sampler is not None:
        collector.sampler.stop()
    server.shutdown()
    server.server_close()
    REGISTRY.unregister(collector)
