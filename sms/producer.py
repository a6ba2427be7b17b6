"""The de-duplicating producer: `Producer(client, stream)` (asyncio) and `SyncProducer`.

A producer owns one producer session per partition it writes to (DESIGN section 6): it
numbers that partition's records 0, 1, 2, ... (the SSSN), stamps each with the time it
was first sent, and tells the ingestion owner its ack high-water mark (HWM: the highest
SSSN that it and every SSSN below are settled, acked or failed for good) with every
request, so the owner's `ingestion/dedup.py` table can answer a resend as a duplicate
instead of storing it twice. `send()` validates and queues a record and returns a future;
one sender task per producer lingers briefly for more records, then sends ONE PutRecords
per ingestion owner at a time (routing from the `sms.aio.Client`'s stream map), so each
session's records reach its owner in SSSN order. Retriable answers are resent with the
same SSSN and submit time, ahead of newer records, after a backoff (and a map refresh
when asked); SSSNs the owner reports missing are resent at once. Everything is bounded:
records pending per partition and in bytes (send() waits), SSSNs above the HWM (the
owner's per-session table), records and bytes per request, and each record's delivery
time (then its future fails with Timeout). `SyncProducer` runs a `Producer` on the loop of
a synchronous `sms.Client`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from sms import wire, errors, limits
from sms.records import prepare_record, prepare_records
from sms.limits import (
    PRODUCER_DEDUP_WINDOW_MARGIN_S,
    PRODUCER_DELIVERY_TIMEOUT_S,
    PRODUCER_ID_RANDOM_BYTES,
    PRODUCER_LINGER_MS,
    PRODUCER_LINGER_MS_MAX,
    PRODUCER_PENDING_BYTES_MAX,
    PRODUCER_PENDING_PER_PARTITION_MAX,
    PRODUCER_RETRY_BACKOFF_MS,
    PRODUCER_RETRY_BACKOFF_MS_CAP,
    PRODUCER_RETRY_BACKOFF_MS_MAX,
    PRODUCER_SESSION_WINDOW_MAX,
)
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.types import PartitionInfo, PartitionState, Routes, StreamInfo, partition_id

log = logging.getLogger(__name__)

# --- limits of the producer -------------------------------------------------------------

# A record's last resend reaches the owner before the default dedup window forgets its first.
assert (PRODUCER_DELIVERY_TIMEOUT_S + PRODUCER_DEDUP_WINDOW_MARGIN_S) * 1000 + limits.DEDUP_CLOCK_SKEW_MS_MAX \
    < limits.DEDUP_WINDOW_MS_DEFAULT
# Even the shortest window leaves a record some time to be delivered.
assert PRODUCER_DEDUP_WINDOW_MARGIN_S * 1000 + limits.DEDUP_CLOCK_SKEW_MS_MAX < limits.DEDUP_WINDOW_MS_MIN
# One full request fits in a session's window; the owner's table never refuses the lowest SSSN.
assert limits.PUT_RECORDS_COUNT_MAX <= PRODUCER_SESSION_WINDOW_MAX <= limits.DEDUP_ENTRIES_PER_SESSION_MAX
assert limits.RECORD_DATA_BYTES_MAX < PRODUCER_PENDING_BYTES_MAX
assert PRODUCER_RETRY_BACKOFF_MS <= PRODUCER_RETRY_BACKOFF_MS_CAP <= PRODUCER_RETRY_BACKOFF_MS_MAX
assert 0 < PRODUCER_ID_RANDOM_BYTES <= limits.PRODUCER_ID_BYTES_MAX

_SSSN_META_BYTES = 2 + 8
_SUBMIT_META_BYTES = 2 + 8
_HASH_KEY_META_BYTES = 2 + 16


HWM_NONE = -1   # no ack yet: the same sentinel as ingestion/dedup.py

ProducerClosed = errors.ProducerClosed
class ProducerResult(NamedTuple):
    """A record stored once: its SN (None when the owner no longer knows it: a duplicate
    of a record below the HWM), its partition and SSSN, and whether this answer was a
    duplicate (the record had already been stored by an earlier send of it)."""

    sn: int | None
    partition_ordinal: int
    sssn: int
    duplicate: bool = False

    @property
    def sequence_number(self) -> str:
        return "" if self.sn is None else str(self.sn)

    @property
    def partition_id(self) -> str:
        return partition_id(self.partition_ordinal)


class ProducerState(enum.Enum):
    RUNNING = "RUNNING"    # send() accepted
    CLOSING = "CLOSING"    # close() is flushing: send() refused, pending records still delivered
    BROKEN = "BROKEN"      # the sender task failed (a bug): every pending record failed with it
    CLOSED = "CLOSED"      # the sender is stopped


_TRANSITIONS: dict[ProducerState, frozenset[ProducerState]] = {
    ProducerState.RUNNING: frozenset({ProducerState.CLOSING, ProducerState.BROKEN}),
    ProducerState.CLOSING: frozenset({ProducerState.CLOSED, ProducerState.BROKEN}),
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


class _BatchOutcome:
    """The outcomes of one send_batch() call, and the one future that carries them."""

    __slots__ = ("values", "pending", "future")

    def __init__(self, count: int, loop: asyncio.AbstractEventLoop):
        self.values: list = [None] * count
        self.pending = count
        self.future: asyncio.Future = loop.create_future()

    def settle(self, index: int, value) -> None:
        if self.values[index] is not None:
            return
        self.values[index] = value
        self.pending -= 1
        if self.pending == 0 and not self.future.done():
            self.future.set_result(self.values)


class _Slot:
    """A record's place in its send_batch() outcome: what the producer needs of a future."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: _BatchOutcome, index: int):
        self.batch = batch
        self.index = index

    def done(self) -> bool:
        return self.batch.values[self.index] is not None

    def cancelled(self) -> bool:
        return False      # (a caller that cancels the batch's future stops waiting; the outcome is still kept)

    def set_result(self, result: "ProducerResult") -> None:
        self.batch.settle(self.index, result)

    def set_exception(self, error: BaseException) -> None:
        self.batch.settle(self.index, error)


