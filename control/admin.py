"""Stream administration on the control node: create, delete, and the cluster's roots.

Creating a stream validates the request, places one chain per partition on live storage
nodes, and writes the stream config, its partition map and every chain config in one
atomic commit, with status CREATING. Nodes pick the chains up from the metadata store;
once every member reports its replica (NodeStatus), the stream is set ACTIVE and
create_stream returns. Deleting marks the stream DELETING, then removes chains, map and
config; nodes drop the replicas of chains that vanished.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
import logging
import os
import re
import secrets
import time

from archive import cleanup
from archive.fragment import check_codec
from sms.objectstore import check_url
from control import phases, placement, quotas, repartition
from kernel import encryption as encryption_module
from metastore import reads
from metastore import BadVersionError, Create, Delete, MetaStore, NodeExistsError, NoNodeError, Set
from metastore.view import ClusterView
from sms import errors, limits, metadata, seqno
from kernel import rpc
from kernel.aiotools import background
from sms.errors import (InvalidArgument, InvalidSequenceNumber, InvalidStreamConfig, LimitExceeded, NodeLive,
                        NodeNotDrained, NodeNotFound, NotEnoughNodes,
                        RepartitionInProgress, StreamAlreadyExists, StreamNotFound, Timeout, Unavailable)
from sms.metadata import ChainChange, ChainConfig, ConsumerRecord, StreamConfig
from sms.partition_map import PartitionMap
from sms.types import IngestionPolicy, NodeLoad, Persistence, StreamStatus

log = logging.getLogger(__name__)



async def ensure_roots(store: MetaStore) -> None:
    """The top-level entries every role expects, and the cluster's token secret."""
    for path in ("/cluster", metadata.NODES, metadata.STREAMS, metadata.CHAINS, metadata.SUSPECTS,
                 metadata.DRAINING, metadata.DISK_FAILED, metadata.KEYS, metadata.TENANTS, metadata.REVOKED_CERTS):
        try:
            await store.create(path)
        except NodeExistsError:
            pass
    try:
        await store.create(metadata.CLUSTER_SECRET, secrets.token_hex(32).encode())
    except NodeExistsError:
        pass


_LIMIT_MAX = {"write_records_per_s": limits.PARTITION_WRITE_RECORDS_PER_S_MAX,
              "write_bytes_per_s": limits.PARTITION_BYTES_PER_S_MAX,
              "read_bytes_per_s": limits.PARTITION_BYTES_PER_S_MAX}


def validate_partition_limits(wanted: dict[str, int]) -> dict[str, int]:
    """The per-partition limits to set (-1: unchanged, 0: none), or InvalidStreamConfig."""
    out = {}
    for name, value in wanted.items():
        if value == -1:
            continue
        if not 0 <= value <= _LIMIT_MAX[name]:
            raise InvalidStreamConfig(f"{name} {value}; expected 0 (no limit) .. {_LIMIT_MAX[name]}, or -1 "
                                      "(unchanged)")
        out[name] = value
    return out


_TAG_CHARS = re.compile(r"[\w .:/=+\-@%]*")


def changed_tags(current: tuple[tuple[str, str], ...], tags_set: dict[str, str] | None,
                 tags_removed: list[str] | None) -> tuple[tuple[str, str], ...] | None:
    """A stream's tags with `tags_set` added and `tags_removed` taken away (None: no change),
    or InvalidStreamConfig: keys of 1..STREAM_TAG_KEY_CHARS_MAX characters, values of at
    most STREAM_TAG_VALUE_CHARS_MAX, letters, digits, spaces and `_ . : / = + - @ %` (as
    Kinesis), no key starting `aws:`, at most STREAM_TAGS_MAX tags."""
    if not tags_set and not tags_removed:
        return None
    tags = dict(current)
    for key in tags_removed or ():
        tags.pop(key, None)
    for key, value in (tags_set or {}).items():
        if not 1 <= len(key) <= limits.STREAM_TAG_KEY_CHARS_MAX or not _TAG_CHARS.fullmatch(key):
            raise InvalidStreamConfig(f"tag key {key[:140]!r}: 1..{limits.STREAM_TAG_KEY_CHARS_MAX} letters, digits, "
                                      f"spaces or _ . : / = + - @ %")
        if key.lower().startswith("aws:"):
            raise InvalidStreamConfig(f"tag key {key[:140]!r}: keys starting 'aws:' are reserved")
        if len(value) > limits.STREAM_TAG_VALUE_CHARS_MAX or not _TAG_CHARS.fullmatch(value):
            raise InvalidStreamConfig(f"tag {key!r}: a value of at most {limits.STREAM_TAG_VALUE_CHARS_MAX} letters, "
                                      f"digits, spaces or _ . : / = + - @ %")
        tags[key] = value
    if len(tags) > limits.STREAM_TAGS_MAX:
        raise LimitExceeded(f"{len(tags)} tags; a stream has at most {limits.STREAM_TAGS_MAX}")
    return tuple(sorted(tags.items()))


