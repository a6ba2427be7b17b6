"""The storage role of a node: its replicas, kept in step with chain configs, and the
gRPC Storage service (Append from ingestion to heads, ReplicateLinks between nodes: one
stream per pair of nodes carries every chain link between them, storage/peerlink.py).

`StorageNode` watches `/chains` in the metadata store and opens, reconfigures or drops
the replicas this node is a member of; its public read methods are what the retrieval
role of the same process uses (`replica_for_read`). `StorageService` binds the
protocols of storage/head.py (Append) and storage/link.py (through storage/peerlink.py)
to grpc.aio streams.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass

import grpc
from grpc._cython import cygrpc     # (its BaseError: what a write on a call gRPC already ended raises)

from metastore import MetaStore, NodeExistsError, NoNodeError
from metastore.reads import ChainConfigs, DecodedReads
from sms import limits, metadata, security, seqno
from kernel import rpc
from kernel import retention
from kernel.aiotools import cancel_and_wait, raise_if_cancelling, wait_event
from sms.errors import InvariantViolation, SmsError, WrongOwner
from sms.metadata import ChainConfig, ConsumerRecord, StreamConfig, chain_name
from kernel import audit
from kernel.encryption import StreamKeys
from sms.partition_map import PartitionMap
from sms.proto import sms_pb2, sms_pb2_grpc
from archive.index import ArchiveState
from storage.archiver import Archiver
from storage.head import HeadSession
from storage.log import LogStore
from storage.peerlink import IncomingLinks, PeerLink
from storage.replica import Replica, ReplicaState

log = logging.getLogger(__name__)


def link_targets(config: ChainConfig, node_id: str) -> list[tuple[str, bool]]:
    """The nodes this node's replica ships its log to, each with "is it a learner": its
    successor in the chain, or, for the tail, the chain's learners; none for a learner."""
    if node_id in config.learners:
        return []
    if config.tail == node_id:
        return [(n, True) for n in config.learners]
    return [(config.successor_of(node_id), False)]


def is_mine(node_id: str, incarnation: int, config: ChainConfig) -> bool:
    """A member or learner of the chain, in this incarnation: a restarted process does
    not act on its predecessor's place until the chain manager takes it back."""
    if not config.holds(node_id):
        return False
    pinned = config.incarnation_of(node_id)
    return pinned is None or not incarnation or pinned == incarnation


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """What a node does to bring its replicas in line with the chain configs
    (`plan_sync`): replicas to close, to open, and to reconfigure (`relink`: stop and start
    its links, as its epoch or membership changed)."""
    close: tuple[str, ...] = ()
    open: tuple[tuple[str, ChainConfig], ...] = ()
    reconfigure: tuple[tuple[str, ChainConfig, bool], ...] = ()


def plan_sync(node_id: str, incarnation: int, held: dict[str, ChainConfig],
              configs: dict[str, ChainConfig]) -> SyncPlan:
    """The decision of `StorageNode.sync`, pure: `held` maps each chain this node has a
    replica of to that replica's config, `configs` every chain's config in the store. The
    simulation (tests/sim/harness.py) runs the same decision."""
    mine = {cid: c for cid, c in configs.items() if is_mine(node_id, incarnation, c)}
    close = tuple(cid for cid in held if cid not in mine)
    opens, reconfigure = [], []
    for cid, config in mine.items():
        old = held.get(cid)
        if old is None:
            opens.append((cid, config))
        elif old != config:
            relink = old.epoch != config.epoch or old.learners != config.learners or old.members != config.members
            reconfigure.append((cid, config, relink))
    return SyncPlan(close, tuple(opens), tuple(reconfigure))


