"""TLS on every channel and the cluster's protocols for members only (issue 15 items 1-2;
node/tls.py, sms/security.py, node/certs.py).

Real TLS clusters (every cluster of the suite is one: tests/conftest.py gives the run a
CA). Each wrong party gets a named error, nothing changes, and the nodes keep serving:
- a plaintext client of a TLS port, a TLS client of a plaintext port, and a client
  trusting another CA: TlsHandshakeFailed;
- the cluster's own calls (append, replication, node status) on a client port:
  PermissionDenied, whatever the caller holds;
- on a cluster port: no certificate, another CA's, or an expired one fail the
  handshake; a client certificate of the right CA gets PermissionDenied;
- a node certificate of a cluster member that is not the chain's predecessor cannot
  replicate into a replica: its hello is refused, and what it sends is never read.
"""

from __future__ import annotations

import datetime
import json
import os

import grpc
import pytest

import sms
from node import certs
from sms import errors, security, seqno, wire
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.records import encode_put
from tests.conftest import client_channel, read_stream, wait_until

pytestmark = pytest.mark.integration

CALL_TIMEOUT_S = 10.0


def _secure(address: str, ca_file: str, cert: certs.Issued | None = None, node_name: bool = False) -> grpc.Channel:
    tls = security.TlsConfig.from_files(ca_file, cert.cert_file if cert else "", cert.key_file if cert else "")
    options = [("grpc.ssl_target_name_override", security.NODE_TARGET_NAME)] if node_name else None
    return grpc.secure_channel(address, tls.channel_credentials(), options=options)


def _error_name(e: grpc.RpcError) -> str:
    return dict(e.trailing_metadata() or ()).get("sms-error", "")


def _node_status(channel: grpc.Channel):
    return sms_pb2_grpc.StorageStub(channel).NodeStatus(sms_pb2.NodeStatusRequest(), timeout=CALL_TIMEOUT_S)


def _assert_serving(client: sms.Client, stream: str) -> None:
    acked = client.put_record(stream, b"still serving", "canary")
    assert acked.sn in {r.sn for rs in read_stream(client, stream).values() for r in rs}


@pytest.fixture(scope="module")
def canary(client) -> str:
    name = "tls-canary"
    client.create_stream(name, partitions=1, replication_factor=3)
    return name


def test_the_suite_runs_on_tls(cluster):
    """Every node of a default cluster serves TLS on its client port and has a cluster port."""
    assert cluster.tls and os.path.exists(cluster.ca_file)
    for node in cluster.procs.values():
        assert node.cluster_address and node.cluster_address != node.address
    with open(os.path.join(cluster.data_dir, "cluster.json")) as f:
        assert json.load(f)["ca_file"] == cluster.ca_file


def test_a_client_from_the_cluster_file(cluster, canary):
    """`sms.Client.from_cluster_file` takes address and CA from DIR/cluster.json, even
    when $SMS_CA_FILE says nothing."""
    saved = os.environ.pop(security.ENV_CA_FILE)
    try:
        with sms.Client.from_cluster_file(cluster.data_dir) as c:
            assert canary in c.list_streams()
        with sms.Client(cluster.address, ca_file=cluster.ca_file) as c:
            assert canary in c.list_streams()
    finally:
        os.environ[security.ENV_CA_FILE] = saved


def test_a_plaintext_client_of_a_tls_cluster_gets_a_named_error(cluster, client, canary):
    with sms.Client(cluster.address, ca_file="") as plain:
        with pytest.raises(errors.TlsHandshakeFailed, match="may require TLS"):
            plain.list_streams()
    _assert_serving(client, canary)


def test_a_client_trusting_another_ca_is_refused(cluster, client, canary, tmp_path):
    other = certs.init_ca(str(tmp_path / "other-ca"))
    with sms.Client(cluster.address, ca_file=other.cert_file) as stranger:
        with pytest.raises(errors.TlsHandshakeFailed, match="not one the given CA issued"):
            stranger.list_streams()
    _assert_serving(client, canary)


def test_a_missing_ca_file_is_a_named_error(cluster, tmp_path):
    with pytest.raises(errors.InvalidArgument, match="cannot read the CA file"):
        sms.Client(cluster.address, ca_file=str(tmp_path / "nope.pem"))


def test_cluster_calls_are_refused_on_the_client_port(cluster, client, canary):
    """Append, replication and node status need the cluster port, even with a node
    certificate of this cluster: the client port serves clients only."""
    info = client.get_stream_info(canary).partition(0)
    tail = info.chain[-1].address
    member = certs.ensure_node_cert(cluster.ca_dir, str(cluster.data_dir) + "/tls/callers", "n1")
    for cert in (None, member):
        with _secure(tail, cluster.ca_file, cert) as channel:
            stub = sms_pb2_grpc.StorageStub(channel)
            with pytest.raises(grpc.RpcError) as e:
                _node_status(channel)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and _error_name(e.value) == "PermissionDenied"
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Append(iter([sms_pb2.AppendRequest(chain_id=f"{canary}:0", epoch=info.chain_epoch,
                                                             batch_id=1, batch=b"x")]), timeout=CALL_TIMEOUT_S))
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.RpcError) as e:
                list(stub.ReplicateLinks(iter([sms_pb2.LinkFrame(from_node="n1")]), timeout=CALL_TIMEOUT_S))
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # the operators' form of node status is a client call
    with client_channel(tail) as channel:
        status = sms_pb2_grpc.ControlStub(channel).NodeStatus(sms_pb2.NodeStatusRequest(), timeout=CALL_TIMEOUT_S)
    assert f"{canary}:0" in {r.chain_id for r in status.replicas}
    _assert_serving(client, canary)


