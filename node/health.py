"""The standard gRPC health service and server reflection, on a node's client port.

Health (`grpc.health.v1.Health`, from grpcio-health-checking): what load balancers,
Kubernetes' gRPC probes and `grpc_health_probe` ask. A node answers for the whole node
(the empty service name) and for each of its roles' services (`sms.v1.Control`,
`sms.v1.Storage`, `sms.v1.Ingestion`, `sms.v1.Retrieval`):

- NOT_SERVING from the start until the node is registered in the metadata store and its
  storage role is serving its chains;
- SERVING from then on;
- NOT_SERVING again while it registers again after its metadata session expired (it was
  paused or cut off: the chain manager may have taken it out of its chains meanwhile);
- NOT_SERVING for good once its disk failed (storage/log.py fences the logs: the node and
  its data roles stay so until a restart; its control role goes on);
- NOT_SERVING for every service once it is stopping (`enter_graceful_shutdown`).

An unknown service name is answered NOT_FOUND. Reflection (`grpc.reflection.v1alpha`,
from grpcio-reflection) lists the services and their message types, for grpcurl and
other tools.

Both are answered without a key on a secure cluster (node/tls.py PUBLIC_SERVICES), as
probes carry none; they tell nothing about streams or records. TLS still applies.
"""

from __future__ import annotations

from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sms.proto import sms_pb2

SERVICE_OF_ROLE = {"control": "Control", "storage": "Storage", "ingestion": "Ingestion", "retrieval": "Retrieval"}
DATA_ROLES = ("storage", "ingestion", "retrieval")      # (what a failed disk takes down)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def service_name(role: str) -> str:
    """The full gRPC name of a role's service, e.g. sms.v1.Storage."""
    return sms_pb2.DESCRIPTOR.services_by_name[SERVICE_OF_ROLE[role]].full_name


class NodeHealth:
    """A node's health statuses: one for the node (""), one per role's service."""

    def __init__(self, roles: tuple[str, ...]):
        self.servicer = health.aio.HealthServicer()
        self.roles = roles
        self.disk_failed = False
        self.registered = False

    def add_to(self, server) -> None:
        """The health service and reflection (of every service the server has) on `server`."""
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        names = [service_name(r) for r in self.roles] + [
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, server)

    async def _update(self) -> None:
        up = self.registered
        await self.servicer.set("", SERVING if up and not self.disk_failed else NOT_SERVING)
        for role in self.roles:
            ok = up and not (self.disk_failed and role in DATA_ROLES)
            await self.servicer.set(service_name(role), SERVING if ok else NOT_SERVING)

    async def starting(self) -> None:
        await self._update()

    async def serving(self) -> None:
        """Registered, and the storage role started: serving."""
        self.registered = True
        await self._update()

    async def unregistered(self) -> None:
        """The metadata session expired: not serving until registered again."""
        self.registered = False
        await self._update()

    async def failed_disk(self) -> None:
        self.disk_failed = True
        await self._update()

    async def stopping(self) -> None:
        await self.servicer.enter_graceful_shutdown()