class StorageNode:
    def __init__(self, node_id: str, data_dir: str, store: MetaStore, incarnation: int = 0,
                 keys: StreamKeys | None = None, channels: rpc.NodeChannels | None = None):
        self.node_id = node_id
        self.channels = channels or rpc.NodeChannels()      # to the peers' cluster ports, with this node's TLS
        self.keys = keys                      # the streams' data keys: heads seal encrypted streams' batches
        self.incarnation = incarnation        # this process's registration started_ms
        self.dormant: dict[str, float] = {}   # logs kept for a rejoin: chain id -> since (monotonic)
        self.logs = LogStore(os.path.join(data_dir, "storage"))
        self.meta = store
        self.replicas: dict[str, Replica] = {}
        self.addresses: dict[str, str] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._retention_task: asyncio.Task | None = None
        self._cancel_watches: list = []
        self.synced = asyncio.Event()
        self.trimmed_records = 0
        self._suspected: dict[str, float] = {}       # peer -> loop time before which it is not probed again
        self._links_reported: dict[tuple[str, str], float] = {}   # (peer, chain id) -> not reported again before
        self._next_report = 0                            # numbers this node's link reports
        self._stalled_until = 0.0                        # this process did not run lately: no link reports
        self._stall_task: asyncio.Task | None = None
        self._reports: set[asyncio.Task] = set()
        self._configs: ChainConfigs | None = None       # every chain config, read again when /chains changes
        self._synced_generation = -1        # the ChainConfigs generation the replicas were last brought in line with
        self._next_dormant_check = 0.0
        # peers' addresses are read again only when /nodes changed, or every
        # CONFIG_REFRESH_INTERVAL_S: a chain change (a failover) is applied without reading
        # every registration first
        self._nodes_changed = True
        self._next_address_refresh = 0.0
        self._channels: dict[str, grpc.aio.Channel] = {}  # peer address -> the channel all links to it share
        self.peer_links: dict[str, PeerLink] = {}          # successor node -> the stream carrying our links to it
        self.incoming_links: dict[int, IncomingLinks] = {}  # the streams from predecessors, being served
        self._decoded = DecodedReads(store)   # retention's metadata reads, decoded once per value
        self.suspects_reported = 0
        self.links_reported = 0
        self.archiver = Archiver(self)
        self._archive_task: asyncio.Task | None = None

    async def start(self) -> None:
        await self.logs.start()
        self._cancel_watches.append(self.meta.watch(metadata.CHAINS, self._changed.set))
        self._cancel_watches.append(self.meta.watch(metadata.NODES, self._on_nodes_changed))
        await self.sync()
        self._task = asyncio.get_running_loop().create_task(self._sync_loop(), name="chain-sync")
        self._retention_task = asyncio.get_running_loop().create_task(self._retention_loop(), name="retention")
        self._archive_task = asyncio.get_running_loop().create_task(self.archiver.run(), name="archive")
        self._stall_task = asyncio.get_running_loop().create_task(self._watch_stalls(), name="stall-watch")

    async def close(self) -> None:
        for cancel in self._cancel_watches:
            cancel()
        if self._configs is not None:
            self._configs.close()
        await cancel_and_wait(self._task)
        await cancel_and_wait(self._retention_task)
        await cancel_and_wait(self._archive_task)
        await cancel_and_wait(self._stall_task)
        self.archiver.close()
        for task in list(self._reports):
            await cancel_and_wait(task)
        # every replica at once: one by one, each waiting for its links' tasks to end, a
        # node with thousands of replicas took longer to stop than its launcher waits
        await asyncio.gather(*(replica.close() for replica in list(self.replicas.values())))
        await asyncio.gather(*(peer.stop() for peer in list(self.peer_links.values())))
        self.peer_links.clear()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        await self.logs.close()

    async def _sync_loop(self) -> None:
        while True:
            await wait_event(self._changed, limits.CONFIG_REFRESH_INTERVAL_S)
            self._changed.clear()
            try:
                await self.sync()
            except InvariantViolation:
                raise
            except Exception:   # a metadata hiccup must not kill the node; retried next tick
                raise_if_cancelling()
                log.exception("chain sync failed")

    async def _chain_configs(self) -> dict[str, ChainConfig]:
        if self._configs is None:
            self._configs = ChainConfigs(self.meta)
        return {name: config for name, (config, _version) in (await self._configs.all()).items()}

    def _on_nodes_changed(self) -> None:
        self._nodes_changed = True
        self._changed.set()

    async def _refresh_addresses(self) -> None:
        try:
            names = await self.meta.children(metadata.NODES)
        except NoNodeError:
            names = []
        addresses = {}
        for name in names:
            entry = await self.meta.get(metadata.node_path(name))
            if entry is not None and entry.value:
                addresses[name] = metadata.node_from_bytes(entry.value).internal_address
        self.addresses = addresses

    async def sync(self) -> None:
        """Bring this node's replicas in line with the chain configs. A replica this node
        no longer serves is closed; its log stays (dormant) for DORMANT_LOG_KEEP_S while
        its chain exists, so a rejoin verifies it and copies only what it lacks."""
        now = asyncio.get_running_loop().time()
        if self._nodes_changed or now >= self._next_address_refresh:
            self._nodes_changed = False
            self._next_address_refresh = now + limits.CONFIG_REFRESH_INTERVAL_S
            try:
                await self._refresh_addresses()
            except BaseException:
                self._nodes_changed = True         # (read again next time)
                raise
            await self._close_unused_channels()
        configs = await self._chain_configs()
        now = asyncio.get_running_loop().time()
        if self._configs.generation == self._synced_generation and now < self._next_dormant_check:
            self.synced.set()        # nothing changed: no pass over every config and every log
            return
        self._synced_generation = self._configs.generation
        self._next_dormant_check = now + limits.DORMANT_CHECK_INTERVAL_S
        plan = plan_sync(self.node_id, self.incarnation, {cid: r.config for cid, r in self.replicas.items()},
                         configs)
        for cid in plan.close:
            log.info("closing replica %s (no longer a member here)", chain_name(cid))
            replica = self.replicas.pop(cid)
            await replica.close()
            self.dormant[cid] = now
        for cid, config in plan.open:
            self.dormant.pop(cid, None)
            plog = self.logs.open_log(cid, config.persistence)
            replica = Replica(self.node_id, config, self.logs, plog, keys=self.keys)
            self.replicas[cid] = replica
            self._start_links(replica)
        for cid, config, relink in plan.reconfigure:
            self.dormant.pop(cid, None)
            replica = self.replicas[cid]
            if relink:
                await replica.stop_links()
            replica.apply_config(config)
            if relink:
                self._start_links(replica)
            await replica.notify()
        for name in self.logs.known_names() + [n for n in self.logs.logs if n not in self.replicas]:
            if name in self.replicas:
                continue
            since = self.dormant.setdefault(name, now)
            if name not in configs or now - since > limits.DORMANT_LOG_KEEP_S:
                log.info("dropping log %s (%s)", name, "its chain is gone" if name not in configs else
                         "not rejoined in time")
                self.dormant.pop(name, None)
                await self.logs.drop_log(name)
        self.synced.set()

    async def _retention_loop(self) -> None:
        while True:
            try:
                await self.apply_retention()
            except InvariantViolation:
                raise
            except Exception:   # a metadata hiccup: the next pass retries
                raise_if_cancelling()
                log.exception("retention pass failed")
            # a pass looks at every replica: with many, passes come less often, so the
            # cost stays flat (a replica is looked at within seconds, retention is hours)
            await asyncio.sleep(max(limits.RETENTION_CHECK_INTERVAL_S,
                                    len(self.replicas) / limits.RETENTION_REPLICAS_PER_S))

    async def _read_decoded(self, path: str, decode):
        got = await self._decoded.get(path, decode)
        return got[0] if got is not None else None

    async def _read_decoded_stream(self, stream: str) -> StreamConfig | None:
        return await self._read_decoded(metadata.stream_path(stream), StreamConfig.from_bytes)

    async def _stream_retention_facts(self, stream: str):
        config = await self._read_decoded(metadata.stream_path(stream), StreamConfig.from_bytes)
        pmap = await self._read_decoded(metadata.map_path(stream), PartitionMap.from_bytes)
        if config is None or pmap is None:
            return None
        consumers = []
        try:
            names = await self.meta.children(metadata.consumers_path(stream))
        except NoNodeError:
            names = []
        for name in names:
            c = await self._read_decoded(metadata.consumer_path(stream, name), ConsumerRecord.from_bytes)
            if c is not None:
                consumers.append(c)
        return config, pmap, consumers

    async def apply_retention(self) -> int:
        """Delete, on every replica here, the committed records below the partition's trim
        point (kernel/retention.py), in bounded batches; returns the records deleted."""
        facts: dict[str, object] = {}
        now_ms = int(time.time() * 1000)
        deleted = 0
        for replica in list(self.replicas.values()):
            stream = replica.config.stream
            if stream not in facts:
                facts[stream] = await self._stream_retention_facts(stream)
            if facts[stream] is None or replica.state is not ReplicaState.ACTIVE:
                continue
            config, pmap, consumers = facts[stream]
            point = retention.trim_point(config, pmap, replica.config.ordinal, consumers, now_ms)
            point = min(point, replica.committed_sn + 1)     # never what is not committed
            replica.trimmed_before = max(replica.trimmed_before, point)    # readers never see below
            delete = point
            if config.archive:
                # two tiers: past local retention, what the archive holds (verified) goes from
                # here, consumers or not -- readers get it from the archive; what it does not
                # hold yet stays, however old, unless retention has passed it
                state = await self._read_decoded(metadata.archive_path(stream, replica.config.ordinal),
                                                 ArchiveState.from_bytes)
                local_cut = seqno.lower_bound_for_time(max(0, now_ms - config.local_retention_ms))
                verified = state.verified_sn if state is not None else 0
                delete = max(point, min(local_cut, verified + 1, replica.committed_sn + 1))
            delete = min(delete, retention.dedup_floor(config, now_ms))
            for chain_link in list(replica.links.values()):
                # nor the batch a successor or learner ends with: its next hello verifies it
                delete = min(delete, chain_link.acked_sn)
            if replica.log.first_sn and replica.log.first_sn < delete:
                n = await self.logs.trim(replica.log, delete)
                if n:
                    log.info("%s: retention deleted %d records below %d", chain_name(replica.chain_id), n, point)
                deleted += n
        self.trimmed_records += deleted
        if len(self._decoded) > 4 * len(facts) + 64:           # streams gone or no longer held here
            held = set(facts)
            self._decoded.retain(lambda path: path.split("/")[2] in held)
        return deleted

    # --- failure detection (faster than the metadata session) -------------------------
    def suspect(self, peer: str | None) -> None:
        """A chain link to or from `peer` broke: probe its port, and if nothing listens
        there report it under /suspects, where the chain manager confirms it with probes of
        its own and removes it from its chains without waiting for its session to expire.
        A peer is probed at most every SUSPECT_PROBE_INTERVAL_S, and reported at most every
        SUSPECT_REPORT_INTERVAL_S; a peer that still listens (alive, or paused) is not
        reported here: a paused or cut-off peer leaves its links unanswered, which
        `link_unresponsive` reports."""
        if not peer or peer == self.node_id or self._task is None:
            return
        now = asyncio.get_running_loop().time()
        if now < self._suspected.get(peer, 0.0):
            return
        self._suspected[peer] = now + limits.SUSPECT_PROBE_INTERVAL_S
        address = self.addresses.get(peer)
        if address:
            task = asyncio.get_running_loop().create_task(self._report(peer, address), name=f"suspect-{peer}")
            self._reports.add(task)
            task.add_done_callback(self._reports.discard)

    async def _report(self, peer: str, address: str) -> None:
        # a few probes apart: the kernel ends a killed process's connections and closes its
        # listening socket in no set order, so the first probe can still be accepted
        loop = asyncio.get_running_loop()
        for attempt in range(limits.SUSPECT_PROBE_ATTEMPTS):
            if attempt:
                await asyncio.sleep(limits.SUSPECT_PROBE_RETRY_S)
            self._suspected[peer] = max(self._suspected.get(peer, 0.0), loop.time() + limits.SUSPECT_PROBE_INTERVAL_S)
            if await rpc.probe_port(address, limits.FAILURE_PROBE_TIMEOUT_S) == rpc.PROBE_REFUSED:
                break
        else:
            return                                 # it listens (alive, or paused): the session TTL decides
        self._suspected[peer] = asyncio.get_running_loop().time() + limits.SUSPECT_REPORT_INTERVAL_S
        log.info("%s refuses connections at %s: reported to the chain manager", peer, address)
        self.suspects_reported += 1
        value = f'{{"reporter": "{self.node_id}", "address": "{address}", "at_ms": {int(time.time() * 1000)}}}'
        try:
            await self.meta.create(metadata.suspect_path(peer), value.encode())
        except NodeExistsError:
            pass                                   # reported already; the manager looks at it
        except Exception:   # (a metadata hiccup: the session TTL still finds the node)
            raise_if_cancelling()
            log.info("reporting %s failed", peer, exc_info=True)

    def link_unresponsive(self, peer: str, direction: str, links: list[tuple[str, int]], reason: str) -> None:
        """Chain links between this node and `peer` went unanswered for LINK_ACK_TIMEOUT_S
        (storage/peerlink.py): `direction` "successor" (the peer is their successor: it
        acked nothing, or our frames did not go through) or "predecessor" (the peer feeds
        them and went silent); `links`: (chain id, the link's epoch). Reported at once under
        /suspects, one report per call, naming the reporter, the peer, the direction and the
        chains; the chain manager confirms it with probes of its own and takes one end out
        of each chain. A chain is reported at most every SUSPECT_REPORT_INTERVAL_S per peer."""
        if not peer or peer == self.node_id or self._task is None:
            return
        now = asyncio.get_running_loop().time()
        if now < self._stalled_until:
            log.info("links %s %s unanswered, not reported: this node itself did not run lately",
                     "to" if direction == "successor" else "from", peer)
            return
        if len(self._links_reported) > limits.SUSPECTS_MAX:
            self._links_reported = {k: t for k, t in self._links_reported.items() if t > now}
        fresh = [(cid, epoch) for cid, epoch in links if now >= self._links_reported.get((peer, cid), 0.0)]
        if not fresh:
            return
        for cid, _epoch in fresh:
            self._links_reported[(peer, cid)] = now + limits.SUSPECT_REPORT_INTERVAL_S
        self._next_report += 1
        report = {"kind": "unresponsive", "reporter": self.node_id, "peer": peer, "direction": direction,
                  "links": [{"chain_id": cid, "epoch": epoch} for cid, epoch in fresh], "reason": reason,
                  "at_ms": int(time.time() * 1000)}
        name = f"{peer}~{self.node_id}~{self.incarnation}-{self._next_report}"
        task = asyncio.get_running_loop().create_task(self._report_link(name, report), name=f"link-report-{peer}")
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def _watch_stalls(self) -> None:
        """Notices when this process itself did not run for LINK_ACK_TIMEOUT_S / 2 (it was
        paused, or starved): what its links measured across that time says nothing about
        its peers, so it reports no link for LINK_ACK_TIMEOUT_S after (the links that broke
        meanwhile just start again)."""
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(limits.LINK_KEEPALIVE_INTERVAL_S / 3)
            now = loop.time()
            if now - last > limits.LINK_ACK_TIMEOUT_S / 2:
                self._stalled_until = now + limits.LINK_ACK_TIMEOUT_S
                log.warning("this node did not run for %.2fs (paused, or starved of CPU): it reports no "
                            "unanswered link for %ss", now - last, limits.LINK_ACK_TIMEOUT_S)
            last = now

    async def _report_link(self, name: str, report: dict) -> None:
        log.warning("links %s %s (%s) unresponsive: %s; reported to the chain manager",
                    "to" if report["direction"] == "successor" else "from", report["peer"],
                    ", ".join(link["chain_id"] for link in report["links"]), report["reason"])
        self.links_reported += 1
        try:
            await self.meta.create(metadata.suspect_path(name), json.dumps(report).encode())
        except Exception:   # (a metadata hiccup: the link breaks again, and is reported again)
            raise_if_cancelling()
            log.info("reporting the links to %s failed", report["peer"], exc_info=True)

    def peer_channel(self, address: str) -> grpc.aio.Channel:
        """The one channel to the peer at `address` that every chain link to it shares."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self.channels.peer_channel(address)
        return channel

    async def _close_unused_channels(self) -> None:
        """Channels to addresses no registered node has any more (a peer restarted elsewhere)."""
        live = set(self.addresses.values())
        for address in [a for a in self._channels if a not in live]:
            await self._channels.pop(address).close()

    def _start_links(self, replica: Replica) -> None:
        for successor, learner in link_targets(replica.config, self.node_id):
            peer = self.peer_links.get(successor)
            if peer is None:
                peer = self.peer_links[successor] = PeerLink(
                    self.node_id, successor, lambda s=successor: self.addresses.get(s),
                    channel_fn=self.peer_channel, on_broken=self.suspect, on_silent=self.link_unresponsive)
            replica.links[successor] = peer.add(replica, learner)

    def link_status(self) -> list:
        return [p.status() for p in self.peer_links.values()] + [i.status() for i in self.incoming_links.values()]

    # --- public API for the roles of this process ------------------------------------
    def replica(self, chain_id: str) -> Replica:
        replica = self.replicas.get(chain_id)
        if replica is None or replica.state is not ReplicaState.ACTIVE:
            raise WrongOwner(f"node {self.node_id} holds no replica of {chain_id}")
        return replica

    def committed_log(self, chain_id: str) -> "CommittedReplica":
        """The port retrieval reads through (kernel.ports.ReplicaReads)."""
        return CommittedReplica(self.replica(chain_id), self.logs)

    def status(self, chain_ids=()) -> list[dict]:
        """Every replica's status, or only those of `chain_ids` (the ones held here)."""
        if chain_ids:
            return [r.status() for cid in chain_ids if (r := self.replicas.get(cid)) is not None]
        return [r.status() for r in self.replicas.values()]


