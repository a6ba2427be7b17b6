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
import logging
import secrets
import time
from collections import Counter

import grpc

from control import placement
from control.metastore import Create, MetaStore, NodeExistsError, NoNodeError, Set
from control.metaview import ClusterView
from sms import limits, metadata, rpc
from sms.errors import InvalidStreamConfig, NotEnoughNodes, StreamAlreadyExists, StreamNotFound, Timeout
from sms.metadata import ChainChange, ChainConfig, StreamConfig
from sms.partition_map import PartitionMap
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.types import IngestionPolicy, Persistence, StreamStatus

log = logging.getLogger(__name__)

STREAM_READY_TIMEOUT_S = 30.0


async def ensure_roots(store: MetaStore) -> None:
    """The top-level entries every role expects, and the cluster's token secret."""
    for path in ("/cluster", metadata.NODES, metadata.STREAMS, metadata.CHAINS):
        try:
            await store.create(path)
        except NodeExistsError:
            pass
    try:
        await store.create(metadata.CLUSTER_SECRET, secrets.token_hex(32).encode())
    except NodeExistsError:
        pass


def validate_create(name: str, partitions: int, replication_factor: int, persistence: str,
                    ingestion_policy: str, retention_hours: int, dedup_window_s: int = 0) -> StreamConfig:
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
    return StreamConfig(name=name, partitions=partitions, replication_factor=replication_factor,
                        persistence=persistence_v, ingestion_policy=policy, retention_hours=retention,
                        created_ms=int(time.time() * 1000), status=StreamStatus.CREATING,
                        dedup_window_ms=window_ms)


class StreamAdmin:
    def __init__(self, store: MetaStore, view: ClusterView):
        self.store = store
        self.view = view
        self.lock = asyncio.Lock()   # one admin change at a time on this control node

    async def _storage_nodes(self) -> dict:
        self.view.invalidate()
        return {n: info for n, info in (await self.view.nodes()).items() if "storage" in info.roles}

    async def _load(self) -> tuple[Counter, Counter]:
        replicas, heads = Counter(), Counter()
        try:
            names = await self.store.children(metadata.CHAINS)
        except NoNodeError:
            names = []
        for name in names:
            entry = await self.store.get(metadata.chain_path(name))
            if entry is not None:
                chain = ChainConfig.from_bytes(entry.value)
                replicas.update(chain.members)
                heads[chain.head] += 1
        return replicas, heads

    async def create_stream(self, config: StreamConfig) -> None:
        async with self.lock:
            if await self.store.get(metadata.stream_path(config.name)) is not None:
                raise StreamAlreadyExists(f"stream {config.name!r} already exists")
            nodes = await self._storage_nodes()
            if config.replication_factor > len(nodes):
                raise NotEnoughNodes(f"replication factor {config.replication_factor} needs that many storage "
                                     f"nodes; {len(nodes)} are live")
            replicas, heads = await self._load()
            chains = placement.place(list(nodes), config.partitions, config.replication_factor, replicas, heads)
            pmap = PartitionMap.even(config.partitions, config.created_ms)
            ops = [Create(metadata.stream_path(config.name), config.to_bytes()),
                   Create(metadata.map_path(config.name), pmap.to_bytes())]
            for entry, members in zip(pmap.entries, chains):
                cid = metadata.chain_id(config.name, entry.ordinal)
                ops.append(Create(metadata.chain_path(cid), ChainConfig(
                    chain_id=cid, stream=config.name, ordinal=entry.ordinal, epoch=1, members=members,
                    persistence=config.persistence,
                    incarnations=tuple(sorted((n, nodes[n].started_ms) for n in members)),
                    history=(ChainChange(1, config.created_ms, "created", members[0],
                                         "placed on " + " -> ".join(members)),)).to_bytes()))
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
        deadline = time.monotonic() + STREAM_READY_TIMEOUT_S
        ready: set[tuple[str, str]] = set()
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
            for member, cid in missing:
                node = live.get(member)
                if node is None:
                    continue
                try:
                    async with rpc.aio_channel(node.address) as channel:
                        status = await sms_pb2_grpc.StorageStub(channel).NodeStatus(
                            sms_pb2.Empty(), timeout=limits.RPC_TIMEOUT_S)
                except grpc.aio.AioRpcError:
                    continue            # down or restarting: the chain manager replaces it
                held = {r.chain_id for r in status.replicas}
                ready.update((member, c) for m, c in missing if m == member and c in held)
            if all(m in ready for m in missing):
                return
            if time.monotonic() > deadline:
                pending = sorted({f"{m} ({c})" for m, c in missing if (m, c) not in ready})
                raise Timeout(f"stream {name!r}: replicas not open in time on {', '.join(pending)}")
            await asyncio.sleep(limits.METASTORE_POLL_INTERVAL_S)

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
                for e in PartitionMap.from_bytes(map_entry.value).entries:
                    try:
                        await self.store.delete(metadata.chain_path(metadata.chain_id(name, e.ordinal)))
                    except NoNodeError:
                        pass
            await self.store.delete(metadata.stream_path(name), recursive=True)
            self.view.invalidate()


