"""min_in_sync on real processes: a stream of RF 3 that needs 2 chain members refuses
writes while its chain is down to one member, and takes them again once re-replication
has restored a second member. Control + 3 storage nodes; two of them killed with SIGKILL
(the chain manager removes them), then restarted (they rejoin as learners, copy the
survivor's log and are promoted). Every wait polls against a deadline."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sms
from sms import errors
from tests.conftest import read_partition, wait_until

pytestmark = pytest.mark.integration

STREAM = "mis"
FAILOVER_TIMEOUT_S = 60.0        # the dead members removed (probes: < 1 s; session expiry: 3 s)
RESTORE_TIMEOUT_S = 90.0         # two restarts, two learners copy and are promoted
REFUSED_PUTS = 5
# what a put may meet while ownership and configs settle, before the refusal itself
SETTLING = (errors.Unavailable, errors.WrongOwner, errors.StaleEpoch, errors.PartitionClosed, errors.Timeout)


def _describe(address: str) -> str:
    out = subprocess.run([sys.executable, "-m", "node", "stream", "describe", STREAM, "--address", address],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_chain_below_min_in_sync_refuses_writes_until_it_is_restored(make_cluster):
    cluster = make_cluster()
    with sms.Client(cluster.address) as client:
        info = client.create_stream(STREAM, partitions=1, replication_factor=3, min_in_sync=2)
        assert info.min_in_sync == 2 and client.get_stream_info(STREAM).min_in_sync == 2
        with pytest.raises(errors.InvalidStreamConfig, match="min_in_sync 4; expected 1..3"):
            client.create_stream("mis-bad", partitions=1, replication_factor=3, min_in_sync=4)
        assert "mis-bad" not in client.list_streams()
        before = client.put_record(STREAM, b"before", "k")     # the whole chain: acknowledged

        # the head and the middle die: the tail is left alone, and becomes head
        members = [m.node_id for m in info.partition(0).chain]
        assert len(members) == 3
        victims, survivor = members[:2], members[2]
        for victim in victims:
            cluster.kill(victim)

        def degraded():
            p = client.get_stream_info(STREAM).partition(0)
            return [m.node_id for m in p.chain] == [survivor] and p
        wait_until(degraded, FAILOVER_TIMEOUT_S, f"{victims} removed from the chain")

        attempts = []

        def refused():
            data = f"settling {len(attempts)}".encode()
            attempts.append(data)
            try:
                client.put_record(STREAM, data, "k")
            except errors.NotEnoughReplicas as e:
                return e
            except SETTLING:
                return None
            raise AssertionError(f"a put to a chain of one member was acknowledged ({data!r})")
        first = wait_until(refused, FAILOVER_TIMEOUT_S, "a put refused with NotEnoughReplicas")
        assert "min_in_sync 2" in first.message and survivor in first.message
        # the head has applied the one-member config (it refused): nothing new is stored now
        refused_data = [f"refused {i}".encode() for i in range(REFUSED_PUTS)]
        for data in refused_data:
            with pytest.raises(errors.NotEnoughReplicas):
                client.put_record(STREAM, data, "k")
        many = client.put_records(STREAM, [("k", b"refused batch %d" % i) for i in range(3)])
        assert [r.error_name for r in many.records] == ["NotEnoughReplicas"] * 3
        assert not any(r.ok for r in many.records)
        text = _describe(cluster.address)
        assert "(min in-sync 2)" in text and "refusing new records (NotEnoughReplicas): 1 member(s)" in text

        # a producer retries NotEnoughReplicas until the chain is restored
        with client.producer(STREAM, producer_id="mis-producer", delivery_timeout_s=110) as producer:
            pending = producer.send(b"from the producer", "k")
            for victim in victims:
                cluster.restart(victim)

            def restored():
                p = client.get_stream_info(STREAM).partition(0)
                return len(p.chain) >= 2 and p
            wait_until(restored, RESTORE_TIMEOUT_S, "a second member back in the chain")
            produced = pending.result(timeout=RESTORE_TIMEOUT_S)
            assert produced.sn

        def accepted():
            try:
                return client.put_record(STREAM, b"after", "k")
            except SETTLING + (errors.NotEnoughReplicas,):
                return None
        after = wait_until(accepted, RESTORE_TIMEOUT_S, "a put acknowledged again")
        assert after.sn > produced.sn > before.sn

        stored = [r.data for r in read_partition(client, STREAM, 0)]
        assert stored[0] == b"before" and stored[-1] == b"after"
        assert stored.count(b"from the producer") == 1
        assert not set(stored) & (set(refused_data) | {b"refused batch %d" % i for i in range(3)}), stored
        # a put that was answered Unavailable while the chain settled may or may not be stored
        assert set(stored) <= {b"before", b"from the producer", b"after", *attempts}
        status = json.loads(subprocess.run(
            [sys.executable, "-m", "node", "stream", "describe", STREAM, "--address", cluster.address, "--json"],
            capture_output=True, text=True, timeout=60, check=True).stdout)
        assert status["min_in_sync"] == 2