@dataclass(slots=True, eq=False)
class _Record:
    """One record from send() until its future is settled."""

    ordinal: int
    sssn: int
    key: bytes                       # partition key, UTF-8
    data: bytes | None               # dropped once `entry` is encoded
    extra: bytes                     # wire meta TLVs: explicit hash key, dedup key, headers (SSSN and
                                     # submit time are added at first send)
    size: int                        # key + meta + data bytes, as a request counts them
    future: "asyncio.Future | _Slot"  # send(): its own future; send_batch(): its slot in the batch's
    enqueued_s: float                # loop time of send()
    deadline_s: float                # loop time after which it fails with Timeout (unless in flight)
    submit_ms: int | None = None     # wall clock of its first send; every resend carries it
    entry: bytes | None = None       # the encoded entry, the same bytes on every resend
    attempts: int = 0
    hash_key: int = 0                # routes it to a child once its partition is closed


@dataclass(slots=True, eq=False)
class _Session:
    """This producer's session with one partition."""

    ordinal: int
    next_sssn: int = 0
    hwm: int = HWM_NONE              # it and every SSSN below are settled
    records: dict[int, _Record] = field(default_factory=dict)    # un-settled, by SSSN
    queue: deque[_Record] = field(default_factory=deque)         # to send, in SSSN order
    queued_bytes: int = 0
    inflight: int = 0                      # records in the one request in flight
    settled_above_hwm: set[int] = field(default_factory=set)
    failures: int = 0                      # consecutive rounds with a retriable answer
    not_before_s: float = 0.0              # backoff: send nothing before this loop time
    urgent: bool = False                   # the owner reported missing SSSNs: no linger
    space: _Pulse = field(default_factory=_Pulse)   # a record settled


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
    """Sends records of one stream with de-duplication (see the module docstring)."""

    def __init__(self, client, stream: str, producer_id: str | bytes | None = None, *,
                 linger_ms: float = PRODUCER_LINGER_MS,
                 max_pending_per_partition: int = PRODUCER_PENDING_PER_PARTITION_MAX,
                 max_pending_bytes: int = PRODUCER_PENDING_BYTES_MAX,
                 retry_backoff_ms: float = PRODUCER_RETRY_BACKOFF_MS,
                 retry_backoff_max_ms: float = PRODUCER_RETRY_BACKOFF_MS_CAP,
                 delivery_timeout_s: float = PRODUCER_DELIVERY_TIMEOUT_S,
                 clock_ms: Callable[[], int] = _wall_clock_ms):
        self.producer_id: bytes = producer_id_bytes(producer_id)
        self.stream = stream
        self.linger_s = _in_range("linger_ms", linger_ms, 0, PRODUCER_LINGER_MS_MAX) / 1000
        self.max_pending_per_partition = int(_in_range("max_pending_per_partition", max_pending_per_partition,
                                                       1, PRODUCER_PENDING_PER_PARTITION_MAX))
        self.max_pending_bytes = int(_in_range("max_pending_bytes", max_pending_bytes,
                                               1, PRODUCER_PENDING_BYTES_MAX))
        self.retry_backoff_s = _in_range("retry_backoff_ms", retry_backoff_ms, 0, PRODUCER_RETRY_BACKOFF_MS_MAX,
                                         lo_open=True) / 1000
        self.retry_backoff_max_s = _in_range("retry_backoff_max_ms", retry_backoff_max_ms, retry_backoff_ms,
                                             PRODUCER_RETRY_BACKOFF_MS_MAX) / 1000
        self.delivery_timeout_s = _in_range("delivery_timeout_s", delivery_timeout_s, 0,
                                            PRODUCER_DELIVERY_TIMEOUT_S, lo_open=True)
        self._client = client
        self._clock_ms = clock_ms
        self._state = ProducerState.RUNNING
        self._broken: BaseException | None = None
        self._info: StreamInfo | None = None
        self._map_lock: asyncio.Lock | None = None
        self._refresh_wanted = False
        self._refresh_not_before_s = 0.0
        self._refresh_failures = 0
        self._sessions: dict[int, _Session] = {}
        self._pending_bytes = 0
        self._inflight: dict[str, int] = {}      # owner address -> records of its one request in flight
        self._flushing = 0                       # flush() calls waiting: no linger meanwhile
        self._wakeup: asyncio.Event | None = None
        self._progress = _Pulse()                # some record settled
        self._closing: asyncio.Event | None = None   # set when the close() under way ends
        self._sender: asyncio.Task | None = None
        self._round_robin = 0
        self._routes: Routes | None = None      # the open partitions of self._info, for bisect
        self._loop: asyncio.AbstractEventLoop | None = None
        self._totals = dict.fromkeys(("sent", "acked", "duplicates", "failed", "requests", "call_failures",
                                      "retries", "missing_resends", "map_refreshes", "expired", "moved"), 0)

    # --- public API -------------------------------------------------------------------
    async def __aenter__(self) -> "Producer":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def state(self) -> ProducerState:
        return self._state

    async def send(self, data: bytes, partition_key: str, *, explicit_hash_key: int | str | None = None,
                   dedup_key: bytes | str | None = None, headers=None) -> asyncio.Future:
        """Queue one record and return a future of its `ProducerResult` (or its named
        error). Bad input raises at once and queues nothing; waits only while the record's
        partition has max_pending_per_partition un-settled records, or all partitions
        max_pending_bytes."""
        self._check_running()
        prepared = prepare_record(partition_key, data, explicit_hash_key, headers)
        extra = prepared.extra
        dedup_key = _dedup_key_bytes(dedup_key)
        if dedup_key is not None:
            extra += bytes((wire.TAG_DEDUP_KEY, len(dedup_key))) + dedup_key
        return await self._queue_record(prepared.key, prepared.data, prepared.hash_key, extra)

    async def send_batch(self, records) -> asyncio.Future:
        """send() for each record of `records`, in order: (partition_key, data) pairs, or
        (partition_key, data, explicit_hash_key) or dicts as `Client.put_records` takes
        them. Returns ONE future for the batch, resolving once every record is settled to a
        list with, per record in order, its `ProducerResult` or its named error (an
        `SmsError`, like `asyncio.gather(..., return_exceptions=True)`). No future per
        record: the batch is the unit of work. Every record is checked before any is queued:
        bad input raises and queues none. Waits, like send(), while a partition or the
        producer is full."""
        self._check_running()
        prepared = prepare_records(records)
        batch = _BatchOutcome(len(prepared), self._loop or self._bind_loop())
        for index, (key, data, hash_key, extra) in enumerate(prepared):
            slot = _Slot(batch, index)
            if self._enqueue_now(key, data, hash_key, extra, slot) is None:
                await self._queue_record(key, data, hash_key, extra, slot)
        if not prepared:
            batch.future.set_result([])
        return batch.future

    def _enqueue_now(self, key: bytes, data: bytes, hash_key: int, extra: bytes,
                     outcome: "_Slot | None" = None):
        """The record's future if it can be queued without waiting; None otherwise."""
        info = self._info
        if info is None or self._state is not ProducerState.RUNNING:
            return None
        try:
            partition = self._routes_for(info).partition_for(hash_key)
        except LookupError:
            return None
        session = self._sessions.get(partition.ordinal)
        if session is None or len(session.records) >= self.max_pending_per_partition:
            return None
        size = len(key) + len(data) + _SSSN_META_BYTES + _SUBMIT_META_BYTES + len(extra)
        if self._pending_bytes and self._pending_bytes + size > self.max_pending_bytes:
            return None
        return self._enqueue(session, key, data, extra, size, hash_key, outcome)

    async def _queue_record(self, key_bytes: bytes, data: bytes, hash_key: int,
                            extra: bytes, outcome: "_Slot | None" = None):
        size = len(key_bytes) + len(data) + _SSSN_META_BYTES + _SUBMIT_META_BYTES + len(extra)
        if size > limits.PUT_RECORDS_BYTES_MAX:
            errors.invariant(False, f"a valid record of {size} bytes fits no request")

        while True:
            info = self._info or await self._load_map()
            self._check_running()
            try:
                partition = self._routes_for(info).partition_for(hash_key)
            except LookupError:
                self._want_refresh()
                raise errors.Unavailable(f"no open partition of {self.stream!r} covers hash key {hash_key} "
                                         f"in map version {info.map_version}; retry") from None
            session = self._sessions.get(partition.ordinal)
            if session is None:
                session = self._sessions[partition.ordinal] = _Session(partition.ordinal)
            if len(session.records) >= self.max_pending_per_partition:
                await session.space.wait()
            elif self._pending_bytes and self._pending_bytes + size > self.max_pending_bytes:
                await self._progress.wait()
            else:
                break
        # From here to the return: no await, so the checks above still hold.
        return self._enqueue(session, key_bytes, data, extra, size, hash_key, outcome)

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    def _routes_for(self, info: StreamInfo) -> Routes:
        routes = self._routes
        if routes is None or routes.info is not info:
            routes = self._routes = Routes(info)
        return routes

    async def put(self, data: bytes, partition_key: str, **kwargs) -> ProducerResult:
        """send() and wait for the record's result; raises its named error."""
        return await (await self.send(data, partition_key, **kwargs))

    async def flush(self) -> None:
        """Wait until every record sent before this call is settled (acked or failed),
        sending without lingering meanwhile."""
        # (the futures, not SSSNs: a record not yet sent when its partition closed moves to
        # a child's session under a new SSSN, and keeps its future)
        pending = sorted(((r.enqueued_s, r.future) for s in self._sessions.values() for r in s.records.values()),
                         key=lambda t: t[0])
        if pending:
            self._flushing += 1
            self._wake()
            try:
                i = 0
                while i < len(pending):
                    if pending[i][1].done():
                        i += 1
                        continue
                    await self._progress.wait()
            finally:
                self._flushing -= 1
        self._raise_if_broken()

    async def close(self) -> None:
        """Refuse new records, flush, then stop the sender. Idempotent."""
        while self._closing is not None:           # another close() is under way
            await self._closing.wait()
        if self._state is ProducerState.CLOSED:
            return
        self._closing = closing = asyncio.Event()
        try:
            if self._state is ProducerState.RUNNING:
                self._transition(ProducerState.CLOSING)
            if self._state is ProducerState.CLOSING:
                try:
                    await self.flush()
                except errors.InternalError:
                    pass                           # broken while flushing: its records are failed already
            await self._stop_sender()
            self._fail_all(lambda: ProducerClosed(f"producer of {self.stream!r} closed before the record "
                                                  f"was settled"))
            self._transition(ProducerState.CLOSED)
        finally:                                   # if this close() was cancelled, the next one goes on
            self._closing = None
            closing.set()

    def statistics(self) -> dict:
        """Pending records per partition, requests in flight, and totals since creation."""
        return {
            "state": self._state.value,
            "pending": {o: len(s.records) for o, s in self._sessions.items()},
            "queued": {o: len(s.queue) for o, s in self._sessions.items()},
            "hwm": {o: s.hwm for o, s in self._sessions.items()},
            "pending_bytes": self._pending_bytes,
            "inflight_requests": len(self._inflight),
            "inflight_records": sum(self._inflight.values()),
            **{f"{k}_total": v for k, v in self._totals.items()},
        }

    # --- states -------------------------------------------------------------------------
    def _transition(self, to: ProducerState) -> None:
        errors.invariant(to in _TRANSITIONS[self._state], f"producer {self._state} -> {to} is not a transition")
        self._state = to

    def _check_running(self) -> None:
        if self._state is ProducerState.RUNNING:
            return
        self._raise_if_broken()
        raise ProducerClosed(f"producer of {self.stream!r} is {self._state.value.lower()}")

    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise errors.InternalError(f"producer of {self.stream!r} failed: {self._broken!r}") from self._broken

    # --- queueing ---------------------------------------------------------------------
    def _enqueue(self, session: _Session, key: bytes, data: bytes, extra: bytes,
                 size: int, hash_key: int = 0, outcome: "_Slot | None" = None):
        if session.next_sssn > limits.SSSN_MAX:
            errors.invariant(False, f"p{session.ordinal}: SSSNs exhausted")
        loop = self._loop or self._bind_loop()
        now_s = loop.time()
        window_s = (self._info.dedup_window_s - limits.DEDUP_CLOCK_SKEW_MS_MAX / 1000
                    - PRODUCER_DEDUP_WINDOW_MARGIN_S)
        record = _Record(session.ordinal, session.next_sssn, key, data, extra, size,
                         outcome or loop.create_future(), now_s,
                         now_s + max(0.0, min(self.delivery_timeout_s, window_s)), hash_key=hash_key)
        session.next_sssn += 1
        session.records[record.sssn] = record
        session.queue.append(record)
        session.queued_bytes += size
        self._pending_bytes += size
        self._totals["sent"] += 1
        self._ensure_sender()
        self._wake()
        return record.future

    def _settle(self, session: _Session, record: _Record, result: ProducerResult | None = None,
                error: BaseException | None = None) -> None:
        """The record's one outcome: its future resolves and its SSSN counts for the HWM."""
        if session.records.pop(record.sssn, None) is not record:
            errors.invariant(False, f"p{session.ordinal}: sssn {record.sssn} settled twice or never sent")
        self._pending_bytes -= record.size
        self._count_settled(session, record.sssn)
        if error is None:
            self._totals["acked"] += 1
            self._totals["duplicates"] += result.duplicate
            if not record.future.cancelled():
                record.future.set_result(result)
        else:
            self._totals["failed"] += 1
            if not record.future.cancelled():
                record.future.set_exception(error)
        session.space.fire()
        self._progress.fire()

    def _fail_queue(self, session: _Session, make_error: Callable[[], BaseException]) -> None:
        while session.queue:
            record = session.queue.popleft()
            session.queued_bytes -= record.size
            self._settle(session, record, error=make_error())

    def _fail_all(self, make_error: Callable[[], BaseException]) -> None:
        """Fail every un-settled record (producer stopped or broken), in SSSN order."""
        for session in self._sessions.values():
            session.queue.clear()
            session.queued_bytes = 0
            session.inflight = 0
            for record in sorted(session.records.values(), key=lambda r: r.sssn):
                self._settle(session, record, error=make_error())

    # --- the stream map ------------------------------------------------------------------
    async def _load_map(self) -> StreamInfo:
        if self._map_lock is None:
            self._map_lock = asyncio.Lock()
        async with self._map_lock:
            if self._info is None:
                self._info = await self._client.get_stream_info(self.stream, refresh=False)
        return self._info

    def _want_refresh(self) -> None:
        self._refresh_wanted = True
        self._wake()

    async def _refresh_map(self) -> None:
        self._totals["map_refreshes"] += 1
        try:
            self._info = await self._client.get_stream_info(self.stream)
        except errors.SmsError:
            # Keep the old map and try again later; records time out if it never comes back.
            self._refresh_failures += 1
            self._refresh_not_before_s = asyncio.get_running_loop().time() + self._backoff_s(self._refresh_failures)
            return
        self._refresh_wanted = False
        self._refresh_failures = 0
        # at once, before send() can queue newer records in the children's sessions: a
        # closed partition's never-sent records go ahead of them (per-key order)
        for session in list(self._sessions.values()):
            partition = self._partition(session.ordinal)
            if partition is not None and partition.state is not PartitionState.OPEN and session.queue:
                self._move_unsent(session)

    def _partition(self, ordinal: int) -> PartitionInfo | None:
        try:
            return self._info.partition(ordinal)
        except LookupError:
            return None

    def _target(self, record: _Record) -> PartitionInfo | None:
        """The open partition a record of a closed session goes to now (by its hash)."""
        try:
            return self._info.open_partition_for_hash(record.hash_key)
        except LookupError:
            return None

    def _ancestor_busy(self, ordinal: int) -> bool:
        """Some session of an ancestor partition still has records to settle: they were sent
        first, and may route here, so this session waits (per-key order across a split)."""
        seen: set[int] = set()
        todo = list(p.parents) if (p := self._partition(ordinal)) is not None else []
        while todo:
            o = todo.pop()
            if o in seen:
                continue
            seen.add(o)
            session = self._sessions.get(o)
            if session is not None and session.records:
                return True
            if (p := self._partition(o)) is not None:
                todo.extend(p.parents)
        return False

    # --- the sender ------------------------------------------------------------------------
    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    def _backoff_s(self, failures: int) -> float:
        return min(self.retry_backoff_s * 2 ** min(max(failures - 1, 0), 16), self.retry_backoff_max_s)

    def _ensure_sender(self) -> None:
        if self._sender is None:
            self._wakeup = asyncio.Event()
            self._sender = asyncio.get_running_loop().create_task(self._run_sender(),
                                                                  name=f"sms-producer-{self.stream}")

    def _break(self, exc: BaseException) -> None:
        """The sender failed (a bug): fail every pending record with it, refuse new ones."""
        self._broken = exc
        self._transition(ProducerState.BROKEN)
        self._fail_all(lambda: errors.InternalError(f"producer of {self.stream!r} failed: {exc!r}"))

    async def _stop_sender(self) -> None:
        if self._sender is None or self._sender.done():
            return
        self._sender.cancel()
        try:
            await self._sender
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
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
        async with asyncio.TaskGroup() as requests:
            while True:
                self._wakeup.clear()
                if self._refresh_wanted and loop.time() >= self._refresh_not_before_s:
                    await self._refresh_map()
                wake_s = self._pump(requests, loop.time())
                if self._refresh_wanted:
                    wake_s = min(wake_s, self._refresh_not_before_s)
                timeout_s = None if wake_s == float("inf") else max(0.0, wake_s - loop.time())
                try:
                    async with asyncio.timeout(timeout_s):
                        await self._wakeup.wait()
                except TimeoutError:
                    pass

    def _pump(self, requests: asyncio.TaskGroup, now_s: float) -> float:
        """Expire records, fail those of closed partitions, and start one request for each
        idle owner with a record due; returns the loop time at which to look again
        (records lingering, backoffs, deadlines) unless something wakes the sender sooner."""
        wake_s = float("inf")
        ready: dict[str, list[_Session]] = {}
        due: set[str] = set()
        owner_load: dict[str, tuple[int, int]] = {}
        for session in list(self._sessions.values()):     # (_move_unsent may add sessions)
            if not session.queue:
                continue
            while session.queue and session.queue[0].deadline_s <= now_s:   # deadlines rise with SSSNs
                record = session.queue.popleft()
                session.queued_bytes -= record.size
                self._totals["expired"] += 1
                self._settle(session, record, error=errors.Timeout(
                    f"p{session.ordinal} sssn {record.sssn}: not delivered within "
                    f"{record.deadline_s - record.enqueued_s:.1f} s ({record.attempts} attempts)"))
            if not session.queue:
                continue
            partition = self._partition(session.ordinal)
            if partition is None:
                # gone from the map: closed so long ago that retention dropped it
                self._fail_queue(session, lambda: errors.PartitionClosed(
                    f"partition p{session.ordinal} of {self.stream!r} is closed and gone"))
                continue
            if session.inflight:
                continue                           # its request's end wakes the sender
            if self._ancestor_busy(session.ordinal):
                wake_s = min(wake_s, session.queue[0].deadline_s)
                continue                           # a settling ancestor wakes the sender
            if partition.state is not PartitionState.OPEN:
                # split or merged: records never sent move to the session of the child that
                # covers their hash; those sent before (maybe stored in the parent) go to that
                # child still in their session, which the child's table knows
                if self._move_unsent(session):
                    wake_s = now_s                 # the children's sessions go next round
                if not session.queue:
                    continue
                partition = self._target(session.queue[0])
                if partition is None:
                    self._want_refresh()
                    session.failures += 1
                    session.not_before_s = now_s + self._backoff_s(session.failures)
                    wake_s = min(wake_s, session.not_before_s)
                    continue
            errors.invariant(session.queue[0].sssn == session.hwm + 1,
                             f"p{session.ordinal}: idle session queue starts at sssn {session.queue[0].sssn}, "
                             f"hwm {session.hwm}")
            wake_s = min(wake_s, session.queue[0].deadline_s)
            if session.not_before_s > now_s:
                wake_s = min(wake_s, session.not_before_s)
                continue
            owner = partition.ingestion_owner.address if partition.ingestion_owner else ""
            if not owner:
                self._want_refresh()
                session.failures += 1
                session.not_before_s = now_s + self._backoff_s(session.failures)
                wake_s = min(wake_s, session.not_before_s)
                continue
            ready.setdefault(owner, []).append(session)
            count, size = owner_load.get(owner, (0, 0))
            count, size = count + len(session.queue), size + session.queued_bytes
            owner_load[owner] = (count, size)
            linger_end_s = session.queue[0].enqueued_s + self.linger_s
            if (session.urgent or self._flushing or session.queue[0].attempts or linger_end_s <= now_s
                    or count >= limits.PUT_RECORDS_COUNT_MAX or size >= limits.PUT_RECORDS_BYTES_MAX):
                due.add(owner)
            elif owner not in self._inflight:
                wake_s = min(wake_s, linger_end_s)
        for owner in due:
            if owner not in self._inflight:
                items, hwms = self._take_batch(ready[owner], owner)
                self._inflight[owner] = len(items)
                requests.create_task(self._deliver(owner, items, hwms))
        return wake_s

    def _move_unsent(self, session: _Session) -> int:
        """Move a closed partition's never-sent records to the sessions of the open
        partitions covering them, under new SSSNs (no node ever saw the old ones), with
        their futures and deadlines; in the old session their SSSNs count as settled."""
        keep: deque[_Record] = deque()
        for record in session.queue:
            target = self._target(record) if not record.attempts else None
            if target is None:
                keep.append(record)
                continue
            session.queued_bytes -= record.size
            errors.invariant(session.records.pop(record.sssn, None) is record,
                             f"p{session.ordinal}: moved sssn {record.sssn} was not pending")
            self._count_settled(session, record.sssn)
            child = self._sessions.get(target.ordinal)
            if child is None:
                child = self._sessions[target.ordinal] = _Session(target.ordinal)
            errors.invariant(child.next_sssn <= limits.SSSN_MAX, f"p{child.ordinal}: SSSNs exhausted")
            moved = dataclasses.replace(record, ordinal=child.ordinal, sssn=child.next_sssn)
            child.next_sssn += 1
            child.records[moved.sssn] = moved
            child.queue.append(moved)
            child.queued_bytes += moved.size
            self._totals["moved"] += 1
        moved = len(session.queue) - len(keep)
        session.queue = keep
        session.space.fire()
        return moved

    def _count_settled(self, session: _Session, sssn: int) -> None:
        if sssn == session.hwm + 1:
            session.hwm += 1
            while session.hwm + 1 in session.settled_above_hwm:
                session.settled_above_hwm.remove(session.hwm + 1)
                session.hwm += 1
        else:
            session.settled_above_hwm.add(sssn)

    def _take_batch(self, sessions: list[_Session], owner: str = "") -> tuple[list[_Record], dict[int, int]]:
        """Records for one request, each session's in SSSN order from the front of its
        queue, within the request bounds and the owner's per-session window."""
        items: list[_Record] = []
        hwms: dict[int, int] = {}
        size = 0
        start = self._round_robin % len(sessions)
        self._round_robin += 1
        for session in sessions[start:] + sessions[:start]:
            taken = 0
            partition = self._partition(session.ordinal)
            closed = partition is not None and partition.state is not PartitionState.OPEN
            if closed:
                taken, size = self._take_closed(session, owner, items, size)
            while not closed and session.queue and len(items) < limits.PUT_RECORDS_COUNT_MAX:
                record = session.queue[0]
                if record.sssn > session.hwm + PRODUCER_SESSION_WINDOW_MAX \
                        or size + record.size > limits.PUT_RECORDS_BYTES_MAX:
                    break
                session.queue.popleft()
                session.queued_bytes -= record.size
                if record.entry is None:
                    self._encode(record)
                size += record.size
                record.attempts += 1
                items.append(record)
                taken += 1
            if taken:
                session.inflight = taken
                session.urgent = False
                hwms[session.ordinal] = session.hwm
            if len(items) >= limits.PUT_RECORDS_COUNT_MAX or (session.queue and taken == 0 and items):
                break                              # full (a session that could not add one: bytes)
        errors.invariant(items, "an owner was due with nothing to send")
        return items, hwms

    def _encode(self, record: _Record) -> None:
        """First send: stamp the submit time; the entry is reused unchanged by every resend."""
        record.submit_ms = self._clock_ms()
        record.entry = wire.encode_session_entry(record.key, record.data, record.sssn, record.submit_ms,
                                                 record.extra)
        if len(record.entry) - wire.ENTRY.size != record.size:
            errors.invariant(False, f"entry of {len(record.entry) - wire.ENTRY.size} bytes; counted {record.size}")
        record.data = None

    def _take_closed(self, session: _Session, owner: str, items: list[_Record], size: int) -> tuple[int, int]:
        """A closed partition's records (all sent before) for the children on `owner`, in
        SSSN order (the request names their session partition); the others stay queued for the
        next request (their children are on other owners). Returns (taken, size)."""
        rest: deque[_Record] = deque()
        taken = 0
        full = False                    # once one record for `owner` does not fit, none after it goes
        for record in session.queue:
            target = self._target(record)
            address = target.ingestion_owner.address if target and target.ingestion_owner else ""
            if address == owner and not full and (
                    len(items) >= limits.PUT_RECORDS_COUNT_MAX
                    or record.sssn > session.hwm + PRODUCER_SESSION_WINDOW_MAX
                    or size + record.size > limits.PUT_RECORDS_BYTES_MAX):
                full = True
            if address != owner or full:
                rest.append(record)
                continue
            session.queued_bytes -= record.size
            if record.entry is None:
                self._encode(record)
            size += record.size
            record.attempts += 1
            items.append(record)
            taken += 1
        session.queue = rest
        return taken, size

    async def _deliver(self, owner: str, items: list[_Record], hwms: dict[int, int]) -> None:
        """One PutRecords to one owner, and what its answer means for each record."""
        request = sms_pb2.PutRecordsRequest(stream=self.stream, count=len(items),
                                            entries=b"".join(r.entry for r in items),
                                            producer_id=self.producer_id, hwm=hwms,
                                            session_ordinals=wire.encode_session_ordinals(r.ordinal for r in items))
        self._totals["requests"] += 1
        try:
            try:
                response = await self._client._call(owner, sms_pb2_grpc.IngestionStub, "PutRecords", request,
                                                    timeout_s=limits.PUT_TIMEOUT_S)
            except errors.SmsError as e:
                self._totals["call_failures"] += 1
                self._on_call_failed(items, e)
            else:
                self._on_response(items, response)
        finally:
            del self._inflight[owner]
            self._wake()

    def _on_call_failed(self, items: list[_Record], error: errors.SmsError) -> None:
        """The whole call failed: resend every record (same SSSNs) or fail every one."""
        if error.retriable:
            answered: dict[int, tuple[int, list[_Record]]] = {}
            for record in items:
                sent, again = answered.get(record.ordinal, (0, []))
                again.append(record)
                answered[record.ordinal] = (sent + 1, again)
            self._requeue(answered, refresh=error.refresh_map)
            return
        for record in items:
            session = self._sessions[record.ordinal]
            session.inflight -= 1
            self._settle(session, record, error=type(error)(error.message))

    def _on_response(self, items: list[_Record], response) -> None:
        n = len(items)
        shape_error = _check_response(response, n)
        if shape_error:
            self._on_call_failed(items, errors.InternalError(shape_error))
            return
        failed = {e.index: e for e in response.errors}
        duplicates = set(response.duplicates)
        answered: dict[int, tuple[int, list[_Record]]] = {}   # ordinal -> (records in flight, to resend)
        refresh = False
        throttled: set[int] = set()                 # partitions with a record answered Throttled
        sessions = self._sessions
        sns, ordinals = wire.decode_put_results(response.sequence_numbers, response.ordinals, len(items))
        for j, record in enumerate(items):
            sent, again = answered.get(record.ordinal, (0, []))
            answered[record.ordinal] = (sent + 1, again)
            if j in failed:
                error = errors.from_name(failed[j].name, failed[j].message)
                if error.retriable:
                    again.append(record)
                    refresh |= error.refresh_map
                    if isinstance(error, errors.Throttled):
                        throttled.add(record.ordinal)
                    continue
                self._settle(self._sessions[record.ordinal], record, error=error)
                continue
            sn = sns[j]
            self._settle(sessions[record.ordinal], record,
                         ProducerResult(sn or None, ordinals[j], record.sssn, j in duplicates))
        self._requeue(answered, refresh=refresh)
        for m in response.missing:
            # SSSNs below one the owner took that it does not hold: resent at once, ahead of
            # newer records, skipping the backoff; unless the owner throttled this session,
            # else a full table (keys, sessions) would be hammered once per round trip.
            session = self._sessions.get(m.ordinal)
            if session is None or session.inflight or m.ordinal in throttled:
                continue                           # (in flight: a partition this request did not carry)
            unsettled = sum(1 for sssn in m.sssns if sssn in session.records)
            if unsettled:
                self._totals["missing_resends"] += unsettled
                session.urgent = True
                session.not_before_s = 0.0

    def _requeue(self, by_ordinal: dict[int, tuple[int, list[_Record]]], *, refresh: bool) -> None:
        """End a request's flight for each session; put retriable records back at the
        front of their queues (they are the lowest un-settled SSSNs), with a backoff."""
        now_s = asyncio.get_running_loop().time()
        for ordinal, (sent, again) in by_ordinal.items():
            session = self._sessions[ordinal]
            errors.invariant(session.inflight == sent, f"p{ordinal}: {sent} records answered, "
                                                       f"{session.inflight} in flight")
            session.inflight = 0
            if again:
                if session.queue and session.queue[0].sssn < again[-1].sssn:
                    # (a closed partition's records left queued for other owners)
                    session.queue = deque(sorted([*again, *session.queue], key=lambda r: r.sssn))
                else:
                    session.queue.extendleft(reversed(again))
                session.queued_bytes += sum(r.size for r in again)
                session.failures += 1
                session.not_before_s = now_s + self._backoff_s(session.failures)
                self._totals["retries"] += len(again)
            else:
                session.failures = 0
            errors.invariant(not session.queue or session.queue[0].sssn == session.hwm + 1,
                             f"p{ordinal}: queue starts at sssn {session.queue and session.queue[0].sssn}, "
                             f"hwm {session.hwm}")
        if refresh:
            self._want_refresh()


