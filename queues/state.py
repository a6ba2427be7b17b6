"""The delivery state of one partition of a queue (docs/queues.md): sans-IO, no clock of its
own, no storage. The queue's owner (one node per partition, as ingestion is) feeds it the
partition's committed records as it reads them, asks it for records to deliver, and writes
each change it returns to the queue's state log; a new owner rebuilds the state by
replaying that log (`replay`).

What it holds, per partition, in memory in proportion to what is in flight and not to the
stream:
- `cursor`: every record of the partition below it has been fetched into the state; a
  fetched record that is not in `entries` is done (acknowledged, or a dead letter
  acknowledged, or trimmed by retention). This is the "acknowledged frontier plus sparse
  acks above it" of the issue, kept the other way round: the cursor plus the sparse
  records not yet done, which is what a queue needs to deliver.
- `entries`: SN -> `Entry` of each fetched record not done: available, in flight (a
  delivery's nonce and deadline), a dead letter (available or in flight to a dead-letter
  receiver). At most `window_max` of them are live (available or in flight) and
  `dead_max` dead: `room()` says how many more records a fetch may add.

Receive counts and first-receive times are per record and survive redelivery; a record
whose count reached `max_receive_count` becomes a dead letter when its visibility timeout
passes unacknowledged (SQS's rule and Kinesis's). `max_receive_count` 0: no dead letters.

Every operation that changes the state returns the `Change`s it made, in order. Applying
the same changes to a state built from the same snapshot (`apply`) gives the same state:
the owner persists them, a new owner replays them. Expiries are changes too (the clock is
the owner's: a replay does not consult one), so a replay gives the very same state.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from sortedcontainers import SortedDict, SortedList

from sms import errors, limits, seqno
from sms.queue import Handle, make_handle, parse_handle

__all__ = ["Kind", "Entry", "Delivery", "Op", "Change", "Handle", "make_handle", "parse_handle", "HandleError",
           "PartitionQueue", "replay", "arrival_ms"]


class Kind(enum.IntEnum):
    AVAILABLE = 0          # visible to a receive
    IN_FLIGHT = 1          # received; invisible until its deadline
    DEAD = 2               # a dead letter, visible to a dead-letter receive
    DEAD_IN_FLIGHT = 3     # a dead letter received; invisible until its deadline


@dataclass(slots=True)
class Entry:
    sn: int
    kind: Kind = Kind.AVAILABLE
    receive_count: int = 0          # receives of the main queue since it was (re)stored
    first_receive_ms: int = 0       # 0: never received
    nonce: int = 0                  # the current delivery's (0: none); a handle must carry it
    deadline_ms: int = 0            # in flight until then


class Delivery(NamedTuple):
    """One record handed to a receiver: what a receive returns for it (the data comes from
    the stream: the state holds none)."""
    sn: int
    handle: str
    receive_count: int
    first_receive_ms: int


# --- changes: what the owner persists, in order ---------------------------------------------

class Op(enum.IntEnum):
    FETCH = 1         # sns: records fetched (in SN order); value: the new cursor
    RECEIVE = 2       # sn, nonce, deadline, count, first receive ms (dead: a dead-letter receive)
    VISIBILITY = 3    # sn, deadline (0: visible now)
    ACK = 4           # sn: done
    RESTORE = 5       # sn: a dead letter back in the main queue, its count 0
    TRIM = 6          # value: records below it are gone (retention)
    DEAD = 7          # sn: became a dead letter (recorded so a replay need not know the config)
    ENTRY = 8         # one entry whole (a snapshot's): sn, kind, nonce, deadline, count, first receive
    EXPIRE = 9        # sn, nonce: its deadline passed; visible again


class Change(NamedTuple):
    op: Op
    sn: int = 0
    value: int = 0            # FETCH, TRIM: the cursor or bound; RECEIVE: the nonce
    deadline_ms: int = 0
    receives: int = 0
    first_ms: int = 0
    dead: bool = False
    sns: tuple[int, ...] = ()
    kind: Kind = Kind.AVAILABLE


# --- receipt handles: their layout is the client's (sms/queue.py) ---------------------------
class HandleError(enum.Enum):
    """Why one entry of an ack, visibility change or restore failed (its ErrorCode)."""
    EXPIRED = "ReceiptHandleExpired"      # the record was delivered again, acked or restored since
    NOT_DEAD = "InvalidDeadLetterHandle"  # a main-queue handle given to a dead-letter call, or back


# --- the state ------------------------------------------------------------------------------

class PartitionQueue:
    """The delivery state of one partition of one queue. `nonces`: a source of delivery
    nonces (nonzero 64-bit ints; the owner passes `secrets.randbits`-backed ones)."""

    def __init__(self, queue_uid: int, ordinal: int, *, cursor: int = 0,
                 window_max: int = limits.QUEUE_WINDOW_RECORDS_MAX,
                 dead_max: int = limits.QUEUE_DEAD_LETTERS_MAX):
        self.queue_uid = queue_uid
        self.ordinal = ordinal
        self.cursor = cursor
        self.window_max = window_max
        self.dead_max = dead_max
        self.entries: SortedDict = SortedDict()        # sn -> Entry (not done)
        self.available: SortedList = SortedList()      # sns of AVAILABLE entries
        self.dead_available: SortedList = SortedList()  # sns of DEAD entries
        self._deadlines: list[tuple[int, int, int]] = []    # heap of (deadline, sn, nonce) in flight
        self.live = 0                                   # AVAILABLE + IN_FLIGHT
        self.dead = 0                                   # DEAD + DEAD_IN_FLIGHT
        self.acked = 0                                  # counters since this state was built
        self.delivered = 0

    # --- what the owner asks --------------------------------------------------------------
    def room(self) -> int:
        """How many more records a fetch may add (0: the window is full)."""
        return max(0, self.window_max - self.live)

    def in_flight(self) -> int:
        return self.live - len(self.available)

    def next_deadline(self) -> int | None:
        """The earliest deadline in flight (ms), for the owner's timer; None: none."""
        while self._deadlines:
            deadline, sn, nonce = self._deadlines[0]
            e = self.entries.get(sn)
            if e is not None and e.nonce == nonce and e.kind in (Kind.IN_FLIGHT, Kind.DEAD_IN_FLIGHT):
                return deadline
            heapq.heappop(self._deadlines)
        return None

    # --- operations -----------------------------------------------------------------------
    def fetch(self, sns: Iterable[int], cursor: int) -> list[Change]:
        """Records read from the partition (committed, in SN order, all at or above the
        cursor and below `cursor`, the new one), to be delivered."""
        sns = tuple(sns)
        errors.invariant(cursor >= self.cursor, f"queue cursor moves back: {cursor} < {self.cursor}")
        errors.invariant(len(sns) <= self.room(), f"a fetch of {len(sns)} records into room for {self.room()}")
        change = Change(Op.FETCH, value=cursor, sns=sns)
        self._apply(change)
        return [change]

    def receive(self, limit: int, now_ms: int, visibility_ms: int, nonces: Iterable[int], *,
                max_receive_count: int = 0, dead: bool = False) -> tuple[list[Delivery], list[Change]]:
        """Up to `limit` visible records, lowest SN first, each in flight for `visibility_ms`
        with a new receipt handle. `dead`: from the dead letters instead."""
        changes = self.expire(now_ms, max_receive_count)
        pool = self.dead_available if dead else self.available
        out: list[Delivery] = []
        nonce_iter = iter(nonces)
        for sn in list(pool.islice(0, limit)):
            e = self.entries[sn]
            nonce = next(nonce_iter)
            errors.invariant(nonce != 0, "a delivery nonce of 0")
            change = Change(Op.RECEIVE, sn=sn, value=nonce, deadline_ms=now_ms + visibility_ms,
                            receives=e.receive_count + (0 if dead else 1),
                            first_ms=e.first_receive_ms if e.receive_count else now_ms, dead=dead)
            self._apply(change)
            changes.append(change)
            out.append(Delivery(sn, make_handle(self.queue_uid, self.ordinal, sn, nonce, dead),
                                change.receives, change.first_ms))
        self.delivered += len(out)
        return out, changes

    def ack(self, handle: Handle, now_ms: int, max_receive_count: int = 0) -> tuple[HandleError | None, list[Change]]:
        """The record is done. A handle of the record's latest delivery acks it even after
        its deadline passed, until another receive takes it (a worker that finished late
        is not made to do it again). An ack of a record that is done already succeeds and
        changes nothing, as SQS's DeleteMessage: a worker that retries an ack whose answer
        it lost learns that the record is done."""
        changes = self.expire(now_ms, max_receive_count)
        if handle.sn not in self.entries and handle.sn < self.cursor:
            return None, changes
        error = self._check(handle, late=True)
        if error is None:
            change = Change(Op.ACK, sn=handle.sn)
            self._apply(change)
            changes.append(change)
            self.acked += 1
        return error, changes

    def change_visibility(self, handle: Handle, now_ms: int, visibility_ms: int,
                          max_receive_count: int = 0) -> tuple[HandleError | None, list[Change]]:
        """A new deadline for a record in flight (0: visible at once, its count kept)."""
        changes = self.expire(now_ms, max_receive_count)
        error = self._check(handle)
        if error is None:
            change = Change(Op.VISIBILITY, sn=handle.sn, deadline_ms=now_ms + visibility_ms if visibility_ms else 0)
            self._apply(change)
            changes.append(change)
            if not visibility_ms:
                changes += self.expire(now_ms, max_receive_count)
        return error, changes

    def restore(self, handle: Handle, now_ms: int, max_receive_count: int = 0) -> tuple[HandleError | None, list[Change]]:
        """A dead letter (received from the dead letters) back in the main queue, count 0."""
        changes = self.expire(now_ms, max_receive_count)
        if not handle.dead:
            return HandleError.NOT_DEAD, changes
        error = self._check(handle, late=True)
        if error is None:
            change = Change(Op.RESTORE, sn=handle.sn)
            self._apply(change)
            changes.append(change)
        return error, changes

    def trim(self, before_sn: int) -> list[Change]:
        """Retention removed the partition's records below `before_sn`: they are not
        delivered any more, whatever their state."""
        if before_sn <= self.cursor and (not self.entries or self.entries.keys()[0] >= before_sn):
            return []
        change = Change(Op.TRIM, value=before_sn)
        self._apply(change)
        return [change]

    def expire(self, now_ms: int, max_receive_count: int = 0) -> list[Change]:
        """Records whose deadline passed become visible again; a main-queue record received
        `max_receive_count` times becomes a dead letter instead (a DEAD change), when dead
        letters are on (> 0) and there is room for one (else it goes round again)."""
        changes: list[Change] = []
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            deadline, sn, nonce = heapq.heappop(self._deadlines)
            e = self.entries.get(sn)
            if e is None or e.nonce != nonce or e.deadline_ms != deadline \
                    or e.kind not in (Kind.IN_FLIGHT, Kind.DEAD_IN_FLIGHT):
                continue                      # acked, restored or given a new deadline since
            if e.kind is Kind.IN_FLIGHT and max_receive_count and e.receive_count >= max_receive_count \
                    and self.dead < self.dead_max:
                change = Change(Op.DEAD, sn=sn)
            else:
                change = Change(Op.EXPIRE, sn=sn, value=nonce)
            self._apply(change)
            changes.append(change)
        return changes

    # --- state changes: the one place each happens, for live operations and replay ---------
    def apply(self, changes: Iterable[Change]) -> None:
        """Replay changes another instance made (the owner's log)."""
        for change in changes:
            self._apply(change)

    def _apply(self, c: Change) -> None:
        op = c.op
        if op is Op.FETCH:
            for sn in c.sns:
                if sn < self.cursor or sn in self.entries:
                    continue                  # (a replay of a fetch already applied)
                self.entries[sn] = Entry(sn)
                self.available.add(sn)
                self.live += 1
            self.cursor = max(self.cursor, c.value)
        elif op is Op.RECEIVE:
            e = self.entries.get(c.sn)
            if e is None:
                return
            self._leave(e)
            e.kind = Kind.DEAD_IN_FLIGHT if c.dead else Kind.IN_FLIGHT
            e.nonce, e.deadline_ms, e.receive_count, e.first_receive_ms = c.value, c.deadline_ms, c.receives, c.first_ms
            self._enter(e)
            heapq.heappush(self._deadlines, (e.deadline_ms, e.sn, e.nonce))
        elif op is Op.VISIBILITY:
            e = self.entries.get(c.sn)
            if e is None or e.kind not in (Kind.IN_FLIGHT, Kind.DEAD_IN_FLIGHT):
                return
            e.deadline_ms = c.deadline_ms
            heapq.heappush(self._deadlines, (e.deadline_ms, e.sn, e.nonce))
        elif op is Op.ACK:
            e = self.entries.pop(c.sn, None)
            if e is not None:
                self._leave(e)
                self._count(e, -1)
        elif op is Op.RESTORE:
            e = self.entries.get(c.sn)
            if e is None or e.kind not in (Kind.DEAD, Kind.DEAD_IN_FLIGHT):
                return
            self._leave(e)
            self._count(e, -1)
            e.kind, e.receive_count, e.first_receive_ms, e.nonce, e.deadline_ms = Kind.AVAILABLE, 0, 0, 0, 0
            self._count(e, +1)
            self._enter(e)
        elif op is Op.DEAD:
            e = self.entries.get(c.sn)
            if e is None or e.kind is not Kind.IN_FLIGHT:
                return
            self._leave(e)
            self._count(e, -1)
            e.kind, e.deadline_ms = Kind.DEAD, 0
            self._count(e, +1)
            self._enter(e)
        elif op is Op.ENTRY:
            e = self.entries.get(c.sn)
            if e is None:
                return
            self._leave(e)
            self._count(e, -1)
            e.kind, e.nonce, e.deadline_ms, e.receive_count, e.first_receive_ms = \
                c.kind, c.value, c.deadline_ms, c.receives, c.first_ms
            self._count(e, +1)
            self._enter(e)
            if e.kind in (Kind.IN_FLIGHT, Kind.DEAD_IN_FLIGHT):
                heapq.heappush(self._deadlines, (e.deadline_ms, e.sn, e.nonce))
        elif op is Op.EXPIRE:
            e = self.entries.get(c.sn)
            if e is None or e.nonce != c.value or e.kind not in (Kind.IN_FLIGHT, Kind.DEAD_IN_FLIGHT):
                return
            self._leave(e)
            e.kind = Kind.DEAD if e.kind is Kind.DEAD_IN_FLIGHT else Kind.AVAILABLE
            e.deadline_ms = 0             # (the nonce stays: its handle may still ack: `ack`)
            self._enter(e)
        elif op is Op.TRIM:
            while self.entries and self.entries.keys()[0] < c.value:
                _sn, e = self.entries.popitem(0)
                self._leave(e)
                self._count(e, -1)
            self.cursor = max(self.cursor, c.value)
        else:
            errors.invariant(False, f"a queue state change no state knows: {c!r}")

    def _leave(self, e: Entry) -> None:
        if e.kind is Kind.AVAILABLE:
            self.available.discard(e.sn)
        elif e.kind is Kind.DEAD:
            self.dead_available.discard(e.sn)

    def _enter(self, e: Entry) -> None:
        if e.kind is Kind.AVAILABLE:
            self.available.add(e.sn)
        elif e.kind is Kind.DEAD:
            self.dead_available.add(e.sn)

    def _count(self, e: Entry, delta: int) -> None:
        if e.kind in (Kind.AVAILABLE, Kind.IN_FLIGHT):
            self.live += delta
        else:
            self.dead += delta

    def _check(self, handle: Handle, late: bool = False) -> HandleError | None:
        """Is `handle` the record's latest delivery, of the kind it says (main queue or dead
        letters)? `late`: its deadline may have passed (else it must be in flight)."""
        errors.invariant(handle.queue_uid == self.queue_uid and handle.ordinal == self.ordinal,
                         "a handle of another queue or partition reached this state")
        e = self.entries.get(handle.sn)
        if e is None or e.nonce != handle.nonce:
            return HandleError.EXPIRED
        if handle.dead != (e.kind in (Kind.DEAD, Kind.DEAD_IN_FLIGHT)) and (handle.dead or e.kind is not Kind.DEAD):
            # (a main-queue handle may still ack a record that became a dead letter since)
            return HandleError.NOT_DEAD
        if not late and e.kind not in (Kind.IN_FLIGHT, Kind.DEAD_IN_FLIGHT):
            return HandleError.EXPIRED
        return None

    # --- snapshots ------------------------------------------------------------------------
    def snapshot(self) -> list[Change]:
        """The state as changes that rebuild it in an empty state: a FETCH of every entry
        and the cursor, then an ENTRY for each one that is not simply available."""
        out = [Change(Op.FETCH, value=self.cursor, sns=tuple(self.entries.keys()))]
        for e in self.entries.values():
            if e.kind is not Kind.AVAILABLE or e.receive_count or e.nonce:
                out.append(Change(Op.ENTRY, sn=e.sn, kind=e.kind, value=e.nonce, deadline_ms=e.deadline_ms,
                                  receives=e.receive_count, first_ms=e.first_receive_ms))
        return out

    def view(self) -> dict[str, object]:
        """Every entry as a plain tuple, with the cursor: what two equal states share."""
        return {"cursor": self.cursor, "entries": {sn: (e.kind, e.receive_count, e.first_receive_ms, e.nonce,
                                                        e.deadline_ms) for sn, e in self.entries.items()}}


def replay(queue_uid: int, ordinal: int, changes: Iterable[Change], **bounds: int) -> PartitionQueue:
    """A state rebuilt from its log: a snapshot's changes, then every change after it."""
    state = PartitionQueue(queue_uid, ordinal, **bounds)
    state.apply(changes)
    return state


def arrival_ms(sn: int) -> int:
    """ApproximateArrivalTimestamp of a record: its SN's timestamp (the head's clock)."""
    return seqno.timestamp_ms_of(sn)
