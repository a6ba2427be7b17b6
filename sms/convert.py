"""The protobuf edge: domain types <-> generated messages, both directions.

Only this module, the gRPC services and the client's transport touch `_pb2` objects.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable

from sms import wire
from sms.proto import sms_pb2
from sms.types import (ChainMember, ChannelDestination, ChannelInfo, ChannelPartition, ChannelStatus, ClusterInfo,
                       IngestionPolicy, NodeInfo, NodeLoad, PartitionInfo, PartitionState, Persistence, Record,
                       StreamInfo, StreamStatus)


def member_to_pb(m: ChainMember | None) -> sms_pb2.ChainMember | None:
    return None if m is None else sms_pb2.ChainMember(node_id=m.node_id, address=m.address, role=m.role)


def member_from_pb(m: sms_pb2.ChainMember) -> ChainMember:
    return ChainMember(node_id=m.node_id, address=m.address, role=m.role)


def stream_to_pb(s: StreamInfo) -> sms_pb2.StreamDescription:
    return sms_pb2.StreamDescription(
        name=s.name, status=s.status.value, replication_factor=s.replication_factor,
        persistence=s.persistence.value, ingestion_policy=s.ingestion_policy.value,
        retention_hours=s.retention_hours, map_version=s.map_version, created_ms=s.created_ms,
        dedup_window_s=s.dedup_window_s, retention_s=s.retention_s, protect_unread=s.protect_unread,
        auto_split_records_per_s=s.auto_split_records_per_s, auto_split_period_s=s.auto_split_period_s,
        repartition=json.dumps(s.repartition) if s.repartition else "", consumers=list(s.consumers),
        min_in_sync=s.min_in_sync, write_records_per_s=s.write_records_per_s,
        write_bytes_per_s=s.write_bytes_per_s, read_bytes_per_s=s.read_bytes_per_s,
        archive=s.archive, archive_after_s=s.archive_after_s, local_retention_s=s.local_retention_s,
        compression=s.compression, payload_prefix=s.payload_prefix, encryption=s.encryption,
        tags=dict(s.tags), shard_metrics=list(s.shard_metrics),
        partitions=[sms_pb2.Partition(
            ordinal=p.ordinal, hash_lo=str(p.hash_lo), hash_hi=str(p.hash_hi), valid_from_ms=p.valid_from_ms,
            valid_to_ms=-1 if p.valid_to_ms is None else p.valid_to_ms, state=p.state.value,
            parents=list(p.parents), children=list(p.children), chain_epoch=p.chain_epoch,
            chain=[member_to_pb(m) for m in p.chain], ingestion_owner=member_to_pb(p.ingestion_owner),
            learners=[member_to_pb(m) for m in p.learners],
            history=[sms_pb2.ChainChange(**h) for h in p.history],
            ending_sn="" if p.ending_sn is None else str(p.ending_sn), sealed=p.sealed)
            for p in s.partitions])


def stream_from_pb(d: sms_pb2.StreamDescription) -> StreamInfo:
    return StreamInfo(
        name=d.name, status=StreamStatus(d.status), replication_factor=d.replication_factor,
        persistence=Persistence(d.persistence), ingestion_policy=IngestionPolicy(d.ingestion_policy),
        retention_hours=d.retention_hours, map_version=d.map_version, created_ms=d.created_ms,
        dedup_window_s=d.dedup_window_s, retention_s=d.retention_s, protect_unread=d.protect_unread,
        auto_split_records_per_s=d.auto_split_records_per_s, auto_split_period_s=d.auto_split_period_s,
        repartition=json.loads(d.repartition) if d.repartition else None, consumers=tuple(d.consumers),
        min_in_sync=d.min_in_sync or 1, write_records_per_s=d.write_records_per_s,
        write_bytes_per_s=d.write_bytes_per_s, read_bytes_per_s=d.read_bytes_per_s,
        archive=d.archive, archive_after_s=d.archive_after_s, local_retention_s=d.local_retention_s,
        compression=d.compression or "zstd", payload_prefix=d.payload_prefix, encryption=d.encryption or "none",
        tags=tuple(sorted(d.tags.items())), shard_metrics=tuple(d.shard_metrics),
        partitions=tuple(PartitionInfo(
            ordinal=p.ordinal, hash_lo=int(p.hash_lo), hash_hi=int(p.hash_hi), valid_from_ms=p.valid_from_ms,
            valid_to_ms=None if p.valid_to_ms < 0 else p.valid_to_ms, state=PartitionState(p.state),
            parents=tuple(p.parents), children=tuple(p.children), chain_epoch=p.chain_epoch,
            chain=tuple(member_from_pb(m) for m in p.chain),
            ingestion_owner=member_from_pb(p.ingestion_owner) if p.HasField("ingestion_owner") else None,
            learners=tuple(member_from_pb(m) for m in p.learners),
            history=tuple({"epoch": h.epoch, "at_ms": h.at_ms, "action": h.action, "node": h.node,
                           "reason": h.reason} for h in p.history),
            ending_sn=int(p.ending_sn) if p.ending_sn else None, sealed=p.sealed)
            for p in d.partitions))


def cluster_to_pb(c: ClusterInfo) -> sms_pb2.ClusterDescription:
    return sms_pb2.ClusterDescription(
        control_address=c.control_address,
        nodes=[sms_pb2.Node(node_id=n.node_id, address=n.address, roles=list(n.roles), pid=n.pid,
                            started_ms=n.started_ms, metrics_address=n.metrics_address,
                            kinesis_address=n.kinesis_address) for n in c.nodes])


def node_loads_to_pb(loads: Iterable[NodeLoad]) -> sms_pb2.ListNodesResponse:
    return sms_pb2.ListNodesResponse(nodes=[
        sms_pb2.NodeLoad(node_id=n.node_id, address=n.address, live=n.live, draining=n.draining,
                         replicas=n.replicas, heads=n.heads, learners=n.learners) for n in loads])


def node_loads_from_pb(d: sms_pb2.ListNodesResponse) -> list[NodeLoad]:
    return [NodeLoad(node_id=n.node_id, address=n.address, live=n.live, draining=n.draining,
                     replicas=n.replicas, heads=n.heads, learners=n.learners) for n in d.nodes]


def cluster_from_pb(d: sms_pb2.ClusterDescription) -> ClusterInfo:
    return ClusterInfo(control_address=d.control_address,
                       nodes=tuple(NodeInfo(node_id=n.node_id, address=n.address, roles=tuple(n.roles),
                                            pid=n.pid, started_ms=n.started_ms, metrics_address=n.metrics_address,
                                            kinesis_address=n.kinesis_address)
                                   for n in d.nodes))


def records_from_slice(batch: bytes, start: int, end: int, ordinal: int) -> list[Record]:
    """Decode records [start, end) of a stored batch (client side), by `wire.decode_records`."""
    return wire.decode_records(batch, start, end, ordinal)


# --- channels (control/channels.py, sms/aio/channels.py): the messages' fields are the types' own
def destination_to_pb(d: ChannelDestination) -> sms_pb2.ChannelDestination:
    return sms_pb2.ChannelDestination(**dataclasses.asdict(d))


def destination_from_pb(pb: sms_pb2.ChannelDestination) -> ChannelDestination:
    return ChannelDestination(**{f.name: getattr(pb, f.name) for f in dataclasses.fields(ChannelDestination)})


# a channel partition's fields on the wire (ChannelPartitionStatus): all but lag_records, which the
# client counts itself (sms/aio/channels.py describe_channel)
_PARTITION_STATUS_FIELDS = tuple(f.name for f in dataclasses.fields(ChannelPartition) if f.name != "lag_records")


def channel_to_pb(c: ChannelInfo) -> sms_pb2.ChannelDescription:
    return sms_pb2.ChannelDescription(
        name=c.name, stream=c.stream, status=c.status.value, created_ms=c.created_ms,
        destination=destination_to_pb(c.destination), data_freshness_s=c.data_freshness_s, start=c.start,
        record_format=c.record_format, schema=[sms_pb2.ChannelColumn(name=n, type=t) for n, t in c.schema],
        dead_letter_url=c.dead_letter_url, uid=f"{c.uid:x}",
        partitions=[sms_pb2.ChannelPartitionStatus(**{f: getattr(p, f) for f in _PARTITION_STATUS_FIELDS})
                    for p in c.partitions])


def channel_from_pb(pb: sms_pb2.ChannelDescription) -> ChannelInfo:
    return ChannelInfo(
        name=pb.name, stream=pb.stream, status=ChannelStatus(pb.status), created_ms=pb.created_ms,
        destination=destination_from_pb(pb.destination), data_freshness_s=pb.data_freshness_s, start=pb.start,
        record_format=pb.record_format, schema=tuple((c.name, c.type) for c in pb.schema),
        dead_letter_url=pb.dead_letter_url, uid=int(pb.uid, 16),
        partitions=tuple(ChannelPartition(**{f: getattr(p, f) for f in _PARTITION_STATUS_FIELDS})
                         for p in pb.partitions))