def _check_response(response, n: int) -> str:
    """Why an answer to n records cannot be read; empty when it can."""
    if len(response.sequence_numbers) != wire.SN_BYTES * n or len(response.ordinals) != wire.ORDINAL.size * n:
        return (f"PutRecords answer with {len(response.sequence_numbers)} bytes of SNs and "
                f"{len(response.ordinals)} of ordinals for {n} records")
    bad = [e.index for e in response.errors if e.index >= n] + [i for i in response.duplicates if i >= n]
    if bad:
        return f"PutRecords answer names record {bad[0]} of {n}"
    return ""


class SyncProducer:
    """A `Producer` on the private loop of a synchronous `sms.Client`. `send()` returns a
    `concurrent.futures.Future`; do not call this producer from that future's callbacks
    (they run on the client's loop thread)."""

    def __init__(self, client, stream: str, producer_id: str | bytes | None = None, **kwargs):
        self._client = client
        self._loop: asyncio.AbstractEventLoop = client._loop
        self._producer: Producer = self._run(self._make(client._aio, stream, producer_id, kwargs))

    @staticmethod
    async def _make(aio_client, stream, producer_id, kwargs) -> Producer:
        return Producer(aio_client, stream, producer_id, **kwargs)

    def _run(self, coro):
        if threading.current_thread() is getattr(self._client, "_thread", None):
            coro.close()
            errors.invariant(False, "SyncProducer called from its client's loop thread (a future's callback?)")
        if not self._loop.is_running():
            coro.close()
            raise ProducerClosed("the client of this producer is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> "SyncProducer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def producer_id(self) -> bytes:
        return self._producer.producer_id

    def send(self, data: bytes, partition_key: str, *, explicit_hash_key: int | str | None = None,
             dedup_key: bytes | str | None = None, headers=None) -> concurrent.futures.Future:
        return self._run(self._send(data, partition_key, explicit_hash_key, dedup_key, headers))

    async def _send(self, data, partition_key, explicit_hash_key, dedup_key, headers) -> concurrent.futures.Future:
        future = await self._producer.send(data, partition_key, explicit_hash_key=explicit_hash_key,
                                           dedup_key=dedup_key, headers=headers)
        out: concurrent.futures.Future = concurrent.futures.Future()
        out.set_running_or_notify_cancel()         # a sent record cannot be called back
        future.add_done_callback(lambda f: _copy_outcome(f, out))
        return out

    def put(self, data: bytes, partition_key: str, **kwargs) -> ProducerResult:
        return self.send(data, partition_key, **kwargs).result()

    def send_batch(self, records) -> concurrent.futures.Future:
        """`Producer.send_batch`: one future of the list of outcomes, in order."""
        return self._run(self._send_batch(list(records)))

    async def _send_batch(self, records) -> concurrent.futures.Future:
        future = await self._producer.send_batch(records)
        out: concurrent.futures.Future = concurrent.futures.Future()
        out.set_running_or_notify_cancel()
        future.add_done_callback(lambda f: _copy_outcome(f, out))
        return out

    def flush(self) -> None:
        self._run(self._producer.flush())

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._producer.close())

    def statistics(self) -> dict:
        return self._run(self._statistics())

    async def _statistics(self) -> dict:
        return self._producer.statistics()


def _copy_outcome(source: asyncio.Future, target: concurrent.futures.Future) -> None:
    if source.cancelled():
        target.set_exception(ProducerClosed("the record's future was cancelled"))
    elif source.exception() is not None:
        target.set_exception(source.exception())
    else:
        target.set_result(source.result())
