"""The fault-trial workload and history checker against a real 3-node cluster.

Without faults, the workload's producers and tailing consumers run a few thousand
records through a replication-factor-3 stream, and the checker must find nothing
wrong: this is the baseline every fault trial is measured against. Then the same with
one storage node restarted on its data while the load runs: writes must resume after
it and nothing acked may be lost or doubled. And with reads that fail on purpose (before
and after the node served them, with lost iterators): the consumers must retry and
resume without a gap or a repeat.
"""

from __future__ import annotations

import itertools

import pytest

import sms
import sms.aio
from sms import errors
from tests.conftest import assert_all_alive, stream_name
from tests.fault.history import check, format_table
from tests.fault.workload import Workload, read_back

pytestmark = pytest.mark.integration

PARTITIONS = 3
RECORDS = 3_000
FLAKY_RECORDS = 1_500
ACK_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0


def test_workload_without_faults_passes_the_checker(make_cluster):
    cluster = make_cluster()
    with sms.Client(cluster.address) as client:
        stream = stream_name("smoke")
        client.create_stream(stream, partitions=PARTITIONS, replication_factor=3)
        with Workload(cluster.address, stream, producers=4, keys=16, consumers=2, records=RECORDS) as load:
            load.wait_acks(RECORDS, ACK_TIMEOUT_S)
            stats = load.stop(STOP_TIMEOUT_S)
        final = read_back(client, stream, history=load.history)
    result = check(load.history, final)
    print(result.summary())
    print({k: v for k, v in stats.items() if k != "producers"})
    print(format_table([("none", result)]))
    result.assert_ok()
    assert result.acked == RECORDS and result.failed == 0, result.summary()
    assert len(final) == RECORDS
    # every consumer saw every record: the tail of each partition reached
    assert result.observations == 2 * RECORDS, result.summary()
    assert_all_alive(cluster)


@pytest.mark.parametrize("how", ["sigterm", pytest.param("sigkill", marks=pytest.mark.slow)])
def test_workload_survives_a_storage_node_restart(make_cluster, how):
    cluster = make_cluster()
    with sms.Client(cluster.address) as client:
        stream = stream_name("smoke-restart")
        info = client.create_stream(stream, partitions=PARTITIONS, replication_factor=3)
        victim = info.partition(0).chain[0].node_id          # head (and ingestion owner) of p0
        with Workload(cluster.address, stream, producers=4, keys=16, consumers=2, rate_per_s=1_000) as load:
            load.wait_acks(500, ACK_TIMEOUT_S)
            load.mark_fault(f"restart-{how}", partitions=[0])
            if how == "sigkill":
                cluster.kill(victim)
            cluster.restart(victim)
            before = load.acked_count()
            load.wait_acks(before + 500, ACK_TIMEOUT_S)
            stats = load.stop(STOP_TIMEOUT_S)
        final = read_back(client, stream, history=load.history)
    result = check(load.history, final)
    print(result.summary())
    print({k: v for k, v in stats.items() if k != "producers"})
    print(format_table([(f"restart-{how}", result)]))
    result.assert_ok()
    assert result.recoveries and result.recoveries[0].resumed
    assert_all_alive(cluster)


class FlakyReadsClient(sms.aio.Client):
    """A real client whose reads fail on purpose: some before reaching a node, some after
    the node answered (the answer is lost), some with an expired iterator."""

    _calls = itertools.count()

    async def get_next_records(self, iterator, max_records=1000, wait_ms=0):
        n = next(self._calls)
        if n % 7 == 3:
            raise errors.Unavailable("injected: request lost")
        if n % 11 == 5:
            raise errors.ExpiredIterator("injected: iterator expired")
        if n % 13 == 6:
            raise errors.InternalError("injected: not retriable")
        page = await super().get_next_records(iterator, max_records, wait_ms)
        if n % 5 == 2:
            raise errors.Timeout("injected: answer lost")
        return page


def test_consumers_ride_out_failing_reads(make_cluster):
    cluster = make_cluster()
    with sms.Client(cluster.address) as client:
        stream = stream_name("smoke-flaky-reads")
        client.create_stream(stream, partitions=PARTITIONS, replication_factor=3)
        with Workload(lambda: FlakyReadsClient(cluster.address), stream, producers=2, consumers=2,
                      records=FLAKY_RECORDS, rate_per_s=2_000) as load:
            load.wait_acks(FLAKY_RECORDS, ACK_TIMEOUT_S)
            stats = load.stop(STOP_TIMEOUT_S)
        final = read_back(client, stream, history=load.history)
    result = check(load.history, final)
    print(result.summary())
    print({k: v for k, v in stats.items() if k != "producers"})
    result.assert_ok()
    assert result.observations == 2 * FLAKY_RECORDS, result.summary()
    for name in ("Unavailable", "ExpiredIterator", "InternalError", "Timeout"):
        assert stats["read_errors"].get(name), f"no read failed with {name}: {stats}"
    assert stats["iterator_renewals"] > 0 and stats["client_renewals"] > 0, stats
