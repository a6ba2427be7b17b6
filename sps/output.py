"""A stage's output, written so that a replay stores nothing twice.

Each (stage, input stream, input partition) writes with its own fixed producer id. The
outputs of one batch get SSSNs derived from the batch's position in its input partition
(`base_sssn(first input SN)` + index), so the worker that replays a batch after a
failover sends the same records under the same SSSNs, and ingestion answers them as
duplicates. The session partition of each record is the output partition that covered
its key at the batch's input time (from the map's validity ranges), so the replay uses
the same session even if the output stream was split in between.

`write` returns once every record is acknowledged (or answered as a duplicate), re-routing
on a changed map, or raises the first non-retriable error.
"""

from __future__ import annotations

import asyncio
import time

from sms import wire, errors, hashing, limits, seqno
from sms.proto import sms_pb2, sms_pb2_grpc



def base_sssn(first_input_sn: int) -> int:
    """The first SSSN of a batch's outputs: its first input record's counter, shifted so
    that each batch has room for SPS_OUTPUTS_PER_BATCH_MAX outputs."""
    return seqno.counter_of(first_input_sn) * limits.SPS_OUTPUTS_PER_BATCH_MAX


class OutputWriter:
    def __init__(self, client, producer_id: bytes, floor_hwm: int = -1):
        self.client = client
        self.producer_id = producer_id
        # (stream, session partition) -> acked high-water mark; `floor_hwm`: every SSSN up to
        # it is settled already (a sink writing micro-batch b knows batches before b are)
        self.floor_hwm = floor_hwm
        self.hwm: dict[tuple[str, int], int] = {}
        self.written = 0
        self.duplicates = 0

    async def write(self, records: list[tuple], first_sssn: int, at_ms: int) -> None:
        """records: (stream, partition key, data[, headers dict]); record i gets SSSN
        first_sssn + i. Each
        goes in its session with the output partition that covered its key at `at_ms` (the
        batch's input time), so a replay picks the same session even if the output stream
        was split since: ingestion routes it to the open child, in that session."""
        if len(records) > limits.SPS_OUTPUTS_PER_BATCH_MAX:
            raise errors.LimitExceeded(f"{len(records)} outputs of one batch; at most {limits.SPS_OUTPUTS_PER_BATCH_MAX}")
        by_stream: dict[str, list[tuple[int, str, bytes, bytes]]] = {}
        for i, (stream, key, data, *headers) in enumerate(records):
            hashing.validate_partition_key(key)
            extra = wire.encode_headers(headers[0]) if headers else b""
            by_stream.setdefault(stream, []).append((first_sssn + i, key, data, extra))
        await asyncio.gather(*(self._write_stream(stream, items, at_ms) for stream, items in by_stream.items()))

    async def _write_stream(self, stream: str, items: list[tuple[int, str, bytes, bytes]], at_ms: int) -> None:
        """Per session (output partition), at most PUT_RECORDS_COUNT_MAX records are
        outstanding at a time, lowest SSSNs first, and the HWM rises as they are
        acknowledged: the partition's dedup table never holds more than its bound."""
        now_ms = int(time.time() * 1000)
        info = await self.client.get_stream_info(stream, refresh=False)
        governing = info.partitions_at(at_ms)
        by_session: dict[int, list] = {}   # session partition -> [sssn, key, data, hash, session, entry], by SSSN
        for sssn, key, data, extra in items:
            h = hashing.hash_key_of(key)
            session = next((p.ordinal for p in governing if p.hash_lo <= h < p.hash_hi), None)
            if session is None:           # before the stream, or retention dropped that partition
                session = info.open_partition_for_hash(h).ordinal
            by_session.setdefault(session, []).append([sssn, key, data, h, session,
                                                       wire.encode_session_entry(key.encode(), data, sssn, now_ms,
                                                                                 extra)])
        deadline = time.monotonic() + limits.SPS_OUTPUT_RETRY_DEADLINE_S
        failures = 0
        while any(by_session.values()):
            groups: dict[str, list] = {}
            for pending in by_session.values():
                for p in pending[:limits.PUT_RECORDS_COUNT_MAX]:
                    try:
                        target = info.open_partition_for_hash(p[3])
                    except LookupError:
                        target = None
                    owner = target.ingestion_owner.address if target and target.ingestion_owner else ""
                    groups.setdefault(owner, []).append(p)
            sends = [self._send(stream, owner, group[start:start + limits.PUT_RECORDS_COUNT_MAX])
                     for owner, group in groups.items()
                     for start in range(0, len(group), limits.PUT_RECORDS_COUNT_MAX)]
            results = await asyncio.gather(*sends)
            retry = {id(p) for again, _stale in results for p in again}
            refresh = any(stale for _again, stale in results)
            for session, pending in by_session.items():
                sent = pending[:limits.PUT_RECORDS_COUNT_MAX]
                left = [p for p in sent if id(p) in retry] + pending[limits.PUT_RECORDS_COUNT_MAX:]
                acked = [p[0] for p in sent if id(p) not in retry]
                if acked:
                    # every SSSN below the lowest one still to send is acknowledged
                    top = left[0][0] - 1 if left else max(acked)
                    self.hwm[(stream, session)] = max(self.hwm.get((stream, session), self.floor_hwm), top)
                by_session[session] = left
            if not retry:
                failures = 0
                continue
            failures += 1
            if time.monotonic() > deadline:
                raise errors.Timeout(f"{len(retry)} outputs to {stream!r} not acknowledged in "
                                     f"{limits.SPS_OUTPUT_RETRY_DEADLINE_S:.0f} s")
            await asyncio.sleep(min(0.05 * failures, 1.0))
            if refresh or failures % 4 == 0:
                info = await self.client.get_stream_info(stream)

    async def _send(self, stream: str, owner: str, chunk: list) -> tuple[list, bool]:
        if not owner:
            return chunk, True
        sessions = sorted({p[4] for p in chunk})
        hwm = {s: self.hwm.get((stream, s), self.floor_hwm) for s in sessions}
        for p in chunk:        # an HWM stays below every record it is sent with
            hwm[p[4]] = min(hwm[p[4]], p[0] - 1)
        req = sms_pb2.PutRecordsRequest(stream=stream, count=len(chunk), entries=b"".join(p[5] for p in chunk),
                                        producer_id=self.producer_id, hwm=hwm,
                                        session_ordinals=wire.encode_session_ordinals(p[4] for p in chunk))
        try:
            resp = await self.client._call(owner, sms_pb2_grpc.IngestionStub, "PutRecords", req,
                                           timeout_s=limits.PUT_TIMEOUT_S)
        except errors.SmsError as e:
            if not e.retriable:
                raise
            return chunk, True
        failed = {e.index: e for e in resp.errors}
        again, refresh = [], False
        for j, p in enumerate(chunk):
            if j in failed:
                err = errors.from_name(failed[j].name, failed[j].message)
                if not err.retriable:
                    raise err
                refresh |= err.refresh_map
                again.append(p)
                continue
            self.written += 1
        self.duplicates += len(resp.duplicates)
        return again, refresh
