"""The producer's core without I/O: sessions, SSSNs, the ack high-water mark, batching,
answers, resends and lineage moves (DESIGN section 6).

`Accumulator` is sans-IO, as aiokafka's RecordAccumulator and h11 are: it never awaits,
sleeps, opens a socket or reads a clock. The caller passes the time (`now_s`, monotonic
seconds) into every call, sends the `PutRequest`s that `poll()` returns over whatever
transport it has, and hands each answer (or the call's failure) back. Outcomes are
reported through the objects the caller queued with each record (anything with `done`,
`cancelled`, `set_result` and `set_exception`: an asyncio or concurrent future, a slot of
a batch). Two senders drive it: `sms.producer.Producer` (asyncio; also behind
`SyncProducer`), and `sps.output.OutputWriter` (stage outputs and the Spark sink) through a
`Producer` whose records carry pinned SSSNs.

A session is this producer's numbering of the records it sends to one partition. The
accumulator numbers them 0, 1, 2, ... (or takes the caller's pinned SSSN, which must
rise within a session; SSSNs skipped over count as settled, since nothing is ever sent
under them). Its HWM is one below its lowest un-settled SSSN: every SSSN up to it has an
outcome here, so the owner may forget them. A record of a partition that was split or
merged goes on in its session to the open partition that now covers its hash, if it was
ever sent (the child's table knows the session); a record never sent moves to the
child's session under a new SSSN, unless its SSSN is pinned.

Bounds: records un-settled per partition and bytes over all partitions (`room()` says when
to wait), one request in flight per owner, records and bytes per request, SSSNs (counted
in records) sent above the HWM, and a delivery deadline per record.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, cast

from sms import errors, limits, wire
from sms.limits import PRODUCER_DEDUP_WINDOW_MARGIN_S, PRODUCER_SESSION_WINDOW_MAX
from sms.proto import sms_pb2
from sms.types import PartitionInfo, PartitionState, Routes, StreamInfo, partition_id

HWM_NONE = -1   # no ack yet: the same sentinel as ingestion/dedup.py

# what one record adds to a request besides key, data and caller meta: the SSSN and submit time TLVs
SESSION_META_BYTES = (2 + 8) + (2 + 8)


class Outcome(Protocol):
    """Where a record's one outcome goes."""

    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def set_result(self, result: ProducerResult) -> None: ...
    def set_exception(self, error: BaseException) -> None: ...


class BatchSink(Protocol):
    """Where the outcomes of a batch of records go, by their index in it, with no object
    per record (`sms.producer`'s send_batch outcome): a record added with a sink and an
    index settles through these instead of an `Outcome`."""

    def settle_result(self, index: int, sn: int | None, ordinal: int, sssn: int, duplicate: bool) -> None: ...
    def settle_stored(self, records: Sequence["PendingRecord"], start: int, end: int, sns: Sequence[int],
                      ordinals: Sequence[int], duplicates: set[int]) -> None:
        """settle_result of records[start:end], all of this sink: record j stored under
        sns[j] (0: its SN is no longer known) in ordinals[j], a duplicate if j is in
        `duplicates`."""
    def settle_error(self, index: int, error: BaseException) -> None: ...
    def settled(self, index: int) -> bool: ...


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


@dataclass(slots=True, eq=False)
class PendingRecord:
    """One record from add() until its outcome is set."""

    ordinal: int                     # its session's partition
    sssn: int
    seq: int                         # its place among the SSSNs its session used (= sssn unless pinned)
    key: bytes                       # partition key, UTF-8
    data: bytes | None               # dropped once `entry` is encoded
    extra: bytes                     # wire meta TLVs: explicit hash key, dedup key, headers
    size: int                        # key + meta + data bytes, as a request counts them
    outcome: Any                     # an Outcome; or, with index >= 0, the BatchSink of its batch
    enqueued_s: float
    deadline_s: float                # after this it fails with Timeout (unless in flight)
    hash_key: int = 0                # routes it to a child once its partition is closed
    pinned: bool = False             # the caller chose its SSSN: it never moves to another session
    submit_ms: int | None = None     # wall clock of its first send; every resend carries it
    entry: bytes | None = None       # the encoded entry, the same bytes on every resend
    attempts: int = 0
    settled: bool = False
    index: int = -1                  # >= 0: its place in the BatchSink `outcome`

    def is_settled_for_caller(self) -> bool:
        """Whether the caller has this record's outcome (flush() waits for it)."""
        return bool(self.outcome.settled(self.index) if self.index >= 0 else self.outcome.done())


