"""The de-duplicating producer (sms/producer.py) against a real cluster, with faults.

The unit tests drive the producer against a fake; these drive the real thing: separate
node processes, LMDB, gRPC. A head (which is also the partition's ingestion owner) is
killed with SIGKILL and restarted while producers keep sending; afterwards every record
a producer sent is stored exactly once, under the SN its future reported, and each
session's records are stored in SSSN order.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from ingestion.fencing import split_session_producer_id
from sms import wire
from tests.conftest import read_stream, stream_name, wait_until

pytestmark = pytest.mark.integration


def stored_by_session(client, stream: str) -> dict[tuple[bytes, int], list[tuple[int, int]]]:
    """(producer id, partition) -> [(sssn, sn)] in storage order."""
    out: dict[tuple[bytes, int], list[tuple[int, int]]] = defaultdict(list)
    records = read_stream(client, stream)
    for ordinal in sorted(records):
        for r in records[ordinal]:
            meta = wire.decode_meta(r.meta)
            producer_id, _epoch = split_session_producer_id(meta[wire.TAG_PRODUCER_ID])
            out[(producer_id, ordinal)].append((int.from_bytes(meta[wire.TAG_SSSN], "big"), r.sn))
    return out


def test_sync_producer_stores_every_record_once_in_sssn_order(client):
    stream = stream_name("producer")
    client.create_stream(stream, partitions=3, replication_factor=3)
    with client.producer(stream, producer_id="steady") as producer:
        futures = [producer.send(f"event {i}".encode(), f"user-{i % 40}") for i in range(3000)]
        producer.flush()
    results = [f.result() for f in futures]
    assert not any(r.duplicate for r in results)
    stored = stored_by_session(client, stream)
    assert sum(len(v) for v in stored.values()) == 3000
    for (_pid, _ordinal), rows in stored.items():
        assert [s for s, _sn in rows] == list(range(len(rows))), "a session's records are stored in SSSN order"
    acked = {(r.partition_ordinal, r.sssn): r.sn for r in results}
    assert {(o, s): sn for (_p, o), rows in stored.items() for s, sn in rows} == acked


@pytest.mark.slow
def test_producers_survive_kill_9_of_a_head_without_loss_or_duplicates(make_cluster):
    cluster = make_cluster()
    import sms
    with sms.Client(cluster.address) as client:
        stream = stream_name("producer-kill")
        info = client.create_stream(stream, partitions=2, replication_factor=3)
        victim = info.partition(0).chain[0].node_id
        sent: list = []
        errors: list = []
        stats: list[dict] = []
        halfway = threading.Event()
        restarted = threading.Event()

        def produce(name: str) -> None:
            try:
                with client.producer(stream, producer_id=name, delivery_timeout_s=60) as producer:
                    for i in range(2000):
                        sent.append((name, producer.send(f"{name} {i}".encode(), f"key-{i % 50}")))
                        if i % 100 == 99:
                            producer.flush()     # paced, so sends straddle the kill
                        if i == 600:
                            halfway.set()
                        if i == 1000:
                            restarted.wait(60)   # keep sending until the head is back
                    producer.flush()
                    stats.append(producer.statistics())
            except Exception as e:   # surfaced by the assertion below, with its type
                errors.append(e)

        threads = [threading.Thread(target=produce, args=(f"producer-{n}",)) for n in range(2)]
        for t in threads:
            t.start()
        assert halfway.wait(60), "producers did not get going"
        cluster.kill(victim)
        cluster.restart(victim)
        restarted.set()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert sum(s["call_failures_total"] + s["retries_total"] for s in stats) > 0, \
            f"the kill hit no request in flight: {stats}"
        results = [f.result(timeout=60) for _name, f in sent]
        assert len(results) == 4000
        stored = wait_until(lambda: (s := stored_by_session(client, stream)) and
                            sum(len(v) for v in s.values()) >= 4000 and s, 30, "all records readable")
        assert sum(len(v) for v in stored.values()) == 4000, "every record stored exactly once"
        for rows in stored.values():
            sssns = [s for s, _sn in rows]
            assert sssns == sorted(sssns) and len(set(sssns)) == len(sssns)
        by_sssn = {(pid, o, s): sn for (pid, o), rows in stored.items() for s, sn in rows}
        for (name, _f), r in zip(sent, results):
            if r.sn is not None:
                assert by_sssn[(name.encode(), r.partition_ordinal, r.sssn)] == r.sn, "acked SN is the stored SN"
