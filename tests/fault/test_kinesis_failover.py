"""The Kinesis endpoint under kill -9: boto3 writes PutRecords through a small TCP balancer
(the setup docs/kinesis.md describes: any TCP balancer in front of every node's endpoint)
while the node that owns a shard's ingestion, and serves endpoint connections, is killed.
Every record boto3 saw acknowledged reads back at its acknowledged sequence number, and
writes go on within the failover bound: a killed node costs the client only the retries
its SDK makes."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest

boto3 = pytest.importorskip("boto3")
from botocore.config import Config  # noqa: E402
from botocore.exceptions import BotoCoreError, ClientError  # noqa: E402

import sms  # noqa: E402
from sms import limits, security  # noqa: E402
from tests.conftest import stream_name, wait_until  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WRITES_RESUME_S = limits.METASTORE_SESSION_TTL_S * 4 + 10    # the failover bound, with room on a busy machine


class Balancer:
    """A TCP balancer on loopback: each connection goes to the next backend that accepts one
    (TLS passes through; the backends' certificates name 127.0.0.1)."""

    def __init__(self, backends: list[tuple[str, int]]):
        self.backends = backends
        self.turn = itertools.count()
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _connection(self, reader, writer) -> None:
        upstream = None
        for _ in range(len(self.backends)):
            host, port = self.backends[next(self.turn) % len(self.backends)]
            try:
                upstream = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
                break
            except (OSError, asyncio.TimeoutError):
                continue
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream

        async def pipe(src, dst) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def close(self) -> None:
        """Every connection ended and the loop closed (nothing left for the collector to
        finalize on a closed loop)."""
        async def shutdown() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_kill_9_of_a_shard_owner_behind_a_balancer_loses_no_acknowledged_record(make_cluster):
    cluster = make_cluster()
    backends = []
    for node in cluster.procs.values():
        if node.kinesis_address and node.roles != "control":
            host, port = node.kinesis_address.split("://", 1)[1].rsplit(":", 1)
            backends.append((host, int(port)))
    balancer = Balancer(backends)
    key_id, secret = security.aws_credentials(cluster.admin_token)
    kinesis = boto3.client("kinesis", endpoint_url=f"https://127.0.0.1:{balancer.port}", region_name="us-east-1",
                           aws_access_key_id=key_id, aws_secret_access_key=secret, verify=cluster.ca_file,
                           config=Config(retries={"max_attempts": 10, "mode": "standard"}, connect_timeout=5,
                                         read_timeout=30))
    name = stream_name("k-failover")
    kinesis.create_stream(StreamName=name, ShardCount=2)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    acked: dict[str, str] = {}
    on_shard0: list[str] = []            # keys acknowledged on shardId-000000000000, in order
    failures: list[str] = []
    refused = [0]                        # records answered with an error code (the caller resends them)
    stop = threading.Event()

    def write() -> None:
        for batch in itertools.count():
            if stop.is_set():
                return
            keys = [f"b{batch}-{i}" for i in range(100)]
            try:
                answer = kinesis.put_records(StreamName=name, Records=[{"PartitionKey": k, "Data": k.encode()}
                                                                       for k in keys])
            except (ClientError, BotoCoreError) as e:
                failures.append(str(e)[:200])
                continue
            for k, r in zip(keys, answer["Records"]):
                if "SequenceNumber" not in r:
                    refused[0] += 1
                    continue
                if r["ShardId"] == "shardId-000000000000":
                    on_shard0.append(k)
                acked[k] = r["SequenceNumber"]

    writer = threading.Thread(target=write)
    writer.start()
    try:
        wait_until(lambda: len(acked) >= 2_000, 60, "records acknowledged before the kill")
        with sms.Client(cluster.address) as native:
            owner = native.get_stream_info(name).partitions[0].ingestion_owner.node_id
        cluster.kill(owner)
        killed_at = time.monotonic()
        before = len(on_shard0)
        wait_until(lambda: len(on_shard0) >= before + 500, WRITES_RESUME_S,
                   "writes to the killed owner's shard going on after the kill")
        resumed_s = time.monotonic() - killed_at
    finally:
        stop.set()
        writer.join(60)
        balancer.close()
    with sms.Client(cluster.address) as native:
        read: dict[str, list[str]] = {}
        for record in native.read_stream(name):
            read.setdefault(record.partition_key, []).append(record.sequence_number)
    missing = [k for k, sn in acked.items() if sn not in read.get(k, ())]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:3]}"
    # (a PutRecords that boto3 resent after its answer was lost may have stored its records
    # twice, as with Kinesis: at least once; the de-duplicating producer is the native one)
    twice = sum(1 for sns in read.values() if len(sns) > 1)
    print(f"kinesis failover: {len(acked)} acked, {refused[0]} records answered with an error, "
          f"{len(failures)} calls failed after boto3's retries, {twice} keys stored twice by resent calls; "
          f"the killed owner's shard took 500 more records {resumed_s:.1f}s after the kill "
          f"(bound {WRITES_RESUME_S:.0f}s)")