def validate_create(name: str, partitions: int, replication_factor: int, persistence: str,
                    ingestion_policy: str, retention_hours: int, dedup_window_s: int = 0,
                    min_in_sync: int = 0, retention_s: int = 0, archive: dict | None = None,
                    encryption: str = "") -> StreamConfig:
    """The config of a new stream; a 0 (an unset proto field) takes the default. Its data
    key, when encrypted, is made by StreamAdmin.create_stream (it holds the master keys)."""
    metadata.validate_stream_name(name)
    if not 1 <= partitions <= limits.STREAM_PARTITIONS_MAX:
        raise InvalidStreamConfig(f"{partitions} partitions; expected 1..{limits.STREAM_PARTITIONS_MAX}")
    if not 1 <= replication_factor <= limits.REPLICATION_FACTOR_MAX:
        raise InvalidStreamConfig(f"replication factor {replication_factor}; expected 1..{limits.REPLICATION_FACTOR_MAX}")
    try:
        persistence_v = Persistence(persistence or Persistence.DISK.value)
    except ValueError:
        raise InvalidStreamConfig(f"persistence {persistence!r}; expected one of "
                                  + ", ".join(p.value for p in Persistence)) from None
    try:
        policy = IngestionPolicy(ingestion_policy or IngestionPolicy.AT_LEAST_ONCE_NO_DUP.value)
    except ValueError:
        raise InvalidStreamConfig(f"ingestion policy {ingestion_policy!r}; expected one of "
                                  + ", ".join(p.value for p in IngestionPolicy)) from None
    retention = retention_hours or limits.RETENTION_HOURS_DEFAULT
    if not limits.RETENTION_HOURS_MIN <= retention <= limits.RETENTION_HOURS_MAX:
        raise InvalidStreamConfig(f"retention {retention} h; expected {limits.RETENTION_HOURS_MIN}.."
                                  f"{limits.RETENTION_HOURS_MAX}")
    window_ms = dedup_window_s * 1000 if dedup_window_s else limits.DEDUP_WINDOW_MS_DEFAULT
    if not limits.DEDUP_WINDOW_MS_MIN <= window_ms <= limits.DEDUP_WINDOW_MS_MAX:
        raise InvalidStreamConfig(f"dedup window {dedup_window_s} s; expected {limits.DEDUP_WINDOW_MS_MIN // 1000}.."
                                  f"{limits.DEDUP_WINDOW_MS_MAX // 1000}")
    in_sync = min_in_sync or 1
    if not 1 <= in_sync <= replication_factor:
        raise InvalidStreamConfig(f"min_in_sync {min_in_sync}; expected 1..{replication_factor} (at most the "
                                  f"replication factor: a chain never has more members)")
    if retention_s and not limits.RETENTION_S_MIN <= retention_s <= limits.RETENTION_HOURS_MAX * 3600:
        raise InvalidStreamConfig(f"retention {retention_s} s; expected {limits.RETENTION_S_MIN}.."
                                  f"{limits.RETENTION_HOURS_MAX * 3600}")
    config = StreamConfig(name=name, partitions=partitions, replication_factor=replication_factor,
                          persistence=persistence_v, ingestion_policy=policy,
                          retention_hours=max(1, retention_s // 3600) if retention_s else retention,
                          retention_s=retention_s, created_ms=int(time.time() * 1000), status=StreamStatus.CREATING,
                          dedup_window_ms=window_ms, min_in_sync=in_sync,
                          encryption=encryption_module.validate_algorithm(encryption or "none"))
    if archive and archive.get("archive"):
        config = dataclasses.replace(config, **validate_archive(config, **archive))
    elif archive and any(v is not None for v in archive.values()):
        raise InvalidStreamConfig("archive_after_s, local_retention_s and compression need an archive (--archive URL)")
    return config


def validate_archive(current: StreamConfig, archive: str | None = None, archive_after_s: int | None = None,
                     local_retention_s: int | None = None, compression: str | None = None) -> dict:
    """The archive settings of a stream being made or changed (None: unchanged), checked
    against each other and its retention; the changes to apply."""
    changes: dict = {}
    if archive is not None and archive != current.archive:
        if current.archive:
            raise InvalidStreamConfig(f"stream {current.name!r} archives to {current.archive}; an archive cannot be "
                                      "moved or removed (its fragments and index stay where they are)")
        if current.name.rpartition(metadata.TENANT_SEP)[2] in (".", ".."):
            raise InvalidStreamConfig(f"stream {current.name!r} cannot have an archive: its name is not a path "
                                      "segment a store accepts")
        changes["archive"] = check_url(archive)
    for key, value in (("archive_after_s", archive_after_s), ("local_retention_s", local_retention_s)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limits.RETENTION_HOURS_MAX * 3600:
                raise InvalidStreamConfig(f"{key} {value!r}; expected 1..{limits.RETENTION_HOURS_MAX * 3600} s")
            changes[key] = value
    if compression is not None:
        changes["compression"] = check_codec(compression)
    new = dataclasses.replace(current, **changes)
    if not new.archive:
        if any(k in changes for k in ("archive_after_s", "local_retention_s", "compression")):
            raise InvalidStreamConfig("archive_after_s, local_retention_s and compression need an archive "
                                      "(--archive URL)")
        return changes
    if not new.archive_after_s:
        changes["archive_after_s"] = min(limits.ARCHIVE_AFTER_S_DEFAULT, new.retention_ms // 1000)
    if not new.local_retention_s:
        changes["local_retention_s"] = max(changes.get("archive_after_s", new.archive_after_s),
                                           min(limits.LOCAL_RETENTION_S_DEFAULT, new.retention_ms // 1000))
    new = dataclasses.replace(current, **changes)
    if new.local_retention_s < new.archive_after_s:
        raise InvalidStreamConfig(f"local retention {new.local_retention_s} s is shorter than archive_after_s "
                                  f"{new.archive_after_s} s: records would leave the replicas before the archive "
                                  "takes them")
    if new.archive_after_s * 1000 > new.retention_ms:
        raise InvalidStreamConfig(f"archive_after_s {new.archive_after_s} s is longer than the retention "
                                  f"({new.retention_ms // 1000} s): nothing would ever be archived")
    return changes


async def record_consumer(store: MetaStore, stream: str, consumer: str, checkpoints: dict[int, int],
                          remove: bool = False, replace_all: bool = False) -> None:
    """Register the stream's consumer (its unread records protected), merge `checkpoints`
    (ordinal -> the SN of the last record it processed) into its entry, or `remove` it.
    `replace_all`: the entry's checkpoints become exactly these."""
    if not metadata._STREAM_NAME.fullmatch(consumer or "") or consumer in (".", ".."):
        raise InvalidArgument(f"consumer name {consumer[:80]!r}; expected [A-Za-z0-9_.-]{{1,"
                              f"{limits.STREAM_NAME_CHARS_MAX}}}, not '.' or '..'")
    path = metadata.consumer_path(stream, consumer)
    if remove:
        try:
            await store.delete(path)
        except NoNodeError:
            pass
        return
    # (commits: a Create there makes no parents, so a stream deleted meanwhile stays deleted)
    try:
        await store.commit([Create(metadata.consumers_path(stream))])
    except NodeExistsError:
        pass
    except NoNodeError:
        raise StreamNotFound(f"stream {stream!r} does not exist") from None
    for _ in range(limits.CLIENT_REDIRECT_RETRIES_MAX):
        entry = await store.get(path)
        if entry is None:
            if len(await store.children(metadata.consumers_path(stream))) >= limits.CONSUMERS_PER_STREAM_MAX:
                raise LimitExceeded(f"stream {stream!r} has {limits.CONSUMERS_PER_STREAM_MAX} registered "
                                    "consumers; remove one first")
            try:
                await store.commit([Create(path, ConsumerRecord(consumer, tuple(sorted(checkpoints.items())))
                                           .to_bytes())])
                return
            except NodeExistsError:
                continue
            except NoNodeError:
                raise StreamNotFound(f"stream {stream!r} does not exist") from None
        merged = {} if replace_all else dict(ConsumerRecord.from_bytes(entry.value).checkpoints)
        merged.update(checkpoints)
        try:
            await store.set(path, ConsumerRecord(consumer, tuple(sorted(merged.items()))).to_bytes(), entry.version)
            return
        except BadVersionError:
            continue
    raise Unavailable(f"consumer {consumer!r} of {stream!r} is checkpointed concurrently; retry")


class StreamAdmin:
    def __init__(self, store: MetaStore, view: ClusterView,
                 master_keys: encryption_module.MasterKeys | None = None, channels: rpc.NodeChannels | None = None):
        self.store = store
        self.view = view
        self.channels = channels or rpc.NodeChannels()      # to the nodes' cluster ports, with this node's TLS
        self.master_keys = master_keys or encryption_module.MasterKeys.none()   # wraps streams' data keys
        self.lock = asyncio.Lock()   # one admin change at a time on this control node
        self.poke_repartitioner = lambda: None   # the leader's Repartitioner takes a request at once
        self.chain_configs: reads.ChainConfigs | None = None    # for placement, read on /chains changes

    async def _storage_nodes(self) -> dict:
        self.view.invalidate()
        return {n: info for n, info in (await self.view.nodes()).items() if "storage" in info.roles}

    async def create_stream(self, config: StreamConfig, retention_given: bool = True) -> None:
        """`retention_given`: the caller named the retention (else a tenant's retention
        cap lowers the default to it; control/quotas.py)."""
        async with self.lock:
            if await self.store.get(metadata.stream_path(config.name)) is not None:
                raise StreamAlreadyExists(f"stream {config.name!r} already exists")
            config = await quotas.admit_stream(self.store, config, retention_given)
            config = self._with_data_key(config)
            nodes = await self._storage_nodes()
            draining = await reads.draining(self.store)
            nodes = {n: info for n, info in nodes.items() if n not in draining} or nodes
            if config.replication_factor > len(nodes):
                raise NotEnoughNodes(f"replication factor {config.replication_factor} needs that many storage "
                                     f"nodes; {len(nodes)} are live and not draining")
            if self.chain_configs is None:
                self.chain_configs = reads.ChainConfigs(self.store)
            replicas, heads = await reads.chain_load(self.store, configs=self.chain_configs)
            chains = placement.place(list(nodes), config.partitions, config.replication_factor, replicas, heads)
            pmap = PartitionMap.even(config.partitions, config.created_ms)
            ops = [Create(metadata.stream_path(config.name), config.to_bytes()),
                   Create(metadata.map_path(config.name), pmap.to_bytes())]
            for entry, members in zip(pmap.entries, chains):
                cid = metadata.chain_id(config.name, entry.ordinal)
                ops.append(Create(metadata.chain_path(cid), ChainConfig(
                    chain_id=cid, stream=config.name, ordinal=entry.ordinal, epoch=1, members=members,
                    persistence=config.persistence, min_in_sync=config.min_in_sync,
                    incarnations=tuple(sorted((n, nodes[n].started_ms) for n in members)),
                    history=(ChainChange(1, config.created_ms, "created", members[0],
                                         "placed on " + " -> ".join(members)),)).to_bytes()))
            ops.append(Set(metadata.CHAINS, metadata.chains_note(
                metadata.chain_id(config.name, e.ordinal) for e in pmap.entries)))
            try:
                await self.store.commit(ops)
            except NodeExistsError:
                raise StreamAlreadyExists(f"stream {config.name!r} already exists") from None
        await self._wait_replicas(config.name, chains, nodes)
        entry = await self.store.get(metadata.stream_path(config.name))
        await self.store.commit([Set(metadata.stream_path(config.name),
                                     config.with_status(StreamStatus.ACTIVE).to_bytes(), entry.version)])
        self.view.invalidate()

    async def _wait_replicas(self, name: str, chains: list[tuple[str, ...]], nodes: dict) -> None:
        """Poll NodeStatus until every current member of every chain of the stream holds
        its replica. The chain configs are re-read each round: a member that died
        meanwhile is replaced by the chain manager, and the stream waits for the new one."""
        deadline = time.monotonic() + limits.STREAM_READY_TIMEOUT_S
        ready: set[tuple[str, str]] = set()
        pause = limits.STREAM_READY_POLL_FIRST_S
        while True:
            self.view.invalidate()
            live = await self.view.nodes()
            missing = []
            for ordinal in range(len(chains)):
                cid = metadata.chain_id(name, ordinal)
                entry = await self.store.get(metadata.chain_path(cid))
                if entry is None:
                    raise StreamNotFound(f"stream {name!r} was deleted while it was being created")
                for member in ChainConfig.from_bytes(entry.value).members:
                    if (member, cid) not in ready:
                        missing.append((member, cid))
            by_member: dict[str, list[str]] = {}
            for member, cid in missing:
                by_member.setdefault(member, []).append(cid)
            asked = [(member, cids, live[member]) for member, cids in by_member.items() if member in live]
            # (one question per node, about these chains only, to every node at once)
            answers = await asyncio.gather(*(self.channels.node_status(node.internal_address, cids)
                                             for _member, cids, node in asked))
            for (member, cids, _node), status in zip(asked, answers):
                if status is None:
                    continue            # down or restarting: the chain manager replaces it
                held = {r.chain_id for r in status.replicas}
                ready.update((member, c) for c in cids if c in held)
            if all(m in ready for m in missing):
                return
            if time.monotonic() > deadline:
                pending = sorted({f"{m} ({c})" for m, c in missing if (m, c) not in ready})
                raise Timeout(f"stream {name!r}: replicas not open in time on {', '.join(pending)}")
            # (soon at first: nodes open new replicas within milliseconds of the commit)
            await asyncio.sleep(pause)
            pause = min(pause * 2, limits.METASTORE_POLL_INTERVAL_S)

    async def delete_stream(self, name: str) -> None:
        metadata.validate_stream_name(name)
        async with self.lock:
            entry = await self.store.get(metadata.stream_path(name))
            if entry is None:
                raise StreamNotFound(f"stream {name!r} does not exist")
            config = StreamConfig.from_bytes(entry.value)
            await self.store.set(metadata.stream_path(name), config.with_status(StreamStatus.DELETING).to_bytes(),
                                 entry.version)
            map_entry = await self.store.get(metadata.map_path(name))
            if map_entry is not None:
                cids = [metadata.chain_id(name, e.ordinal) for e in PartitionMap.from_bytes(map_entry.value).entries]
                held = [cid for cid in cids if await self.store.get(metadata.chain_path(cid)) is not None]
                try:       # one commit, with its note on /chains (metastore/reads.py ChainConfigs)
                    await self.store.commit([*(Delete(metadata.chain_path(cid)) for cid in held),
                                             Set(metadata.CHAINS, metadata.chains_note(held))])
                except NoNodeError:       # one went meanwhile: one by one
                    for cid in held:
                        try:
                            await self.store.delete(metadata.chain_path(cid))
                        except NoNodeError:
                            pass
            await self.store.delete(metadata.stream_path(name), recursive=True)
            self.view.invalidate()
            if config.archive:
                background(cleanup.drop_stream(config))



    # --- repartitioning, retention, consumers ---------------------------------------------
    async def list_nodes(self) -> list[NodeLoad]:
        """Every storage node that is live or holds a replica, with its share of chains."""
        nodes = await self._storage_nodes()
        draining = await reads.draining(self.store)
        replicas, heads, learners = Counter(), Counter(), Counter()
        for config in await reads.all_chains(self.store):
            replicas.update(config.members)
            heads[config.head] += 1
            learners.update(config.learners)
        names = sorted(set(nodes) | set(replicas) | set(learners) | (draining & set(nodes)))
        return [NodeLoad(node_id=n, address=nodes[n].address if n in nodes else "", live=n in nodes,
                         draining=n in draining, replicas=replicas[n], heads=heads[n], learners=learners[n])
                for n in names]

    async def drain_node(self, node_id: str, undo: bool = False) -> list[NodeLoad]:
        """Mark a storage node as draining: the chain manager moves its replicas to the other
        nodes (each through a learner, so no chain drops below its replication factor),
        and nothing new is placed on it. `undo` clears the mark."""
        if not isinstance(node_id, str) or not node_id:
            raise InvalidArgument("a node id is required")
        loads = await self.list_nodes()
        known = {n.node_id for n in loads}
        if undo:
            known |= await reads.draining(self.store)      # (a drained node that was stopped: listed no more)
        if node_id not in known:
            raise NodeNotFound(f"no storage node {node_id[:64]!r} is registered or holds a replica; "
                               f"the nodes are: {', '.join(sorted(known)) or '(none)'}")
        path = metadata.draining_path(node_id)
        if undo:
            try:
                await self.store.delete(path)
            except NoNodeError:
                pass
        else:
            try:
                await self.store.create(path, str(int(time.time() * 1000)).encode())
                log.info("node %s is draining: its replicas move to the other nodes", node_id)
            except NodeExistsError:
                pass
        return [dataclasses.replace(n, draining=not undo) if n.node_id == node_id else n for n in loads]

    async def remove_node(self, node_id: str) -> list[NodeLoad]:
        """Forget a storage node: one that is stopped (not registered) and holds no replica
        (drained) loses its draining mark and the other entries the cluster keeps of it (a
        failed-disk report, a peer's suspicion), so `list_nodes` no longer shows it. A node
        started again under that id later joins as a new one. Returns the other nodes' loads."""
        if not isinstance(node_id, str) or not node_id:
            raise InvalidArgument("a node id is required")
        loads = await self.list_nodes()
        kept = {root: set(await self.store.children(root))
                for root in (metadata.DRAINING, metadata.DISK_FAILED, metadata.SUSPECTS)}
        mine = next((n for n in loads if n.node_id == node_id), None)
        if mine is None and not any(node_id in ids for ids in kept.values()):
            known = {n.node_id for n in loads}.union(*kept.values())
            raise NodeNotFound(f"no storage node {node_id[:64]!r} is registered, holds a replica or is "
                               f"remembered; the nodes are: {', '.join(sorted(known)) or '(none)'}")
        held = 0 if mine is None else mine.replicas + mine.learners
        if mine is not None and mine.live:
            raise NodeLive(f"node {node_id} is running (at {mine.address}): stop it first, then remove it"
                           + (f"; it holds {held} replicas: drain it before stopping it "
                              f"(sms node drain {node_id} --wait)" if held else ""))
        if held:
            raise NodeNotDrained(f"node {node_id} is down but still holds {held} replicas: "
                                 f"drain it first (sms node drain {node_id} --wait; the chain manager moves them "
                                 f"to the live nodes)")
        for root, ids in kept.items():
            if node_id in ids:
                try:
                    await self.store.delete(f"{root}/{node_id}")
                except NoNodeError:
                    pass
        log.info("node %s removed: the cluster no longer keeps any entry of it", node_id)
        return [n for n in loads if n.node_id != node_id]

    async def _stream_entry(self, name: str):
        metadata.validate_stream_name(name)
        entry = await self.store.get(metadata.stream_path(name))
        if entry is None:
            raise StreamNotFound(f"stream {name!r} does not exist")
        config = StreamConfig.from_bytes(entry.value)
        if config.status is not StreamStatus.ACTIVE:
            raise Unavailable(f"stream {name!r} is {config.status.value}")
        return config, entry.version

    async def repartition_stream(self, name: str, request: dict) -> None:
        """Record the request in the stream's config (the leader's Repartitioner drives it)
        and wait until it is done; raises the error that ended it, if any."""
        async with self.lock:
            config, version = await self._stream_entry(name)
            known = config.repartition or {}
            if known.get("id") != request["id"]:     # (the same id: a retry of a request recorded)
                map_entry = await self.store.get(metadata.map_path(name))
                pmap = PartitionMap.from_bytes(map_entry.value, version=map_entry.version)
                steps = repartition.check_request(config, pmap, request, int(time.time() * 1000))
                if steps == 0:
                    return                       # scale to the partitions it has: nothing to do
                await quotas.admit_open_partitions(self.store, name, phases.opened_after(request, pmap))
                try:
                    await self.store.set(metadata.stream_path(name),
                                         dataclasses.replace(config, repartition=request).to_bytes(), version)
                except BadVersionError:
                    raise RepartitionInProgress(f"stream {name!r} changed meanwhile; retry") from None
        self.poke_repartitioner()
        deadline = time.monotonic() + limits.REPARTITION_WAIT_S
        while True:
            entry = await self.store.get(metadata.stream_path(name))
            if entry is None:
                raise StreamNotFound(f"stream {name!r} was deleted during its repartition")
            current = StreamConfig.from_bytes(entry.value).repartition or {}
            if current.get("id") != request["id"]:
                return                       # finished, and another request followed
            if current.get("done"):
                if current.get("error"):
                    raise errors.from_name(*current["error"])
                self.view.invalidate()
                return
            if time.monotonic() > deadline:
                raise Timeout(f"stream {name!r}: repartition not done within {limits.REPARTITION_WAIT_S:.0f} s "
                              f"({current.get('steps_done', 0)} steps done); it goes on in the background")
            await asyncio.sleep(limits.REPARTITION_POLL_INTERVAL_S)

    async def update_stream(self, name: str, retention_hours: int = 0, retention_s: int = 0,
                            protect_unread: bool | None = None, auto_split_records_per_s: int = -1,
                            auto_split_period_s: int = 0, partition_limits: dict[str, int] | None = None,
                            archive: dict | None = None, encryption: str | None = None,
                            tags_set: dict[str, str] | None = None, tags_removed: list[str] | None = None,
                            shard_metrics: list[str] | None = None, shard_metrics_add: list[str] | None = None,
                            shard_metrics_remove: list[str] | None = None) -> None:
        changes: dict = validate_partition_limits(partition_limits or {})
        for names in (shard_metrics, shard_metrics_add, shard_metrics_remove):
            if names and (len(names) > limits.STREAM_SHARD_METRICS_MAX or
                          any(not m.isalpha() or len(m) > limits.STREAM_SHARD_METRIC_CHARS_MAX for m in names)):
                raise InvalidStreamConfig(f"shard metrics {names[:16]!r}: at most "
                                          f"{limits.STREAM_SHARD_METRICS_MAX} names of letters")
        if shard_metrics is not None:
            changes["shard_metrics"] = tuple(sorted(set(shard_metrics)))
        if encryption_module.validate_algorithm(encryption) is not None:
            changes["encryption"] = encryption
        if retention_hours:
            if not limits.RETENTION_HOURS_MIN <= retention_hours <= limits.RETENTION_HOURS_MAX:
                raise InvalidStreamConfig(f"retention {retention_hours} h; expected {limits.RETENTION_HOURS_MIN}.."
                                          f"{limits.RETENTION_HOURS_MAX}")
            changes.update(retention_hours=retention_hours, retention_s=0)
        if retention_s:
            if not limits.RETENTION_S_MIN <= retention_s <= limits.RETENTION_HOURS_MAX * 3600:
                raise InvalidStreamConfig(f"retention {retention_s} s; expected {limits.RETENTION_S_MIN}.."
                                          f"{limits.RETENTION_HOURS_MAX * 3600}")
            changes.update(retention_s=retention_s, retention_hours=max(1, retention_s // 3600))
        if protect_unread is not None:
            changes["protect_unread"] = protect_unread
        if auto_split_records_per_s >= 0:
            changes["auto_split_records_per_s"] = auto_split_records_per_s
        elif auto_split_records_per_s < -1:
            raise InvalidStreamConfig(f"auto-split rate {auto_split_records_per_s}; expected >= 0 (0: off)")
        if auto_split_period_s:
            if auto_split_period_s < limits.AUTO_SPLIT_PERIOD_S_MIN:
                raise InvalidStreamConfig(f"auto-split period {auto_split_period_s} s; at least "
                                          f"{limits.AUTO_SPLIT_PERIOD_S_MIN}")
            changes["auto_split_period_s"] = auto_split_period_s
        tenant = metadata.tenant_of(name)
        caps = await quotas.tenant_config(self.store, tenant)
        given = bool(retention_hours or retention_s)

        given_archive = {k: v for k, v in (archive or {}).items() if v is not None}

        def change(c: StreamConfig) -> StreamConfig:
            new = dataclasses.replace(c, **changes)
            tags = changed_tags(c.tags, tags_set, tags_removed)
            if tags is not None:
                new = dataclasses.replace(new, tags=tags)
            if shard_metrics_add or shard_metrics_remove:      # (merged here: concurrent changes keep each other)
                metrics = (set(new.shard_metrics) | set(shard_metrics_add or ())) - set(shard_metrics_remove or ())
                if len(metrics) > limits.STREAM_SHARD_METRICS_MAX:
                    raise InvalidStreamConfig(f"{len(metrics)} shard metrics; at most "
                                              f"{limits.STREAM_SHARD_METRICS_MAX}")
                new = dataclasses.replace(new, shard_metrics=tuple(sorted(metrics)))
            if given_archive or new.archive:
                new = dataclasses.replace(new, **validate_archive(new, **given_archive))
            return self._with_data_key(quotas.within_retention(new, caps, tenant, given))
        await self._change_config(name, change)

    def _with_data_key(self, config: StreamConfig) -> StreamConfig:
        """An encrypted stream's config with a data key (made once, then kept: batches
        sealed under it stay readable after a change back to "none")."""
        if config.encryption == encryption_module.ALGORITHM and not config.data_key:
            data_key = os.urandom(encryption_module.KEY_BYTES)
            return dataclasses.replace(config, data_key=self.master_keys.wrap(config.name, data_key))
        return config

    async def rewrap_data_keys(self) -> int:
        """Master key rotation, step two: every stream's data key wrapped again by the current
        master key (the leader reads its key file again first). Returns how many were."""
        if self.master_keys.source and not self.master_keys.source.startswith("$"):
            self.master_keys = encryption_module.MasterKeys.load(self.master_keys.source)
        rewrapped = 0
        for name in await self._stream_names():
            def change(c: StreamConfig) -> StreamConfig:
                if not c.data_key or c.data_key.partition(":")[0] == self.master_keys.current:
                    return c
                key = self.master_keys.unwrap(c.name, c.data_key)
                return dataclasses.replace(c, data_key=self.master_keys.wrap(c.name, key))
            config, _v = await self._stream_entry(name)
            if config.data_key and config.data_key.partition(":")[0] != self.master_keys.current:
                await self._change_config(name, change)
                rewrapped += 1
        return rewrapped

    async def _stream_names(self) -> list[str]:
        try:
            return await self.store.children(metadata.STREAMS)
        except NoNodeError:
            return []

    async def _change_config(self, name: str, change) -> None:
        for _ in range(limits.CLIENT_REDIRECT_RETRIES_MAX):
            config, version = await self._stream_entry(name)
            try:
                await self.store.set(metadata.stream_path(name), change(config).to_bytes(), version)
            except BadVersionError:
                continue           # the repartitioner wrote meanwhile: apply to the new config
            self.view.invalidate()
            return
        raise Unavailable(f"stream {name!r} changes too often; retry")

    async def trim_stream(self, name: str, before_sn: int = 0, before_ms: int = 0) -> None:
        if not before_sn and not before_ms:
            raise InvalidArgument("trim_stream needs before_sn or before_ms")
        if before_ms < 0 or before_ms > int(time.time() * 1000) + limits.DEDUP_CLOCK_SKEW_MS_MAX:
            raise InvalidArgument(f"before_ms {before_ms}; expected a time in the past (ms since the epoch)")
        ordinal = seqno.ordinal_of(before_sn) if before_sn else None
        if ordinal is not None:
            pmap = (await self.view.stream(name)).map
            if not any(e.ordinal == ordinal for e in pmap.entries):
                raise InvalidSequenceNumber(f"sequence number {before_sn} names partition p{ordinal:04d}, "
                                            f"which stream {name!r} does not have")

        def change(c: StreamConfig) -> StreamConfig:
            sns = dict(c.trim_before_sns)
            if ordinal is not None:
                sns[ordinal] = max(sns.get(ordinal, 0), before_sn)
            return dataclasses.replace(c, trim_before_ms=max(c.trim_before_ms, before_ms),
                                       trim_before_sns=tuple(sorted(sns.items())))
        await self._change_config(name, change)

    async def update_consumer(self, stream: str, consumer: str, checkpoints: dict[int, int],
                              remove: bool = False) -> None:
        await self._stream_entry(stream)
        self.view.invalidate()
        await record_consumer(self.store, stream, consumer, checkpoints, remove)
        self.view.invalidate()
