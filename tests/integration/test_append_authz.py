"""Only the partition's own ingestion writes to its head (issue 30 item 2; storage/head.py,
storage/service.py `append_caller`, sms/wire.py `sequence_checked`).

On the suite's TLS cluster, `Storage.Append` is called on the head's cluster port as an
attacker holding a certificate of the cluster's CA would:
- a node certificate of another member of the chain, and of a node id the cluster does
  not know, sending a well-formed batch with the chain's current epoch: refused with
  PermissionDenied, nothing stored on any replica, the partition serving on; the same
  batch from the head's own identity is taken (the refusal is the caller's identity,
  not the batch);
- the head's own identity (the ingestion owner) sending a batch one of whose records has
  a partition key that is not UTF-8: refused with CorruptBatch, nothing stored, and every
  read of the partition works afterwards (before, it was stored and every read of the
  partition then failed with CorruptBatch);
- a client certificate of the cluster's CA: refused at the cluster port, as before.
Each refused Append is in the head's audit log (`append.refused`: who, the chain, the error).
"""

from __future__ import annotations

import random
import time

import grpc
import pytest

from node import certs
from sms import security, wire
from sms.proto import sms_pb2, sms_pb2_grpc
from tests.conftest import node_channel, read_partition

pytestmark = pytest.mark.integration

CALL_TIMEOUT_S = 10.0


def _append(cluster, head_address: str, as_node: str, chain_id: str, epoch: int, batch: bytes) -> list:
    """The acks of one Append call to the head's cluster port, as node `as_node`."""
    seq = wire.read_header(batch).origin_seq
    with node_channel(cluster, head_address, as_node) as channel:
        call = sms_pb2_grpc.StorageStub(channel).Append(
            iter([sms_pb2.AppendRequest(chain_id=chain_id, epoch=epoch, batch_id=seq, batch=batch)]),
            timeout=CALL_TIMEOUT_S)
        return list(call)


def _batch(*entries: bytes) -> bytes:
    """An unsequenced batch as an ingestion writer seals it, of an origin no writer uses."""
    return wire.seal(len(entries), 0, b"".join(entries), random.getrandbits(62) + 1, 1)


def _replicas(cluster, info, chain_id: str) -> dict[str, tuple]:
    """(last_sn, batches, records) of the chain on each member, from its own status."""
    out = {}
    for member in info.chain:
        with node_channel(cluster, member.address) as channel:
            status = sms_pb2_grpc.StorageStub(channel).NodeStatus(
                sms_pb2.NodeStatusRequest(chain_ids=[chain_id]), timeout=CALL_TIMEOUT_S)
        (replica,) = [r for r in status.replicas if r.chain_id == chain_id]
        out[member.node_id] = (replica.last_sn, replica.batches, replica.records)
    return out


@pytest.fixture
def chain(client, unique_stream):
    """A stream of one partition on three replicas holding one record: (stream, chain id,
    stream info of the partition, the records read back)."""
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    client.put_record(unique_stream, b"real", "k")
    info = client.get_stream_info(unique_stream).partition(0)
    return unique_stream, f"{unique_stream}:0", info, read_partition(client, unique_stream, 0)


def _refusals(client, chain_id: str, since_ms: int) -> set[tuple]:
    """(outcome, who, node) of the audit log's append.refused lines of the chain."""
    events = client.read_audit(since_ms)["events"]
    return {(e["outcome"], e["who"].get("node"), e["node"]) for e in events
            if e["action"] == "append.refused" and e["target"] == chain_id}


def _assert_serving(client, stream: str, before: list) -> None:
    """Every read of the partition gives what it held, and a put after is read back."""
    assert [(r.sn, r.data) for r in read_partition(client, stream, 0)] == [(r.sn, r.data) for r in before]
    after = client.put_record(stream, b"after", "k")
    assert [r.data for r in read_partition(client, stream, 0)] == [r.data for r in before] + [b"after"]
    assert after.sn > before[-1].sn