def test_the_cluster_port_serves_node_certificates_only(cluster, client, canary, tmp_path):
    node = cluster.procs["n1"]
    ca_dir = cluster.ca_dir
    callers = str(tmp_path / "callers")
    app = certs.issue(ca_dir, callers, client="app")
    expired = certs.issue(ca_dir, callers + "/old", node="n2", days=1,
                          not_before=datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=3))
    other_ca = str(tmp_path / "other-ca")
    certs.init_ca(other_ca)
    foreign = certs.issue(other_ca, callers + "/foreign", node="n2")
    good = certs.issue(ca_dir, callers + "/good", node="n2")

    for what, cert in (("no certificate", None), ("an expired node certificate", expired),
                       ("another CA's node certificate", foreign)):
        with _secure(node.cluster_address, cluster.ca_file, cert, node_name=True) as channel:
            with pytest.raises(grpc.RpcError) as e:
                _node_status(channel)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, what     # the handshake failed
    with _secure(node.cluster_address, cluster.ca_file, app, node_name=True) as channel:
        with pytest.raises(grpc.RpcError) as e:
            _node_status(channel)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "node certificate" in e.value.details()
    with _secure(node.cluster_address, cluster.ca_file, good, node_name=True) as channel:
        assert _node_status(channel).node_id == "n1"
    _assert_serving(client, canary)


def test_a_revoked_node_certificate_is_refused_at_every_cluster_port(cluster, client, canary, tmp_path):
    """A node certificate whose key leaked: `revoke_certificate` (sms certs revoke) makes
    every cluster port refuse it by name, while the nodes' own certificates go on."""
    leaked = certs.issue(cluster.ca_dir, str(tmp_path / "leaked"), node="n2")
    other = certs.issue(cluster.ca_dir, str(tmp_path / "other"), node="n3")
    nodes = [p.cluster_address for p in cluster.procs.values() if "storage" in p.roles]
    for address in nodes:
        with _secure(address, cluster.ca_file, leaked, node_name=True) as channel:
            assert _node_status(channel).node_id
    serial = client.revoke_certificate(leaked.cert_file, reason="the key leaked")
    assert serial == security.cert_serial(leaked.cert_file)
    assert [(c["serial"], c["reason"]) for c in client.list_revoked_certificates()] == [(serial, "the key leaked")]

    def refused_everywhere() -> bool:
        for address in nodes:
            with _secure(address, cluster.ca_file, leaked, node_name=True) as channel:
                try:
                    _node_status(channel)
                    return False
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and "revoked" in e.details()
        return True
    wait_until(refused_everywhere, 10.0, "the revoked certificate refused at every cluster port")
    with _secure(nodes[0], cluster.ca_file, other, node_name=True) as channel:
        assert _node_status(channel).node_id            # another certificate of the CA still serves
    with pytest.raises(errors.FailedPrecondition):
        client.revoke_certificate(serial)
    for bad in ("not-hex", "0x", "f" * 41):
        with pytest.raises(errors.InvalidArgument):
            client.revoke_certificate(bad)
    assert len(client.list_revoked_certificates()) == 1
    _assert_serving(client, canary)                      # the cluster's own links are untouched


def _forge_batch(stream: str, after_sn: int) -> bytes:
    """A well-formed batch of one record that never passed ingestion."""
    entries, _hashes = wire.encode_puts([("k", b"forged")], encode_put)
    first = after_sn + seqno.COUNTER_UNIT
    return wire.seal(1, first, entries[0], 7, 1)


