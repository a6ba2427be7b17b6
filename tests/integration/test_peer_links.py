"""One replication stream per pair of nodes (storage/peerlink.py), on real processes.

A stream of many partitions over three storage nodes: every node ships all its chain
links to a successor node over one stream, frames carry many chains' messages, and every
acknowledged record reads back from every partition. NodeStatus reports the streams.
"""

from __future__ import annotations

import grpc
import pytest

from sms.proto import sms_pb2, sms_pb2_grpc
from tests.conftest import client_channel, read_stream, wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 12
RECORDS = 3_000


def node_status(address: str) -> sms_pb2.NodeStatusResponse:
    with client_channel(address) as channel:
        return sms_pb2_grpc.ControlStub(channel).NodeStatus(sms_pb2.NodeStatusRequest(), timeout=5)


def test_every_chain_link_to_a_node_shares_one_stream(cluster, client, unique_stream):
    client.create_stream(unique_stream, partitions=PARTITIONS, replication_factor=3)
    keys = [f"key-{i}" for i in range(RECORDS)]
    acked = []
    for start in range(0, RECORDS, 500):
        out = client.put_records(unique_stream, [(k, k.encode()) for k in keys[start:start + 500]])
        assert out.failed_record_count == 0, [r for r in out.records if not r.ok][:3]
        acked.extend(keys[start:start + 500])
    got = read_stream(client, unique_stream)
    assert sorted(r.data.decode() for rs in got.values() for r in rs) == sorted(acked)

    storage = [n for n in cluster.procs.values() if n.roles != "control"]
    assert len(storage) == 3
    for node in storage:
        def links_settled(node=node):
            status = node_status(node.address)
            mine = [r for r in status.replicas if r.chain_id.startswith(unique_stream + ":")]
            shipping = sum(1 for r in mine if r.role in ("head", "middle"))
            outgoing = [p for p in status.peer_links if p.outgoing]
            chains = sum(p.chains for p in outgoing)
            return (status, outgoing) if len(mine) == PARTITIONS and chains >= shipping > 0 else None
        status, outgoing = wait_until(links_settled, 30, f"{node.node_id}'s chain links on their streams")
        peers = [p.peer for p in outgoing]
        assert len(peers) == len(set(peers)) <= 2, f"{node.node_id}: one stream per successor node, got {peers}"
        assert node.node_id not in peers
        for p in outgoing:
            assert p.connected and p.streams >= 1
        # many chains' messages per frame: fewer frames than link messages on the busiest stream
        busiest = max(outgoing, key=lambda p: p.items)
        assert busiest.items > busiest.frames > 0, (node.node_id, busiest)
        incoming = [p for p in status.peer_links if not p.outgoing]
        assert incoming and all(p.peer for p in incoming if p.frames)