def test_another_nodes_certificate_cannot_append_to_a_head(cluster, client, chain):
    stream, chain_id, info, before = chain
    head, member = info.chain[0], info.chain[1]
    batch = _batch(wire.encode_entry(b"k", b"forged"))
    replicas = _replicas(cluster, info, chain_id)
    since_ms = time.time_ns() // 1_000_000 - 1_000
    for caller in (member.node_id, "n-stranger"):
        acks = _append(cluster, head.address, caller, chain_id, info.chain_epoch, batch)
        assert [(a.error_name, a.count) for a in acks] == [("PermissionDenied", 0)], acks
        assert f"only its ingestion owner {head.node_id}" in acks[0].error_message
        assert f"not node {caller}" in acks[0].error_message
    assert _replicas(cluster, info, chain_id) == replicas             # nothing stored on any replica
    assert _refusals(client, chain_id, since_ms) == {("PermissionDenied", caller, head.node_id)
                                                     for caller in (member.node_id, "n-stranger")}
    assert client.get_stream_info(stream).partition(0).chain_epoch == info.chain_epoch
    _assert_serving(client, stream, before)

    # the same batch from the head's own identity is taken: the caller was refused, not the batch
    before = read_partition(client, stream, 0)
    acks = _append(cluster, head.address, head.node_id, chain_id, info.chain_epoch, batch)
    assert [(a.error_name, a.count) for a in acks] == [("", 1)], acks
    assert [r.data for r in read_partition(client, stream, 0)] == [r.data for r in before] + [b"forged"]


@pytest.mark.parametrize("key", [b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\x80"], ids=["ff-fe", "surrogate", "overlong"])
def test_the_owner_cannot_store_a_record_no_reader_decodes(cluster, client, chain, key):
    stream, chain_id, info, before = chain
    head = info.chain[0]
    poison = _batch(wire.encode_entry(b"fine", b"first"), wire.encode_entry(key, b"poison"))
    replicas = _replicas(cluster, info, chain_id)
    since_ms = time.time_ns() // 1_000_000 - 1_000
    acks = _append(cluster, head.address, head.node_id, chain_id, info.chain_epoch, poison)
    assert [(a.error_name, a.count) for a in acks] == [("CorruptBatch", 0)], acks
    assert "record 1: partition key is not UTF-8" in acks[0].error_message
    assert _replicas(cluster, info, chain_id) == replicas             # nothing stored on any replica
    assert _refusals(client, chain_id, since_ms) == {("CorruptBatch", head.node_id, head.node_id)}
    _assert_serving(client, stream, before)
    # and a read from every position of the partition works
    for record in read_partition(client, stream, 0):
        it = client.get_iterator(stream, 0, "AT_SEQUENCE_NUMBER", sequence_number=str(record.sn))
        assert client.get_next_records(it, max_records=10).records[0].sn == record.sn


def test_a_client_certificate_cannot_append(cluster, client, chain, tmp_path):
    stream, chain_id, info, before = chain
    head = next(n for n in cluster.procs.values() if info.chain[0].address in (n.address, n.cluster_address))
    app = certs.issue(cluster.ca_dir, str(tmp_path / "app"), client="app")
    tls = security.TlsConfig.from_files(cluster.ca_file, app.cert_file, app.key_file)
    batch = _batch(wire.encode_entry(b"k", b"forged"))
    with grpc.secure_channel(head.cluster_address, tls.channel_credentials(),
                             options=[("grpc.ssl_target_name_override", security.NODE_TARGET_NAME)]) as channel:
        with pytest.raises(grpc.RpcError) as e:
            list(sms_pb2_grpc.StorageStub(channel).Append(
                iter([sms_pb2.AppendRequest(chain_id=chain_id, epoch=info.chain_epoch, batch_id=1, batch=batch)]),
                timeout=CALL_TIMEOUT_S))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "node certificate" in e.value.details()
    _assert_serving(client, stream, before)
