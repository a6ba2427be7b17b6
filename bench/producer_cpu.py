"""CPU per record of the de-duplicating producer itself (`sms.producer.Producer` around
`sms.accumulator.Accumulator`), in this one process, against an in-process transport that
answers every PutRecords at once as written (no gRPC, no server). Beside it: the cost of
building those answers alone (the transport's share, subtracted), and of `send_batch`'s
input checks alone. Prints one JSON document.

    .venv/bin/python -m bench.producer_cpu [--records 200000] [--batch 500] [--partitions 4]

The figure is the producer's share of the end-to-end CPU per record that `make bench`
reports for the client process; nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time

from bench import common
from sms import hashing, wire
from sms.proto import sms_pb2
from sms.records import prepare_records
from sms.types import ChainMember, IngestionPolicy, PartitionInfo, PartitionState, Persistence, StreamInfo, StreamStatus

STREAM = "bench"


def stream_map(partitions: int) -> StreamInfo:
    parts = []
    for p in range(partitions):
        member = ChainMember(f"n{p % 3}", f"node-{p % 3}:1", "head+tail")
        parts.append(PartitionInfo(
            ordinal=p, hash_lo=p * hashing.HASH_SPACE // partitions, hash_hi=(p + 1) * hashing.HASH_SPACE // partitions,
            valid_from_ms=0, valid_to_ms=None, state=PartitionState.OPEN, parents=(), children=(), chain_epoch=1,
            chain=(member,), ingestion_owner=member))
    return StreamInfo(name=STREAM, status=StreamStatus.ACTIVE, replication_factor=1, persistence=Persistence.MEMORY,
                      ingestion_policy=IngestionPolicy.AT_LEAST_ONCE_NO_DUP, retention_hours=24, map_version=1,
                      created_ms=0, partitions=tuple(parts), dedup_window_s=300)


class InstantTransport:
    """Answers every record of a PutRecords as stored, with made-up SNs."""

    def __init__(self, partitions: int):
        self.info = stream_map(partitions)
        self.sn = 1 << 80
        self.requests = 0
        self.answer_s = 0.0

    async def get_stream_info(self, name: str, *, refresh: bool = True) -> StreamInfo:
        return self.info

    async def init_producer(self, stream: str, producer_id: bytes) -> int:
        return 1                               # (a producer with an id opens an epoch first)

    async def upload_payloads(self, stream: str, records):
        raise AssertionError("the bench sends no record by reference")

    async def send_put_records(self, address: str, request) -> sms_pb2.PutRecordsResponse:
        await asyncio.sleep(0)                 # an answer comes later, as over a network
        t0 = time.process_time()
        response = self.answer(request)
        self.answer_s += time.process_time() - t0
        return response

    def answer(self, request) -> sms_pb2.PutRecordsResponse:
        n = request.count
        self.requests += 1
        ordinals = wire.decode_ordinals(request.session_ordinals)
        sns, self.sn = list(range(self.sn, self.sn + n)), self.sn + n
        seq, ords = wire.encode_put_results(sns, ordinals)
        return sms_pb2.PutRecordsResponse(sequence_numbers=seq, ordinals=ords)


async def _run(records: int, batch: int, partitions: int, in_flight: int) -> dict:
    from sms.producer import Producer
    recs = common.records(records, 100)
    groups = common.batches(recs, batch)
    transport = InstantTransport(partitions)
    producer = Producer(transport, STREAM, b"bench-producer")
    pending: collections.deque = collections.deque()
    acked = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for group in groups:
        pending.append(await producer.send_batch(group))
        while len(pending) > in_flight:
            acked += sum(1 for r in await pending.popleft() if not isinstance(r, BaseException))
    while pending:
        acked += sum(1 for r in await pending.popleft() if not isinstance(r, BaseException))
    cpu_s, wall_s = time.process_time() - c0, time.perf_counter() - t0
    await producer.close()
    t1 = time.process_time()
    for group in groups:
        prepare_records(group)
    prepare_s = time.process_time() - t1
    return {
        "records": records, "acked": acked, "requests": transport.requests,
        "records_per_s": round(records / wall_s),
        "producer_cpu_us_per_record": round((cpu_s - transport.answer_s) / records * 1e6, 3),
        "of_which_input_checks_us_per_record": round(prepare_s / records * 1e6, 3),
        "transport_answers_us_per_record": round(transport.answer_s / records * 1e6, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=4)
    args = ap.parse_args(argv)
    out = {"bench": "producer_cpu", "wire": wire.IMPLEMENTATION,
           **asyncio.run(_run(args.records, args.batch, args.partitions, args.in_flight))}
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