def append_caller(context) -> str | None:
    """Who calls Append: the node id its certificate names ("" when it names none: never
    an owner), or None on a plaintext cluster, whose callers have no identity to check."""
    if context.auth_context().get("transport_security_type") == [b"insecure"]:
        return None
    return security.peer_node_id(context) or ""


class StorageService(sms_pb2_grpc.StorageServicer):
    def __init__(self, node: StorageNode, roles: tuple[str, ...], pid: int):
        self.node = node
        self.roles = roles
        self.pid = pid

    async def Append(self, request_iterator, context):
        """ingestion -> head (storage/head.py). Acks go out in request order, each after commit;
        a batch from a node that is not the partition's ingestion owner is refused
        (PermissionDenied), one that a reader could not decode too (CorruptBatch)."""
        audited: set[tuple[str, str]] = set()

        def refused(chain_id: str, error: SmsError) -> None:
            # one line per chain and error of a call: a rogue sender's every batch would
            # only repeat it
            if (chain_id, error.name) not in audited:
                audited.add((chain_id, error.name))
                audit.event(audit.APPEND_REFUSED, chain_id, error.name, audit.who_cert(security.peer_cert(context)),
                            audit.peer(context), error.message)

        session = HeadSession(self.node, caller=append_caller(context), on_refused=refused)

        async def take_requests() -> None:
            try:
                async for req in request_iterator:
                    await session.append(req.chain_id, req.epoch, req.batch_id, req.batch)
            finally:
                session.end()

        reader = asyncio.get_running_loop().create_task(take_requests())
        try:
            async for ack in session.acks():
                yield sms_pb2.AppendAck(batch_id=ack.batch_id, error_name=ack.error_name,
                                        error_message=ack.error_message, count=ack.count,
                                        first_sn=seqno.to_bytes(ack.first_sn) if ack.count else b"")
        finally:
            reader.cancel()

    async def ReplicateLinks(self, request_iterator, context):
        """A predecessor node -> this node: every chain link between the two
        (storage/peerlink.py IncomingLinks). Acks written after the predecessor went away, or
        while this server stops, fail in gRPC's core (its BaseError: ExecuteBatchError,
        _ServerStoppedError): the link's end, as the call's, not an error of this node (it
        was logged as an unretrieved task exception, a traceback on every restart)."""
        try:
            await IncomingLinks(self.node, self.node.incoming_links).serve(context)
        except cygrpc.BaseError as e:
            log.info("incoming links from %s: the stream ended while acks were written (%s)",
                     security.peer_node_id(context) or "?", type(e).__name__)

    def _archive_status(self, chain_id: str) -> dict:
        part = self.node.archiver.status(chain_id)
        if part is None:
            return {}
        return {"archived_sn": str(part.archived_sn), "verified_sn": str(part.verified_sn),
                "archive_lag_ms": part.lag_ms, "archive_error": part.error}

    async def NodeStatus(self, request, context):
        failures, last = self.node.logs.write_failures()
        return sms_pb2.NodeStatusResponse(
            node_id=self.node.node_id, pid=self.pid, roles=list(self.roles),
            storage_write_failures=failures, storage_last_error=last[0] if last else "",
            storage_last_error_ms=last[1] if last else 0,
            replicas=[sms_pb2.ReplicaStatus(chain_id=s["chain_id"], epoch=s["epoch"], role=s["role"],
                                            last_sn=str(s["last_sn"]), committed_sn=str(s["committed_sn"]),
                                            batches=s["batches"], records=s["records"],
                                            verified=s["verified"], gated_learners=s["gated"],
                                            sealed=s["sealed"], first_sn=str(s["first_sn"]),
                                            trimmed_before=str(s["trimmed_before"]), frozen=s["frozen"],
                                            **self._archive_status(s["chain_id"]))
                      for s in self.node.status(request.chain_ids)],
            peer_links=self.node.link_status())




class CommittedReplica:
    """One replica as readers see it (kernel.ports.CommittedLog): committed records only."""

    __slots__ = ("replica", "logs")

    def __init__(self, replica: Replica, logs: LogStore):
        self.replica = replica
        self.logs = logs

    @property
    def committed_sn(self) -> int:
        return self.replica.committed_sn

    @property
    def trimmed_before(self) -> int:
        return self.replica.trimmed_before

    @property
    def stored_first_sn(self) -> int:
        """The first SN stored here (0: none)."""
        return self.replica.log.first_sn

    @property
    def local_first_sn(self) -> int:
        """The first SN stored here (0: none), or where a trim under way deletes up to:
        records below it are in the archive, if any."""
        log = self.replica.log
        return max(log.first_sn, log.trim_floor) if log.first_sn else 0

    async def wait_committed(self, sn: int, timeout_s: float) -> bool:
        return await self.replica.wait_committed(sn, timeout_s)

    def read(self, from_sn: int, upto_sn: int, max_records: int, max_bytes: int):
        return self.logs.read(self.replica.log, from_sn, upto_sn, max_records, max_bytes)