@dataclass(slots=True, eq=False)
class Session:
    """This producer's session with one partition."""

    ordinal: int
    next_sssn: int = 0
    next_seq: int = 0
    records: dict[int, PendingRecord] = field(default_factory=dict)   # un-settled, by SSSN
    order: deque[PendingRecord] = field(default_factory=deque)        # from the lowest un-settled, by SSSN
    queue: deque[PendingRecord] = field(default_factory=deque)        # to send, by SSSN
    queued_bytes: int = 0
    inflight: int = 0                # records in the one request in flight
    failures: int = 0                # consecutive rounds with a retriable answer
    not_before_s: float = 0.0        # backoff: send nothing before this time
    urgent: bool = False             # the owner reported missing SSSNs: no linger
    eager: bool = False              # a send_batch() record is queued: the caller's batch is whole, no linger

    @property
    def hwm(self) -> int:
        """Every SSSN up to this one is settled (or was never used)."""
        return self.order[0].sssn - 1 if self.order else self.next_sssn - 1

    @property
    def hwm_seq(self) -> int:
        return self.order[0].seq - 1 if self.order else self.next_seq - 1


@dataclass(slots=True, eq=False)
class PutRequest:
    """One PutRecords for the sender to deliver to `owner`, then answer with
    `Accumulator.on_answer` or `Accumulator.on_call_failed`."""

    owner: str
    message: sms_pb2.PutRecordsRequest
    records: list[PendingRecord]
    counts: dict[int, int] = field(default_factory=dict)   # records per session partition


class Room:
    """room()'s answers besides a session: why a record must wait."""

    PARTITION_FULL = "partition full"
    PRODUCER_FULL = "producer full"


