"""The Control gRPC service. Every process serves the reads (ListStreams, DescribeStream,
DescribeCluster) from its metadata view, so a client can discover the cluster from any
one address; only a process with the control role accepts CreateStream/DeleteStream.
Every change of a stream, tenant, key, certificate, node or consumer group is written to
the audit log with its outcome (`audited`; kernel/audit.py), and ReadAudit answers this
node's audit lines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
import time

import grpc
from google.protobuf import text_format

from control import auth, repartition, revocation
from control.phases import Kind
from control.admin import StreamAdmin, changed_tags, validate_create
from control.groups import Groups
from control import channels as channel_defs
from control.channels import Channels
from control.queues import Queues, consumer_name, start_cursor
from kernel import audit
from metastore import producers
from metastore.view import ClusterView, bounded
from sms import convert, limits, metadata, seqno
from sms.errors import (FailedPrecondition, InvalidArgument, InvalidStreamConfig, InvalidProducerId, InvalidSplitPoint, InvalidStreamName, QueueNotFound, ChannelNotFound, SmsError,
                        StreamInUse, StreamNotFound,
                        Unavailable)
from sms.metadata import ConsumerRecord
from sms.types import PartitionState
from sms.proto import sms_pb2, sms_pb2_grpc
from kernel.rpc import rpc_errors
from sms.rpc import to_sms_error

log = logging.getLogger(__name__)


def audited(action, target):
    """A change handler (under @rpc_errors) whose every call goes to the audit log with its
    outcome ("ok" or the name of the error the caller gets): who (the caller's key,
    auth.CURRENT), `action` (a name, or a function of the request), `target(request,
    answer)` (answer None when it failed), the request in one line, and the call's peer.
    No audited request holds a secret (a key's token is in CreateKey's answer only)."""
    def wrap(handler):
        @functools.wraps(handler)
        async def wrapper(self, request, context):
            answer, outcome, message = None, audit.OK, ""
            try:
                answer = await handler(self, request, context)
                return answer
            except BaseException as e:       # (recorded, then raised as it was)
                outcome, message = _outcome(e)
                raise
            finally:
                try:
                    asked = text_format.MessageToString(request, as_one_line=True)
                    audit.event(action(request) if callable(action) else action, target(request, answer), outcome,
                                audit.who_key(auth.CURRENT.get()), audit.peer(context),
                                f"{asked}; {message}" if message else asked)
                except Exception:       # (auditing never fails the call)
                    log.warning("audit: %s not recorded", handler.__name__, exc_info=True)
        return wrapper
    return wrap


def _outcome(e: BaseException) -> tuple[str, str]:
    """(name, message) of the error a caller gets for `e`, as kernel/rpc.py rpc_errors maps it."""
    if isinstance(e, SmsError):
        return e.name, e.message
    if isinstance(e, grpc.aio.AioRpcError):
        error = to_sms_error(e)
        return error.name, error.message
    if isinstance(e, asyncio.CancelledError):
        return "Cancelled", "the call was cancelled"
    return "InternalError", f"{type(e).__name__}: {e}"


def _named(field: str):
    return lambda request, _answer: getattr(request, field)


def _group(request, _answer) -> str:
    return f"{request.stream}/{request.group}"


def repartition_request(request: sms_pb2.RepartitionStreamRequest) -> repartition.RepartitionRequest:
    """The typed request a RepartitionStream call asks for (named errors for a malformed one;
    `request_id`, if given, is the request's id: a retry of a recorded request is the same)."""
    if request.op in ("split", "merge", "scale") and len(request.request_id) > 64:
        raise InvalidArgument("request_id of more than 64 characters")
    op = request.op
    if op == "split":
        if len(request.partitions) != 1:
            raise InvalidArgument(f"split names one partition; {len(request.partitions)} given")
        at_hash = None
        if request.at_hash:
            try:
                at_hash = int(request.at_hash)
            except ValueError:
                raise InvalidSplitPoint(f"split point {request.at_hash[:64]!r}; expected a decimal "
                                        "hash key") from None
        return repartition.new_request(Kind.SPLIT, parents=(request.partitions[0],), at_hash=at_hash,
                                       request_id=request.request_id or None)
    if op == "merge":
        if len(request.partitions) != 2:
            raise InvalidArgument(f"merge names two partitions; {len(request.partitions)} given")
        return repartition.new_request(Kind.MERGE, parents=tuple(request.partitions),
                                       request_id=request.request_id or None)
    if op == "scale":
        return repartition.new_request(Kind.SCALE, target=request.target_partitions,
                                       request_id=request.request_id or None)
    raise InvalidArgument(f"repartition op {op[:32]!r}; expected split, merge or scale")


def _queue_pb(q) -> sms_pb2.QueueDescription:
    return sms_pb2.QueueDescription(name=q.name, stream=q.stream, status=q.status.value, created_ms=q.created_ms,
                                    start=q.start, timestamp_ms=q.timestamp_ms, visibility_s=q.visibility_s,
                                    max_receive_count=q.max_receive_count, uid=f"{q.uid:x}")


class ControlService(sms_pb2_grpc.ControlServicer):
    def __init__(self, view: ClusterView, admin: StreamAdmin | None, control_role: bool = False):
        self.view = view
        self.admin = admin                  # set while this process leads the control plane
        self.control_role = control_role
        self.node_settings: tuple[str, list[dict]] = ("", [])     # (node id, node/config.py show()'s rows)
        self.storage_service = None         # storage.service.StorageService of this process, if it stores
        self.groups = Groups(view.store, view)
        self.queues = Queues(view.store, view)
        self.channels = Channels(view.store, view)     # (node/server.py sets its defaults: catalog, warehouse)

    # --- credentials (control/auth.py; the guard lets admin keys only call these) --------
    @rpc_errors
    @audited(audit.KEY_CREATE, lambda _r, answer: answer.key.key_id if answer is not None else "")
    async def CreateKey(self, request, context):
        admin = self._admin()
        entry, token = await auth.create_key(admin.store, request.role, list(request.streams),
                                             request.name, tenant=auth.acting_tenant(request.tenant),
                                             master_keys=admin.master_keys)
        return sms_pb2.CreateKeyResponse(key=_key_pb(entry), token=token)

    @rpc_errors
    async def ListKeys(self, request, context):
        keys = await auth.list_keys(self._admin().store, auth.tenant_scope())
        return sms_pb2.ListKeysResponse(keys=[_key_pb(k) for k in keys])

    @rpc_errors
    @audited(audit.KEY_REVOKE, _named("key_id"))
    async def RevokeKey(self, request, context):
        await auth.revoke_key(self._admin().store, request.key_id, auth.tenant_scope())
        return sms_pb2.Empty()

    @rpc_errors
    @audited(audit.TENANT_CREATE, _named("name"))
    async def CreateTenant(self, request, context):
        await auth.create_tenant(self._admin().store, request.name)
        return sms_pb2.Empty()

    @rpc_errors
    async def ListTenants(self, request, context):
        tenants = await auth.list_tenants(self._admin().store)
        return sms_pb2.ListTenantsResponse(names=[n for n, _c in tenants],
                                           tenants=[_tenant_pb(n, c) for n, c in tenants])

    @rpc_errors
    @audited(audit.CERTIFICATE_REVOKE, _named("serial"))
    async def RevokeCertificate(self, request, context):
        auth.require_cluster_admin()
        await revocation.revoke(self._admin().store, request.serial, request.reason)
        return sms_pb2.Empty()

    @rpc_errors
    async def ReadAudit(self, request, context):
        """This node's audit lines (kernel/audit.py), the newest `limit` at or after
        `since_ms`; `sms audit` asks every node. A process without an audit file: none."""
        auth.require_cluster_admin()
        if request.since_ms < 0:
            raise InvalidArgument(f"since_ms {request.since_ms}; expected 0 or a time in ms since the epoch")
        if request.limit > limits.AUDIT_READ_EVENTS_MAX:
            raise InvalidArgument(f"limit {request.limit}; at most {limits.AUDIT_READ_EVENTS_MAX}")
        written = audit.current()
        if written is None:
            return sms_pb2.ReadAuditResponse()
        events, truncated = await asyncio.to_thread(written.read, request.since_ms,
                                                    request.limit or limits.AUDIT_READ_EVENTS_MAX)
        return sms_pb2.ReadAuditResponse(node_id=written.node, events=events, truncated=truncated)

    @rpc_errors
    async def ListRevokedCertificates(self, request, context):
        auth.require_cluster_admin()
        return sms_pb2.ListRevokedCertificatesResponse(certificates=[
            sms_pb2.RevokedCertificate(serial=serial, revoked_ms=at, reason=reason)
            for serial, at, reason in await revocation.list_revoked(self._admin().store)])

    # --- consumer groups (control/groups.py): any node answers ------------------------------
    @rpc_errors
    async def GroupState(self, request, context):
        leases, members = await self.groups.state(request.stream, request.group)
        return sms_pb2.GroupStateResponse(
            leases=[sms_pb2.GroupEntry(key=k, value=v, version=n) for k, v, n in leases],
            members=[sms_pb2.GroupEntry(key=k, value=v, version=n) for k, v, n in members])

    @rpc_errors
    async def GroupWrite(self, request, context):
        version = await self.groups.write(request.stream, request.group, request.member, request.key, request.value,
                                          request.version, request.delete)
        return sms_pb2.GroupWriteResponse(version=version)

    @rpc_errors
    async def ListGroups(self, request, context):
        return sms_pb2.ListGroupsResponse(groups=await self.groups.list(request.stream))

    @rpc_errors
    @audited(audit.GROUP_RESET, _group)
    async def ResetGroup(self, request, context):
        await self.groups.reset(request.stream, request.group, request.position, request.timestamp_ms,
                                dict(request.sequence_numbers))
        return sms_pb2.Empty()

    @rpc_errors
    @audited(audit.GROUP_DELETE, _group)
    async def DeleteGroup(self, request, context):
        await self.groups.delete(request.stream, request.group)
        return sms_pb2.Empty()

    # --- queues (control/queues.py, docs/queues.md): any node answers -------------------------
    @rpc_errors
    @audited(audit.QUEUE_CREATE, _named("name"))
    async def CreateQueue(self, request, context):
        admin = self._admin()                 # (it makes the queue's state log: a stream)

        async def make_log(queue, view) -> None:
            source = view.config
            parts = min(max(1, sum(1 for e in view.map.entries if e.state is PartitionState.OPEN)),
                        limits.QUEUE_LOG_PARTITIONS_MAX)
            log = validate_create(metadata.queue_state_stream(queue.name, queue.uid), parts, source.replication_factor,
                                  "disk", "", source.retention_hours, retention_s=source.retention_s,
                                  min_in_sync=source.min_in_sync)
            # a registered consumer of its stream (docs/queues.md): from its start on, what it
            # has not acknowledged is kept while the stream protects unread records
            start = start_cursor(queue)
            await admin.update_consumer(queue.stream, consumer_name(queue), {
                e.ordinal: seqno.highest_below(start, e.ordinal) for e in view.map.entries} if start else {})
            try:
                await admin.create_stream(log)
            except SmsError:
                await admin.update_consumer(queue.stream, consumer_name(queue), {}, remove=True)
                raise

        queue = await self.queues.create(
            request.name, request.stream, request.start, request.timestamp_ms,
            request.visibility_s if request.HasField("visibility_s") else None,
            request.max_receive_count if request.HasField("max_receive_count") else None,
            make_log=make_log, drop_log=self._drop_queue_log)
        return _queue_pb(queue)

    async def _drop_queue_log(self, queue) -> None:
        admin = self._admin()
        try:
            await admin.update_consumer(queue.stream, consumer_name(queue), {}, remove=True)
        except StreamNotFound:
            pass
        try:
            await admin.delete_stream(metadata.queue_state_stream(queue.name, queue.uid))
        except StreamNotFound:
            pass

    @rpc_errors
    async def DescribeQueue(self, request, context):
        queue = await self.queues.describe(request.name)
        caller = auth.CURRENT.get()
        if caller is not None and not caller.sees(auth.unqualify(queue.stream)):
            raise QueueNotFound(f"queue {request.name!r} does not exist")     # (a key limited to other streams)
        return _queue_pb(queue)

    @rpc_errors
    async def ListQueues(self, request, context):
        caller = auth.CURRENT.get()
        tenant = caller.tenant if caller is not None else metadata.DEFAULT_TENANT
        if request.stream:
            metadata.validate_stream_name(request.stream)
        return sms_pb2.ListQueuesResponse(queues=[_queue_pb(q) for q in await self.queues.list(tenant, request.stream)])

    @rpc_errors
    @audited(audit.QUEUE_UPDATE, _named("name"))
    async def UpdateQueue(self, request, context):
        return _queue_pb(await self.queues.update(
            request.name, request.visibility_s if request.HasField("visibility_s") else None,
            request.max_receive_count if request.HasField("max_receive_count") else None))

    @rpc_errors
    @audited(audit.QUEUE_DELETE, _named("name"))
    async def DeleteQueue(self, request, context):
        self._admin()                         # (it deletes the queue's state log: a stream)
        await self.queues.delete(request.name, drop_log=self._drop_queue_log)
        return sms_pb2.Empty()

    # --- channels (control/channels.py, docs/channels.md): any node answers ------------------
    @rpc_errors
    @audited(audit.CHANNEL_CREATE, _named("name"))
    async def CreateChannel(self, request, context):
        admin = self._admin()                 # (it registers the channel as a consumer of its stream)

        async def register(channel) -> None:
            view = await self.view.stream(channel.stream, max_age_s=0)
            start = seqno.lower_bound_for_time(channel.created_ms) if channel.start == "LATEST" else 0
            await admin.update_consumer(channel.stream, channel_defs.consumer_name(channel), {
                e.ordinal: seqno.highest_below(start, e.ordinal) for e in view.map.entries} if start else {})

        d = request.destination
        caller = auth.CURRENT.get()
        if caller is not None and not caller.allows(auth.CLUSTER, None):
            channel_defs.check_tenant_locations(
                [d.url, d.catalog_uri, d.warehouse, request.dead_letter_url], limits.CHANNEL_TENANT_URL_PREFIXES)
            if d.kind == "ICEBERG" and not d.catalog_uri:
                channel_defs.check_tenant_namespace(caller.tenant, d.namespace)
        channel = await self.channels.create(
            request.name, request.stream, convert.destination_from_pb(d), start=request.start,
            data_freshness_s=request.data_freshness_s if request.HasField("data_freshness_s") else None,
            record_format=request.record_format, schema=[(c.name, c.type) for c in request.schema],
            dead_letter_url=request.dead_letter_url, register=register)
        return convert.channel_to_pb(channel)

    async def _deregister_channel(self, channel) -> None:
        try:
            await self._admin().update_consumer(channel.stream, channel_defs.consumer_name(channel), {}, remove=True)
        except StreamNotFound:
            pass

    @rpc_errors
    async def DescribeChannel(self, request, context):
        channel = await self.channels.describe(request.name)
        caller = auth.CURRENT.get()
        if caller is not None and not caller.sees(auth.unqualify(channel.stream)):
            raise ChannelNotFound(f"channel {request.name!r} does not exist")
        return convert.channel_to_pb(channel)

    @rpc_errors
    async def ListChannels(self, request, context):
        caller = auth.CURRENT.get()
        tenant = caller.tenant if caller is not None else metadata.DEFAULT_TENANT
        if request.stream:
            metadata.validate_stream_name(request.stream)
        return sms_pb2.ListChannelsResponse(channels=[convert.channel_to_pb(c) for c in
                                                      await self.channels.list(tenant, request.stream)])

    @rpc_errors
    @audited(audit.CHANNEL_UPDATE, _named("name"))
    async def UpdateChannel(self, request, context):
        await self.channels.update(request.name, request.data_freshness_s
                                   if request.HasField("data_freshness_s") else None)
        return convert.channel_to_pb(await self.channels.describe(request.name))

    @rpc_errors
    @audited(audit.CHANNEL_DELETE, _named("name"))
    async def DeleteChannel(self, request, context):
        self._admin()
        await self.channels.delete(request.name, deregister=self._deregister_channel)
        return sms_pb2.Empty()

    # --- producer epochs (metastore/producers.py): any node answers ---------------------------
    @rpc_errors
    async def InitProducer(self, request, context):
        if not 0 < len(request.producer_id) <= limits.PRODUCER_ID_BYTES_MAX:
            raise InvalidProducerId(f"producer id of {len(request.producer_id)} bytes; "
                                    f"expected 1..{limits.PRODUCER_ID_BYTES_MAX}")
        metadata.validate_stream_name(request.stream)
        epoch, previous = await bounded(
            producers.open_epoch(self.view.store, request.stream, request.producer_id, int(time.time() * 1000)),
            f"InitProducer of {request.stream[:64]!r}")
        if previous:
            # every ingestion node's verdict that let the earlier epoch in runs out meanwhile
            # (ingestion/fencing.py): from the answer on, no earlier instance writes
            await asyncio.sleep(limits.PRODUCER_EPOCH_VERDICT_S)
        return sms_pb2.InitProducerResponse(epoch=epoch)

    @rpc_errors
    @audited(audit.TENANT_UPDATE, _named("name"))
    async def UpdateTenant(self, request, context):
        wanted = {f: getattr(request, f) for f in metadata.TenantConfig.LIMITS
                  if f.startswith("write_") or request.HasField(f)}
        config = await auth.update_tenant(self._admin().store, request.name, **wanted)
        return _tenant_pb(request.name, config)

    @rpc_errors
    @audited(audit.TENANT_DELETE, _named("name"))
    async def DeleteTenant(self, request, context):
        await auth.delete_tenant(self._admin().store, request.name)
        return sms_pb2.Empty()

    @rpc_errors
    async def NodeStatus(self, request, context):
        """This node's storage status (`sms status`): what Storage.NodeStatus answers other
        nodes on the cluster port; or, asked for `settings`, the settings it runs with
        (node/config.py, `sms config show --node`), whatever its roles."""
        if request.settings:
            node_id, rows = self.node_settings
            return sms_pb2.NodeStatusResponse(node_id=node_id, pid=os.getpid(),
                                              settings_json=json.dumps(rows, default=str))
        if self.storage_service is None:
            raise FailedPrecondition("this node has no storage role")
        return await self.storage_service.NodeStatus(request, context)

    def _admin(self) -> StreamAdmin:
        if self.admin is None:
            if self.control_role:
                raise Unavailable("this control node is a standby; the leader answers admin calls "
                                  "(describe the cluster again for its address)")
            raise FailedPrecondition("this node has no control role; send admin calls to the control address")
        return self.admin

    @rpc_errors
    @audited(audit.STREAM_CREATE, _named("name"))
    async def CreateStream(self, request, context):
        admin = self._admin()
        if metadata.is_queue_state(request.name):
            raise InvalidStreamName(f"stream names starting {metadata.QUEUE_STATE_PREFIX!r} are the queues' state logs "
                                    "(docs/queues.md)")
        archive = {"archive": request.archive or None, "archive_after_s": request.archive_after_s or None,
                   "local_retention_s": request.local_retention_s or None, "compression": request.compression or None}
        config = validate_create(request.name, request.partitions, request.replication_factor,
                                 request.persistence, request.ingestion_policy, request.retention_hours,
                                 request.dedup_window_s, request.min_in_sync, request.retention_s, archive,
                                 encryption=request.encryption)
        if request.tags or request.auto_split_records_per_s:      # (made with the stream: one write, not two)
            if request.auto_split_records_per_s < 0:
                raise InvalidStreamConfig(f"auto-split rate {request.auto_split_records_per_s}; expected >= 0 "
                                          f"(0: off)")
            config = dataclasses.replace(config, tags=changed_tags((), dict(request.tags), None) or (),
                                         auto_split_records_per_s=request.auto_split_records_per_s)
        await admin.create_stream(config, retention_given=bool(request.retention_hours or request.retention_s))
        return convert.stream_to_pb(await self.view.describe_stream(request.name))

    @rpc_errors
    @audited(audit.STREAM_DELETE, _named("name"))
    async def DeleteStream(self, request, context):
        admin = self._admin()
        queues = await self.queues.on_stream(request.name)
        if queues:
            raise StreamInUse(f"stream {request.name!r} has queues ({', '.join(q.name for q in queues)}): delete them "
                              "first")
        if metadata.is_queue_state(request.name):
            raise InvalidArgument(f"stream {request.name!r} is a queue's state log: delete the queue instead")
        channels = await self.channels.on_stream(request.name)
        if channels:
            raise StreamInUse(f"stream {request.name!r} has channels ({', '.join(c.name for c in channels)}): delete "
                              "them first")
        await admin.delete_stream(request.name)
        return sms_pb2.Empty()

    # the reads any node answers wait at most METADATA_READ_WAIT_S for the metadata, then
    # say Unavailable: the client moves on to another node (tests/netfault)
    @rpc_errors
    async def ListStreams(self, request, context):
        names = await bounded(self.view.list_streams(), "ListStreams")
        # (a queue's state log is the queue's, not a stream of its tenant's: docs/queues.md)
        return sms_pb2.ListStreamsResponse(names=[n for n in names if not metadata.is_queue_state(n)])

    @rpc_errors
    async def DescribeStream(self, request, context):
        return convert.stream_to_pb(await bounded(self.view.describe_stream(request.name),
                                                  f"DescribeStream {request.name[:64]!r}"))

    @rpc_errors
    async def DescribeCluster(self, request, context):
        return convert.cluster_to_pb(await bounded(self.view.describe_cluster(), "DescribeCluster"))

    @rpc_errors
    @audited(audit.STREAM_REPARTITION, _named("name"))
    async def RepartitionStream(self, request, context):
        admin = self._admin()
        req = repartition_request(request)
        await admin.repartition_stream(request.name, req.record())
        return convert.stream_to_pb(await self.view.describe_stream(request.name))

    @rpc_errors
    @audited(audit.STREAM_UPDATE, _named("name"))
    async def UpdateStream(self, request, context):
        admin = self._admin()
        protect = {"": None, "true": True, "false": False}.get(request.protect_unread.lower(), "bad")
        if protect == "bad":
            raise InvalidArgument(f"protect_unread {request.protect_unread[:16]!r}; expected true or false")
        await admin.update_stream(request.name, request.retention_hours, request.retention_s, protect,
                                  request.auto_split_records_per_s, request.auto_split_period_s,
                                  partition_limits={"write_records_per_s": request.write_records_per_s,
                                          "write_bytes_per_s": request.write_bytes_per_s,
                                          "read_bytes_per_s": request.read_bytes_per_s},
                                  archive={"archive": request.archive or None,
                                           # (<= 0: unchanged; a client that predates these fields sends 0)
                                           "archive_after_s": None if request.archive_after_s <= 0
                                           else request.archive_after_s,
                                           "local_retention_s": None if request.local_retention_s <= 0
                                           else request.local_retention_s,
                                           "compression": request.compression or None},
                                  encryption=request.encryption or None,
                                  tags_set=dict(request.tags_set), tags_removed=list(request.tags_removed),
                                  shard_metrics=list(request.shard_metrics) if request.set_shard_metrics else None,
                                  shard_metrics_add=list(request.shard_metrics_add),
                                  shard_metrics_remove=list(request.shard_metrics_remove))
        self.view.invalidate()
        return convert.stream_to_pb(await self.view.describe_stream(request.name))

    @rpc_errors
    @audited(audit.KEY_REWRAP, lambda _r, answer: f"{answer.rewrapped} data keys" if answer is not None else "")
    async def RewrapDataKeys(self, request, context):
        """Master key rotation, step two (kernel/encryption.py): every encrypted stream's
        data key wrapped by the current master key of the leader's key file."""
        auth.require_cluster_admin()
        try:
            count = await self._admin().rewrap_data_keys()
        except ValueError as e:            # the key file cannot be read
            raise FailedPrecondition(f"the control leader's master key file: {e}") from None
        return sms_pb2.RewrapDataKeysResponse(rewrapped=count)

    @rpc_errors
    @audited(audit.STREAM_TRIM, _named("name"))
    async def TrimStream(self, request, context):
        before_sn = seqno.parse(request.before_sn) if request.before_sn else 0
        await self._admin().trim_stream(request.name, before_sn, request.before_ms)
        return sms_pb2.Empty()

    @rpc_errors
    async def ListNodes(self, request, context):
        return convert.node_loads_to_pb(await self._admin().list_nodes())

    @rpc_errors
    @audited(lambda r: audit.NODE_UNDRAIN if r.undo else audit.NODE_DRAIN, _named("node_id"))
    async def DrainNode(self, request, context):
        return convert.node_loads_to_pb(await self._admin().drain_node(request.node_id, request.undo))

    @rpc_errors
    @audited(audit.NODE_REMOVE, _named("node_id"))
    async def RemoveNode(self, request, context):
        return convert.node_loads_to_pb(await self._admin().remove_node(request.node_id))

    @rpc_errors
    async def UpdateConsumer(self, request, context):
        checkpoints = {}
        for ordinal, sn in request.checkpoints.items():
            checkpoints[ordinal] = ConsumerRecord.SHARD_END_SN if sn == "SHARD_END" else seqno.parse(sn)
        await self._admin().update_consumer(request.stream, request.consumer, checkpoints, request.remove)
        return sms_pb2.Empty()


def _tenant_pb(name: str, config) -> sms_pb2.TenantInfo:
    return sms_pb2.TenantInfo(name=name, **config.limits())


def _key_pb(entry: auth.KeyEntry) -> sms_pb2.KeyInfo:
    return sms_pb2.KeyInfo(key_id=entry.key_id, tenant=entry.tenant, role=entry.role, streams=list(entry.streams),
                           name=entry.name, created_ms=entry.created_ms)
