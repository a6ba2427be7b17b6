"""The asyncio client's writes: `put_record`, `put_records` (routed to each partition's
ingestion owner, re-routed after a map refresh), payloads by reference, producers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, cast

from sms import wire, errors, limits, payloads
from sms.payloads import PayloadRef
from sms.proto import sms_pb2
from sms.records import encode_put, needs_reference, record_fields
from sms.types import Headers, PutRecordResult, PutRecordsResult, RecordInput, Routes
from sms.aio.reads import Reads

if TYPE_CHECKING:
    from sms.producer import Producer


def _encode_puts(records: Iterable[RecordInput]) -> list[tuple[bytes, int]]:
    """(entry, hash key) per record, or the named error of the first bad one."""
    entries, hashes = wire.encode_puts(records, encode_put)
    return list(zip(entries, hashes))


class Writes(Reads):
    """The writes part of `sms.aio.Client` (sms/aio/__init__.py); each part builds on the
    ones before it: transport, admin, reads, writes, groups."""

    # --- writes -------------------------------------------------------------------------
    async def put_record(self, stream: str, data: bytes, partition_key: str, *,
                         explicit_hash_key: int | str | None = None,
                         headers: Headers | None = None) -> PutRecordResult:
        """Store one record (with optional headers: name -> bytes, read back as
        `Record.headers`); returns its result or raises its named error.

        Args:
            stream: the stream.
            data: the record's bytes (at most RECORD_DATA_BYTES_MAX).
            partition_key: routes the record (its MD5), 1..256 characters.
            explicit_hash_key: routes it instead of the key's hash (0..2^128-1).
            headers: name -> bytes or str.

        Raises:
            InvalidPartitionKey, InvalidHashKey, RecordTooLarge, InvalidRecordHeader,
            InvalidArgument (data that is not bytes), StreamNotFound, and the record's
            own error (e.g. Throttled, NotEnoughReplicas, Unavailable) after retries."""
        record: RecordInput = ((partition_key, data, explicit_hash_key, headers) if headers
                               else (partition_key, data, explicit_hash_key))
        result = (await self.put_records(stream, [record])).records[0]
        if not result.ok:
            raise errors.from_name(result.error_name, result.error_message)
        return result

    async def put_records(self, stream: str, records: Iterable[RecordInput]) -> PutRecordsResult:
        """Store 1..500 records; one result per record, in order. A failed record does
        not fail the others (its result names the error); routing errors are retried
        transparently. Over a write limit, the records that fit are stored and the rest
        answered `Throttled` (with a retry hint), for the caller to resend.

        Args:
            stream: the stream.
            records: (partition_key, data[, explicit_hash_key[, headers]]) tuples or
                dicts with those names.

        Raises:
            RequestTooLarge (count or bytes), InvalidArgument (a record of another
            shape), InvalidPartitionKey, InvalidHashKey, RecordTooLarge,
            InvalidRecordHeader, StreamNotFound."""
        uploads: list[tuple[int, PayloadRef]] = []
        if not isinstance(records, (list, tuple)):
            records = list(records)        # (read twice when some go by reference)
        try:
            encoded = _encode_puts(records)
        except (errors.RecordTooLarge, errors.InvalidArgument):
            # (only then: a put of ordinary records pays nothing for this)
            if not any(needs_reference(r) for r in records):
                raise
            if not 1 <= len(records) <= limits.PUT_RECORDS_COUNT_MAX:
                raise errors.RequestTooLarge(f"{len(records)} records; expected 1..{limits.PUT_RECORDS_COUNT_MAX}")
            records, uploads = await self.upload_payloads(stream, records)
            try:
                encoded = _encode_puts(records)
            except BaseException:
                for _i, ref in uploads:
                    await asyncio.to_thread(payloads.discard, ref)
                raise
        if not 1 <= len(encoded) <= limits.PUT_RECORDS_COUNT_MAX:
            raise errors.RequestTooLarge(f"{len(encoded)} records; expected 1..{limits.PUT_RECORDS_COUNT_MAX}")
        total = sum(len(e) - wire.ENTRY.size for e, _ in encoded)
        if total > limits.PUT_RECORDS_BYTES_MAX:
            raise errors.RequestTooLarge(f"request of {total} bytes of keys and data; "
                                         f"at most {limits.PUT_RECORDS_BYTES_MAX}")
        results: list[PutRecordResult | None] = [None] * len(encoded)
        todo = list(range(len(encoded)))
        info = await self.get_stream_info(stream, refresh=stream not in self._streams)
        for attempt in range(limits.CLIENT_REDIRECT_RETRIES_MAX + 1):
            routes = self._routes.get(stream)
            if routes is None or routes.info is not info:
                routes = self._routes[stream] = Routes(info)
            groups: dict[str, list[int]] = {}
            owner_of = routes.owner_address
            for i in todo:
                owner = owner_of(encoded[i][1])
                group = groups.get(owner)
                if group is None:
                    groups[owner] = [i]
                else:
                    group.append(i)
            outcomes = await asyncio.gather(*(self._put_group(stream, address, idx, encoded)
                                              for address, idx in groups.items()))
            retry = []
            for answers in outcomes:
                for i, result in answers:
                    err = errors.registry().get(result.error_name)
                    # (Throttled is the caller's to retry, as Kinesis's per-record
                    # ProvisionedThroughputExceededException: the limit admitted what fitted)
                    if result.ok or err is None or not err.retriable or issubclass(err, errors.Throttled) \
                            or attempt == limits.CLIENT_REDIRECT_RETRIES_MAX:
                        results[i] = result
                    else:
                        retry.append(i)
            if not retry:
                break
            todo = retry
            await asyncio.sleep(limits.CLIENT_REDIRECT_BACKOFF_S * (attempt + 1))
            info = await self.get_stream_info(stream)
        done = PutRecordsResult(tuple(cast(list[PutRecordResult], results)))   # (every index is set by now)
        for i, ref in uploads:
            error = errors.registry().get(done.records[i].error_name)
            if error is not None and not error.retriable:      # (surely not stored: its upload goes)
                await asyncio.to_thread(payloads.discard, ref)
        return done

    async def upload_payloads(self, stream: str, records: Sequence[RecordInput]
                            ) -> tuple[list[RecordInput], list[tuple[int, PayloadRef]]]:
        """`records` with each payload over the inline limit (or given as a binary file)
        uploaded to the stream's archive store and replaced by its reference (a record
        with the header `sms-payload`: sms/payloads.py), and which records those were.
        `put_records` and the producers call it for such records.

        Raises:
            RecordTooLarge (no archive, an encrypted stream, or over PAYLOAD_BYTES_MAX), ArchiveUnavailable,
            Timeout (an upload slower than half PAYLOAD_GRACE_S), StreamNotFound."""
        info = await self.get_stream_info(stream, refresh=stream not in self._streams)
        out: list[RecordInput] = []
        uploads: list[tuple[int, PayloadRef]] = []
        for i, r in enumerate(records):
            if not needs_reference(r):
                out.append(r)
                continue
            key, data, hash_key, headers = record_fields(r)
            if not info.archive:
                size = "a file" if payloads.is_file(data) else f"{len(data)} bytes"
                raise errors.RecordTooLarge(f"record {i}: {size} of data; at most {limits.RECORD_DATA_BYTES_MAX} "
                                            f"inline, and stream {stream!r} has no archive to keep larger payloads "
                                            "by reference (create_stream(..., archive=URL))")
            if info.encryption != "none":
                # (this client writes a payload straight to the store, where it would rest in
                # clear: an encrypted stream keeps every record inside its sealed batches)
                size = "a file" if payloads.is_file(data) else f"{len(data)} bytes"
                raise errors.RecordTooLarge(f"record {i}: {size} of data; at most {limits.RECORD_DATA_BYTES_MAX} "
                                            f"in stream {stream!r}, which is encrypted: payloads by reference "
                                            "are not")
            ref = await asyncio.to_thread(payloads.upload, info.archive, info.payload_prefix, data)
            uploads.append((i, ref))
            reference = ref.to_bytes()
            out.append((key, reference, hash_key, {**(headers or {}), payloads.HEADER: reference}))
        return out, uploads

    async def _put_group(self, stream: str, address: str, indexes: list[int],
                         encoded: list[tuple[bytes, int]]) -> list[tuple[int, PutRecordResult]]:
        if not address:
            err = errors.Unavailable("no ingestion owner for the partition yet")
            return [(i, PutRecordResult(error_name=err.name, error_message=err.message)) for i in indexes]
        req = sms_pb2.PutRecordsRequest(stream=stream, count=len(indexes),
                                        entries=b"".join(encoded[i][0] for i in indexes))
        try:
            resp = await self.send_put_records(address, req)
        except errors.SmsError as e:
            if not e.retriable:
                raise
            return [(i, PutRecordResult(error_name=e.name, error_message=e.message)) for i in indexes]
        failed = {e.index: e for e in resp.errors}
        out: list[tuple[int, PutRecordResult]] = []
        sns, ordinals = wire.decode_put_results(resp.sequence_numbers, resp.ordinals, len(indexes))
        for j, i in enumerate(indexes):
            if j in failed:
                out.append((i, PutRecordResult(partition_ordinal=ordinals[j], error_name=failed[j].name,
                                               error_message=failed[j].message)))
            else:
                out.append((i, PutRecordResult(sns[j], ordinals[j])))
        return out

    def producer(self, stream: str, producer_id: str | bytes | None = None, *,
                 linger_ms: float = limits.PRODUCER_LINGER_MS,
                 max_pending_per_partition: int = limits.PRODUCER_PENDING_PER_PARTITION_MAX,
                 max_pending_bytes: int = limits.PRODUCER_PENDING_BYTES_MAX,
                 retry_backoff_ms: float = limits.PRODUCER_RETRY_BACKOFF_MS,
                 retry_backoff_max_ms: float = limits.PRODUCER_RETRY_BACKOFF_MS_CAP,
                 delivery_timeout_s: float = limits.PRODUCER_DELIVERY_TIMEOUT_S,
                 epochs: bool = True) -> Producer:
        """A de-duplicating producer for `stream` (sms/producer.py; docs/dedup.md).

        Args:
            stream: the stream it writes to.
            producer_id: its identity across restarts (None: a random one).
            linger_ms: how long a record of send() may wait for others to fill a request
                (PRODUCER_LINGER_MS).
            max_pending_per_partition: un-settled records per partition before send() waits.
            max_pending_bytes: un-settled bytes in all before send() waits.
            retry_backoff_ms, retry_backoff_max_ms: the first and the longest wait before a
                resend.
            delivery_timeout_s: a record not stored by then fails with Timeout.
            epochs: with a `producer_id`, open a new epoch of it, fencing off an earlier
                instance (True); False keeps the id's one session (`sms.producer.Producer`).

        Raises:
            InvalidProducerId, InvalidArgument (an option out of range)."""
        from sms.producer import Producer
        return Producer(self, stream, producer_id, linger_ms=linger_ms, max_pending_per_partition=max_pending_per_partition,
                        max_pending_bytes=max_pending_bytes, retry_backoff_ms=retry_backoff_ms,
                        retry_backoff_max_ms=retry_backoff_max_ms, delivery_timeout_s=delivery_timeout_s, epochs=epochs)
