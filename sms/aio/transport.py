"""The asyncio client's transport: its options, channels (TLS, the key's token), discovery of
the cluster and the control leader, and the calls every other part makes (`_call`,
`_admin_call`, `_discovery_call`)."""

from __future__ import annotations

import asyncio
import json
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, Self

import grpc

from sms import convert, errors, limits, rpc, security
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.types import ClusterInfo, Routes, StreamInfo


# A token that this task's calls carry instead of the client's own: a node that calls the
# cluster on a key's behalf (the Kinesis endpoint, with a token delegated to the key that
# signed its request) shares one client among its requests and sets this for each.
CALL_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("sms_call_token", default=None)


class Transport:
    """The transport part of `sms.aio.Client` (sms/aio/__init__.py); each part builds on the
    ones before it: transport, admin, reads, writes, groups."""

    def __init__(self, address: str, *, timeout_s: float = limits.RPC_TIMEOUT_S, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None, token: str | None = None,
                 payloads: str = "inline", tls_config: security.TlsConfig | None = None,
                 cluster_ports: Callable[[], Awaitable[dict[str, str]]] | None = None) -> None:
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
            tls_config: the TLS to use, as bytes, instead of the files (a node's own).
            cluster_ports: makes this a node's own client of its cluster (the queue owners'
                state logs, docs/queues.md): it gives each node's client port -> its cluster
                port (the node's own view: clients are not told cluster ports), and every
                call goes to a cluster port, where the node's certificate (`tls_config`) is
                the credential (no token) and stream names are stored names. `address` is
                then a node's cluster port.

        Raises:
            InvalidArgument: a TLS file that cannot be read, or another `payloads`."""
        if payloads not in ("inline", "reference"):
            raise errors.InvalidArgument(f"payloads {payloads!r}; expected inline or reference")
        self.payloads = payloads
        self.address = address
        self.timeout_s = timeout_s
        self.tls = tls_config if tls_config is not None else security.TlsConfig.resolve(ca_file, cert_file, key_file)
        # the key's token goes with every call, over TLS only: never in clear text
        token = security.resolve_token(token)
        self._own_metadata = (("authorization", f"Bearer {token}"),) if token and self.tls is not None else None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._streams: dict[str, StreamInfo] = {}
        self._routes: dict[str, Routes] = {}
        self._cluster: ClusterInfo | None = None
        self._shunned: dict[str, float] = {}       # address -> until when discovery asks it last
        self._read_member: dict[tuple[str, int], int] = {}
        self._cluster_ports: dict[str, str] = {}     # a node's client port -> its cluster port (cluster_ports)
        self._ports_source = cluster_ports

    @property
    def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        """What each call carries: the key's token (CALL_TOKEN's, when this task set one)."""
        delegated = CALL_TOKEN.get()
        if delegated and self.tls is not None:
            return (("authorization", f"Bearer {delegated}"),)
        return self._own_metadata

    @classmethod
    def from_cluster_file(cls, path: str, **kwargs: Any) -> Self:
        """A client of the cluster `sms up` runs: its DIR/cluster.json (or DIR) names the
        address, the CA and the admin token.

        Args:
            path: the cluster file, or the DIR that holds it.
            **kwargs: `Client` options, over those the file gives.

        Raises:
            InvalidArgument: the file cannot be read, is not JSON or names no address."""
        address, options = security.cluster_file_options(path)
        return cls(address, **{**options, **kwargs})

    async def __aenter__(self) -> Self:
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
        if self._ports_source is not None and address not in self._cluster_ports \
                and address not in self._cluster_ports.values() and address not in self.address.split(","):
            self._cluster_ports = await self._ports_source()     # (a node this client has not seen yet)
        stub = stub_cls(self._channel(self._cluster_ports.get(address, address)))
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

    async def node_settings(self, address: str) -> tuple[str, list[dict[str, Any]]]:
        """(node id, settings) of the node at `address`: each setting it runs with, its
        value and where it came from (node/config.py; `sms config show --node`). Raises
        Unavailable when that node does not answer."""
        pb = await self._call(address, sms_pb2_grpc.ControlStub, "NodeStatus", sms_pb2.NodeStatusRequest(settings=True))
        if not pb.settings_json:      # (a release before 0.2 ignores `settings` and answers its replicas)
            raise errors.FailedPrecondition(f"node {pb.node_id or address} does not tell its settings: its release "
                                            "predates `sms config show --node` (0.2)")
        return pb.node_id, json.loads(pb.settings_json)

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
                           "connected": p.connected, "heard_ago_s": p.heard_ago_s} for p in pb.peer_links]}

    async def ingestion_status(self, address: str) -> dict[str, Any]:
        """Per partition owned by the ingestion node at `address`: dedup table sizes, queue.
        Raises Unavailable when that node does not answer."""
        pb = await self._call(address, sms_pb2_grpc.IngestionStub, "IngestionStatus", sms_pb2.Empty())
        return {"node_id": pb.node_id, "partitions": [
            {"chain_id": p.chain_id, "policy": p.policy, "ready": p.ready, "table": dict(p.table),
             "queued_records": p.queued_records, "inflight_batches": p.inflight_batches}
            for p in pb.partitions]}
