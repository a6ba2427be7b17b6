"""A stage's output, written so that a replay stores nothing twice.

Each (stage, input stream, input partition) writes with its own fixed producer id. The
outputs of one batch get SSSNs derived from the batch's position in its input partition
(`base_sssn(first input SN)` + index), so the worker that replays a batch after a
failover sends the same records under the same SSSNs, and ingestion answers them as
duplicates. The session partition of each record is the output partition that covered
its key at the batch's input time (from the map's validity ranges), so the replay uses
the same session even if the output stream was split in between.

The sending is the client's: one `sms.producer.Producer` per output stream, whose
records carry these pinned SSSNs (`Producer.send_pinned`); its accumulator batches them
per ingestion owner, keeps each session's HWM (one below its lowest un-acknowledged
SSSN), resends what is retriable and re-routes on a changed map. `write` returns once
every record is acknowledged (or answered as a duplicate), or raises the first
non-retriable error once every record has its outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sms import errors, limits, seqno
from sms.producer import BatchResults, Producer
from sms.records import prepare_record


def base_sssn(first_input_sn: int) -> int:
    """The first SSSN of a batch's outputs: its first input record's counter, shifted so
    that each batch has room for SPS_OUTPUTS_PER_BATCH_MAX outputs."""
    return seqno.counter_of(first_input_sn) * limits.SPS_OUTPUTS_PER_BATCH_MAX


class OutputWriter:
    def __init__(self, client, producer_id: bytes):
        self.client = client
        self.producer_id = producer_id
        self.producers: dict[str, Producer] = {}
        self.written = 0
        self.duplicates = 0

    async def write(self, records: list[tuple], first_sssn: int, at_ms: int) -> Sequence:
        """records: (stream, partition key, data[, headers dict]); record i gets SSSN
        first_sssn + i. Each goes in its session with the output partition that covered
        its key at `at_ms` (the batch's input time), so a replay picks the same session even
        if the output stream was split since: ingestion routes it to the open child, in
        that session. Returns each record's outcome (`ProducerResult`), in order."""
        if len(records) > limits.SPS_OUTPUTS_PER_BATCH_MAX:
            raise errors.LimitExceeded(f"{len(records)} outputs of one batch; at most {limits.SPS_OUTPUTS_PER_BATCH_MAX}")
        by_stream: dict[str, list] = {}
        places: dict[str, list[int]] = {}
        for i, (stream, key, data, *headers) in enumerate(records):
            prepared = prepare_record(key, data, None, headers[0] if headers else None)
            by_stream.setdefault(stream, []).append((prepared, first_sssn + i))
            places.setdefault(stream, []).append(i)
        outcomes = await asyncio.gather(*(self._write_stream(stream, items, at_ms)
                                          for stream, items in by_stream.items()))
        # (each stream's outcomes are a BatchResults: its errors and duplicates without a
        # look at every record)
        failures = [e for batch in outcomes for _i, e in batch.failed]
        self.written += sum(len(batch) for batch in outcomes) - len(failures)
        self.duplicates += sum(batch.duplicates for batch in outcomes)
        if failures:
            raise failures[0]
        if len(outcomes) == 1:
            return outcomes[0]                  # one stream: already in the records' order
        ordered: list = [None] * len(records)
        for stream, batch in zip(by_stream, outcomes):
            for i, outcome in zip(places[stream], batch):
                ordered[i] = outcome
        return ordered

    async def _write_stream(self, stream: str, items: list, at_ms: int) -> BatchResults:
        producer = self.producers.get(stream)
        if producer is None:
            producer = self.producers[stream] = Producer(
                self.client, stream, self.producer_id, linger_ms=0,
                delivery_timeout_s=limits.SPS_OUTPUT_RETRY_DEADLINE_S,
                epochs=False)           # (SSSNs come from the input: a replay must meet the same session)
        info = await producer.stream_map()
        governing = info.partitions_at(at_ms)
        pinned = []
        for prepared, sssn in items:
            h = prepared.hash_key
            session = next((p.ordinal for p in governing if p.hash_lo <= h < p.hash_hi), None)
            if session is None:           # before the stream, or retention dropped that partition
                session = info.open_partition_for_hash(h).ordinal
            pinned.append((prepared, session, sssn))
        return await (await producer.send_pinned(pinned))

    async def close(self, *, flush: bool = True) -> None:
        """Stop the producers (see `Producer.close`)."""
        producers, self.producers = list(self.producers.values()), {}
        for producer in producers:
            await producer.close(flush=flush)
