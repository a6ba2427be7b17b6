"""The de-duplicating producer: `Producer(client, stream)` (asyncio) and `SyncProducer`.

A producer owns one producer session per partition it writes to (DESIGN section 6): it
numbers that partition's records 0, 1, 2, ... (the SSSN), stamps each with the time it
was first sent, and tells the ingestion owner its ack high-water mark (HWM) with every
request, so the owner's `ingestion/dedup.py` table can answer a resend as a duplicate
instead of storing it twice. All of that state, and every decision about it, is the
sans-IO `sms.accumulator.Accumulator`; this module is the I/O around it, in two parts as
aiokafka's producer: the API (`send()`, `send_batch()`, `flush()`, `close()`: validate,
queue, wait for room) and one sender task per producer that polls the accumulator, sends
each request it returns through the client's transport (`send_put_records`, one
PutRecords per ingestion owner at a time), refreshes the stream map when asked, and hands
the answers back. `SyncProducer` runs a `Producer` on the loop of a synchronous
`sms.Client`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, overload

from sms import wire, errors, limits
from sms.accumulator import (HWM_NONE, SESSION_META_BYTES, Accumulator, Outcome, PendingRecord, ProducerResult,
                             PutRequest, Session)
from sms.records import PreparedRecord, needs_reference, prepare_record, prepare_records, record_fields
from sms.limits import (
    PRODUCER_DELIVERY_TIMEOUT_S,
    PRODUCER_ID_RANDOM_BYTES,
    PRODUCER_LINGER_MS,
    PRODUCER_LINGER_MS_MAX,
    PRODUCER_PENDING_BYTES_MAX,
    PRODUCER_PENDING_PER_PARTITION_MAX,
    PRODUCER_RETRY_BACKOFF_MS,
    PRODUCER_RETRY_BACKOFF_MS_CAP,
    PRODUCER_RETRY_BACKOFF_MS_MAX,
)
from sms.proto import sms_pb2
from sms.payloads import PayloadRef
from sms.types import Headers, PartitionState, RecordInput, StreamInfo

if TYPE_CHECKING:
    from sms import client as sync_client

log = logging.getLogger(__name__)

_T = TypeVar("_T")
# One record's outcome in a send_batch() result: its ProducerResult or its named error.
RecordOutcome = ProducerResult | BaseException

__all__ = ["HWM_NONE", "BatchResults", "Producer", "ProducerClosed", "ProducerResult", "ProducerState", "SyncProducer",
           "producer_id_bytes"]

ProducerClosed = errors.ProducerClosed


class Transport(Protocol):
    """What a producer needs of its client (`sms.aio.Client` has both)."""

    async def get_stream_info(self, name: str, *, refresh: bool = True) -> StreamInfo: ...

    async def init_producer(self, stream: str, producer_id: bytes) -> int: ...

    async def send_put_records(self, address: str,
                               request: sms_pb2.PutRecordsRequest) -> sms_pb2.PutRecordsResponse: ...

    async def upload_payloads(self, stream: str, records: Sequence[RecordInput]
                              ) -> tuple[list[RecordInput], list[tuple[int, PayloadRef]]]: ...


class ProducerState(enum.Enum):
    RUNNING = "RUNNING"    # send() accepted
    CLOSING = "CLOSING"    # close() is flushing: send() refused, pending records still delivered
    FENCED = "FENCED"      # another instance of this producer id opened: every record not
                           # stored fails with ProducerFenced, send() raises it
    BROKEN = "BROKEN"      # the sender task failed (a bug): every pending record failed with it
    CLOSED = "CLOSED"      # the sender is stopped


_TRANSITIONS: dict[ProducerState, frozenset[ProducerState]] = {
    ProducerState.RUNNING: frozenset({ProducerState.CLOSING, ProducerState.FENCED, ProducerState.BROKEN}),
    ProducerState.CLOSING: frozenset({ProducerState.CLOSED, ProducerState.FENCED, ProducerState.BROKEN}),
    ProducerState.FENCED: frozenset({ProducerState.CLOSED, ProducerState.BROKEN}),
    ProducerState.BROKEN: frozenset({ProducerState.CLOSED}),
    ProducerState.CLOSED: frozenset(),
}


class _Pulse:
    """Wake every current waiter at once (no lock, no lost wake-up between check and wait)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None

    async def wait(self) -> None:
        if self._event is None:
            self._event = asyncio.Event()
        await self._event.wait()

    def fire(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None


class BatchResults(Sequence[RecordOutcome]):
    """What a send_batch() future resolves to: per record, in order, its
    `ProducerResult` or its named error (an `SmsError`), as a sequence: index it, iterate
    it, compare it with a list. The outcomes are kept as columns and a record's
    `ProducerResult` is made when it is looked at, so a batch costs no object per record
    until then. `failed` lists the errors alone (empty: every record was stored), and
    `duplicates` counts the records an earlier send had stored already."""

    __slots__ = ("_sns", "_ordinals", "_sssns", "_dups", "_errors")

    def __init__(self, sns: list[int | None], ordinals: list[int], sssns: list[int], dups: bytearray,
                 errors_by_index: dict[int, BaseException]) -> None:
        self._sns, self._ordinals, self._sssns, self._dups, self._errors = sns, ordinals, sssns, dups, errors_by_index

    def __len__(self) -> int:
        return len(self._sns)

    def _at(self, i: int) -> RecordOutcome:
        error = self._errors.get(i) if self._errors else None
        if error is not None:
            return error
        return ProducerResult(self._sns[i], self._ordinals[i], self._sssns[i], bool(self._dups[i]))

    @overload
    def __getitem__(self, index: int) -> RecordOutcome: ...

    @overload
    def __getitem__(self, index: slice) -> list[RecordOutcome]: ...

    def __getitem__(self, index: int | slice) -> RecordOutcome | list[RecordOutcome]:
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(len(self._sns)))]
        n = len(self._sns)
        if not -n <= index < n:
            raise IndexError("batch result index out of range")
        return self._at(index % n)

    def __iter__(self) -> Iterator[RecordOutcome]:
        return (self._at(i) for i in range(len(self._sns)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (BatchResults, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Sequence[RecordOutcome]) -> list[RecordOutcome]:
        return [*self, *other]

    def __radd__(self, other: Sequence[RecordOutcome]) -> list[RecordOutcome]:
        return [*other, *self]             # (list + BatchResults: a list, as before)

    def __repr__(self) -> str:
        return f"BatchResults({list(self)!r})"

    @property
    def failed(self) -> list[tuple[int, BaseException]]:
        """(index, named error) of each record not stored, in order."""
        return sorted(self._errors.items())

    @property
    def duplicates(self) -> int:
        """Records answered as duplicates (stored once already, by an earlier send)."""
        return sum(self._dups)


class _BatchOutcome:
    """The outcomes of one send_batch() call as columns (the accumulator's BatchSink),
    and the one future that carries them."""

    __slots__ = ("sns", "ordinals", "sssns", "dups", "errors", "state", "pending", "future")

    def __init__(self, count: int, loop: asyncio.AbstractEventLoop) -> None:
        self.sns: list[int | None] = [None] * count
        self.ordinals = [0] * count
        self.sssns = [0] * count
        self.dups = bytearray(count)
        self.errors: dict[int, BaseException] = {}
        self.state = bytearray(count)           # 1 once the record's outcome is in
        self.pending = count
        self.future: asyncio.Future[BatchResults] = loop.create_future()

    def settled(self, index: int) -> bool:
        return self.state[index] != 0

    def settle_result(self, index: int, sn: int | None, ordinal: int, sssn: int, duplicate: bool) -> None:
        if self.state[index]:
            return
        self.state[index] = 1
        self.sns[index] = sn
        self.ordinals[index] = ordinal
        self.sssns[index] = sssn
        if duplicate:
            self.dups[index] = 1
        self.pending -= 1
        if self.pending == 0:
            self._resolve()

    def settle_stored(self, records: Sequence[PendingRecord], start: int, end: int, sns: Sequence[int],
                      ordinals: Sequence[int], duplicates: set[int]) -> None:
        state, out_sns, out_ordinals, out_sssns = self.state, self.sns, self.ordinals, self.sssns
        settled = 0
        for j in range(start, end):
            record = records[j]
            i = record.index
            if state[i]:
                continue
            state[i] = 1
            out_sns[i] = sns[j] or None
            out_ordinals[i] = ordinals[j]
            out_sssns[i] = record.sssn
            if duplicates and j in duplicates:
                self.dups[i] = 1
            settled += 1
        self.pending -= settled
        if settled and self.pending == 0:
            self._resolve()

    def settle_error(self, index: int, error: BaseException) -> None:
        if self.state[index]:
            return
        self.state[index] = 1
        self.errors[index] = error
        self.pending -= 1
        if self.pending == 0:
            self._resolve()

    def _resolve(self) -> None:
        if not self.future.done():
            self.future.set_result(BatchResults(self.sns, self.ordinals, self.sssns, self.dups, self.errors))


class _Slot:
    """A record's place in its send_batch() outcome, as an `Outcome` (for a record that
    waited for room one at a time: `Accumulator.add`)."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: _BatchOutcome, index: int) -> None:
        self.batch = batch
        self.index = index

    def done(self) -> bool:
        return self.batch.settled(self.index)

    def cancelled(self) -> bool:
        return False      # (a caller that cancels the batch's future stops waiting; the outcome is still kept)

    def set_result(self, result: "ProducerResult") -> None:
        self.batch.settle_result(self.index, result.sn, result.partition_ordinal, result.sssn, result.duplicate)

    def set_exception(self, error: BaseException) -> None:
        self.batch.settle_error(self.index, error)


# --- validation at the edge ---------------------------------------------------------------
def producer_id_bytes(producer_id: str | bytes | None) -> bytes:
    """The caller's producer id (str as UTF-8), 1..PRODUCER_ID_BYTES_MAX bytes, or a random one."""
    if producer_id is None:
        return os.urandom(PRODUCER_ID_RANDOM_BYTES)
    if isinstance(producer_id, str):
        producer_id = producer_id.encode("utf-8")
    if not isinstance(producer_id, (bytes, bytearray)):
        raise errors.InvalidProducerId(f"producer id of type {type(producer_id).__name__}; expected str or bytes")
    if not 0 < len(producer_id) <= limits.PRODUCER_ID_BYTES_MAX:
        raise errors.InvalidProducerId(f"producer id of {len(producer_id)} bytes; "
                                      f"expected 1..{limits.PRODUCER_ID_BYTES_MAX}")
    return bytes(producer_id)


def _dedup_key_bytes(dedup_key: bytes | str | None) -> bytes | None:
    if dedup_key is None:
        return None
    if isinstance(dedup_key, str):
        dedup_key = dedup_key.encode("utf-8")
    if not isinstance(dedup_key, (bytes, bytearray)):
        raise errors.InvalidDedupKey(f"dedup key of type {type(dedup_key).__name__}; expected str or bytes")
    if not dedup_key:
        raise errors.InvalidDedupKey("empty dedup key; omit it instead")
    if len(dedup_key) > limits.DEDUP_KEY_BYTES_MAX:
        raise errors.DedupKeyTooLarge(f"dedup key of {len(dedup_key)} bytes; at most {limits.DEDUP_KEY_BYTES_MAX}")
    return bytes(dedup_key)


def _in_range(name: str, value: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not (lo < value if lo_open else lo <= value) or not value <= hi:
        raise errors.InvalidArgument(f"{name} {value!r}; expected {lo} {'<' if lo_open else '<='} {name} <= {hi}")
    return value


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Producer:
    """Sends records of one stream with de-duplication (see the module docstring): the
    asyncio sender around an `Accumulator`.

    `client` is the transport: anything with `get_stream_info(stream, refresh=)` and
    `send_put_records(address, request)`, as `sms.aio.Client` has.

    Errors are `sms.errors` classes: bad input raises at once (InvalidPartitionKey,
    InvalidHashKey, RecordTooLarge, InvalidRecordHeader, InvalidDedupKey,
    DedupKeyTooLarge, InvalidArgument); a record's future fails with its named error
    (Timeout after `delivery_timeout_s`, or one that cannot be retried); calls after
    close() raise ProducerClosed, and after the sender failed (a bug) InternalError."""

    def __init__(self, client: Transport, stream: str, producer_id: str | bytes | None = None, *,
                 linger_ms: float = PRODUCER_LINGER_MS,
                 max_pending_per_partition: int = PRODUCER_PENDING_PER_PARTITION_MAX,
                 max_pending_bytes: int = PRODUCER_PENDING_BYTES_MAX,
                 retry_backoff_ms: float = PRODUCER_RETRY_BACKOFF_MS,
                 retry_backoff_max_ms: float = PRODUCER_RETRY_BACKOFF_MS_CAP,
                 delivery_timeout_s: float = PRODUCER_DELIVERY_TIMEOUT_S,
                 epochs: bool = True,
                 clock_ms: Callable[[], int] = _wall_clock_ms) -> None:
        """A producer of `stream`; it sends nothing until the first record. With a
        `producer_id` it opens then: it takes a new epoch of that id from the cluster
        (docs/dedup.md, "Producer epochs"), so it never collides with an earlier
        instance of itself, and fences that instance off.

        Args:
            client: the transport (an `sms.aio.Client`).
            stream: the stream it writes to.
            producer_id: its identity across restarts, 1..PRODUCER_ID_BYTES_MAX bytes
                (str as UTF-8); None: a random one.
            linger_ms: how long a record of send() may wait for others to fill a request
                (a send_batch() is a whole batch: it goes at once, or with the next
                request if one is in flight to its owner).
            max_pending_per_partition: un-settled records per partition before send() waits.
            max_pending_bytes: un-settled bytes in all before send() waits.
            retry_backoff_ms, retry_backoff_max_ms: the first and the longest wait
                before a resend.
            delivery_timeout_s: a record not stored by then fails with Timeout.
            epochs: with a `producer_id`, open a new epoch of it (True). False: keep the
                id's one session across restarts, for writers that derive their SSSNs
                from their input so that a replay is de-duplicated (SPS stage outputs,
                the Spark sink: `send_pinned`); such a producer is never fenced.
            clock_ms: the wall clock records are stamped with (tests inject one).

        Raises:
            InvalidProducerId, InvalidArgument (an option out of range)."""
        self.producer_id: bytes = producer_id_bytes(producer_id)
        self.stream = stream
        self._wants_epoch = producer_id is not None and epochs
        self._acc = Accumulator(
            stream, self.producer_id,
            linger_s=_in_range("linger_ms", linger_ms, 0, PRODUCER_LINGER_MS_MAX) / 1000,
            max_pending_per_partition=int(_in_range("max_pending_per_partition", max_pending_per_partition,
                                                    1, PRODUCER_PENDING_PER_PARTITION_MAX)),
            max_pending_bytes=int(_in_range("max_pending_bytes", max_pending_bytes, 1, PRODUCER_PENDING_BYTES_MAX)),
            retry_backoff_s=_in_range("retry_backoff_ms", retry_backoff_ms, 0, PRODUCER_RETRY_BACKOFF_MS_MAX,
                                      lo_open=True) / 1000,
            retry_backoff_max_s=_in_range("retry_backoff_max_ms", retry_backoff_max_ms, retry_backoff_ms,
                                          PRODUCER_RETRY_BACKOFF_MS_MAX) / 1000,
            delivery_timeout_s=_in_range("delivery_timeout_s", delivery_timeout_s, 0,
                                         PRODUCER_DELIVERY_TIMEOUT_S, lo_open=True),
            clock_ms=clock_ms)
        self._client = client
        self._state = ProducerState.RUNNING
        self._broken: BaseException | None = None
        self._map_lock: asyncio.Lock | None = None
        self._wakeup: asyncio.Event | None = None
        self._progress = _Pulse()                # some record settled
        self._closing: asyncio.Event | None = None   # set when the close() under way ends
        self._sender: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- public API -------------------------------------------------------------------
    async def __aenter__(self) -> "Producer":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def state(self) -> ProducerState:
        """RUNNING, CLOSING, FENCED, BROKEN or CLOSED. FENCED as soon as an owner refused
        this producer's epoch, before the sender takes the answer in: a record's
        ProducerFenced may reach another thread's future first (SyncProducer)."""
        if self._acc.fenced is not None and self._state in (ProducerState.RUNNING, ProducerState.CLOSING):
            return ProducerState.FENCED
        return self._state

    @property
    def epoch(self) -> int:
        """The epoch this producer opened with (0: none yet, or a producer without epochs)."""
        return self._acc.producer_epoch

    @property
    def linger_s(self) -> float:
        """How long a record may wait for others to fill a request, in seconds."""
        return self._acc.linger_s

    @property
    def max_pending_per_partition(self) -> int:
        """Un-settled records per partition before send() waits."""
        return self._acc.max_pending_per_partition

    @property
    def max_pending_bytes(self) -> int:
        """Un-settled bytes in all before send() waits."""
        return self._acc.max_pending_bytes

    @property
    def delivery_timeout_s(self) -> float:
        """A record not stored within this fails with Timeout."""
        return self._acc.delivery_timeout_s

    async def send(self, data: bytes, partition_key: str, *, explicit_hash_key: int | str | None = None,
                   dedup_key: bytes | str | None = None,
                   headers: Headers | None = None) -> asyncio.Future[ProducerResult]:
        """Queue one record and return a future of its `ProducerResult` (or its named
        error). Bad input raises at once and queues nothing; waits only while the record's
        partition has max_pending_per_partition un-settled records, or all partitions
        max_pending_bytes.

        Args:
            data: the record's bytes.
            partition_key: routes the record, 1..256 characters.
            explicit_hash_key: routes it instead of the key's hash.
            dedup_key: de-duplicates it against other records of the same key (docs/dedup.md).
            headers: name -> bytes or str.

        Raises:
            InvalidPartitionKey, InvalidHashKey, RecordTooLarge, InvalidRecordHeader,
            InvalidDedupKey, DedupKeyTooLarge, InvalidArgument, StreamNotFound (the first
            map), ProducerClosed, InternalError (the sender failed)."""
        self._check_running()
        try:
            prepared = prepare_record(partition_key, data, explicit_hash_key, headers)
        except (errors.RecordTooLarge, errors.InvalidArgument):
            if not needs_reference((partition_key, data)):
                raise
            # over the inline limit, or a file: uploaded, then sent as its reference (sms/payloads.py)
            converted, _uploads = await self._client.upload_payloads(
                self.stream, [(partition_key, data, explicit_hash_key, headers)])
            prepared = prepare_record(*record_fields(converted[0]))
        extra = prepared.extra
        dedup = _dedup_key_bytes(dedup_key)
        if dedup is not None:
            extra += bytes((wire.TAG_DEDUP_KEY, len(dedup))) + dedup
        future = await self._queue(prepared.key, prepared.data, prepared.hash_key, extra)
        return cast("asyncio.Future[ProducerResult]", future)     # (given no outcome, _queue makes a future)

    async def send_batch(self, records: Iterable[RecordInput]) -> asyncio.Future[BatchResults]:
        """send() for each record of `records`, in order: (partition_key, data) pairs, or
        (partition_key, data, explicit_hash_key) or dicts as `Client.put_records` takes
        them. Returns ONE future for the batch, resolving once every record is settled to a
        list with, per record in order, its `ProducerResult` or its named error (an
        `SmsError`, like `asyncio.gather(..., return_exceptions=True)`). No future per
        record: the batch is the unit of work. Every record is checked before any is queued:
        bad input raises and queues none. Waits, like send(), while a partition or the
        producer is full.

        Raises:
            InvalidArgument (a record of another shape), InvalidPartitionKey,
            InvalidHashKey, RecordTooLarge, InvalidRecordHeader, StreamNotFound,
            ProducerClosed, InternalError."""
        self._check_running()
        if not isinstance(records, (list, tuple)):
            records = list(records)        # (read twice when some go by reference)
        try:
            return await self._queue_batch(prepare_records(records))
        except (errors.RecordTooLarge, errors.InvalidArgument):
            if not any(needs_reference(r) for r in records):
                raise
            converted, _uploads = await self._client.upload_payloads(self.stream, records)
            return await self._queue_batch(prepare_records(converted))

    async def send_pinned(self, records: Sequence[tuple[PreparedRecord, int, int]]
                          ) -> asyncio.Future[BatchResults]:
        """For writers that derive SSSNs from their input, so that a replay sends the same
        records under the same SSSNs (SPS stage outputs, the Spark sink): `records` are
        (PreparedRecord, session ordinal, SSSN), SSSNs rising within each session (or
        starting a session again once it is idle). A record keeps its session and SSSN
        even if that partition closed: it goes to the open partition covering its hash.
        Returns one future of the outcomes, as send_batch().

        Raises:
            ProducerClosed, InternalError, StreamNotFound (the first map); a pinned SSSN
            out of range or below pending ones is an InvariantViolation."""
        self._check_running()
        return await self._queue_batch([(p.key, p.data, p.hash_key, p.extra) for p, _, _ in records],
                                       [(ordinal, sssn) for _, ordinal, sssn in records])

    async def stream_map(self) -> StreamInfo:
        """The stream map this producer routes by (loaded at the first call). Raises
        StreamNotFound."""
        return self._acc.info or await self._load_map()

    async def put(self, data: bytes, partition_key: str, **kwargs: Any) -> ProducerResult:
        """send() (`kwargs`: explicit_hash_key, dedup_key, headers) and wait for the
        record's result. Raises what send() raises, and the record's named error
        (Timeout, or one that cannot be retried)."""
        return await (await self.send(data, partition_key, **kwargs))

    async def flush(self) -> None:
        """Wait until every record sent before this call is settled (acked or failed),
        sending without lingering meanwhile. Raises InternalError if the sender failed."""
        # (the outcomes, not SSSNs: a record not yet sent when its partition closed moves to
        # a child's session under a new SSSN, and keeps its outcome)
        pending = sorted(self._acc.unsettled(), key=lambda r: r.enqueued_s)
        if pending:
            self._acc.flushing += 1
            self._wake()
            try:
                i = 0
                while i < len(pending):
                    if pending[i].is_settled_for_caller():
                        i += 1
                        continue
                    await self._progress.wait()
            finally:
                self._acc.flushing -= 1
        self._raise_if_broken()

    async def close(self, *, flush: bool = True) -> None:
        """Refuse new records, flush (unless `flush` is False: then every record not
        settled yet fails with ProducerClosed, though it may have been stored), then stop
        the sender. Idempotent; raises nothing of its own."""
        while self._closing is not None:           # another close() is under way
            await self._closing.wait()
        if self._state is ProducerState.CLOSED:
            return
        self._closing = closing = asyncio.Event()
        try:
            if self._state is ProducerState.RUNNING:
                self._transition(ProducerState.CLOSING)
            if self._state in (ProducerState.CLOSING, ProducerState.FENCED) and flush:
                try:
                    await self.flush()             # (fenced: the records in flight settle by their answers)
                except (errors.InternalError, errors.ProducerFenced):
                    pass                           # broken or fenced while flushing: its records are failed already
            await self._stop_sender()
            self._acc.fail_all(lambda: ProducerClosed(f"producer of {self.stream!r} closed before the record "
                                                      f"was settled"))
            self._progress.fire()
            self._transition(ProducerState.CLOSED)
        finally:                                   # if this close() was cancelled, the next one goes on
            self._closing = None
            closing.set()

    def statistics(self) -> dict[str, Any]:
        """The state, pending records per partition, requests in flight, and totals since
        creation."""
        return {"state": self._state.value, **self._acc.statistics()}

    # --- states -------------------------------------------------------------------------
    def _transition(self, to: ProducerState) -> None:
        errors.invariant(to in _TRANSITIONS[self._state], f"producer {self._state} -> {to} is not a transition")
        self._state = to

    def _check_running(self) -> None:
        if self._state is ProducerState.RUNNING and self._acc.fenced is None:
            return
        self._raise_if_broken()
        raise ProducerClosed(f"producer of {self.stream!r} is {self._state.value.lower()}")

    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise errors.InternalError(f"producer of {self.stream!r} failed: {self._broken!r}") from self._broken
        if self._acc.fenced is not None:
            raise errors.ProducerFenced(self._acc.fenced.message)

    # --- queueing ---------------------------------------------------------------------
    async def _queue_batch(self, prepared: Sequence[tuple[bytes, bytes, int, bytes]],
                           pins: Sequence[tuple[int, int]] | None = None) -> asyncio.Future[BatchResults]:
        loop = self._loop or self._bind_loop()
        batch = _BatchOutcome(len(prepared), loop)
        acc = self._acc
        i, n = 0, len(prepared)
        while i < n:
            if acc.info is not None and self._state is ProducerState.RUNNING:
                start = i
                i = acc.add_many(prepared, i, batch, loop.time(), pins)
                if i > start:
                    self._kick()
                if i == n:
                    break
            # no room (or no map yet): wait for it, one record
            key, data, hash_key, extra = prepared[i]
            ordinal, sssn = pins[i] if pins is not None else (None, None)
            await self._queue(key, data, hash_key, extra, _Slot(batch, i), ordinal, sssn)
            i += 1
        if not prepared:
            batch._resolve()
        return batch.future

    async def _queue_outcomes(self, prepared: Sequence[tuple[bytes, bytes, int, bytes]],
                              outcomes: Sequence[Outcome]) -> None:
        """Queue each prepared record with its own outcome (a SyncProducer's records, each
        sent by send() with a concurrent future), in order, waiting for room as send()
        does. Raises nothing for a record: a record refused (no open partition covers its
        hash, the map could not be loaded) fails its outcome and the next ones go on; once
        the producer stops running (closed, fenced, broken) or this is cancelled, every
        record not queued fails with that error."""
        loop = self._loop or self._bind_loop()
        acc = self._acc
        i, n = 0, len(prepared)
        try:
            while i < n:
                if acc.info is not None and self._state is ProducerState.RUNNING:
                    start, sent = i, acc.totals["sent"]
                    try:
                        i = acc.add_many(prepared, i, outcomes.__getitem__, loop.time())
                    except errors.SmsError as e:
                        i = start + acc.totals["sent"] - sent      # (add_many added those before it)
                        outcomes[i].set_exception(e)
                        i += 1
                    if acc.totals["sent"] > sent:
                        self._kick()
                    if i == n:
                        break
                # no room, no map yet, or the record after a refused one: one record, waiting for room
                key, data, hash_key, extra = prepared[i]
                try:
                    await self._queue(key, data, hash_key, extra, outcomes[i])
                except errors.SmsError as e:
                    if self._state is not ProducerState.RUNNING:
                        raise
                    outcomes[i].set_exception(e)
                i += 1
        except BaseException as e:
            error = e if isinstance(e, errors.SmsError) else ProducerClosed(
                f"producer of {self.stream!r} stopped before the record was queued")
            for outcome in outcomes[i:]:
                if not outcome.done():
                    outcome.set_exception(error)
            if not isinstance(e, errors.SmsError):
                raise

    async def _queue(self, key: bytes, data: bytes, hash_key: int, extra: bytes, outcome: Outcome | None = None,
                     ordinal: int | None = None, sssn: int | None = None) -> Outcome:
        size = len(key) + len(data) + SESSION_META_BYTES + len(extra)
        if size > limits.PUT_RECORDS_BYTES_MAX:
            errors.invariant(False, f"a valid record of {size} bytes fits no request")
        acc = self._acc
        while True:
            if acc.info is None:
                await self._load_map()
            self._check_running()
            room = acc.room(hash_key, size, ordinal)
            if type(room) is Session:
                break
            await self._progress.wait()
        # From here to the return: no await, so room() still holds.
        loop = self._loop or self._bind_loop()
        if outcome is None:
            outcome = loop.create_future()
        acc.add(room, key, data, hash_key, extra, outcome, loop.time(), sssn)
        self._kick()
        return outcome

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def _kick(self) -> None:
        """Records were added: the sender looks."""
        self._ensure_sender()
        self._wake()

    # --- the stream map ------------------------------------------------------------------
    async def _load_map(self) -> StreamInfo:
        if self._map_lock is None:
            self._map_lock = asyncio.Lock()
        async with self._map_lock:
            if self._wants_epoch and not self._acc.producer_epoch:
                self._acc.producer_epoch = await self._client.init_producer(self.stream, self.producer_id)
            if self._acc.info is None:
                self._acc.set_map(await self._client.get_stream_info(self.stream, refresh=False))
        return cast(StreamInfo, self._acc.info)      # (set just now, or before)

    async def _refresh_map(self) -> None:
        try:
            info = await self._client.get_stream_info(self.stream)
        except errors.SmsError:
            self._acc.refresh_failed(asyncio.get_running_loop().time())
            return
        self._acc.set_map(info)
        self._progress.fire()

    # --- the sender ------------------------------------------------------------------------
    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    def _ensure_sender(self) -> None:
        if self._sender is None:
            self._wakeup = asyncio.Event()
            self._sender = asyncio.get_running_loop().create_task(self._run_sender(),
                                                                  name=f"sms-producer-{self.stream}")

    def _break(self, exc: BaseException) -> None:
        """The sender failed (a bug): fail every pending record with it, refuse new ones."""
        self._broken = exc
        self._transition(ProducerState.BROKEN)
        self._acc.fail_all(lambda: errors.InternalError(f"producer of {self.stream!r} failed: {exc!r}"))
        self._progress.fire()

    async def _stop_sender(self) -> None:
        if self._sender is None or self._sender.done():
            return
        self._sender.cancel()
        try:
            await self._sender
        except asyncio.CancelledError:
            if cast(asyncio.Task[Any], asyncio.current_task()).cancelling():   # (in a task: not None)
                raise                              # close() itself was cancelled

    async def _run_sender(self) -> None:
        """Owns every request task; cancelled by close(). A bug ends it: every pending
        record, and every later send() and flush(), then fails with InternalError."""
        try:
            await self._send_forever()
        except Exception as exc:
            log.exception("producer %s of %r: sender failed", self.producer_id.hex(), self.stream)
            self._break(exc)

    async def _send_forever(self) -> None:
        loop = asyncio.get_running_loop()
        acc = self._acc
        async with asyncio.TaskGroup() as requests:
            while True:
                cast(asyncio.Event, self._wakeup).clear()    # (_ensure_sender set it before this task)
                if acc.refresh_wanted and loop.time() >= acc.refresh_not_before_s:
                    await self._refresh_map()
                due, wake_s = acc.poll(loop.time())
                for request in due:
                    requests.create_task(self._deliver(request))
                self._progress.fire()              # (poll may have expired records)
                timeout_s = None if wake_s == float("inf") else max(0.0, wake_s - loop.time())
                try:
                    async with asyncio.timeout(timeout_s):
                        await cast(asyncio.Event, self._wakeup).wait()
                except TimeoutError:
                    pass

    async def _deliver(self, request: PutRequest) -> None:
        """One PutRecords to one owner, and what its answer means for each record. A call
        unanswered for PRODUCER_OWNER_CHECK_S looks at the stream map again, every so
        often: once the owner of its records moved (a paused or cut-off head was taken out
        of its chain), the call is given up and its records go to the new owner under the
        same SSSNs (the old owner, fenced by the new epoch, can no longer commit them; the
        new one recognises any it had), instead of waiting out PUT_TIMEOUT_S."""
        loop = asyncio.get_running_loop()
        try:
            call = loop.create_task(self._client.send_put_records(request.owner, request.message))
            try:
                while not (await asyncio.wait({call}, timeout=limits.PRODUCER_OWNER_CHECK_S))[0]:
                    if await self._owner_moved(request):
                        call.cancel()
                        await asyncio.wait({call})
                        break
            finally:
                if not call.done():          # (this task was cancelled: the producer stops)
                    call.cancel()
            if call.cancelled():
                self._acc.on_call_failed(request, errors.Unavailable(
                    f"the owner of these records moved from {request.owner}; resent to the new one"), loop.time())
            elif (error := call.exception()) is not None:
                if not isinstance(error, errors.SmsError):
                    raise error
                self._acc.on_call_failed(request, error, loop.time())
            else:
                self._acc.on_answer(request, call.result(), loop.time())
            if self._acc.fenced is not None and self._state in (ProducerState.RUNNING, ProducerState.CLOSING):
                log.warning("producer %r of %r was fenced: %s", self.producer_id, self.stream,
                            self._acc.fenced.message)
                self._transition(ProducerState.FENCED)
        finally:
            self._progress.fire()
            self._wake()


    async def _owner_moved(self, request: PutRequest) -> bool:
        """Whether a fresh stream map names another owner for a partition of `request`'s
        records (the map is taken into use)."""
        try:
            info = await self._client.get_stream_info(self.stream)
        except errors.SmsError:
            return False
        self._acc.set_map(info)
        self._progress.fire()
        for ordinal in {r.ordinal for r in request.records}:
            try:
                partition = info.partition(ordinal)
            except LookupError:
                continue
            if partition.state is not PartitionState.OPEN:
                continue       # (a closed partition's records go to its children: its head answers first)
            owner = partition.ingestion_owner
            if owner is not None and owner.address and owner.address != request.owner:
                return True
        return False


_FINISHED = concurrent.futures._base.FINISHED
_CANCELLED = (concurrent.futures._base.CANCELLED, concurrent.futures._base.CANCELLED_AND_NOTIFIED)
_SETTLED = (_FINISHED, *_CANCELLED)
_MAKE_CONDITION = threading.Lock()     # a _RecordFuture's condition is made, or its outcome set without one


class _RecordFuture(concurrent.futures.Future):  # type: ignore[type-arg]
    """The concurrent future SyncProducer.send() returns: a `concurrent.futures.Future`
    in every way (result, exception, callbacks, `concurrent.futures.wait` and
    `as_completed`), that makes its `threading.Condition` only when something waits on it
    or registers a callback. Most records are looked at once settled, if ever, and a
    Condition costs more to make than the rest of a record's send() (py-spy: 30% of a
    sync producer's thread). Born running (it cannot be cancelled, as a sent record cannot
    be called back).

    Why it is safe: a waiter, `wait()`/`as_completed()` and `add_done_callback` all reach
    the condition through `_condition`, which is made under one process-wide lock; setting
    the outcome takes that lock, and without a condition there is nobody to wake, so it
    sets the state and returns; with one it is the base class's own set_result. Reads of
    the state are single attribute reads."""

    _cond: threading.Condition | None = None

    def __init__(self) -> None:   # (the base class's, without the condition, and running)
        self._state = concurrent.futures._base.RUNNING
        self._result = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    @property
    def _condition(self) -> threading.Condition:        # type: ignore[override]
        cond = self._cond
        if cond is None:
            with _MAKE_CONDITION:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition()
        return cond

    def _settled_unwatched(self, result: Any, exception: BaseException | None) -> bool:
        """Set the outcome here if nothing waits on this future (no condition made yet);
        False: the base class must, to wake its waiters and run its callbacks."""
        with _MAKE_CONDITION:
            if self._cond is not None:
                return False
            if self._state in _SETTLED:
                raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
            self._result, self._exception, self._state = result, exception, _FINISHED
            return True

    def set_result(self, result: Any) -> None:
        if not self._settled_unwatched(result, None):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._settled_unwatched(None, exception):
            super().set_exception(exception)

    def done(self) -> bool:
        return self._state in _SETTLED

    def cancelled(self) -> bool:
        return self._state in _CANCELLED

    def running(self) -> bool:
        return self._state == concurrent.futures._base.RUNNING

    def result(self, timeout: float | None = None) -> Any:
        if self._state == _FINISHED:
            if self._exception is not None:
                try:
                    raise self._exception
                finally:
                    self = None     # type: ignore[assignment]  # (no cycle through the traceback, as the base)
            return self._result
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == _FINISHED:
            return self._exception
        return super().exception(timeout)


class SyncProducer:
    """A `Producer` on the private loop of a synchronous `sms.Client`. `send()` returns a
    `concurrent.futures.Future`; do not call this producer from that future's callbacks
    (they run on the client's loop thread). Errors as `Producer`.

    send() checks and encodes its record in the calling thread (bad input raises there, at
    once) and hands it to the loop by the batch, not one call per record: records wait in a
    bounded hand-off (PRODUCER_SYNC_HANDOFF_RECORDS_MAX, PRODUCER_SYNC_HANDOFF_BYTES_MAX)
    that one task on the loop takes whole and queues in order, each with its own future.
    A sending thread wakes the loop only when the hand-off was empty, and waits (send()
    blocks) while it is full: the producer's own bounds (records per partition, bytes)
    hold the loop's task, and through it every sending thread. send_batch(), flush() and
    close() take what is handed off first, so one thread's records keep their order."""

    def __init__(self, client: sync_client.Client, stream: str, producer_id: str | bytes | None = None,
                 **kwargs: Any) -> None:
        """A producer of `stream` on `client`'s loop; `kwargs` as `Producer`.

        Raises:
            InvalidProducerId, InvalidArgument (an option out of range), ProducerClosed
            (the client is closed)."""
        self._client = client
        self._loop: asyncio.AbstractEventLoop = client._loop
        self._producer: Producer = self._run(self._make(client._aio, stream, producer_id, kwargs))
        self._handoff: list[tuple[tuple[bytes, bytes, int, bytes], concurrent.futures.Future[ProducerResult]]] = []
        self._handoff_bytes = 0
        self._room = threading.Condition()       # guards the hand-off; notified when the loop takes it
        self._take_scheduled = False             # a take is scheduled on the loop (under _room)
        self._order = asyncio.Lock()             # (loop side) one taker at a time: records keep their order
        self._closed = False                     # close() began: send() refuses

    @staticmethod
    async def _make(aio_client: Transport, stream: str, producer_id: str | bytes | None,
                    kwargs: dict[str, Any]) -> Producer:
        return Producer(aio_client, stream, producer_id, **kwargs)

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if threading.current_thread() is getattr(self._client, "_thread", None):
            coro.close()
            errors.invariant(False, "SyncProducer called from its client's loop thread (a future's callback?)")
        if not self._loop.is_running():
            coro.close()
            raise ProducerClosed("the client of this producer is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> "SyncProducer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def producer_id(self) -> bytes:
        """The producer's id (given, or the random one it made)."""
        return self._producer.producer_id

    def send(self, data: bytes, partition_key: str, *, explicit_hash_key: int | str | None = None,
             dedup_key: bytes | str | None = None,
             headers: Headers | None = None) -> concurrent.futures.Future[ProducerResult]:
        """Queue one record; a future of its `ProducerResult` or its named error
        (`Producer.send`). Waits while PRODUCER_SYNC_HANDOFF_RECORDS_MAX records (or
        _BYTES_MAX bytes) this producer was given are not yet taken by its loop.

        Raises:
            InvalidPartitionKey, InvalidHashKey, RecordTooLarge, InvalidRecordHeader,
            InvalidDedupKey, DedupKeyTooLarge, InvalidArgument, StreamNotFound,
            ProducerClosed, InternalError."""
        self._check_open()
        try:
            prepared = prepare_record(partition_key, data, explicit_hash_key, headers)
        except (errors.RecordTooLarge, errors.InvalidArgument):
            if not needs_reference((partition_key, data)):
                raise
            # over the inline limit, or a file: uploaded on the loop, then sent by reference
            return self._run(self._after_handoff(lambda: self._producer.send(
                data, partition_key, explicit_hash_key=explicit_hash_key, dedup_key=dedup_key, headers=headers)))
        extra = prepared.extra
        dedup = _dedup_key_bytes(dedup_key)
        if dedup is not None:
            extra += bytes((wire.TAG_DEDUP_KEY, len(dedup))) + dedup
        record = (prepared.key, prepared.data, prepared.hash_key, extra)
        if self._producer._acc.info is None:
            # the first record loads the stream map: StreamNotFound raises here, not on the future
            return self._run(self._after_handoff(
                lambda: cast("Coroutine[Any, Any, asyncio.Future[ProducerResult]]", self._producer._queue(*record))))
        future: concurrent.futures.Future[ProducerResult] = _RecordFuture()
        self._hand_off(record, future)
        return future

    def _check_open(self) -> None:
        if threading.current_thread() is getattr(self._client, "_thread", None):
            errors.invariant(False, "SyncProducer called from its client's loop thread (a future's callback?)")
        if self._closed or not self._loop.is_running():
            raise ProducerClosed(f"producer of {self._producer.stream!r} is closed")
        self._producer._check_running()         # (reads its state only: fenced or broken raise here)

    def _hand_off(self, record: tuple[bytes, bytes, int, bytes], future: concurrent.futures.Future[Any]) -> None:
        size = len(record[0]) + len(record[1]) + len(record[3])
        with self._room:
            while self._handoff and (len(self._handoff) >= limits.PRODUCER_SYNC_HANDOFF_RECORDS_MAX
                                     or self._handoff_bytes + size > limits.PRODUCER_SYNC_HANDOFF_BYTES_MAX):
                if not self._room.wait(limits.PRODUCER_SYNC_WAIT_CHECK_S):
                    self._check_open()
            if self._closed:                        # (close() began while this send checked its record)
                raise ProducerClosed(f"producer of {self._producer.stream!r} is closed")
            self._handoff.append((record, future))
            self._handoff_bytes += size
            if self._take_scheduled:
                return
            try:
                self._loop.call_soon_threadsafe(self._schedule_take)
            except RuntimeError:                    # the loop closed meanwhile
                self._handoff.pop()
                self._handoff_bytes -= size
                raise ProducerClosed("the client of this producer is closed") from None
            self._take_scheduled = True

    def _schedule_take(self) -> None:
        """(on the loop) A task that takes the hand-off."""
        self._loop.create_task(self._taken())

    async def _take_locked(self) -> None:
        """Queue everything handed off so far, in order (the caller holds _order); waits
        for room in the producer meanwhile, so the hand-off fills and send() waits."""
        while True:
            with self._room:
                items, self._handoff = self._handoff, []
                self._handoff_bytes = 0
                self._take_scheduled = False
                self._room.notify_all()
            if not items:
                return
            await self._producer._queue_outcomes([r for r, _f in items], [f for _r, f in items])

    async def _taken(self) -> None:
        """Every record handed off so far is queued (before what the caller does next)."""
        async with self._order:
            await self._take_locked()

    async def _after_handoff(self, queue: Callable[[], Coroutine[Any, Any, asyncio.Future[_T]]]
                             ) -> concurrent.futures.Future[_T]:
        """`queue()` (a producer call that queues records and returns their future) after
        every record handed off so far, so one thread's records keep their order; its
        future as a concurrent one."""
        async with self._order:
            await self._take_locked()
            future = await queue()
        return _concurrent_of(future)

    def put(self, data: bytes, partition_key: str, **kwargs: Any) -> ProducerResult:
        """send() (`kwargs`: explicit_hash_key, dedup_key, headers) and wait for the
        record's result. Raises what send() raises, and the record's named error."""
        return self.send(data, partition_key, **kwargs).result()

    def send_batch(self, records: Iterable[RecordInput]) -> concurrent.futures.Future[BatchResults]:
        """`Producer.send_batch`: one future of the list of outcomes, in order.

        Raises:
            InvalidArgument, InvalidPartitionKey, InvalidHashKey, RecordTooLarge,
            InvalidRecordHeader, StreamNotFound, ProducerClosed, InternalError."""
        self._check_open()
        batch = list(records)
        return self._run(self._after_handoff(lambda: self._producer.send_batch(batch)))

    def flush(self) -> None:
        """Wait until every record sent before is settled. Raises InternalError if the
        sender failed, ProducerClosed if the client is closed."""
        self._run(self._flush())

    async def _flush(self) -> None:
        await self._taken()
        await self._producer.flush()

    def close(self) -> None:
        """Flush and stop the producer (`Producer.close`). Idempotent."""
        self._closed = True
        if self._loop.is_running():
            self._run(self._close())
        with self._room:
            self._room.notify_all()               # (threads waiting for room see the close)
            left, self._handoff = self._handoff, []
        for _record, future in left:              # (only if the loop stopped first)
            if not future.done():
                future.set_exception(ProducerClosed("the client of this producer closed before the record was sent"))

    async def _close(self) -> None:
        await self._taken()
        await self._producer.close()

    def statistics(self) -> dict[str, Any]:
        """`Producer.statistics`, and the records handed off but not yet taken by the
        loop. Raises ProducerClosed if the client is closed."""
        return {**self._run(self._statistics()), "handed_off": len(self._handoff)}

    async def _statistics(self) -> dict[str, Any]:
        return self._producer.statistics()


def _concurrent_of(source: asyncio.Future[_T]) -> concurrent.futures.Future[_T]:
    """A concurrent future that takes `source`'s outcome (set on the loop)."""
    out: concurrent.futures.Future[_T] = concurrent.futures.Future()
    out.set_running_or_notify_cancel()             # a sent record cannot be called back
    source.add_done_callback(lambda f: _copy_outcome(f, out))
    return out


def _copy_outcome(source: asyncio.Future[_T], target: concurrent.futures.Future[_T]) -> None:
    if source.cancelled():
        target.set_exception(ProducerClosed("the record's future was cancelled"))
    elif source.exception() is not None:
        target.set_exception(source.exception())
    else:
        target.set_result(source.result())