def test_only_the_predecessor_may_replicate_into_a_replica(cluster, client, tmp_path):
    """A member of the chain with a valid node certificate, but not the tail's
    predecessor, opens a replication stream to the tail (claiming in its frame to be the
    predecessor): the hello is refused with PermissionDenied, and a batch sent after it
    is dropped; readers never see it and the chain goes on."""
    stream = "tls-forge"
    client.create_stream(stream, partitions=1, replication_factor=3)
    good = client.put_record(stream, b"real", "k")
    info = client.get_stream_info(stream).partition(0)
    head, middle, tail = (m.node_id for m in info.chain)
    impostor = certs.ensure_node_cert(cluster.ca_dir, str(tmp_path / "impostor"), head)   # the head's identity
    chain_id = f"{stream}:0"
    frames = [sms_pb2.LinkFrame(from_node=middle, items=[
        sms_pb2.ReplicateRequest(chain_id=chain_id, epoch=info.chain_epoch, hello=True, session=1)])]
    with _secure(cluster.procs[tail].cluster_address, cluster.ca_file, impostor, node_name=True) as channel:
        call = sms_pb2_grpc.StorageStub(channel).ReplicateLinks(iter(frames), timeout=CALL_TIMEOUT_S)
        answers = [item for frame in call for item in frame.items]
    refusals = [a for a in answers if a.chain_id == chain_id and a.error_name]
    assert refusals and refusals[0].error_name == "PermissionDenied", answers
    assert f"predecessor {middle}" in refusals[0].error_message and f"node {head}" in refusals[0].error_message

    # a batch after the refused hello: dropped (its session ended)
    frames = [sms_pb2.LinkFrame(from_node=middle, items=[
        sms_pb2.ReplicateRequest(chain_id=chain_id, epoch=info.chain_epoch, hello=True, session=2),
        sms_pb2.ReplicateRequest(chain_id=chain_id, epoch=info.chain_epoch, session=2,
                                 batch=_forge_batch(stream, good.sn), committed_sn=seqno.to_bytes(good.sn))])]
    with _secure(cluster.procs[tail].cluster_address, cluster.ca_file, impostor, node_name=True) as channel:
        list(sms_pb2_grpc.StorageStub(channel).ReplicateLinks(iter(frames), timeout=CALL_TIMEOUT_S))
    after = client.put_record(stream, b"after", "k")
    datas = [r.data for r in read_stream(client, stream)[0]]
    assert datas == [b"real", b"after"], datas
    assert client.get_stream_info(stream).partition(0).chain_epoch == info.chain_epoch   # nothing reconfigured
    assert after.sn > good.sn


def test_a_tls_client_of_a_plaintext_cluster_gets_a_named_error(make_cluster):
    """`sms up --insecure`: one plaintext port per node; a TLS client is told so, a
    plaintext one works."""
    plain = make_cluster(nodes=1, tls=False)
    with open(os.path.join(plain.data_dir, "cluster.json")) as f:
        assert json.load(f)["ca_file"] == ""
    with sms.Client(plain.address) as tls_client:            # $SMS_CA_FILE: TLS
        with pytest.raises(errors.TlsHandshakeFailed, match="does not speak TLS"):
            tls_client.list_streams()
    with sms.Client.from_cluster_file(plain.data_dir) as c:
        c.create_stream("plain", partitions=1, replication_factor=1)
        c.put_record("plain", b"x", "k")
        wait_until(lambda: read_stream(c, "plain")[0], 10.0, "the record read back over plaintext")


def test_a_predecessor_cannot_replicate_a_batch_no_reader_decodes(cluster, client, tmp_path):
    """The poison batch of issue 30 (a record whose partition key is not UTF-8) through
    the replication path: the tail's own predecessor (a valid certificate with its node
    id) sends it, sequenced right after the log's last record. The tail checks every
    record as a reader will decode it and refuses the batch with CorruptBatch; nothing
    is stored, and every read of the partition still works. (Before, replicas trusted
    the checksum alone and such a batch made every read of the partition fail.)"""
    stream = "tls-poison-replication"
    client.create_stream(stream, partitions=1, replication_factor=3)
    good = client.put_record(stream, b"real", "k")
    info = client.get_stream_info(stream).partition(0)
    _head, middle, tail = (m.node_id for m in info.chain)
    predecessor = certs.ensure_node_cert(cluster.ca_dir, str(tmp_path / "predecessor"), middle)
    chain_id = f"{stream}:0"
    poison = wire.seal(1, good.sn + seqno.COUNTER_UNIT, wire.encode_entry(b"\xff\xfe", b"poison"), 7, 1)
    frames = [sms_pb2.LinkFrame(from_node=middle, items=[
        sms_pb2.ReplicateRequest(chain_id=chain_id, epoch=info.chain_epoch, hello=True, session=7),
        sms_pb2.ReplicateRequest(chain_id=chain_id, epoch=info.chain_epoch, session=7, verified=True),
        sms_pb2.ReplicateRequest(chain_id=chain_id, epoch=info.chain_epoch, session=7, batch=poison,
                                 committed_sn=seqno.to_bytes(good.sn))])]
    with _secure(cluster.procs[tail].cluster_address, cluster.ca_file, predecessor, node_name=True) as channel:
        call = sms_pb2_grpc.StorageStub(channel).ReplicateLinks(iter(frames), timeout=CALL_TIMEOUT_S)
        answers = [item for frame in call for item in frame.items]
    refusals = [a for a in answers if a.chain_id == chain_id and a.error_name]
    assert refusals and refusals[0].error_name == "CorruptBatch", answers
    assert "not UTF-8" in refusals[0].error_message
    # the real chain goes on (its link re-established if the forged session displaced it)
    after = wait_until(lambda: _put_or_none(client, stream, b"after"), 30.0, "a put after the poison batch")
    datas = [r.data for r in read_stream(client, stream)[0]]
    assert datas == [b"real", b"after"], datas
    assert after.sn > good.sn


def _put_or_none(client: sms.Client, stream: str, data: bytes):
    try:
        return client.put_record(stream, data, "k")
    except errors.Unavailable:
        return None