class Accumulator:
    """The producer's state (see the module docstring)."""

    def __init__(self, stream: str, producer_id: bytes, *, linger_s: float, max_pending_per_partition: int,
                 max_pending_bytes: int, retry_backoff_s: float, retry_backoff_max_s: float,
                 delivery_timeout_s: float, clock_ms: Callable[[], int]) -> None:
        self.stream = stream
        self.producer_id = producer_id
        self.producer_epoch = 0          # the epoch this producer opened with (0: none; sms/producer.py)
        self.fenced: errors.ProducerFenced | None = None   # an owner refused our epoch: send nothing more
        self.linger_s = linger_s
        self.max_pending_per_partition = max_pending_per_partition
        self.max_pending_bytes = max_pending_bytes
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self.delivery_timeout_s = delivery_timeout_s
        self.clock_ms = clock_ms
        self.info: StreamInfo | None = None
        self.routes: Routes | None = None
        self.refresh_wanted = False
        self.refresh_not_before_s = 0.0
        self.refresh_failures = 0
        self.flushing = 0                # flush() calls waiting: no linger meanwhile
        self.sessions: dict[int, Session] = {}
        self.pending_bytes = 0
        self.inflight: dict[str, int] = {}          # owner address -> records of its one request in flight
        self._round_robin = 0
        self.totals = dict.fromkeys(("sent", "acked", "duplicates", "failed", "requests", "call_failures",
                                     "retries", "missing_resends", "map_refreshes", "expired", "moved"), 0)

    # --- the stream map -------------------------------------------------------------------
    def set_map(self, info: StreamInfo) -> None:
        """A (newer) stream map. A closed partition's records never sent move at once to
        the children's sessions, before newer records can be queued there (per-key order)."""
        first = self.info is None
        self.info = info
        self.routes = Routes(info)
        if first:
            return
        self.totals["map_refreshes"] += 1
        self.refresh_wanted = False
        self.refresh_failures = 0
        for session in list(self.sessions.values()):
            partition = self.partition(session.ordinal)
            if partition is not None and partition.state is not PartitionState.OPEN and session.queue:
                self._move_unsent(session)

    def want_refresh(self) -> None:
        self.refresh_wanted = True

    def refresh_failed(self, now_s: float) -> None:
        """The map could not be read: keep the old one, try again after a backoff
        (records time out if it never comes back)."""
        self.totals["map_refreshes"] += 1
        self.refresh_failures += 1
        self.refresh_not_before_s = now_s + self.backoff_s(self.refresh_failures)

    def partition(self, ordinal: int) -> PartitionInfo | None:
        try:
            return self._info().partition(ordinal)
        except LookupError:
            return None

    def _target(self, record: PendingRecord) -> PartitionInfo | None:
        """The open partition a record of a closed session goes to now (by its hash)."""
        try:
            return self._info().open_partition_for_hash(record.hash_key)
        except LookupError:
            return None

    def _info(self) -> StreamInfo:
        """The map, once set_map() ran (the producer loads it before it adds a record)."""
        return cast(StreamInfo, self.info)      # (None only before the first set_map())

    # --- adding records -------------------------------------------------------------------
    def room(self, hash_key: int, size: int, ordinal: int | None = None) -> Session | str:
        """The session a record of this hash (or of the pinned session `ordinal`) and size
        goes to if it can be added now; else a `Room` reason to wait for a settled record.
        Raises Unavailable (and wants a map refresh) if no open partition covers the hash."""
        if ordinal is None:
            try:
                ordinal = cast(Routes, self.routes).partition_for(hash_key).ordinal   # (set with the map)
            except LookupError:
                self.want_refresh()
                raise errors.Unavailable(f"no open partition of {self.stream!r} covers hash key {hash_key} "
                                         f"in map version {self._info().map_version}; retry") from None
        session = self.sessions.get(ordinal)
        if session is None:
            session = self.sessions[ordinal] = Session(ordinal)
        if len(session.records) >= self.max_pending_per_partition:
            return Room.PARTITION_FULL
        if self.pending_bytes and self.pending_bytes + size > self.max_pending_bytes:
            return Room.PRODUCER_FULL
        return session

    def add(self, session: Session, key: bytes, data: bytes, hash_key: int, extra: bytes,
            outcome: Outcome, now_s: float, sssn: int | None = None) -> None:
        """Queue a record in the session room() gave (nothing may have changed between the
        two calls). `sssn` pins its SSSN: at least the session's next one unless the session
        is idle (a replay starts the session again there). add_many() of one record."""
        pins = None if sssn is None else [(session.ordinal, sssn)]
        added = self.add_many([(key, data, hash_key, extra)], 0, lambda _i: outcome, now_s, pins)
        if not (added == 1 and session.records.get(session.next_sssn - 1) is not None):
            errors.invariant(False, f"p{session.ordinal}: a record room() made room for was not added")

    def add_many(self, prepared: Sequence[tuple[bytes, bytes, int, bytes]], start: int,
                 outcome_of: Callable[[int], Outcome] | BatchSink, now_s: float,
                 pins: Sequence[tuple[int, int]] | None = None) -> int:
        """add() for prepared[start:], (key, data, hash key, extra) each (and pins[i]:
        (session ordinal, SSSN) when pinned), as long as each has room without waiting;
        returns the index of the first record not added (len(prepared) if all were).
        `outcome_of(i)` is record i's Outcome; or `outcome_of` is a BatchSink, which
        takes record i's outcome as its index i. Raises as room() does, with the records
        before added."""
        sink = None if callable(outcome_of) else outcome_of
        window_s = self._info().dedup_window_s - limits.DEDUP_CLOCK_SKEW_MS_MAX / 1000 - PRODUCER_DEDUP_WINDOW_MARGIN_S
        deadline_s = now_s + max(0.0, min(self.delivery_timeout_s, window_s))
        sessions, per_partition_max = self.sessions, self.max_pending_per_partition
        pending_bytes, bytes_max = self.pending_bytes, self.max_pending_bytes
        routes = cast(Routes, self.routes)         # (set with the map, which add() needs)
        los, opened = routes.los, routes.partitions
        i, n = start, len(prepared)
        try:
            while i < n:
                key, data, hash_key, extra = prepared[i]
                size = len(key) + len(data) + SESSION_META_BYTES + len(extra)
                if pins is None:
                    j = bisect_right(los, hash_key) - 1
                    p = opened[j] if j >= 0 else None
                    if p is None or not p.hash_lo <= hash_key < p.hash_hi:
                        self.pending_bytes = pending_bytes
                        self.room(hash_key, size)          # raises Unavailable
                    # (p is None only where room() raised)
                    ordinal, sssn = cast(PartitionInfo, p).ordinal, None
                else:
                    ordinal, sssn = pins[i]
                session = sessions.get(ordinal)
                if session is None:
                    session = sessions[ordinal] = Session(ordinal)
                if len(session.records) >= per_partition_max or (
                        pending_bytes and pending_bytes + size > bytes_max):
                    break
                if sssn is not None and not 0 <= sssn <= limits.SSSN_MAX:
                    errors.invariant(False, f"p{ordinal}: pinned sssn {sssn} out of range")
                if sssn is not None and sssn < session.next_sssn:
                    errors.invariant(not session.records, f"p{ordinal}: pinned sssn {sssn} below "
                                                          f"{session.next_sssn} while records are pending")
                    session.order.clear()
                if sssn is None:
                    sssn = session.next_sssn
                if sssn > limits.SSSN_MAX:          # (no message built per record)
                    errors.invariant(False, f"p{ordinal}: SSSNs exhausted")
                if sink is None:
                    record = PendingRecord(ordinal, sssn, session.next_seq, key, data, extra, size,
                                           outcome_of(i), now_s, deadline_s, hash_key, pins is not None)  # type: ignore[operator]
                else:
                    record = PendingRecord(ordinal, sssn, session.next_seq, key, data, extra, size, sink, now_s,
                                           deadline_s, hash_key, pins is not None, index=i)
                    session.eager = True
                session.next_sssn = sssn + 1
                session.next_seq += 1
                session.records[sssn] = record
                session.order.append(record)
                session.queue.append(record)
                session.queued_bytes += size
                pending_bytes += size
                i += 1
        finally:
            self.pending_bytes = pending_bytes
            self.totals["sent"] += i - start
        return i

    @staticmethod
    def _append(session: Session, record: PendingRecord) -> None:
        session.next_sssn = record.sssn + 1
        session.next_seq = record.seq + 1
        session.records[record.sssn] = record
        session.order.append(record)
        session.queue.append(record)
        session.queued_bytes += record.size

    # --- outcomes -------------------------------------------------------------------------
    def _settle(self, session: Session, record: PendingRecord, result: ProducerResult | None = None,
                error: BaseException | None = None) -> None:
        """The record's one outcome: it is set, and the SSSN counts for the HWM."""
        if error is None:
            r = cast(ProducerResult, result)          # (given whenever `error` is not)
            self._settle_ok(session, record, r.sn, r.partition_ordinal, r.duplicate)
            return
        if session.records.pop(record.sssn, None) is not record:
            errors.invariant(False, f"p{session.ordinal}: sssn {record.sssn} settled twice or never sent")
        self.pending_bytes -= record.size
        self._count_settled(session, record)
        self.totals["failed"] += 1
        outcome = record.outcome
        if record.index >= 0:
            outcome.settle_error(record.index, error)
        elif not outcome.cancelled():
            outcome.set_exception(error)

    def _settle_ok(self, session: Session, record: PendingRecord, sn: int | None, ordinal: int,
                   duplicate: bool) -> None:
        """_settle of a stored record: its SN (None: a duplicate whose SN the owner no
        longer knows), the partition it is in, and whether this answer was a duplicate.
        A record of a batch gets its outcome as columns of the batch (no object here)."""
        if session.records.pop(record.sssn, None) is not record:
            errors.invariant(False, f"p{session.ordinal}: sssn {record.sssn} settled twice or never sent")
        self.pending_bytes -= record.size
        self._count_settled(session, record)
        self.totals["acked"] += 1
        self.totals["duplicates"] += duplicate
        outcome = record.outcome
        if record.index >= 0:
            outcome.settle_result(record.index, sn, ordinal, record.sssn, duplicate)
        elif not outcome.cancelled():
            outcome.set_result(ProducerResult(sn, ordinal, record.sssn, duplicate))

    def _settle_stored(self, items: list[PendingRecord], counts: dict[int, int], sns: list[int],
                       ordinals: list[int], duplicates: set[int]) -> None:
        """_settle_ok of every record of an answer with no error, session by session (the
        request's items are `counts` records of each session in turn): item j stored under
        sns[j] (0: a duplicate whose SN the owner no longer knows) in ordinals[j]. The
        records of one send_batch() settle into its columns in one call."""
        sessions = self.sessions
        pending_bytes = self.pending_bytes
        pos = 0
        try:
            for ordinal, n in counts.items():
                session, end = sessions[ordinal], pos + n
                held = session.records
                for j in range(pos, end):
                    record = items[j]
                    if held.pop(record.sssn, None) is not record:
                        errors.invariant(False, f"p{ordinal}: sssn {record.sssn} settled twice or never sent")
                    pending_bytes -= record.size
                    record.settled = True
                order = session.order
                while order and order[0].settled:
                    order.popleft()
                j = pos
                while j < end:
                    record = items[j]
                    outcome = record.outcome
                    if record.index >= 0:
                        k = j + 1
                        while k < end and items[k].outcome is outcome:
                            k += 1
                        outcome.settle_stored(items, j, k, sns, ordinals, duplicates)
                        j = k
                        continue
                    if not outcome.cancelled():
                        outcome.set_result(ProducerResult(sns[j] or None, ordinals[j], record.sssn, j in duplicates))
                    j += 1
                pos = end
        finally:
            self.pending_bytes = pending_bytes
        if pos != len(items):
            errors.invariant(False, f"{len(items)} records answered, {pos} counted in their sessions")
        self.totals["acked"] += len(items)
        self.totals["duplicates"] += len(duplicates)

    @staticmethod
    def _count_settled(session: Session, record: PendingRecord) -> None:
        record.settled = True
        order = session.order
        while order and order[0].settled:
            order.popleft()

    def _fail_queue(self, session: Session, make_error: Callable[[], BaseException]) -> None:
        while session.queue:
            record = session.queue.popleft()
            session.queued_bytes -= record.size
            self._settle(session, record, error=make_error())

    def fail_all(self, make_error: Callable[[], BaseException]) -> None:
        """Fail every un-settled record (the producer stopped or broke), in SSSN order.
        Only once no request is in flight any more: its answer would find nothing."""
        for session in self.sessions.values():
            session.queue.clear()
            session.queued_bytes = 0
            session.inflight = 0
            for record in sorted(session.records.values(), key=lambda r: r.sssn):
                self._settle(session, record, error=make_error())

    def unsettled(self) -> Iterator[PendingRecord]:
        for session in self.sessions.values():
            yield from session.records.values()

    # --- requests -------------------------------------------------------------------------
    def backoff_s(self, failures: int) -> float:
        factor: int = 2 ** min(max(failures - 1, 0), 16)
        return min(self.retry_backoff_s * factor, self.retry_backoff_max_s)

    def poll(self, now_s: float) -> tuple[list[PutRequest], float]:
        """Expire records, fail those of partitions gone from the map, and build one request
        for each idle owner with a record due. Returns the requests and the time at which
        to poll again (records lingering, backoffs, deadlines) unless an answer, a new
        record or a new map comes sooner."""
        wake_s = float("inf")
        fenced = self.fenced
        if fenced is not None:
            # a newer instance of this producer opened: nothing queued is sent any more;
            # records in flight settle with their answers
            for session in self.sessions.values():
                self._fail_queue(session, lambda: errors.ProducerFenced(fenced.message))
            return [], wake_s
        ready: dict[str, list[Session]] = {}
        due: set[str] = set()
        owner_load: dict[str, tuple[int, int]] = {}
        for session in list(self.sessions.values()):     # (_move_unsent may add sessions)
            if not session.queue:
                continue
            while session.queue and session.queue[0].deadline_s <= now_s:   # deadlines rise with SSSNs
                record = session.queue.popleft()
                session.queued_bytes -= record.size
                self.totals["expired"] += 1
                self._settle(session, record, error=errors.Timeout(
                    f"p{session.ordinal} sssn {record.sssn}: not delivered within "
                    f"{record.deadline_s - record.enqueued_s:.1f} s ({record.attempts} attempts)"))
            if not session.queue:
                continue
            partition = self.partition(session.ordinal)
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
                    wake_s = min(wake_s, self._no_route(session, now_s))
                    continue
            if session.queue[0].sssn != session.hwm + 1:
                errors.invariant(False, f"p{session.ordinal}: idle session queue starts at sssn "
                                        f"{session.queue[0].sssn}, hwm {session.hwm}")
            wake_s = min(wake_s, session.queue[0].deadline_s)
            if session.not_before_s > now_s:
                wake_s = min(wake_s, session.not_before_s)
                continue
            owner = partition.ingestion_owner.address if partition.ingestion_owner else ""
            if not owner:
                wake_s = min(wake_s, self._no_route(session, now_s))
                continue
            ready.setdefault(owner, []).append(session)
            count, size = owner_load.get(owner, (0, 0))
            count, size = count + len(session.queue), size + session.queued_bytes
            owner_load[owner] = (count, size)
            linger_end_s = session.queue[0].enqueued_s + self.linger_s
            if (session.urgent or session.eager or self.flushing or session.queue[0].attempts or linger_end_s <= now_s
                    or count >= limits.PUT_RECORDS_COUNT_MAX or size >= limits.PUT_RECORDS_BYTES_MAX):
                due.add(owner)
            elif owner not in self.inflight:
                wake_s = min(wake_s, linger_end_s)
        requests = []
        for owner in due:
            if owner not in self.inflight:
                requests.append(self._take_request(ready[owner], owner))
        if self.refresh_wanted:
            wake_s = min(wake_s, self.refresh_not_before_s)
        return requests, wake_s

    def _no_route(self, session: Session, now_s: float) -> float:
        """No owner (or no open partition) for the session's next record: refresh the map
        and back off."""
        self.want_refresh()
        session.failures += 1
        session.not_before_s = now_s + self.backoff_s(session.failures)
        return session.not_before_s

    def _ancestor_busy(self, ordinal: int) -> bool:
        """Some session of an ancestor partition still has records to settle: they were sent
        first, and may route here, so this session waits (per-key order across a split)."""
        seen: set[int] = set()
        todo = list(p.parents) if (p := self.partition(ordinal)) is not None else []
        while todo:
            o = todo.pop()
            if o in seen:
                continue
            seen.add(o)
            session = self.sessions.get(o)
            if session is not None and session.records:
                return True
            if (p := self.partition(o)) is not None:
                todo.extend(p.parents)
        return False

    def _move_unsent(self, session: Session) -> int:
        """Move a closed partition's never-sent records to the sessions of the open
        partitions covering them, under new SSSNs (no node ever saw the old ones), with
        their outcomes and deadlines; in the old session their SSSNs count as settled.
        Records with pinned SSSNs stay."""
        keep: deque[PendingRecord] = deque()
        for record in session.queue:
            target = self._target(record) if not record.attempts and not record.pinned else None
            if target is None:
                keep.append(record)
                continue
            session.queued_bytes -= record.size
            errors.invariant(session.records.pop(record.sssn, None) is record,
                             f"p{session.ordinal}: moved sssn {record.sssn} was not pending")
            self._count_settled(session, record)
            child = self.sessions.get(target.ordinal)
            if child is None:
                child = self.sessions[target.ordinal] = Session(target.ordinal)
            errors.invariant(child.next_sssn <= limits.SSSN_MAX, f"p{child.ordinal}: SSSNs exhausted")
            self._append(child, dataclasses.replace(record, ordinal=child.ordinal, sssn=child.next_sssn,
                                                    seq=child.next_seq, settled=False))
            self.totals["moved"] += 1
        moved = len(session.queue) - len(keep)
        session.queue = keep
        return moved

    def _take_request(self, sessions: list[Session], owner: str) -> PutRequest:
        """Records for one request, each session's in SSSN order from the front of its
        queue, within the request bounds and the owner's per-session window."""
        items: list[PendingRecord] = []
        hwms: dict[int, int] = {}
        counts: dict[int, int] = {}
        ordinals: list[int] = []
        fresh: list[PendingRecord] = []
        size = 0
        count_max, bytes_max = limits.PUT_RECORDS_COUNT_MAX, limits.PUT_RECORDS_BYTES_MAX
        start = self._round_robin % len(sessions)
        self._round_robin += 1
        for session in sessions[start:] + sessions[:start]:
            taken = 0
            partition = self.partition(session.ordinal)
            closed = partition is not None and partition.state is not PartitionState.OPEN
            if closed:
                before = len(items)
                taken, size = self._take_closed(session, owner, items, size)
                fresh.extend(r for r in items[before:] if r.entry is None)
            else:
                queue = session.queue
                window_top = session.hwm_seq + PRODUCER_SESSION_WINDOW_MAX
                room = count_max - len(items)
                taken_bytes = size
                while queue and taken < room:
                    record = queue[0]
                    if record.seq > window_top or size + record.size > bytes_max:
                        break
                    queue.popleft()
                    size += record.size
                    items.append(record)
                    if record.entry is None:
                        fresh.append(record)
                    taken += 1
                session.queued_bytes -= size - taken_bytes
            if taken:
                session.inflight = taken
                session.urgent = False
                session.eager = session.eager and bool(session.queue)
                hwms[session.ordinal] = session.hwm
                counts[session.ordinal] = taken
                ordinals.extend([session.ordinal] * taken)
            if len(items) >= count_max or (session.queue and taken == 0 and items):
                break                              # full (a session that could not add one: bytes)
        errors.invariant(items, "an owner was due with nothing to send")
        if fresh:
            self._encode(fresh)
        for record in items:
            record.attempts += 1
        entries = [cast(bytes, r.entry) for r in items]    # (_encode() gave every record its entry)
        self.inflight[owner] = len(items)
        self.totals["requests"] += 1
        message = sms_pb2.PutRecordsRequest(stream=self.stream, count=len(items), entries=b"".join(entries),
                                            producer_id=self.producer_id, producer_epoch=self.producer_epoch,
                                            hwm=hwms, session_ordinals=wire.encode_session_ordinals(ordinals))
        return PutRequest(owner, message, items, counts)

    def _encode(self, records: list[PendingRecord]) -> None:
        """First send: stamp the submit time; each entry is reused unchanged by every resend."""
        submit_ms = self.clock_ms()
        for record, entry in zip(records, wire.encode_session_entries(records, submit_ms)):
            if len(entry) - wire.ENTRY.size != record.size:
                errors.invariant(False, f"entry of {len(entry) - wire.ENTRY.size} bytes; counted {record.size}")
            record.submit_ms = submit_ms
            record.entry = entry
            record.data = None

    def _take_closed(self, session: Session, owner: str, items: list[PendingRecord], size: int) -> tuple[int, int]:
        """A closed partition's records (sent before, or pinned) for the children on
        `owner`, in SSSN order (the request names their session partition); the others stay
        queued for the next request (their children are on other owners). Returns (taken, size)."""
        rest: deque[PendingRecord] = deque()
        taken = 0
        full = False                    # once one record for `owner` does not fit, none after it goes
        window_top = session.hwm_seq + PRODUCER_SESSION_WINDOW_MAX
        for record in session.queue:
            target = self._target(record)
            address = target.ingestion_owner.address if target and target.ingestion_owner else ""
            if address == owner and not full and (
                    len(items) >= limits.PUT_RECORDS_COUNT_MAX or record.seq > window_top
                    or size + record.size > limits.PUT_RECORDS_BYTES_MAX):
                full = True
            if address != owner or full:
                rest.append(record)
                continue
            session.queued_bytes -= record.size
            size += record.size
            items.append(record)
            taken += 1
        session.queue = rest
        return taken, size

    # --- answers --------------------------------------------------------------------------
    def on_call_failed(self, request: PutRequest, error: errors.SmsError, now_s: float) -> None:
        """The whole call failed: resend every record (same SSSNs) or fail every one."""
        del self.inflight[request.owner]
        self.totals["call_failures"] += 1
        self._call_failed(request.records, error, now_s)

    def _call_failed(self, items: list[PendingRecord], error: errors.SmsError, now_s: float) -> None:
        if error.retriable:
            answered: dict[int, tuple[int, list[PendingRecord]]] = {}
            for record in items:
                sent, again = answered.get(record.ordinal, (0, []))
                again.append(record)
                answered[record.ordinal] = (sent + 1, again)
            self._requeue(answered, refresh=error.refresh_map, now_s=now_s)
            return
        if isinstance(error, errors.ProducerFenced):
            self.fenced = self.fenced or error
        for record in items:
            session = self.sessions[record.ordinal]
            session.inflight -= 1
            self._settle(session, record, error=type(error)(error.message))

    def on_answer(self, request: PutRequest, response: sms_pb2.PutRecordsResponse, now_s: float) -> None:
        """The owner's answer: settle, resend or fail each record of the request."""
        del self.inflight[request.owner]
        items = request.records
        shape_error = _check_response(response, len(items))
        if shape_error:
            self._call_failed(items, errors.InternalError(shape_error), now_s)
            return
        failed = {e.index: e for e in response.errors}
        duplicates = set(response.duplicates)
        answered: dict[int, list[Any]] = {}   # ordinal -> [records in flight, [records to resend]]
        refresh = False
        throttled: set[int] = set()                 # partitions with a record answered Throttled
        sessions = self.sessions
        sns, ordinals = wire.decode_put_results(response.sequence_numbers, response.ordinals, len(items))
        if not failed:
            # the usual answer: every record stored (some maybe as duplicates)
            for ordinal, n in request.counts.items():
                answered[ordinal] = [n, []]
            self._settle_stored(items, request.counts, sns, ordinals, duplicates)
            items = []
        settle, settle_ok = self._settle, self._settle_ok
        for j, record in enumerate(items):
            ordinal = record.ordinal
            counts = answered.get(ordinal)
            if counts is None:
                counts = answered[ordinal] = [0, []]
            counts[0] += 1
            if failed and j in failed:
                error = errors.from_name(failed[j].name, failed[j].message)
                if error.retriable:
                    counts[1].append(record)
                    refresh |= error.refresh_map
                    if isinstance(error, errors.Throttled):
                        throttled.add(ordinal)
                    continue
                if isinstance(error, errors.ProducerFenced):
                    self.fenced = self.fenced or error
                settle(sessions[ordinal], record, error=error)
                continue
            settle_ok(sessions[ordinal], record, sns[j] or None, ordinals[j], j in duplicates)
        self._requeue(answered, refresh=refresh, now_s=now_s)
        for m in response.missing:
            # SSSNs below one the owner took that it does not hold: resent at once, ahead of
            # newer records, skipping the backoff; unless the owner throttled this session,
            # else a full table (keys, sessions) would be hammered once per round trip.
            session = sessions.get(m.ordinal)
            if session is None or session.inflight or m.ordinal in throttled:
                continue                           # (in flight: a partition this request did not carry)
            unsettled = sum(1 for sssn in m.sssns if sssn in session.records)
            if unsettled:
                self.totals["missing_resends"] += unsettled
                session.urgent = True
                session.not_before_s = 0.0

    def _requeue(self, by_ordinal: Mapping[int, Sequence[Any]], *, refresh: bool, now_s: float) -> None:
        """End a request's flight for each session; put retriable records back at the
        front of their queues (they are the lowest un-settled SSSNs), with a backoff."""
        for ordinal, (sent, again) in by_ordinal.items():
            session = self.sessions[ordinal]
            if session.inflight != sent:
                errors.invariant(False, f"p{ordinal}: {sent} records answered, {session.inflight} in flight")
            session.inflight = 0
            if again:
                if session.queue and session.queue[0].sssn < again[-1].sssn:
                    # (a closed partition's records left queued for other owners)
                    session.queue = deque(sorted([*again, *session.queue], key=lambda r: r.sssn))
                else:
                    session.queue.extendleft(reversed(again))
                session.queued_bytes += sum(r.size for r in again)
                session.failures += 1
                session.not_before_s = now_s + self.backoff_s(session.failures)
                self.totals["retries"] += len(again)
            else:
                session.failures = 0
            if session.queue and session.queue[0].sssn != session.hwm + 1:
                errors.invariant(False, f"p{ordinal}: queue starts at sssn {session.queue[0].sssn}, "
                                        f"hwm {session.hwm}")
        if refresh:
            self.want_refresh()

    # --- what it holds --------------------------------------------------------------------
    def statistics(self) -> dict[str, Any]:
        return {
            "pending": {o: len(s.records) for o, s in self.sessions.items()},
            "queued": {o: len(s.queue) for o, s in self.sessions.items()},
            "hwm": {o: s.hwm for o, s in self.sessions.items()},
            "pending_bytes": self.pending_bytes,
            "inflight_requests": len(self.inflight),
            "inflight_records": sum(self.inflight.values()),
            **{f"{k}_total": v for k, v in self.totals.items()},
        }


def _check_response(response: sms_pb2.PutRecordsResponse, n: int) -> str:
    """Why an answer to n records cannot be read; empty when it can."""
    if len(response.sequence_numbers) != wire.SN_BYTES * n or len(response.ordinals) != wire.ORDINAL.size * n:
        return (f"PutRecords answer with {len(response.sequence_numbers)} bytes of SNs and "
                f"{len(response.ordinals)} of ordinals for {n} records")
    bad = [e.index for e in response.errors if e.index >= n] + [i for i in response.duplicates if i >= n]
    if bad:
        return f"PutRecords answer names record {bad[0]} of {n}"
    return ""
