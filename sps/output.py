"""A stage's output, written so that a replay stores nothing twice.

Each (stage, input stream, input partition) writes with its own fixed producer id. The
outputs of one batch get SSSNs derived from the batch's position in its input partition
(`base_sssn(first input SN)` + index), so the worker that replays a batch after a
failover sends the same records under the same SSSNs, and ingestion answers them as
duplicates. Every record also carries a dedup key (producer id + SSSN), which holds even
when the output partition was split between the first send and the replay (a child's
table knows its parents' dedup keys).

`write` returns once every record is acknowledged (or answered as a duplicate), re-routing
on a changed map, or raises the first non-retriable error.
"""

from __future__ import annotations

import asyncio
import struct
import time

from sms import codec, errors, hashing, limits, seqno
from sms.proto import sms_pb2, sms_pb2_grpc

_ORDINAL = struct.Struct("<I")


def base_sssn(first_input_sn: int) -> int:
    """The first SSSN of a batch's outputs: its first input record's counter, shifted so
    that each batch has room for SPS_OUTPUTS_PER_BATCH_MAX outputs."""
    return seqno.counter_of(first_input_sn) * limits.SPS_OUTPUTS_PER_BATCH_MAX


class OutputWriter:
    def __init__(self, client, producer_id: bytes):
        self.client = client
        self.producer_id = producer_id
        self.hwm: dict[tuple[str, int], int] = {}      # (stream, session partition) -> acked high-water mark
        self.written = 0
        self.duplicates = 0

    async def write(self, records: list[tuple[str, str, bytes]], first_sssn: int) -> None:
        """records: (stream, partition key, data); record i gets SSSN first_sssn + i."""
        if len(records) > limits.SPS_OUTPUTS_PER_BATCH_MAX:
            raise errors.LimitExceeded(f"{len(records)} outputs of one batch; at most {limits.SPS_OUTPUTS_PER_BATCH_MAX}")
        by_stream: dict[str, list[tuple[int, str, bytes]]] = {}
        for i, (stream, key, data) in enumerate(records):
            hashing.validate_partition_key(key)
            by_stream.setdefault(stream, []).append((first_sssn + i, key, data))
        await asyncio.gather(*(self._write_stream(stream, items) for stream, items in by_stream.items()))

    async def _write_stream(self, stream: str, items: list[tuple[int, str, bytes]]) -> None:
        now_ms = int(time.time() * 1000)
        info = await self.client.get_stream_info(stream, refresh=False)
        pending = []          # [sssn, key, data, hash, session ordinal, entry]
        for sssn, key, data in items:
            h = hashing.hash_key_of(key)
            session = info.open_partition_for_hash(h).ordinal
            meta = codec.encode_meta({codec.TAG_SSSN: sssn.to_bytes(8, "big"),
                                      codec.TAG_SUBMIT_MS: now_ms.to_bytes(8, "big"),
                                      codec.TAG_DEDUP_KEY: self.producer_id + sssn.to_bytes(8, "big")})
            pending.append([sssn, key, data, h, session, codec.encode_entry(key.encode(), data, meta)])
        done = list(pending)
        deadline = time.monotonic() + limits.SPS_OUTPUT_RETRY_DEADLINE_S
        attempt = 0
        while pending:
            groups: dict[str, list] = {}
            for p in pending:
                try:
                    target = info.open_partition_for_hash(p[3])
                except LookupError:
                    target = None
                owner = target.ingestion_owner.address if target and target.ingestion_owner else ""
                groups.setdefault(owner, []).append(p)
            retry: list = []
            refresh = False
            for owner, group in groups.items():
                for start in range(0, len(group), limits.PUT_RECORDS_COUNT_MAX):
                    chunk = group[start:start + limits.PUT_RECORDS_COUNT_MAX]
                    again, stale = await self._send(stream, owner, chunk)
                    retry += again
                    refresh |= stale
            pending = sorted(retry, key=lambda p: p[0])
            if not pending:
                break
            attempt += 1
            if time.monotonic() > deadline:
                raise errors.Timeout(f"{len(pending)} outputs to {stream!r} not acknowledged in "
                                     f"{limits.SPS_OUTPUT_RETRY_DEADLINE_S:.0f} s")
            await asyncio.sleep(min(0.05 * attempt, 1.0))
            if refresh or attempt % 4 == 0:
                info = await self.client.get_stream_info(stream)
        # all acknowledged: the producer holds an ack for every SSSN up to each session's top
        for sssn, _key, _data, _h, session, _entry in done:
            self.hwm[(stream, session)] = max(self.hwm.get((stream, session), -1), sssn)

    async def _send(self, stream: str, owner: str, chunk: list) -> tuple[list, bool]:
        if not owner:
            return chunk, True
        sessions = sorted({p[4] for p in chunk})
        hwm = {s: self.hwm.get((stream, s), -1) for s in sessions}
        for p in chunk:        # an HWM stays below every record it is sent with
            hwm[p[4]] = min(hwm[p[4]], p[0] - 1)
        req = sms_pb2.PutRecordsRequest(stream=stream, count=len(chunk), entries=b"".join(p[5] for p in chunk),
                                        producer_id=self.producer_id, hwm=hwm,
                                        session_ordinals=b"".join(_ORDINAL.pack(p[4]) for p in chunk))
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
