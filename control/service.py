"""The Control gRPC service. Every process serves the reads (ListStreams, DescribeStream,
DescribeCluster) from its metadata view, so a client can discover the cluster from any
one address; only a process with the control role accepts CreateStream/DeleteStream.
"""

from __future__ import annotations

from control.admin import StreamAdmin, validate_create
from control.metaview import ClusterView
from sms import convert
from sms.errors import FailedPrecondition, Unavailable
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.rpc import rpc_errors


class ControlService(sms_pb2_grpc.ControlServicer):
    def __init__(self, view: ClusterView, admin: StreamAdmin | None, control_role: bool = False):
        self.view = view
        self.admin = admin                  # set while this process leads the control plane
        self.control_role = control_role

    def _admin(self) -> StreamAdmin:
        if self.admin is None:
            if self.control_role:
                raise Unavailable("this control node is a standby; the leader answers admin calls "
                                  "(describe the cluster again for its address)")
            raise FailedPrecondition("this node has no control role; send admin calls to the control address")
        return self.admin

    @rpc_errors
    async def CreateStream(self, request, context):
        admin = self._admin()
        config = validate_create(request.name, request.partitions, request.replication_factor,
                                 request.persistence, request.ingestion_policy, request.retention_hours,
                                 request.dedup_window_s)
        await admin.create_stream(config)
        return convert.stream_to_pb(await self.view.describe_stream(request.name))

    @rpc_errors
    async def DeleteStream(self, request, context):
        await self._admin().delete_stream(request.name)
        return sms_pb2.Empty()

    @rpc_errors
    async def ListStreams(self, request, context):
        return sms_pb2.ListStreamsResponse(names=await self.view.list_streams())

    @rpc_errors
    async def DescribeStream(self, request, context):
        return convert.stream_to_pb(await self.view.describe_stream(request.name))

    @rpc_errors
    async def DescribeCluster(self, request, context):
        return convert.cluster_to_pb(await self.view.describe_cluster())
