"""A cached, read-only view of the cluster's metadata, shared by every role of a process.

Ingestion routes by it, retrieval resolves partitions with it, and every process answers
DescribeStream / DescribeCluster / ListStreams from it. Entries are cached for at most
CONFIG_REFRESH_INTERVAL_S and dropped at once when a watch on /streams, /chains or /nodes
fires, or when a caller that was told it is stale calls `invalidate()`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from metastore import MetaStore, MetaStoreError, NoNodeError
from sms import limits, metadata
from sms.errors import StreamNotFound, Unavailable
from sms.metadata import ChainConfig, StreamConfig
from sms.partition_map import PartitionMap
from sms.types import ChainMember, ClusterInfo, NodeInfo, PartitionInfo, PartitionState, StreamInfo


@dataclass(frozen=True, slots=True)
class StreamView:
    config: StreamConfig
    map: PartitionMap
    chains: dict[int, ChainConfig]      # by partition ordinal
    consumers: tuple[str, ...] = ()


class ClusterView:
    def __init__(self, store: MetaStore):
        self.store = store
        self._streams: dict[str, tuple[float, StreamView]] = {}
        self._nodes: tuple[float, dict[str, NodeInfo]] | None = None
        self._cancel: list = []

    async def start(self) -> None:
        for path in (metadata.STREAMS, metadata.CHAINS, metadata.NODES):
            self._cancel.append(self.store.watch(path, self.invalidate))

    def close(self) -> None:
        for cancel in self._cancel:
            cancel()

    def invalidate(self) -> None:
        self._streams.clear()
        self._nodes = None

    async def stream(self, name: str, max_age_s: float | None = None) -> StreamView:
        """The stream's config, map and chains, read at most `max_age_s` ago (default
        CONFIG_REFRESH_INTERVAL_S; the watches of /streams, /chains and /nodes drop what
        they see change sooner)."""
        cached = self._streams.get(name)
        age_max = limits.CONFIG_REFRESH_INTERVAL_S if max_age_s is None else max_age_s
        if cached and time.monotonic() - cached[0] < age_max:
            return cached[1]
        metadata.validate_stream_name(name)
        entry = await self.store.get(metadata.stream_path(name))
        map_entry = await self.store.get(metadata.map_path(name))
        if entry is None or map_entry is None:
            raise StreamNotFound(f"stream {name!r} does not exist")
        config = StreamConfig.from_bytes(entry.value)
        pmap = PartitionMap.from_bytes(map_entry.value, version=map_entry.version)
        chains = {}
        for e in pmap.entries:
            chain = await self.store.get(metadata.chain_path(metadata.chain_id(name, e.ordinal)))
            if chain is not None:
                chains[e.ordinal] = ChainConfig.from_bytes(chain.value)
        try:
            consumers = tuple(sorted(await self.store.children(metadata.consumers_path(name))))
        except NoNodeError:
            consumers = ()
        view = StreamView(config, pmap, chains, consumers)
        self._streams[name] = (time.monotonic(), view)
        return view

    async def nodes(self) -> dict[str, NodeInfo]:
        if self._nodes and time.monotonic() - self._nodes[0] < limits.CONFIG_REFRESH_INTERVAL_S:
            return self._nodes[1]
        try:
            names = await self.store.children(metadata.NODES)
        except NoNodeError:
            names = []
        nodes = {}
        for name in names:
            entry = await self.store.get(metadata.node_path(name))
            if entry is not None and entry.value:
                nodes[name] = metadata.node_from_bytes(entry.value)
        self._nodes = (time.monotonic(), nodes)
        return nodes

    async def list_streams(self) -> list[str]:
        try:
            return await self.store.children(metadata.STREAMS)
        except NoNodeError:
            return []

    async def control_address(self) -> str:
        entry = await self.store.get(metadata.CLUSTER_CONTROL)
        if entry is None or not entry.value:
            return ""
        return json.loads(entry.value)["address"]

    async def describe_cluster(self) -> ClusterInfo:
        nodes = await self.nodes()
        return ClusterInfo(control_address=await self.control_address(),
                           nodes=tuple(nodes[k] for k in sorted(nodes)))

    async def describe_stream(self, name: str) -> StreamInfo:
        view, nodes = await asyncio.gather(self.stream(name), self.nodes())
        partitions = []
        for e in view.map.entries:
            chain = view.chains.get(e.ordinal)
            members: tuple[ChainMember, ...] = ()
            learners: tuple[ChainMember, ...] = ()
            if chain is not None:
                members = tuple(ChainMember(n, nodes[n].address if n in nodes else "", chain.role_of(n))
                                for n in chain.members)
                learners = tuple(ChainMember(n, nodes[n].address if n in nodes else "", "learner")
                                 for n in chain.learners)
            partitions.append(PartitionInfo(
                ordinal=e.ordinal, hash_lo=e.hash_lo, hash_hi=e.hash_hi, valid_from_ms=e.valid_from_ms,
                valid_to_ms=e.valid_to_ms, state=e.state, parents=e.parents, children=e.children,
                chain_epoch=chain.epoch if chain else 0, chain=members,
                ingestion_owner=members[0] if members else None, learners=learners,
                history=tuple(c.to_dict() for c in chain.history) if chain else (),
                ending_sn=e.ending_sn if e.state is PartitionState.CLOSED else None,
                sealed=bool(chain and chain.sealed)))
        c = view.config
        return StreamInfo(name=c.name, status=c.status, replication_factor=c.replication_factor,
                          persistence=c.persistence, ingestion_policy=c.ingestion_policy,
                          retention_hours=c.retention_hours, map_version=view.map.version,
                          created_ms=c.created_ms, partitions=tuple(partitions),
                          dedup_window_s=c.dedup_window_ms // 1000, retention_s=c.retention_ms // 1000,
                          protect_unread=c.protect_unread, auto_split_records_per_s=c.auto_split_records_per_s,
                          write_records_per_s=c.write_records_per_s, write_bytes_per_s=c.write_bytes_per_s,
                          read_bytes_per_s=c.read_bytes_per_s,
                          auto_split_period_s=c.auto_split_period_s, repartition=c.repartition,
                          consumers=tuple(view.consumers), min_in_sync=c.min_in_sync,
                          archive=c.archive, archive_after_s=c.archive_after_s,
                          local_retention_s=c.local_retention_ms // 1000 if c.archive else 0,
                          compression=c.compression,
                          payload_prefix=f"{c.name}/{c.created_ms}/payloads/" if c.archive else "",
                          encryption=c.encryption, tags=c.tags, shard_metrics=c.shard_metrics)


async def bounded(read, what: str):
    """Await `read` (a metadata read of a client call) for at most METADATA_READ_WAIT_S. A
    node that cannot read the metadata in that time may be cut off from the store (its
    session, and with it what it owns, gone): it answers Unavailable, and the client asks
    another node, instead of holding the call for the store's own timeout."""
    try:
        async with asyncio.timeout(limits.METADATA_READ_WAIT_S):
            return await read
    except TimeoutError:
        raise Unavailable(f"{what}: the metadata is not readable here within {limits.METADATA_READ_WAIT_S} s "
                          "(cut off from the metadata store?); ask another node") from None
    except MetaStoreError as e:
        raise Unavailable(f"{what}: the metadata is not readable here: {type(e).__name__}: {e}") from None
