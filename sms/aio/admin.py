"""The asyncio client's administration: streams, keys, tenants, certificates, the audit log,
nodes, consumer groups and registered consumers."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterable
from typing import Any

from sms import convert, errors, limits, metadata, security
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.types import NodeLoad, StreamInfo, parse_partition_id
from sms.aio.transport import Transport


TENANT_LIMITS = metadata.TenantConfig.LIMITS


def _tenant_dict(pb: sms_pb2.TenantInfo) -> dict[str, Any]:
    return {"name": pb.name, **{f: getattr(pb, f) for f in TENANT_LIMITS}}


def _key_info(pb: sms_pb2.KeyInfo) -> dict[str, Any]:
    return {"key_id": pb.key_id, "tenant": pb.tenant, "role": pb.role, "streams": list(pb.streams), "name": pb.name,
            "created_ms": pb.created_ms}


class Admin(Transport):
    """The admin part of `sms.aio.Client` (sms/aio/__init__.py); each part builds on the
    ones before it: transport, admin, reads, writes, groups."""

    # --- admin -------------------------------------------------------------------------
    async def create_stream(self, name: str, partitions: int = 1, replication_factor: int = 1, *,
                            persistence: str = "disk", ingestion_policy: str = "at_least_once_no_dup",
                            retention_hours: int = 0,
                            dedup_window_s: int = limits.DEDUP_WINDOW_MS_DEFAULT // 1000,
                            min_in_sync: int = 1, retention_s: int = 0, archive: str = "",
                            archive_after_s: int = 0, local_retention_s: int = 0,
                            compression: str = "", encryption: str = "none", tags: dict[str, str] | None = None,
                            auto_split_records_per_s: int = 0) -> StreamInfo:
        """Create a stream and wait until it is ACTIVE; returns its map.

        Args:
            name: the stream's name.
            partitions: how many partitions it starts with (even hash ranges).
            replication_factor: the length of each partition's chain.
            persistence: "disk", "disk_async" or "memory".
            ingestion_policy: "at_least_once_no_dup", "at_least_once_dup_permitted" or
                "best_effort".
            retention_hours: 0 takes the default (RETENTION_HOURS_DEFAULT, or the
                tenant's retention cap when that is shorter).
            dedup_window_s: how long the ingestion owners remember a producer's records.
            min_in_sync: (1..replication_factor) a partition takes new records only while
                its chain has at least that many members; else they fail with the
                retriable NotEnoughReplicas (docs/operations.md, "Minimum in-sync replicas").
            encryption: "none", or "aes-256-gcm": its batches are stored sealed under a data
                key of its own, and readers get them opened (docs/security.md, "Encryption
                at rest"; the control node needs a master key).
            tags: labels, key -> value (as `update_stream`'s), made with the stream.
            auto_split_records_per_s: 0 (off), or the rate over which a partition is split
                (as `update_stream`'s), from the start.

        Raises:
            StreamAlreadyExists, InvalidStreamName, InvalidStreamConfig, NotEnoughNodes,
            TooManyPartitions, TenantLimitExceeded."""
        if isinstance(min_in_sync, bool) or not isinstance(min_in_sync, int) or min_in_sync < 1:
            # (0 on the wire means "the default"; a caller's 0 or -1 is a mistake)
            raise errors.InvalidStreamConfig(f"min_in_sync {min_in_sync!r}; expected 1..{replication_factor} "
                                             f"(at most the replication factor)")
        req = sms_pb2.CreateStreamRequest(name=name, partitions=partitions, replication_factor=replication_factor,
                                          persistence=persistence, ingestion_policy=ingestion_policy,
                                          retention_hours=retention_hours, dedup_window_s=dedup_window_s,
                                          min_in_sync=min_in_sync, retention_s=retention_s, archive=archive,
                                          archive_after_s=archive_after_s, local_retention_s=local_retention_s,
                                          compression=compression, encryption=encryption, tags=tags or {},
                                          auto_split_records_per_s=auto_split_records_per_s)
        pb = await self._admin_call("CreateStream", req, timeout_s=60.0)
        info = convert.stream_from_pb(pb)
        self._streams[name] = info
        return info

    # --- credentials (admin keys only; docs/security.md) --------------------------------
    async def create_key(self, role: str, *, streams: Iterable[str] = (), name: str = "",
                         tenant: str = "") -> tuple[dict[str, Any], str]:
        """A new key of `role` ("admin", "producer" or "consumer"), limited to `streams`
        when given, of the caller's tenant or (an admin of the default tenant) of
        `tenant`: (its description, its token). The token is shown this once.

        Args:
            role: "admin", "producer" or "consumer".
            streams: the streams it may use (empty: all of its tenant's).
            name: a label for operators.
            tenant: the tenant it belongs to ("": the caller's).

        Raises:
            InvalidArgument (an unknown role), TenantNotFound, PermissionDenied."""
        pb = await self._admin_call("CreateKey", sms_pb2.CreateKeyRequest(role=role, streams=list(streams), name=name,
                                                                          tenant=tenant))
        return _key_info(pb.key), pb.token

    async def create_tenant(self, name: str) -> None:
        """Create a tenant: its keys see only its streams, under their own names (admins
        of the default tenant only).

        Raises:
            InvalidArgument (a bad name, or one that exists), PermissionDenied."""
        await self._admin_call("CreateTenant", sms_pb2.TenantRequest(name=name))

    async def list_tenants(self) -> list[str]:
        """The names of every tenant. Raises PermissionDenied for a non-admin key."""
        return list((await self._admin_call("ListTenants", sms_pb2.Empty())).names)

    async def describe_tenants(self) -> list[dict[str, Any]]:
        """Every tenant with its limits (0: none): throughput over all its partitions
        (write_records_per_s, write_bytes_per_s, read_bytes_per_s) and caps on what it
        holds (streams_max, partitions_max, retention_hours_max). Raises
        PermissionDenied for a non-admin key."""
        return [_tenant_dict(t) for t in (await self._admin_call("ListTenants", sms_pb2.Empty())).tenants]

    async def update_tenant(self, name: str, **limits: int | None) -> dict[str, Any]:
        """Change a tenant's limits (`describe_tenants` names them; None: unchanged, 0
        removes one). Each live node takes an even share of a throughput limit; a write
        over it gets Throttled and a read waits. A lower retention cap shortens its
        streams' retention. Returns the tenant with its limits now.

        Raises:
            TypeError: a limit that is not one of TENANT_LIMITS.
            TenantNotFound, TenantLimitExceeded (a change past a cap), InvalidArgument."""
        request = sms_pb2.UpdateTenantRequest(name=name, write_records_per_s=-1, write_bytes_per_s=-1)
        for field, value in limits.items():
            if field not in TENANT_LIMITS:
                raise TypeError(f"update_tenant() got an unexpected keyword argument {field!r}")
            if value is not None:
                setattr(request, field, value)
        return _tenant_dict(await self._admin_call("UpdateTenant", request))

    async def revoke_certificate(self, certificate: str, reason: str = "") -> str:
        """Revoke a certificate, given as its serial in hex or as a PEM file's path: no
        cluster port serves it from about REVOCATION_REFRESH_S on. Returns its serial,
        in hex.

        Raises:
            InvalidArgument: neither a serial nor a readable certificate."""
        serial = security.cert_serial(certificate)
        await self._admin_call("RevokeCertificate", sms_pb2.RevokeCertificateRequest(serial=serial, reason=reason))
        return serial

    async def list_revoked_certificates(self) -> list[dict[str, Any]]:
        """Every revoked certificate: {serial, revoked_ms, reason}."""
        pb = await self._admin_call("ListRevokedCertificates", sms_pb2.Empty())
        return [{"serial": c.serial, "revoked_ms": c.revoked_ms, "reason": c.reason} for c in pb.certificates]

    async def read_audit(self, since_ms: int = 0, limit: int = limits.AUDIT_READ_EVENTS_MAX) -> dict[str, Any]:
        """The audit log (docs/security.md, "Audit log"): each node's events at or after
        `since_ms` (ms since the epoch), merged by time, the newest `limit`, oldest first.
        Returns {events: [{ts_ms, time, node, action, target, outcome, who, from, detail}],
        truncated: whether older events at or after `since_ms` were left out, unanswered:
        {node_id: "Name: message"} of the nodes that could not be reached (their events are
        missing)}.

        Raises:
            InvalidArgument, PermissionDenied (admins of the default tenant only)."""
        if since_ms < 0:
            raise errors.InvalidArgument(f"since_ms {since_ms}; expected 0 or a time in ms since the epoch")
        if not 0 < limit <= limits.AUDIT_READ_EVENTS_MAX:
            raise errors.InvalidArgument(f"limit {limit}; expected 1 to {limits.AUDIT_READ_EVENTS_MAX}")
        request = sms_pb2.ReadAuditRequest(since_ms=since_ms, limit=limit)
        nodes = [n for n in (await self.describe_cluster()).nodes if n.address]

        async def ask(address: str) -> Any:
            try:
                return await self._call(address, sms_pb2_grpc.ControlStub, "ReadAudit", request)
            except (errors.Unavailable, errors.Timeout) as e:     # (a node down: named, the others answer)
                return e
        answers = await asyncio.gather(*(ask(n.address) for n in nodes))
        events: list[dict[str, Any]] = []
        truncated = False
        unanswered: dict[str, str] = {}
        for node, answer in zip(nodes, answers):
            if isinstance(answer, errors.SmsError):
                unanswered[node.node_id] = f"{answer.name}: {answer.message}"
                continue
            truncated = truncated or answer.truncated
            events.extend(json.loads(line) for line in answer.events)
        events.sort(key=lambda e: (e.get("ts_ms", 0), e.get("node", "")))    # (stable: each node's order)
        return {"events": events[-limit:], "truncated": truncated or len(events) > limit,
                "unanswered": unanswered}

    async def delete_tenant(self, name: str) -> None:
        """Delete a tenant; its keys go with it.

        Raises:
            TenantNotFound, FailedPrecondition (it still has streams)."""
        await self._admin_call("DeleteTenant", sms_pb2.TenantRequest(name=name))

    async def list_keys(self) -> list[dict[str, Any]]:
        """Every key the caller may see: {key_id, tenant, role, streams, name, created_ms}
        (never a token)."""
        return [_key_info(k) for k in (await self._admin_call("ListKeys", sms_pb2.Empty())).keys]

    async def revoke_key(self, key_id: str) -> None:
        """Revoke a key: returns once no node admits its token any more (about KEY_CACHE_TTL_S).

        Raises:
            KeyNotFound."""
        await self._admin_call("RevokeKey", sms_pb2.RevokeKeyRequest(key_id=key_id))

    async def delete_stream(self, name: str) -> None:
        """Delete a stream and every record of it. Raises StreamNotFound."""
        await self._admin_call("DeleteStream", sms_pb2.DeleteStreamRequest(name=name))
        self._streams.pop(name, None)

    async def repartition_stream(self, name: str, op: str, *, partitions: Iterable[int | str] = (),
                                 at_hash: int | str | None = None, target_partitions: int = 0) -> StreamInfo:
        """split / merge / scale a stream while it runs; returns the stream once the new map
        is committed (for scale, the last of its steps). See `split`, `merge`, `scale`.

        Args:
            name: the stream.
            op: "split", "merge" or "scale".
            partitions: the partition (split) or two partitions (merge), ids or ordinals.
            at_hash: where a split cuts (its middle by default).
            target_partitions: how many even ranges a scale makes.

        Raises:
            StreamNotFound, PartitionNotFound, PartitionNotOpen, PartitionsNotAdjacent,
            InvalidSplitPoint, RepartitionInProgress, TooManyPartitions, RescaleTooSoon,
            InvalidArgument."""
        ordinals = [p if isinstance(p, int) else parse_partition_id(p) for p in partitions]
        req = sms_pb2.RepartitionStreamRequest(name=name, op=op, partitions=ordinals,
                                               at_hash="" if at_hash is None else str(at_hash),
                                               target_partitions=target_partitions,
                                               request_id=secrets.token_hex(8))   # one id for every retry
        pb = await self._admin_call("RepartitionStream", req, timeout_s=limits.REPARTITION_WAIT_S + self.timeout_s)
        info = convert.stream_from_pb(pb)
        self._streams[name] = info
        return info

    async def split(self, name: str, partition: int | str, at_hash: int | str | None = None) -> StreamInfo:
        """Split an open partition at `at_hash` (its middle by default) into two children;
        returns the new map. Raises as `repartition_stream`."""
        return await self.repartition_stream(name, "split", partitions=[partition], at_hash=at_hash)

    async def merge(self, name: str, partition_a: int | str, partition_b: int | str) -> StreamInfo:
        """Merge two open partitions with adjacent hash ranges into one child; returns the
        new map. Raises as `repartition_stream`."""
        return await self.repartition_stream(name, "merge", partitions=[partition_a, partition_b])

    async def scale(self, name: str, target_partitions: int) -> StreamInfo:
        """Split and merge toward `target_partitions` even hash ranges; returns the map
        after the last step. Raises as `repartition_stream`."""
        return await self.repartition_stream(name, "scale", target_partitions=target_partitions)

    async def update_stream(self, name: str, *, retention_hours: int | None = None, retention_s: int | None = None,
                            protect_unread: bool | None = None, auto_split_records_per_s: int | None = None,
                            auto_split_period_s: int | None = None, write_records_per_s: int | None = None,
                            write_bytes_per_s: int | None = None, read_bytes_per_s: int | None = None,
                            archive: str | None = None, archive_after_s: int | None = None,
                            local_retention_s: int | None = None, compression: str | None = None,
                            encryption: str | None = None, tags: dict[str, str] | None = None,
                            untag: list[str] | None = None, shard_metrics: list[str] | None = None,
                            shard_metrics_add: list[str] | None = None,
                            shard_metrics_remove: list[str] | None = None) -> StreamInfo:
        """Change retention, unread-record protection, automatic splitting, the
        per-partition limits, tags (`tags` added or changed, the keys in `untag` removed;
        at most STREAM_TAGS_MAX), the shard-level metrics a Kinesis client enabled (set, or
        `shard_metrics_add` / `shard_metrics_remove` merged with the stored set), encryption at rest ("aes-256-gcm" or "none": batches stored
        from then on) or the archive tier while it runs (an archive may be added
        to a stream that has none; it cannot be moved or removed: see `create_stream`
        for the archive's settings). A limit of 0 removes it: writes over
        `write_records_per_s` or `write_bytes_per_s` get `Throttled` (retriable, with the
        wait in its message; producers back off by themselves); reads over
        `read_bytes_per_s` are slowed down. None leaves a setting as it is. Returns the
        stream's map with the change.

        Raises:
            StreamNotFound, InvalidStreamConfig, TenantLimitExceeded."""
        for key, value in (("archive_after_s", archive_after_s), ("local_retention_s", local_retention_s)):
            # (on the wire 0 means "unchanged", for clients that predate these settings)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise errors.InvalidStreamConfig(f"{key} {value!r}; expected at least 1 s")
        req = sms_pb2.UpdateStreamRequest(
            name=name, retention_hours=retention_hours or 0, retention_s=retention_s or 0,
            protect_unread="" if protect_unread is None else ("true" if protect_unread else "false"),
            auto_split_records_per_s=-1 if auto_split_records_per_s is None else auto_split_records_per_s,
            auto_split_period_s=auto_split_period_s or 0,
            write_records_per_s=-1 if write_records_per_s is None else write_records_per_s,
            write_bytes_per_s=-1 if write_bytes_per_s is None else write_bytes_per_s,
            read_bytes_per_s=-1 if read_bytes_per_s is None else read_bytes_per_s,
            archive=archive or "", archive_after_s=-1 if archive_after_s is None else archive_after_s,
            local_retention_s=-1 if local_retention_s is None else local_retention_s,
            compression=compression or "", encryption=encryption or "", tags_set=tags or {},
            tags_removed=list(untag or ()), set_shard_metrics=shard_metrics is not None,
            shard_metrics=list(shard_metrics or ()), shard_metrics_add=list(shard_metrics_add or ()),
            shard_metrics_remove=list(shard_metrics_remove or ()))
        info = convert.stream_from_pb(await self._admin_call("UpdateStream", req))
        self._streams[name] = info
        return info

    async def rewrap_data_keys(self) -> int:
        """Master key rotation, step two (docs/security.md, "Encryption at rest"): every
        encrypted stream's data key wrapped again by the current master key of the control
        leader's key file (add the new key to every node's key file first). Returns how many
        were. Raises PermissionDenied (cluster admins only), FailedPrecondition."""
        answer = await self._admin_call("RewrapDataKeys", sms_pb2.Empty())
        return int(answer.rewrapped)

    async def update_retention(self, name: str, *, hours: int | None = None, seconds: int | None = None) -> StreamInfo:
        """`update_stream` of the retention only, in hours or seconds; returns the map.

        Raises:
            StreamNotFound, InvalidStreamConfig, TenantLimitExceeded."""
        return await self.update_stream(name, retention_hours=hours, retention_s=seconds)

    async def trim_stream(self, name: str, *, before_sn: int | str | None = None,
                          before_time_ms: int | None = None) -> None:
        """Delete records before an SN (of its partition) or older than a time (every
        partition), on every replica, in the background.

        Raises:
            StreamNotFound, InvalidSequenceNumber, InvalidArgument (neither or both given)."""
        await self._admin_call("TrimStream", sms_pb2.TrimStreamRequest(
            name=name, before_sn="" if before_sn is None else str(before_sn), before_ms=before_time_ms or 0))

    async def list_nodes(self) -> list[NodeLoad]:
        """Every storage node that is live or holds a replica: its replicas, heads and
        learners, and whether it is draining."""
        return convert.node_loads_from_pb(await self._admin_call("ListNodes", sms_pb2.Empty()))

    async def drain_node(self, node_id: str, *, undo: bool = False) -> list[NodeLoad]:
        """Empty a storage node before removing it: its replicas move to the other nodes
        while writes go on (each chain keeps its replication factor throughout), and
        nothing new is placed on it. Returns at once; `list_nodes` shows the progress.
        `undo=True` stops draining. Returns every node's load, as `list_nodes`.

        Raises:
            NodeNotFound, NotEnoughNodes (no other node can take its replicas)."""
        return convert.node_loads_from_pb(await self._admin_call(
            "DrainNode", sms_pb2.DrainNodeRequest(node_id=node_id, undo=undo)))

    async def remove_node(self, node_id: str) -> list[NodeLoad]:
        """Forget a storage node for good, once it is drained and stopped: its draining mark
        and every other entry the cluster keeps of it go, so `list_nodes` no longer shows it.
        Returns the other nodes' loads, as `list_nodes`.

        Raises:
            NodeNotFound, NodeLive (it runs: stop it first), NodeNotDrained (it holds replicas)."""
        return convert.node_loads_from_pb(await self._admin_call(
            "RemoveNode", sms_pb2.RemoveNodeRequest(node_id=node_id)))

    async def list_streams(self) -> list[str]:
        """The names of the streams the caller may see."""
        pb = await self._discovery_call("ListStreams", sms_pb2.Empty())
        return list(pb.names)

    async def init_producer(self, stream: str, producer_id: bytes) -> int:
        """A new epoch for the named producer `producer_id` of `stream` (docs/dedup.md,
        "Producer epochs"): writes of its earlier epochs are refused with ProducerFenced
        from the answer on. Any node answers. The producers call it when they open.

        Raises:
            StreamNotFound, StreamNotActive, InvalidProducerId, PermissionDenied."""
        answer = await self._discovery_call("InitProducer", sms_pb2.InitProducerRequest(
            stream=stream, producer_id=producer_id))
        return int(answer.epoch)

    async def get_stream_info(self, name: str, *, refresh: bool = True) -> StreamInfo:
        """The stream's map: status, settings and partitions with their chains.
        `refresh=False` answers from this client's cache when it holds the stream.
        Raises StreamNotFound."""
        if not refresh and name in self._streams:
            return self._streams[name]
        pb = await self._discovery_call("DescribeStream", sms_pb2.DescribeStreamRequest(name=name))
        info = convert.stream_from_pb(pb)
        self._streams[name] = info
        return info
