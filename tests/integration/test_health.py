"""The standard gRPC health service and reflection on every node (node/health.py), on a
real secure cluster (TLS, keys): what probes, load balancers and grpcurl ask.

- every node answers SERVING for itself ("") and for each of its roles' services, and
  NOT_FOUND for a service it does not have, without a key (a probe carries none), while a
  call of the API without a key is refused;
- reflection lists the node's services and describes them;
- a node that stops says NOT_SERVING to a watcher before it goes;
- a failed disk (NOT_SERVING for the node and its data roles) is checked in
  test_fsync_failure.py, where a disk fails for real.
"""

from __future__ import annotations

import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from node.launcher import LocalCluster
from sms import security
from sms.proto import sms_pb2, sms_pb2_grpc
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
STORAGE_SERVICES = ("sms.v1.Control", "sms.v1.Storage", "sms.v1.Ingestion", "sms.v1.Retrieval")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(str(tmp_path_factory.mktemp("health")), nodes=2) as c:
        yield c


def channel(cluster: LocalCluster, address: str) -> grpc.Channel:
    """A channel that trusts the cluster's CA and carries no key."""
    creds = security.TlsConfig.from_files(cluster.ca_file).channel_credentials()
    return grpc.secure_channel(address, creds)


def status(ch: grpc.Channel, service: str = "") -> int:
    return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                timeout=CALL_TIMEOUT_S).status


def test_every_node_is_serving_for_itself_and_each_role_without_a_key(cluster):
    for node_id, node in cluster.procs.items():
        with channel(cluster, node.address) as ch:
            wait_until(lambda: status(ch) == SERVING, READY_TIMEOUT_S, f"{node_id} SERVING")
            services = ("sms.v1.Control",) if node.roles == "control" else STORAGE_SERVICES
            for service in services:
                assert status(ch, service) == SERVING, (node_id, service)
            if node.roles == "control":       # (a control node has no data roles)
                for service in STORAGE_SERVICES[1:]:
                    with pytest.raises(grpc.RpcError) as e:
                        status(ch, service)
                    assert e.value.code() == grpc.StatusCode.NOT_FOUND, (node_id, service)
            with pytest.raises(grpc.RpcError) as e:
                status(ch, "no.such.Service")
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            # the API itself still wants a key
            with pytest.raises(grpc.RpcError) as e:
                sms_pb2_grpc.ControlStub(ch).ListStreams(sms_pb2.Empty(), timeout=CALL_TIMEOUT_S)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value


def test_reflection_lists_and_describes_the_services(cluster):
    node = cluster.procs["n1"]
    with channel(cluster, node.address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        answers = list(stub.ServerReflectionInfo(iter([
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="sms.v1.Ingestion")]),
            timeout=CALL_TIMEOUT_S))
    listed = {s.name for s in answers[0].list_services_response.service}
    assert set(STORAGE_SERVICES) | {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= listed
    files = answers[1].file_descriptor_response.file_descriptor_proto
    assert files and any(b"PutRecords" in f for f in files), "sms.v1.Ingestion's file does not describe PutRecords"


def test_a_stopping_node_says_not_serving_to_a_watcher(cluster):
    node = cluster.procs["n2"]
    with channel(cluster, node.address) as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service="sms.v1.Storage"),
                                                      timeout=READY_TIMEOUT_S)
        seen = [next(watch).status]
        assert seen == [SERVING]
        cluster.signal("n2", signal.SIGTERM)
        t0 = time.monotonic()
        try:
            for answer in watch:
                seen.append(answer.status)
                if answer.status == NOT_SERVING:
                    break
        except grpc.RpcError:
            pass                             # (the server went away after saying it)
        assert NOT_SERVING in seen, f"the watcher saw {seen} in {time.monotonic() - t0:.1f}s"
        node.proc.wait(timeout=READY_TIMEOUT_S)
    cluster.restart("n2")
    with channel(cluster, cluster.procs["n2"].address) as ch:
        wait_until(lambda: status(ch) == SERVING, READY_TIMEOUT_S, "n2 SERVING again after its restart")
