"""The asyncio client: `sms.aio.Client(address)`.

It discovers the cluster from any one node address (DescribeCluster), caches each
stream's map (DescribeStream) and routes every record to the ingestion owner of its
partition; records answered with a "refresh your map" error (WrongOwner,
PartitionClosed, Unavailable) are re-routed transparently after a refresh, with a
bounded number of attempts. Reads go to a replica of the iterator's partition; if that
node fails, another member of the chain is tried.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import json
import random
import secrets
import time
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import grpc

from sms import wire, convert, errors, limits, metadata, payloads, rpc, security, seqno
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.payloads import PayloadRef
from sms.records import encode_put, needs_reference, record_fields
from sms.tokens import peek
from sms.batch import RecordBatch
from sms.consumer import GroupConsumer, GroupLeases
from sms.tokens import Position
from sms.types import (ClusterInfo, Headers, NodeLoad, GetRecordBatchResult, GetRecordsResult, IteratorType,
                       PartitionInfo, PartitionState, PutRecordResult, PutRecordsResult, Record, RecordInput, Routes,
                       StreamInfo, parse_partition_id, partition_id)

if TYPE_CHECKING:
    from sms.producer import Producer



def _encode_puts(records: Iterable[RecordInput]) -> list[tuple[bytes, int]]:
    """(entry, hash key) per record, or the named error of the first bad one."""
    entries, hashes = wire.encode_puts(records, encode_put)
    return list(zip(entries, hashes))


def _page(ordinal: int, slices: Iterable[Any], next_iterator: str, behind_ms: int,
          children: Iterable[str]) -> GetRecordsResult:
    """A page of a GetNextRecords answer or a Subscribe event, decoded into `Record`s."""
    records: list[Record] = []
    for s in slices:
        records.extend(wire.decode_records(s.batch, s.start, s.end, ordinal))
    return GetRecordsResult(records=records, next_iterator=next_iterator or None, millis_behind_latest=behind_ms,
                            child_partitions=tuple(children))


def _descendants_and(by: Mapping[int, PartitionInfo], ordinals: set[int]) -> set[int]:
    out: set[int] = set()
    todo = list(ordinals)
    while todo:
        o = todo.pop()
        if o in out:
            continue
        out.add(o)
        if o in by:
            todo.extend(by[o].children)
    return out


TENANT_LIMITS = metadata.TenantConfig.LIMITS
_log = logging.getLogger(__name__)


def _tenant_dict(pb: sms_pb2.TenantInfo) -> dict[str, Any]:
    return {"name": pb.name, **{f: getattr(pb, f) for f in TENANT_LIMITS}}


def _key_info(pb: sms_pb2.KeyInfo) -> dict[str, Any]:
    return {"key_id": pb.key_id, "tenant": pb.tenant, "role": pb.role, "streams": list(pb.streams), "name": pb.name,
            "created_ms": pb.created_ms}


class Client:
    """A client of the cluster at `address` ("host:port[,host:port...]", any nodes).

    TLS (docs/security.md): `ca_file` is the cluster CA's certificate to trust, and
    `cert_file`/`key_file` an optional client certificate to present. Without `ca_file`
    the client reads $SMS_CA_FILE ($SMS_CERT_FILE, $SMS_KEY_FILE); with neither, or with
    `ca_file=""`, it speaks plaintext (a cluster started with `sms up --insecure`).
    `token`: the token of a key (`sms key create`; default $SMS_TOKEN), sent with every
    call over TLS, never over plaintext.
    `Client.from_cluster_file(path)` takes all of it from `sms up`'s DIR/cluster.json.

    Errors are `sms.errors` classes (`SmsError`). Besides those each method names, any
    call may raise Unavailable (no node answered, or no control leader), Timeout,
    TlsHandshakeFailed, Unauthenticated or PermissionDenied (the key's role or streams),
    and Throttled (a tenant or stream limit)."""

    def __init__(self, address: str, *, timeout_s: float = limits.RPC_TIMEOUT_S, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None, token: str | None = None,
                 payloads: str = "inline") -> None:
        """A client of the nodes at `address`; no call is made until the first method.

        Args:
            address: "host:port[,host:port...]", any nodes of the cluster.
            timeout_s: the deadline of each call.
            ca_file, cert_file, key_file: TLS files (see the class docstring); None reads
                $SMS_CA_FILE, $SMS_CERT_FILE, $SMS_KEY_FILE.
            token: a key's token (None: $SMS_TOKEN), sent over TLS only.
            payloads: what reads give for a record stored by reference (a payload over
                RECORD_DATA_BYTES_MAX): "inline", the payload in `Record.data` (up to
                PAYLOAD_INLINE_READ_BYTES_MAX; a larger one stays a reference), or
                "reference", its reference; `Record.payload` names it either way and
                `open_payload` streams it (docs/api.md, "Payloads by reference").

        Raises:
            InvalidArgument: a TLS file that cannot be read, or another `payloads`."""
        if payloads not in ("inline", "reference"):
            raise errors.InvalidArgument(f"payloads {payloads!r}; expected inline or reference")
        self.payloads = payloads
        self.address = address
        self.timeout_s = timeout_s
        self.tls = security.TlsConfig.resolve(ca_file, cert_file, key_file)
        # the key's token goes with every call, over TLS only: never in clear text
        token = security.resolve_token(token)
        self._metadata = (("authorization", f"Bearer {token}"),) if token and self.tls is not None else None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._streams: dict[str, StreamInfo] = {}
        self._routes: dict[str, Routes] = {}
        self._cluster: ClusterInfo | None = None
        self._shunned: dict[str, float] = {}       # address -> until when discovery asks it last
        self._read_member: dict[tuple[str, int], int] = {}

    @classmethod
    def from_cluster_file(cls, path: str, **kwargs: Any) -> "Client":
        """A client of the cluster `sms up` runs: its DIR/cluster.json (or DIR) names the
        address, the CA and the admin token.

        Args:
            path: the cluster file, or the DIR that holds it.
            **kwargs: `Client` options, over those the file gives.

        Raises:
            InvalidArgument: the file cannot be read, is not JSON or names no address."""
        address, options = security.cluster_file_options(path)
        return cls(address, **{**options, **kwargs})

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every channel this client opened. Idempotent; raises nothing."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    # --- plumbing ---------------------------------------------------------------------
    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = rpc.aio_channel(address, self.tls)
        return channel

    async def _call(self, address: str, stub_cls: Any, method: str, request: Any,
                    timeout_s: float | None = None) -> Any:
        stub = stub_cls(self._channel(address))
        try:
            return await getattr(stub, method)(request, timeout=timeout_s or self.timeout_s, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            error = rpc.to_sms_error(e)
            raise (rpc.plaintext_refused(error) if self.tls is None else error) from None

    async def send_put_records(self, address: str, request: sms_pb2.PutRecordsRequest, *,
                               timeout_s: float = limits.PUT_TIMEOUT_S) -> sms_pb2.PutRecordsResponse:
        """The producers' transport: one PutRecords, as built, to the ingestion node at
        `address`, with no routing and no retry (`sms.producer.Producer` decides those).
        Raises the call's named error (`SmsError`)."""
        response: sms_pb2.PutRecordsResponse = await self._call(address, sms_pb2_grpc.IngestionStub, "PutRecords", request, timeout_s=timeout_s)
        return response

    async def _discovery_call(self, method: str, request: Any, learn_cluster: bool = True) -> Any:
        """A read-only Control call to the first node that answers: the addresses this
        client was given ("host:port[,host:port...]"), then every node it has seen (any
        node answers these). The first success also learns the cluster's nodes, so the
        client outlives the node it was pointed at."""
        seeds = [a.strip() for a in self.address.split(",") if a.strip()]
        addresses = seeds + [n.address for n in (self._cluster.nodes if self._cluster else ())]
        now = asyncio.get_running_loop().time()
        # a node that failed a moment ago is asked last (stable: the given order otherwise)
        ordered = sorted(dict.fromkeys(addresses), key=lambda a: self._shunned.get(a, 0.0) > now)
        last: errors.SmsError | None = None
        for address in ordered:
            try:
                answer = await self._call(address, sms_pb2_grpc.ControlStub, method, request)
            except (errors.Unavailable, errors.Timeout) as e:     # down, or cut off: the next node
                last = e
                self._shunned[address] = asyncio.get_running_loop().time() + limits.CLIENT_SHUN_S
                continue
            self._shunned.pop(address, None)
            if learn_cluster and self._cluster is None:
                try:
                    await self.describe_cluster()
                except errors.SmsError:
                    pass
            return answer
        raise last or errors.Unavailable("no node answered")

    async def describe_cluster(self) -> ClusterInfo:
        """The cluster's nodes (id, address, roles, metrics address) and its control
        leader's address, from the first node that answers (and learnt for discovery)."""
        self._cluster = convert.cluster_from_pb(await self._discovery_call("DescribeCluster", sms_pb2.Empty(),
                                                                           learn_cluster=False))
        return self._cluster

    async def _admin_call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        """An admin call to the control leader; while leadership moves (the leader died,
        a standby takes over) it re-resolves the leader and retries, up to a deadline."""
        deadline = asyncio.get_running_loop().time() + limits.CLIENT_LEADER_WAIT_S
        while True:
            try:
                cluster = await self.describe_cluster()
                if not cluster.control_address:
                    raise errors.Unavailable("the cluster has no control leader registered")
                return await self._call(cluster.control_address, sms_pb2_grpc.ControlStub, method, request,
                                        timeout_s=timeout_s)
            except errors.Unavailable:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(limits.CONTROL_ELECTION_RETRY_S)

    # --- admin -------------------------------------------------------------------------
    async def create_stream(self, name: str, partitions: int = 1, replication_factor: int = 1, *,
                            persistence: str = "disk", ingestion_policy: str = "at_least_once_no_dup",
                            retention_hours: int = 0,
                            dedup_window_s: int = limits.DEDUP_WINDOW_MS_DEFAULT // 1000,
                            min_in_sync: int = 1, retention_s: int = 0, archive: str = "",
                            archive_after_s: int = 0, local_retention_s: int = 0,
                            compression: str = "", encryption: str = "none") -> StreamInfo:
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
                                          compression=compression, encryption=encryption)
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
                            encryption: str | None = None) -> StreamInfo:
        """Change retention, unread-record protection, automatic splitting, the
        per-partition limits, encryption at rest ("aes-256-gcm" or "none": batches stored
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
            compression=compression or "", encryption=encryption or "")
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

    # --- consumer groups (sms/consumer.py) ------------------------------------------------
    def consumer(self, stream: str, group: str, **options: Any) -> GroupConsumer:
        """A member of the consumer group `group` of `stream`: `async with` it and iterate
        for ConsumerBatch-es. Options: member_id, start (TRIM_HORIZON, LATEST or
        AT_TIMESTAMP with timestamp_ms) for partitions the group has not read yet,
        auto_checkpoint (True), failover_s, max_records, wait_ms, skip_trimmed (False).

        Raises:
            InvalidArgument: a bad option (the stream is checked when it is opened:
                StreamNotFound)."""
        return GroupConsumer(self, stream, group, **options)

    async def list_groups(self, stream: str) -> list[str]:
        """The names of the stream's consumer groups. Raises StreamNotFound."""
        return list((await self._discovery_call("ListGroups", sms_pb2.ListGroupsRequest(stream=stream))).groups)

    async def describe_group(self, stream: str, group: str) -> dict[str, Any]:
        """The group's members and, per partition of its lease table, the owner, the
        checkpoint, records processed under the lease, and how far the checkpoint is
        behind the partition's last committed record (ms; 0 at its end).

        Raises:
            GroupNotFound, StreamNotFound."""
        state = await GroupLeases(self, stream, group).state()
        if not state.leases and not state.members:
            raise errors.GroupNotFound(f"stream {stream!r} has no consumer group {group!r}")
        now_ms = int(time.time() * 1000)
        members = []
        for m in state.members:
            d = json.loads(m.value)
            members.append({"member": m.key, "host": d.get("host", ""), "pid": d.get("pid", 0),
                            "heartbeat_age_ms": max(0, now_ms - int(d.get("heartbeat_ms", 0)))})
        info = await self.get_stream_info(stream)
        by = {p.ordinal: p for p in info.partitions}
        partitions = []
        for e in sorted(state.leases, key=lambda e: int(e.key)):
            d = json.loads(e.value)
            ordinal = int(e.key)
            checkpoint = str(d.get("checkpoint", ""))
            lag_ms = 0
            if checkpoint != "SHARD_END" and ordinal in by:
                latest = peek(await self.get_iterator(stream, ordinal, "LATEST")).position_sn - 1
                done = int(checkpoint) if checkpoint.isdigit() else 0
                if latest > done:
                    lag_ms = max(0, seqno.timestamp_ms_of(latest) - (seqno.timestamp_ms_of(done) if done else
                                                                      by[ordinal].valid_from_ms))
            partitions.append({"partition_id": partition_id(ordinal), "owner": d.get("owner", ""),
                               "checkpoint": checkpoint, "records": int(d.get("records", 0)),
                               "lag_ms": lag_ms, "state": by[ordinal].state.value if ordinal in by else "DROPPED"})
        return {"stream": stream, "group": group, "members": members, "partitions": partitions}

    async def reset_group(self, stream: str, group: str, *, to: str = "TRIM_HORIZON", timestamp_ms: int = 0,
                          sequence_numbers: dict[str, str] | None = None) -> None:
        """Move the group's checkpoints: to TRIM_HORIZON, LATEST, AT_TIMESTAMP
        (`timestamp_ms`), or per-partition SNs to resume after (`sequence_numbers`,
        partition id -> SN; partitions not named from TRIM_HORIZON). LATEST is the end of
        each partition now, as Kafka's --to-latest: what is written after the reset is
        read. Running members lose their leases at their next write and resume from the
        new checkpoints.

        Raises:
            StreamNotFound, GroupNotFound, InvalidArgument, InvalidSequenceNumber."""
        if to == "LATEST" and not sequence_numbers:
            sequence_numbers = {}
            for p in (await self.get_stream_info(stream)).partitions:
                if p.state is PartitionState.OPEN:
                    last = peek(await self.get_iterator(stream, p.ordinal, "LATEST")).position_sn - 1
                    if last > 0 and seqno.ordinal_of(last) == p.ordinal:
                        sequence_numbers[p.partition_id] = str(last)
        await self._discovery_call("ResetGroup", sms_pb2.ResetGroupRequest(
            stream=stream, group=group, position=to, timestamp_ms=timestamp_ms,
            sequence_numbers={k: str(v) for k, v in (sequence_numbers or {}).items()}))

    async def delete_group(self, stream: str, group: str) -> None:
        """Delete a consumer group: its leases, checkpoints and members. Raises
        GroupNotFound, StreamNotFound."""
        await self._discovery_call("DeleteGroup", sms_pb2.GroupRequest(stream=stream, group=group))

    async def register_consumer(self, stream: str, consumer: str) -> None:
        """Register a consumer: while the stream protects unread records, nothing it has not
        checkpointed past is trimmed. Raises StreamNotFound."""
        await self.checkpoint_consumer(stream, consumer, {})

    async def checkpoint_consumer(self, stream: str, consumer: str,
                                  checkpoints: Mapping[int, int | str] | Mapping[str, int | str]) -> None:
        """Record, per partition (ordinal or id), the SN of the last record processed, or
        "SHARD_END" once a closed partition is read to its end.

        Raises:
            StreamNotFound, PartitionNotFound (a bad partition id), InvalidSequenceNumber."""
        pb = {(p if isinstance(p, int) else parse_partition_id(p)): str(sn) for p, sn in checkpoints.items()}
        await self._admin_call("UpdateConsumer", sms_pb2.UpdateConsumerRequest(
            stream=stream, consumer=consumer, checkpoints=pb))

    async def deregister_consumer(self, stream: str, consumer: str) -> None:
        """Forget a registered consumer: its unread records no longer hold retention back.
        Raises StreamNotFound."""
        await self._admin_call("UpdateConsumer", sms_pb2.UpdateConsumerRequest(
            stream=stream, consumer=consumer, remove=True))

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

    # --- writes -------------------------------------------------------------------------
    async def put_record(self, stream: str, data: bytes, partition_key: str, *,
                         explicit_hash_key: int | str | None = None,
                         headers: Headers | None = None) -> PutRecordResult:
        """Store one record (with optional headers: name -> bytes, read back as
        `Record.headers`); returns its result or raises its named error.

        Args:
            stream: the stream.
            data: the record's bytes (at most RECORD_DATA_BYTES_MAX).
            partition_key: routes the record (its MD5), 1..256 characters.
            explicit_hash_key: routes it instead of the key's hash (0..2^128-1).
            headers: name -> bytes or str.

        Raises:
            InvalidPartitionKey, InvalidHashKey, RecordTooLarge, InvalidRecordHeader,
            InvalidArgument (data that is not bytes), StreamNotFound, and the record's
            own error (e.g. Throttled, NotEnoughReplicas, Unavailable) after retries."""
        record: RecordInput = ((partition_key, data, explicit_hash_key, headers) if headers
                               else (partition_key, data, explicit_hash_key))
        result = (await self.put_records(stream, [record])).records[0]
        if not result.ok:
            raise errors.from_name(result.error_name, result.error_message)
        return result

    async def put_records(self, stream: str, records: Iterable[RecordInput]) -> PutRecordsResult:
        """Store 1..500 records; one result per record, in order. A failed record does
        not fail the others (its result names the error); routing errors are retried
        transparently. Over a write limit, the records that fit are stored and the rest
        answered `Throttled` (with a retry hint), for the caller to resend.

        Args:
            stream: the stream.
            records: (partition_key, data[, explicit_hash_key[, headers]]) tuples or
                dicts with those names.

        Raises:
            RequestTooLarge (count or bytes), InvalidArgument (a record of another
            shape), InvalidPartitionKey, InvalidHashKey, RecordTooLarge,
            InvalidRecordHeader, StreamNotFound."""
        uploads: list[tuple[int, PayloadRef]] = []
        if not isinstance(records, (list, tuple)):
            records = list(records)        # (read twice when some go by reference)
        try:
            encoded = _encode_puts(records)
        except (errors.RecordTooLarge, errors.InvalidArgument):
            # (only then: a put of ordinary records pays nothing for this)
            if not any(needs_reference(r) for r in records):
                raise
            if not 1 <= len(records) <= limits.PUT_RECORDS_COUNT_MAX:
                raise errors.RequestTooLarge(f"{len(records)} records; expected 1..{limits.PUT_RECORDS_COUNT_MAX}")
            records, uploads = await self.upload_payloads(stream, records)
            try:
                encoded = _encode_puts(records)
            except BaseException:
                for _i, ref in uploads:
                    await asyncio.to_thread(payloads.discard, ref)
                raise
        if not 1 <= len(encoded) <= limits.PUT_RECORDS_COUNT_MAX:
            raise errors.RequestTooLarge(f"{len(encoded)} records; expected 1..{limits.PUT_RECORDS_COUNT_MAX}")
        total = sum(len(e) - wire.ENTRY.size for e, _ in encoded)
        if total > limits.PUT_RECORDS_BYTES_MAX:
            raise errors.RequestTooLarge(f"request of {total} bytes of keys and data; "
                                         f"at most {limits.PUT_RECORDS_BYTES_MAX}")
        results: list[PutRecordResult | None] = [None] * len(encoded)
        todo = list(range(len(encoded)))
        info = await self.get_stream_info(stream, refresh=stream not in self._streams)
        for attempt in range(limits.CLIENT_REDIRECT_RETRIES_MAX + 1):
            routes = self._routes.get(stream)
            if routes is None or routes.info is not info:
                routes = self._routes[stream] = Routes(info)
            groups: dict[str, list[int]] = {}
            owner_of = routes.owner_address
            for i in todo:
                owner = owner_of(encoded[i][1])
                group = groups.get(owner)
                if group is None:
                    groups[owner] = [i]
                else:
                    group.append(i)
            outcomes = await asyncio.gather(*(self._put_group(stream, address, idx, encoded)
                                              for address, idx in groups.items()))
            retry = []
            for answers in outcomes:
                for i, result in answers:
                    err = errors.registry().get(result.error_name)
                    # (Throttled is the caller's to retry, as Kinesis's per-record
                    # ProvisionedThroughputExceededException: the limit admitted what fitted)
                    if result.ok or err is None or not err.retriable or issubclass(err, errors.Throttled) \
                            or attempt == limits.CLIENT_REDIRECT_RETRIES_MAX:
                        results[i] = result
                    else:
                        retry.append(i)
            if not retry:
                break
            todo = retry
            await asyncio.sleep(limits.CLIENT_REDIRECT_BACKOFF_S * (attempt + 1))
            info = await self.get_stream_info(stream)
        done = PutRecordsResult(tuple(cast(list[PutRecordResult], results)))   # (every index is set by now)
        for i, ref in uploads:
            error = errors.registry().get(done.records[i].error_name)
            if error is not None and not error.retriable:      # (surely not stored: its upload goes)
                await asyncio.to_thread(payloads.discard, ref)
        return done

    async def upload_payloads(self, stream: str, records: Sequence[RecordInput]
                            ) -> tuple[list[RecordInput], list[tuple[int, PayloadRef]]]:
        """`records` with each payload over the inline limit (or given as a binary file)
        uploaded to the stream's archive store and replaced by its reference (a record
        with the header `sms-payload`: sms/payloads.py), and which records those were.
        `put_records` and the producers call it for such records.

        Raises:
            RecordTooLarge (no archive, an encrypted stream, or over PAYLOAD_BYTES_MAX), ArchiveUnavailable,
            Timeout (an upload slower than half PAYLOAD_GRACE_S), StreamNotFound."""
        info = await self.get_stream_info(stream, refresh=stream not in self._streams)
        out: list[RecordInput] = []
        uploads: list[tuple[int, PayloadRef]] = []
        for i, r in enumerate(records):
            if not needs_reference(r):
                out.append(r)
                continue
            key, data, hash_key, headers = record_fields(r)
            if not info.archive:
                size = "a file" if payloads.is_file(data) else f"{len(data)} bytes"
                raise errors.RecordTooLarge(f"record {i}: {size} of data; at most {limits.RECORD_DATA_BYTES_MAX} "
                                            f"inline, and stream {stream!r} has no archive to keep larger payloads "
                                            "by reference (create_stream(..., archive=URL))")
            if info.encryption != "none":
                # (this client writes a payload straight to the store, where it would rest in
                # clear: an encrypted stream keeps every record inside its sealed batches)
                size = "a file" if payloads.is_file(data) else f"{len(data)} bytes"
                raise errors.RecordTooLarge(f"record {i}: {size} of data; at most {limits.RECORD_DATA_BYTES_MAX} "
                                            f"in stream {stream!r}, which is encrypted: payloads by reference "
                                            "are not")
            ref = await asyncio.to_thread(payloads.upload, info.archive, info.payload_prefix, data)
            uploads.append((i, ref))
            reference = ref.to_bytes()
            out.append((key, reference, hash_key, {**(headers or {}), payloads.HEADER: reference}))
        return out, uploads

    async def _with_payloads(self, stream: str, records: list[Record]) -> tuple[list[Record], int | None]:
        """`records` with each payload stored by reference read back into `data` (this
        client's `payloads="inline"`, each up to PAYLOAD_INLINE_READ_BYTES_MAX), and the SN
        of the first record left out when the page's payloads passed
        PAYLOAD_INLINE_PAGE_BYTES_MAX (None: none was). A reference header that does not
        parse, or that names anything but the stream's own store, is left as stored."""
        if self.payloads != "inline" or not records:
            return records, None
        info = self._streams.get(stream) or await self.get_stream_info(stream, refresh=False)
        if not info.archive:
            return records, None
        out = records
        inlined = 0
        for j, r in enumerate(records):
            if not (r.meta and b"sms-payload" in r.meta):
                continue
            try:
                ref = r.payload
            except errors.InvalidArgument:   # (a header of that name that is not a reference: an ordinary record)
                ref = None
            if ref is None:
                continue
            if ref.store != info.archive or not ref.key.startswith(info.payload_prefix):
                # a reference outside the stream's own store (a forged record) is never followed
                _log.warning("record %s of %s names a payload outside the stream's archive (%s %s): not read",
                             r.sn, stream, ref.store[:80], ref.key[:80])
                continue
            if ref.size > limits.PAYLOAD_INLINE_READ_BYTES_MAX:
                continue
            if inlined and inlined + ref.size > limits.PAYLOAD_INLINE_PAGE_BYTES_MAX:
                return out[:j], r.sn          # (the rest next page: memory stays bounded)
            inlined += ref.size
            if out is records:
                out = list(records)
            out[j] = r._replace(data=await asyncio.to_thread(payloads.read_all, ref))
        return out, None

    def open_payload(self, record: Record | PayloadRef, offset: int = 0, *,
                     stream: str | None = None) -> payloads.PayloadReader:
        """A record's payload stored by reference, as a binary file object read chunk by
        chunk (at most two chunks in memory, checksums verified), from `offset` -- where
        a reader that stopped goes on. Its reads block: call them from a thread in async
        code.

        `stream`: the stream the record was read from, to check that the reference names
        that stream's own archive (pass it when writers are not trusted: a forged record
        could name any store the reader can reach).

        Raises:
            InvalidArgument (a record without a payload by reference, an offset past its
            end, or one outside `stream`'s archive); its reads raise FragmentCorrupt,
            FragmentMissing, ArchiveUnavailable."""
        ref = record if isinstance(record, PayloadRef) else record.payload
        if ref is None:
            raise errors.InvalidArgument("the record carries its data inline, not a payload by reference")
        if stream is not None:
            info = self._streams.get(stream)
            if info is None or ref.store != info.archive or not ref.key.startswith(info.payload_prefix):
                raise errors.InvalidArgument(f"the payload ({ref.store[:80]} {ref.key[:80]}) is not in stream "
                                             f"{stream!r}'s archive (or the stream was not read by this client)")
        return payloads.open_payload(ref, offset)

    async def _put_group(self, stream: str, address: str, indexes: list[int],
                         encoded: list[tuple[bytes, int]]) -> list[tuple[int, PutRecordResult]]:
        if not address:
            err = errors.Unavailable("no ingestion owner for the partition yet")
            return [(i, PutRecordResult(error_name=err.name, error_message=err.message)) for i in indexes]
        req = sms_pb2.PutRecordsRequest(stream=stream, count=len(indexes),
                                        entries=b"".join(encoded[i][0] for i in indexes))
        try:
            resp = await self.send_put_records(address, req)
        except errors.SmsError as e:
            if not e.retriable:
                raise
            return [(i, PutRecordResult(error_name=e.name, error_message=e.message)) for i in indexes]
        failed = {e.index: e for e in resp.errors}
        out: list[tuple[int, PutRecordResult]] = []
        sns, ordinals = wire.decode_put_results(resp.sequence_numbers, resp.ordinals, len(indexes))
        for j, i in enumerate(indexes):
            if j in failed:
                out.append((i, PutRecordResult(partition_ordinal=ordinals[j], error_name=failed[j].name,
                                               error_message=failed[j].message)))
            else:
                out.append((i, PutRecordResult(sns[j], ordinals[j])))
        return out

    # --- reads ----------------------------------------------------------------------------
    async def _read_address(self, stream: str, ordinal: int, refresh: bool) -> str:
        """The replica of the partition this client reads from (one per partition, kept
        until it fails: `_next_replica`)."""
        info = await self.get_stream_info(stream, refresh=refresh or stream not in self._streams)
        try:
            partition = info.partition(ordinal)
        except LookupError:
            raise errors.PartitionNotFound(f"stream {stream!r} has no partition p{ordinal:04d}") from None
        members = [m for m in partition.chain if m.address]
        if not members:
            raise errors.Unavailable(f"partition p{ordinal:04d} of {stream!r} has no live replica")
        key = (stream, ordinal)
        if key not in self._read_member:
            self._read_member[key] = random.randrange(len(members))
        return members[self._read_member[key] % len(members)].address

    def _position(self, iterator: str) -> Position:
        """Where an iterator points, its stream as this client names it: on a secure
        cluster a tenant's stream is stored, and named in its tokens, as tenant~name
        (docs/security.md), and its clients know it by the name alone."""
        pos = peek(iterator)
        if self.tls is not None and metadata.TENANT_SEP in pos.stream:
            pos = dataclasses.replace(pos, stream=pos.stream.partition(metadata.TENANT_SEP)[2])
        return pos

    def _next_replica(self, stream: str, ordinal: int) -> None:
        key = (stream, ordinal)
        self._read_member[key] = self._read_member.get(key, 0) + 1

    async def _read_call(self, stream: str, ordinal: int, method: str, request: Any,
                         timeout_s: float | None = None) -> Any:
        """Send a retrieval call to a replica of the partition, failing over along the chain."""
        last: errors.SmsError | None = None
        for attempt in range(limits.CLIENT_UNAVAILABLE_RETRIES_MAX):
            address = await self._read_address(stream, ordinal, refresh=attempt > 0)
            try:
                return await self._call(address, sms_pb2_grpc.RetrievalStub, method, request, timeout_s)
            except errors.SmsError as e:
                if not e.retriable:
                    raise
                last = e
                self._next_replica(stream, ordinal)
                await asyncio.sleep(limits.CLIENT_REDIRECT_BACKOFF_S)
        raise last or errors.Unavailable("no replica answered")

    async def subscribe(self, stream: str, partition_id: str | int, iterator_type: str | IteratorType = "LATEST", *,
                        sequence_number: str | int | None = None, timestamp_ms: int | None = None,
                        max_records: int = limits.SUBSCRIBE_RECORDS_MAX_DEFAULT, iterator: str | None = None,
                        skip_trimmed: bool = False) -> AsyncGenerator[GetRecordsResult, None]:
        """Push reads of one partition (Kinesis's SubscribeToShard): an async iterator of
        pages (`GetRecordsResult`) as records commit, from the position the iterator type
        names. A quiet partition sends an empty page every SUBSCRIBE_HEARTBEAT_S. The
        subscription resumes by itself when its server session ends or its replica fails;
        it ends after the page that reads a closed partition to its end (that page names
        the children and has no next iterator). Reading slowly slows the sender: pages wait
        in HTTP/2 flow control, not in an unbounded buffer. `iterator`: start where an
        iterator from get_iterator (or a page's next_iterator) points, instead.
        `skip_trimmed`: as get_next_records. The other arguments as `get_iterator`.

        Raises:
            StreamNotFound, PartitionNotFound, InvalidIteratorType, InvalidSequenceNumber,
            InvalidIterator, ExpiredIterator, RecordsTrimmed; Unavailable once the
            replicas failed CLIENT_UNAVAILABLE_RETRIES_MAX times in a row."""
        it = iterator or await self.get_iterator(stream, partition_id, iterator_type, sequence_number=sequence_number,
                                                 timestamp_ms=timestamp_ms)
        async for page in self._subscription(it, max_records, skip_trimmed):
            yield page

    async def _subscription(self, iterator: str, max_records: int,
                            skip_trimmed: bool = False) -> AsyncGenerator[GetRecordsResult, None]:
        pos = self._position(iterator)
        failures = 0
        while True:
            address = await self._read_address(pos.stream, pos.ordinal, refresh=failures > 0)
            call = sms_pb2_grpc.RetrievalStub(self._channel(address)).Subscribe(
                sms_pb2.SubscribeRequest(iterator=iterator, max_records=max_records, skip_trimmed=skip_trimmed),
                metadata=self._metadata)
            try:
                async for event in call:
                    failures = 0
                    page = _page(pos.ordinal, event.slices, event.continuation, event.millis_behind_latest,
                                 event.child_partitions)
                    records, cut = await self._with_payloads(pos.stream, page.records)
                    while cut is not None:       # (a page over the inline budget: in parts)
                        yield dataclasses.replace(page, records=records, child_partitions=(),
                                                  next_iterator=await self.get_iterator(
                                                      pos.stream, pos.ordinal, IteratorType.AT_SEQUENCE_NUMBER,
                                                      sequence_number=cut))
                        rest = [r for r in page.records if r.sn >= cut]
                        records, cut = await self._with_payloads(pos.stream, rest)
                    yield page if records is page.records else dataclasses.replace(page, records=records)
                    if not event.continuation:
                        return
                    iterator = event.continuation
            except grpc.aio.AioRpcError as e:
                error = rpc.to_sms_error(e)
                if not error.retriable or failures >= limits.CLIENT_UNAVAILABLE_RETRIES_MAX:
                    raise error from None
                failures += 1
                self._next_replica(pos.stream, pos.ordinal)
                await asyncio.sleep(min(limits.CLIENT_REDIRECT_BACKOFF_S * 2 ** failures, 2.0))
            finally:
                call.cancel()
            # the server's session ended (SUBSCRIBE_SESSION_S): resume from the continuation

    async def get_iterator(self, stream: str, partition_id: str | int, iterator_type: str | IteratorType = "TRIM_HORIZON",
                           *, sequence_number: str | int | None = None, timestamp_ms: int | None = None) -> str:
        """An iterator (an opaque token) at a position of one partition, for
        `get_next_records`.

        Args:
            stream: the stream.
            partition_id: its id ("p0003") or ordinal.
            iterator_type: TRIM_HORIZON, LATEST, AT_SEQUENCE_NUMBER, AFTER_SEQUENCE_NUMBER
                (with `sequence_number`) or AT_TIMESTAMP (with `timestamp_ms`).

        Raises:
            StreamNotFound, PartitionNotFound, InvalidIteratorType, InvalidSequenceNumber."""
        ordinal = partition_id if isinstance(partition_id, int) else parse_partition_id(partition_id)
        kind = iterator_type.value if isinstance(iterator_type, IteratorType) else str(iterator_type)
        req = sms_pb2.GetIteratorRequest(
            stream=stream, partition_id=f"p{ordinal:04d}", iterator_type=kind,
            sequence_number="" if sequence_number is None else str(sequence_number),
            timestamp_ms=timestamp_ms or 0)
        resp = await self._read_call(stream, ordinal, "GetIterator", req)
        iterator: str = resp.iterator
        return iterator

    async def get_next_records(self, iterator: str, max_records: int = 1000, wait_ms: int = 0, *,
                               skip_trimmed: bool = False) -> GetRecordsResult:
        """The next records after the iterator's position (long-polling up to `wait_ms`
        for new ones), the next iterator, and, at the end of a closed partition, its
        children and no next iterator. Records after the position that retention or a
        trim deleted before this read are RecordsTrimmed, never skipped in silence;
        `skip_trimmed=True` goes on from the oldest record left.

        Args:
            iterator: from `get_iterator` or a page's `next_iterator`.
            max_records: at most this many records (1..GET_RECORDS_COUNT_MAX).
            wait_ms: wait up to this long for a record when there is none (0: answer at once).
            skip_trimmed: see above.

        Raises:
            InvalidIterator, ExpiredIterator, RecordsTrimmed, StreamNotFound,
            PartitionNotFound, InvalidArgument."""
        pos, resp = await self._get_next(iterator, max_records, wait_ms, skip_trimmed)
        page = _page(pos.ordinal, resp.slices, resp.next_iterator, resp.millis_behind_latest, resp.child_partitions)
        records, cut = await self._with_payloads(pos.stream, page.records)
        if cut is not None:       # the next page starts at the first record left out
            return dataclasses.replace(page, records=records, child_partitions=(), next_iterator=await self.get_iterator(
                pos.stream, pos.ordinal, IteratorType.AT_SEQUENCE_NUMBER, sequence_number=cut))
        return page if records is page.records else dataclasses.replace(page, records=records)

    async def get_next_record_batch(self, iterator: str, max_records: int = 1000,
                                    wait_ms: int = 0, *, skip_trimmed: bool = False) -> GetRecordBatchResult:
        """get_next_records as columns: the page's records as one `RecordBatch`
        (`to_arrow()`, `records()`), decoded without an object per record. Arguments
        and errors as `get_next_records`."""
        pos, resp = await self._get_next(iterator, max_records, wait_ms, skip_trimmed)
        return GetRecordBatchResult(batch=RecordBatch(pos.ordinal, [(s.batch, s.start, s.end) for s in resp.slices]),
                                    next_iterator=resp.next_iterator or None,
                                    millis_behind_latest=resp.millis_behind_latest,
                                    child_partitions=tuple(resp.child_partitions))

    async def _get_next(self, iterator: str, max_records: int, wait_ms: int,
                        skip_trimmed: bool = False) -> tuple[Position, Any]:
        pos = self._position(iterator)
        req = sms_pb2.GetNextRecordsRequest(iterator=iterator, max_records=max_records, wait_ms=wait_ms,
                                            skip_trimmed=skip_trimmed)
        timeout_s = self.timeout_s + wait_ms / 1000
        try:
            resp = await self._read_call(pos.stream, pos.ordinal, "GetNextRecords", req, timeout_s)
        except (errors.StreamNotFound, errors.PartitionNotFound, errors.InvalidStreamName):
            # the client routed by the token's unverified name; let a node verify the
            # token and say what is wrong with it (forged, or its stream is gone)
            cluster = self._cluster or await self.describe_cluster()
            readers = [n.address for n in cluster.nodes if "retrieval" in n.roles]
            if not readers:
                raise
            resp = await self._call(random.choice(readers), sms_pb2_grpc.RetrievalStub, "GetNextRecords", req,
                                    timeout_s)
        return pos, resp

    async def read_stream(self, stream: str, *, start: str = "TRIM_HORIZON", timestamp_ms: int | None = None,
                          sequence_number: int | str | None = None, follow: bool = False,
                          max_records: int = 1000, wait_ms: int = 1000,
                          skip_trimmed: bool = False) -> AsyncGenerator[Record, None]:
        """Every record of the stream once, walking its lineage: a partition's records come
        only after all of its parents' (so per key, in SN order across splits and merges).

        Starts at the oldest record (TRIM_HORIZON), at LATEST, at `timestamp_ms` (in the
        partitions whose validity holds that time) or at `sequence_number` (its partition
        from that record, the others from its time). Without `follow` it ends once every
        partition is read to its current end; with it, it tails for ever, each partition
        by a subscription (`subscribe`: records pushed as they commit; `wait_ms` is no
        longer used and stays for callers that pass it). An async iterator of `Record`.
        Records deleted (retention, a trim) while the read was behind them raise
        RecordsTrimmed; `skip_trimmed=True` goes on from the oldest left.

        Raises:
            StreamNotFound, InvalidSequenceNumber, RecordsTrimmed, and a partition's
            read error once it failed READ_STREAM_RETRIES_MAX times in a row."""
        info = await self.get_stream_info(stream)
        by = {p.ordinal: p for p in info.partitions}
        starts: dict[int, tuple[str, dict[str, Any]]] = {}
        if sequence_number is not None or timestamp_ms is not None:
            sn = None if sequence_number is None else seqno.parse(sequence_number)
            # (timestamp_ms is given when sequence_number is not)
            ts = cast(int, timestamp_ms) if sn is None else seqno.timestamp_ms_of(sn)
            # the partitions valid at ts, and the roots younger than ts: those whose parents
            # retention dropped cover the hash ranges of partitions no longer in the map
            for p in info.partitions_at(ts) + [r for r in info.roots() if r.valid_from_ms > ts]:
                starts[p.ordinal] = ("AT_TIMESTAMP", {"timestamp_ms": ts})
            if sn is not None:
                starts[seqno.ordinal_of(sn)] = ("AT_SEQUENCE_NUMBER", {"sequence_number": sn})
        elif start == "LATEST":
            starts = {p.ordinal: ("LATEST", {}) for p in info.partitions if p.state is PartitionState.OPEN}
        else:
            starts = {p.ordinal: ("TRIM_HORIZON", {}) for p in info.roots()}
        # the partitions this read covers: the starting cut and everything after it
        scope = _descendants_and(by, set(starts))
        done: set[int] = set()
        started: set[int] = set()
        # (what, ordinal, payload): ("records", o, [Record]), ("end", o, [child ordinals]),
        # ("idle", o, None) or ("error", o, exception)
        queue: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue(maxsize=limits.READ_STREAM_PAGES_QUEUED_MAX)
        tasks: dict[int, asyncio.Task[None]] = {}

        async def read_partition(ordinal: int, kind: str, kw: dict[str, Any]) -> None:
            last_sn = None           # after a retriable failure the read resumes after it
            failures = 0
            try:
                it: str | None = await self.get_iterator(stream, ordinal, kind, **kw)
                pages = self._subscription(it, max_records, skip_trimmed) if follow and it else None
                while it:
                    try:
                        if pages is not None:       # follow: records pushed as they commit
                            page = await anext(pages)
                        else:
                            page = await self.get_next_records(it, max_records, 0, skip_trimmed=skip_trimmed)
                        failures = 0
                    except errors.PartitionNotFound:
                        # retention dropped it while we read: nothing of it is left to read
                        current = await self.get_stream_info(stream)
                        children = [p.ordinal for p in current.partitions if ordinal in p.parents]
                        await queue.put(("end", ordinal, children))
                        return
                    except errors.SmsError as e:
                        if not e.retriable or failures >= limits.READ_STREAM_RETRIES_MAX:
                            raise
                        failures += 1          # (a replica restarting, a connection reset)
                        await asyncio.sleep(min(limits.CLIENT_REDIRECT_BACKOFF_S * 2 ** failures, 2.0))
                        if last_sn is None:
                            it = await self.get_iterator(stream, ordinal, kind, **kw)
                        else:
                            it = await self.get_iterator(stream, ordinal, "AFTER_SEQUENCE_NUMBER",
                                                         sequence_number=last_sn)
                        if pages is not None:
                            await pages.aclose()
                            pages = self._subscription(it, max_records, skip_trimmed)
                        continue
                    if page.records:
                        last_sn = page.records[-1].sn
                        await queue.put(("records", ordinal, page.records))
                    it = page.next_iterator
                    if it and not page.records and not follow and page.millis_behind_latest == 0:
                        break        # caught up with an open partition
                    if it is None:
                        await queue.put(("end", ordinal, [parse_partition_id(c) for c in page.child_partitions]))
                        return
                await queue.put(("idle", ordinal, None))
            except Exception as e:           # (a cancelled reader puts nothing: nobody reads)
                await queue.put(("error", ordinal, e))

        def start_partition(ordinal: int, kind: str, kw: dict[str, Any]) -> None:
            started.add(ordinal)
            tasks[ordinal] = asyncio.get_running_loop().create_task(read_partition(ordinal, kind, kw))

        for ordinal, (kind, kw) in starts.items():
            start_partition(ordinal, kind, kw)
        try:
            running = len(tasks)
            while running:
                what, ordinal, payload = await queue.get()
                if what == "records":
                    for record in payload:
                        yield record
                    continue
                running -= 1
                if what == "error":
                    raise payload
                if what == "idle":
                    continue
                done.add(ordinal)
                children = payload
                if any(c not in by for c in children):
                    info = await self.get_stream_info(stream)
                    by = {p.ordinal: p for p in info.partitions}
                scope |= _descendants_and(by, set(children))
                for c in children:
                    if c in started or c not in by:
                        continue
                    if all(p in done or p not in scope or p not in by for p in by[c].parents):
                        start_partition(c, "TRIM_HORIZON", {})
                        running += 1
        finally:
            for task in tasks.values():
                task.cancel()

    async def get_record(self, stream: str, sequence_number: str | int) -> Record:
        """The record of that sequence number.

        Raises:
            InvalidSequenceNumber, StreamNotFound, PartitionNotFound, RecordNotFound,
            RecordsTrimmed."""
        sn = seqno.parse(sequence_number)
        resp = await self._read_call(stream, seqno.ordinal_of(sn), "GetRecord",
                                     sms_pb2.GetRecordRequest(stream=stream, sequence_number=str(sn)))
        record = convert.records_from_slice(resp.slice.batch, resp.slice.start, resp.slice.end, seqno.ordinal_of(sn))[0]
        return (await self._with_payloads(stream, [record]))[0][0]

    async def node_status(self, address: str) -> dict[str, Any]:
        """Replicas held by the storage node at `address` (operators; `sms status`): its
        id, pid, roles, replicas, storage failures and replication links. Raises
        Unavailable when that node does not answer."""
        pb = await self._call(address, sms_pb2_grpc.ControlStub, "NodeStatus", sms_pb2.NodeStatusRequest())
        return {"node_id": pb.node_id, "pid": pb.pid, "roles": list(pb.roles),
                "replicas": [{"chain_id": r.chain_id, "epoch": r.epoch, "role": r.role, "last_sn": r.last_sn,
                              "committed_sn": r.committed_sn, "batches": r.batches, "records": r.records,
                              "first_sn": r.first_sn,
                              # the tail of a stream with an archive: how far it archived
                              **({"archive": {"archived_sn": r.archived_sn, "verified_sn": r.verified_sn,
                                              "lag_ms": r.archive_lag_ms, "error": r.archive_error}}
                                 if r.archived_sn else {})}
                             for r in pb.replicas],
                "storage_write_failures": pb.storage_write_failures,
                "storage_last_error": pb.storage_last_error, "storage_last_error_ms": pb.storage_last_error_ms,
                # its replication streams, one per peer and direction (storage/peerlink.py)
                "links": [{"peer": p.peer, "direction": "out" if p.outgoing else "in", "chains": p.chains,
                           "frames": p.frames, "messages": p.items, "streams_opened": p.streams,
                           "connected": p.connected} for p in pb.peer_links]}

    async def ingestion_status(self, address: str) -> dict[str, Any]:
        """Per partition owned by the ingestion node at `address`: dedup table sizes, queue.
        Raises Unavailable when that node does not answer."""
        pb = await self._call(address, sms_pb2_grpc.IngestionStub, "IngestionStatus", sms_pb2.Empty())
        return {"node_id": pb.node_id, "partitions": [
            {"chain_id": p.chain_id, "policy": p.policy, "ready": p.ready, "table": dict(p.table),
             "queued_records": p.queued_records, "inflight_batches": p.inflight_batches}
            for p in pb.partitions]}

    def producer(self, stream: str, producer_id: str | bytes | None = None, **options: Any) -> Producer:
        """A de-duplicating producer for `stream` (sms/producer.py; docs/dedup.md).

        Args:
            stream: the stream it writes to.
            producer_id: its identity across restarts (None: a random one).
            **options: `sms.producer.Producer` options (linger_ms, max_pending_*, ...).

        Raises:
            InvalidProducerId, InvalidArgument (an option out of range)."""
        from sms.producer import Producer
        return Producer(self, stream, producer_id, **options)

    async def partitions(self, stream: str) -> list[PartitionInfo]:
        """The stream's partitions (open and closed), from a fresh map. Raises
        StreamNotFound."""
        return list((await self.get_stream_info(stream)).partitions)

